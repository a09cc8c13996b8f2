"""Trading cycles for memory: a smaller memory proportion gives leaner, slower plans that still
fit and still compute the right numbers."""

from __future__ import annotations

import json
import re

from ipu_stack.cli import main


def _bench(capsys, tmp_path, cache_dir, lock_path, *extra):
    code = main(["bench", "siglip-mlp", "--tokens", "64", "--blocks", "4", "--json",
                 "--finalists", "1", "--out", str(tmp_path), "--cache-dir", str(cache_dir),
                 "--lock", str(lock_path), *extra])
    captured = capsys.readouterr()
    return code, json.loads(captured.out.strip().splitlines()[-1]), captured.err


def test_lower_memory_proportion_trades_cycles_for_bytes(capsys, tmp_path, cache_dir, lock_path):
    """Four stacked MLPs keep eight weight blocks resident: at 10 % of tile memory the fastest
    plans do not fit the planner's budget, so it moves stages to leaner, slower plans."""
    code, roomy, log = _bench(capsys, tmp_path / "a", cache_dir, lock_path)
    assert code == 0 and "traded cycles for memory" not in log
    code, tight, log = _bench(capsys, tmp_path / "b", cache_dir, lock_path,
                              "--memory-proportion", "0.1")
    assert code == 0 and tight["numericalTest"] == "PASS"
    traded = re.search(r"traded cycles for memory moves=(\d+) budget_bytes=(\d+) "
                       r"estimated_bytes=(\d+)", log)
    assert traded, log
    moves, budget, estimated = (int(g) for g in traded.groups())
    assert moves >= 1 and estimated <= budget
    assert tight["cycles"] > roomy["cycles"]


def test_impossible_memory_proportion_is_one_line(capsys, tmp_path, cache_dir):
    code = main(["compile", "siglip-mlp", "--memory-proportion", "0.001", "-o", str(tmp_path),
                 "--cache-dir", str(cache_dir)])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(err) == 1
    assert "does not fit" in err[0]
