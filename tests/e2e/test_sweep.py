"""Sweeps: the 8-point grid of the issue (small layers), resume after a kill, a point that does
not fit, the summary, the page in headless Chromium, and the Ray engine when Ray installs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ipu_stack.cli import main
from ipu_stack.sweep import read_results
from tests.chromium import rendered_dom

SMALL = ["--tokens", "17", "--dim", "64", "--heads", "4", "--hidden", "96"]
GRID = ["--grid", "batch=1,2", "--grid", "precision=fp8,f16",
        "--grid", "memory-proportion=0.6,0.9"]


def _sweep(out: Path, cache_dir: Path, *extra: str) -> int:
    return main(["--quiet", "sweep", "siglip-layer", *SMALL, *GRID, "-o", str(out),
                 "--cache-dir", str(cache_dir), "--finalists", "1", *extra])


def _comparable(records: list[dict]) -> dict[str, tuple]:
    """Each point's results without timings, workers or paths."""
    keep = ("status", "numericalTest", "cycles", "estimatedCycles", "peakTileBytes",
            "maximumAbsoluteError", "stageAgreement", "noiseRatio", "point")
    return {r["key"]: tuple(json.dumps(r.get(k), sort_keys=True) for k in keep)
            for r in records}


@pytest.fixture(scope="module")
def local_sweep(tmp_path_factory, cache_dir) -> Path:
    out = tmp_path_factory.mktemp("sweep")
    assert _sweep(out, cache_dir, "--workers", "2") == 0
    return out


def test_eight_points_run_on_the_local_engine(local_sweep: Path, capsys) -> None:
    records = read_results(local_sweep / "results.jsonl")
    assert len(records) == 8 and len({r["key"] for r in records}) == 8
    assert all(r["status"] == "ok" and r["numericalTest"] == "PASS" for r in records)
    points = {(r["point"]["batch"], r["point"]["precision"], r["point"]["memory-proportion"])
              for r in records}
    assert points == {(b, p, m) for b in (1, 2) for p in ("fp8", "f16") for m in (0.6, 0.9)}
    assert all(r["compilerVersion"] and len(r["optionsHash"]) == 16 for r in records)
    assert len({r["worker"] for r in records}) >= 1
    csv_lines = (local_sweep / "results.csv").read_text().splitlines()
    assert len(csv_lines) == 9 and csv_lines[0].startswith("key,batch,")
    assert main(["sweep", "--summary", str(local_sweep)]) == 0
    table = capsys.readouterr().out
    assert len(table.strip().splitlines()) == 9 and "memory-proportion" in table


def test_resume_after_a_kill_runs_no_point_twice(tmp_path, cache_dir, local_sweep) -> None:
    out = tmp_path / "killed"
    command = [sys.executable, "-m", "ipu_stack.cli", "--quiet", "sweep", "siglip-layer",
               *SMALL, *GRID, "-o", str(out), "--cache-dir", str(cache_dir),
               "--finalists", "1", "--workers", "1"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    results = out / "results.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if results.exists() and len(results.read_text().splitlines()) >= 3:
            break
        time.sleep(0.05)
    process.kill()
    process.wait()
    # a kill in the middle of a write leaves a line without its end: the resume drops it
    results.write_bytes(results.read_bytes() + b'{"key": "abc", "bat')
    first = read_results(results)
    assert 3 <= len(first) < 8
    assert main(["--quiet", "sweep", "siglip-layer", *SMALL, *GRID, "-o", str(out),
                 "--cache-dir", str(cache_dir), "--finalists", "1", "--workers", "1"]) == 0
    records = read_results(results)
    keys = [r["key"] for r in records]
    assert len(keys) == len(set(keys)) == 8  # every point once
    assert [r["key"] for r in records[: len(first)]] == [r["key"] for r in first]
    # the same results as the uninterrupted sweep, except timings
    assert _comparable(records) == _comparable(read_results(local_sweep / "results.jsonl"))


def test_a_point_that_does_not_fit_is_recorded_and_fails_the_sweep(tmp_path, cache_dir,
                                                                     capsys) -> None:
    out = tmp_path / "tight"
    code = main(["--quiet", "sweep", "siglip-mlp", "--grid", "memory-proportion=0.9,0.001",
                 "-o", str(out), "--cache-dir", str(cache_dir), "--workers", "1",
                 "--tokens", "64"])
    assert code == 1
    records = read_results(out / "results.jsonl")
    by_proportion = {r["point"]["memory-proportion"]: r for r in records}
    assert by_proportion[0.9]["status"] == "ok"
    failed = by_proportion[0.001]
    assert failed["status"] == "error" and "does not fit" in failed["error"]
    assert "failed=1" in capsys.readouterr().out


@pytest.mark.parametrize(("grid", "message"), [
    ("colour=red", "not a parameter of siglip-layer or a compile option"),
    ("batch", "expected NAME=V1,V2"),
    ("batch=1,two", "'two' is not a whole number"),
    # every value is checked as the command line checks it, before any point runs
    ("gemm-mode=x", "--grid gemm-mode: 'x' is not one of auto, fp8, f16"),
    ("strategy=foo", "--grid strategy: 'foo' is not one of layers, pipeline, auto"),
    ("chips=9", "--grid chips: 9: a C600 cluster holds 1 to 8 cards"),
    ("groups=0", "--grid groups: 0 is below 1"),
    ("finalists=0", "--grid finalists: 0 is below 1"),
    ("batch=1,1", "--grid batch: 1 is given twice"),
    ("batch=1,,2", "expected NAME=V1,V2"),
    ("tokens=16,016", "are the same point"),
])
def test_bad_grids_are_one_line(tmp_path, capsys, grid, message) -> None:
    code = main(["sweep", "siglip-layer", "--grid", grid, "-o", str(tmp_path)])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1 and message in err[0]


def test_sweep_page_renders_in_headless_chromium(local_sweep, tmp_path) -> None:
    dom = rendered_dom(tmp_path, (local_sweep / "sweep.html").as_uri())
    assert 'data-rendered="1"' in dom and 'data-points="8"' in dom
    assert dom.count("<circle") == 8
    assert "fewest cycles" in dom and "least peak tile memory" in dom


def test_ray_engine_gives_the_same_results(tmp_path, cache_dir, local_sweep) -> None:
    pytest.importorskip("ray", reason="the ray engine needs the [ray] extra")
    out = tmp_path / "ray"
    assert _sweep(out, cache_dir, "--engine", "ray") == 0
    records = read_results(out / "results.jsonl")
    assert _comparable(records) == _comparable(read_results(local_sweep / "results.jsonl"))


@pytest.mark.parametrize("content, message", [
    (b"\xff\xfe\n{}\n", "results.jsonl:1: not a sweep record"),
    (b"[" * 100000 + b"]" * 100000 + b"\n{}\n", "results.jsonl:1: not a sweep record"),
])
def test_a_results_file_that_is_not_records_is_one_line(tmp_path, content, message) -> None:
    """Bytes that are not UTF-8 or JSON nested past the parser's depth, not a traceback."""
    from ipu_stack.util.errors import UsageError

    path = tmp_path / "results.jsonl"
    path.write_bytes(content)
    with pytest.raises(UsageError, match=message):
        read_results(path)


def test_a_results_file_that_is_a_fifo_is_refused_unread(tmp_path) -> None:
    from ipu_stack.util.errors import UsageError

    os.mkfifo(tmp_path / "results.jsonl")
    with pytest.raises(UsageError, match="results.jsonl: not a regular file"):
        read_results(tmp_path / "results.jsonl")
