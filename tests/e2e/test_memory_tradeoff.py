"""Trading cycles for memory: a smaller memory proportion gives leaner, slower plans that still
fit and still compute the right numbers."""

from __future__ import annotations

import json

from ipu_stack.cli import main


def _bench(capsys, tmp_path, cache_dir, lock_path, *extra):
    code = main(["--quiet", "bench", "siglip-mlp", "--tokens", "200", "--dim", "256",
                 "--hidden", "1024", "--json", "--finalists", "1", "--out", str(tmp_path),
                 "--cache-dir", str(cache_dir), "--lock", str(lock_path), *extra])
    return code, json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_lower_memory_proportion_trades_cycles_for_bytes(capsys, tmp_path, cache_dir, lock_path):
    code, roomy = _bench(capsys, tmp_path / "a", cache_dir, lock_path)
    assert code == 0
    code, tight = _bench(capsys, tmp_path / "b", cache_dir, lock_path,
                         "--memory-proportion", "0.03")
    assert code == 0 and tight["numericalTest"] == "PASS"
    assert tight["peakTileBytes"] < roomy["peakTileBytes"]
    assert tight["cycles"] >= roomy["cycles"]


def test_impossible_memory_proportion_is_one_line(capsys, tmp_path, cache_dir):
    code = main(["compile", "siglip-mlp", "--memory-proportion", "0.001", "-o", str(tmp_path),
                 "--cache-dir", str(cache_dir)])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(err) == 1
    assert "does not fit" in err[0]
