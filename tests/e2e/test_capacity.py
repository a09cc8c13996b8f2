"""The capacity probe: the largest size that compiles, found without compiling every size."""

from __future__ import annotations

import json

import pytest

from ipu_stack import capacity
from ipu_stack.cli import main
from ipu_stack.pipeline import CompileOptions
from ipu_stack.workloads import get_workload


@pytest.mark.parametrize("fits_up_to", [0, 1, 2, 37, 63, 64])
def test_search_finds_the_boundary_in_few_compiles(monkeypatch, fits_up_to):
    tried: list[int] = []

    def fake_fits(workload, params, options, **_):
        tried.append(params["batch"])
        return "" if params["batch"] <= fits_up_to else f"batch {params['batch']} is too big"

    monkeypatch.setattr(capacity, "_fits", fake_fits)
    workload = get_workload("siglip-mlp")
    result = capacity.probe_capacity(workload, workload.defaults(), "batch", 64, CompileOptions())
    assert result.maximum == fits_up_to
    assert len(tried) == len(set(tried)) <= 2 * 6 + 2  # about 2 log2(64), never all 64
    if fits_up_to < 64:
        assert result.reason.startswith(f"batch={fits_up_to + 1}: batch {fits_up_to + 1} is")
    else:
        assert result.reason == "reached --max-batch 64"


@pytest.mark.parametrize("fits_up_to, answer, failed", [
    (70, 64, 96), (20, 0, 32), (100, 100, None), (99, 96, 100)])
def test_a_context_is_searched_in_whole_blocks_of_positions(monkeypatch, fits_up_to, answer,
                                                            failed):
    """A cache holds whole blocks of 32 positions: only their ends (and the limit) are
    compiled, and the answer is one of them."""
    tried: list[int] = []

    def fake_fits(workload, params, options, **_):
        tried.append(params["context"])
        return "" if params["context"] <= fits_up_to else "too long"

    monkeypatch.setattr(capacity, "_fits", fake_fits)
    workload = get_workload("smollm2-135m")
    result = capacity.probe_capacity(workload, workload.defaults(), "context", 100,
                                     CompileOptions())
    assert result.maximum == answer
    assert all(size % 32 == 0 or size == 100 for size in tried)
    assert len(tried) == len(set(tried))
    assert result.reason == (f"context={failed}: too long" if failed
                             else "reached --max-context 100")


@pytest.mark.slow  # a minute of compiles on 2 cores; a decoder's capacity runs by default
def test_capacity_of_the_siglip_mlp(capsys, cache_dir):
    # an eighth of tile memory keeps the boundary at a small batch (row-chunked plans fit
    # batch 20 into the whole of it, a compile of minutes)
    code = main(["--quiet", "capacity", "siglip-mlp", "--max-batch", "64", "--json",
                 "--memory-proportion", "0.12", "--cache-dir", str(cache_dir)])
    record = json.loads(capsys.readouterr().out)
    assert code == 0
    assert record["maximumBatch"] >= 1
    nxt = record["maximumBatch"] + 1
    assert record["tried"][str(record["maximumBatch"])] == "fits"
    assert record["reason"].startswith(f"batch={nxt}: ") and "does not fit" in record["reason"]
    assert record["compiles"] < 64


def test_capacity_rejects_a_bad_limit(capsys):
    assert main(["capacity", "siglip-mlp", "--max-batch", "0"]) == 2
    assert "--max-batch must be at least 1" in capsys.readouterr().err


def test_nothing_that_fits_is_a_compile_error(monkeypatch, capsys):
    """Not even the least size compiles: the record says why, and the exit status is 2."""
    monkeypatch.setattr(capacity, "_fits", lambda *_, **__: "stage 0 does not fit")
    code = main(["--quiet", "capacity", "siglip-mlp", "--max-batch", "4", "--json"])
    record = json.loads(capsys.readouterr().out)
    assert code == 2 and record["maximumBatch"] == 0
    assert record["reason"] == "batch=1: stage 0 does not fit"


def test_nothing_that_fits_is_one_error_line(monkeypatch, capsys):
    """Without --json a search where nothing compiles ends like any compile error: one
    ``error:`` line on stderr naming the reason, nothing on stdout."""
    monkeypatch.setattr(capacity, "_fits", lambda *_, **__: "stage 0 does not fit")
    code = main(["--quiet", "capacity", "siglip-mlp", "--max-batch", "4"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err.strip() == "error: batch=1: stage 0 does not fit"
