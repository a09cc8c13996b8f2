"""Trading cycles for memory: a smaller memory proportion gives leaner, slower plans that still
fit and still compute the right numbers."""

from __future__ import annotations

import re

import pytest

from ipu_stack.cli import main
from tests.helpers import bench

MLP4 = ["--tokens", "64", "--blocks", "4"]


@pytest.mark.slow  # tests/e2e/test_profile.py makes the same two runs and checks the trade
def test_lower_memory_proportion_trades_cycles_for_bytes(tmp_path, cache_dir, lock_path):
    """Four stacked MLPs keep eight weight blocks resident: at 10 % of tile memory the fastest
    plans do not fit the planner's budget, so it moves stages to leaner, slower plans."""
    roomy = bench("siglip-mlp", *MLP4, folder=tmp_path / "a", cache_dir=cache_dir, lock=lock_path)
    assert roomy.code == 0 and "traded cycles for memory" not in roomy.stderr
    tight = bench("siglip-mlp", *MLP4, "--memory-proportion", "0.1", folder=tmp_path / "b",
                  cache_dir=cache_dir, lock=lock_path)
    assert tight.code == 0 and tight.record["numericalTest"] == "PASS"
    traded = re.search(r"traded cycles for memory moves=(\d+) budget_bytes=(\d+) "
                       r"estimated_bytes=(\d+)", tight.stderr)
    assert traded, tight.stderr
    moves, budget, estimated = (int(g) for g in traded.groups())
    assert moves >= 1 and estimated <= budget
    assert tight.record["cycles"] > roomy.record["cycles"]


def test_impossible_memory_proportion_is_one_line(capsys, tmp_path, cache_dir):
    code = main(["compile", "siglip-mlp", "--memory-proportion", "0.001", "-o", str(tmp_path),
                 "--cache-dir", str(cache_dir)])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(err) == 1
    assert "does not fit" in err[0]
