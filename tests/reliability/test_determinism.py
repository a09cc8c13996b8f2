"""Same workload, options and seed: byte-identical package and identical cycles, whatever the
process, ``PYTHONHASHSEED``, working directory or cache state.

Each workload is benchmarked by two separate ``python -m ipu_stack.cli bench`` processes that
run concurrently: one with ``PYTHONHASHSEED=0``, a fresh cache and one working
directory, the other with ``PYTHONHASHSEED=12345``, another cache and another working
directory.  The package files (and the memory reports written beside them) must be identical
byte for byte, and the ``bench --json`` records identical in every simulated field.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKLOADS = {
    "siglip-mlp": ["--tokens", "17", "--dim", "64", "--hidden", "96"],
    "attention": ["--tokens", "17", "--dim", "64", "--heads", "4"],
    # a layer loop: slots, per-layer tables and per-pass probe names
    "pe-vision": ["--image", "28", "--patch", "7", "--dim", "64", "--heads", "4", "--hidden",
                  "96", "--layers", "3"],
}
# every record field that comes from the compiler or the simulator (not wall time or paths)
SIMULATED = ("numericalTest", "workload", "cycles", "estimatedCycles", "exchangeCycles",
             "computeCycles", "syncCycles", "minimumTileCycles", "activeTiles",
             "maximumAbsoluteError", "peakTileBytes", "hostBytes", "effectiveGemmTflops")


def _bench_process(workload: str, root: Path, hash_seed: str) -> tuple[subprocess.Popen, Path]:
    cwd = root / f"cwd-{hash_seed}"
    cwd.mkdir(parents=True)
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    argv = [sys.executable, "-m", "ipu_stack.cli", "--quiet", "bench", workload,
            *WORKLOADS[workload], "--json", "--finalists", "2",
            "--out", "pkg",  # relative: inside this process's own working directory
            "--cache-dir", str(root / f"cache-{hash_seed}"), "--lock", str(root / "device.lock")]
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    return proc, cwd / "pkg"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_two_processes_give_byte_identical_packages(tmp_path: Path, workload: str) -> None:
    runs = [_bench_process(workload, tmp_path, seed) for seed in ("0", "12345")]
    records, folders = [], []
    for proc, folder in runs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        assert "Traceback" not in err
        records.append(json.loads(out.strip().splitlines()[-1]))
        folders.append(folder)
    first, second = folders
    assert first != second
    assert _sha(first / "model.ipuexe") == _sha(second / "model.ipuexe")
    for report in ("memory/memory-profile.json", "memory/placement.html"):
        assert (first / report).read_bytes() == (second / report).read_bytes(), report
    a, b = records
    assert a["numericalTest"] == "PASS"
    assert {k: a[k] for k in SIMULATED} == {k: b[k] for k in SIMULATED}
    assert a["cycles"] == a["exchangeCycles"] + a["computeCycles"] + a["syncCycles"]


def test_package_does_not_depend_on_the_output_path_or_a_warm_cache(
    tmp_path: Path, cache_dir: Path
) -> None:
    """In one process: a cold-cache compile and a warm-cache compile into a differently named
    folder give the same bytes (no path, time or cache state leaks into the package)."""
    from tests.helpers import cli

    shas = []
    for index, cache in enumerate((tmp_path / "cold-cache", cache_dir, cache_dir)):
        out = tmp_path / f"out-{index}" / ("deeper" * index)
        code, _, err = cli(["--quiet", "compile", "siglip-mlp", *WORKLOADS["siglip-mlp"],
                            "--finalists", "2", "-o", str(out), "--cache-dir", str(cache)])
        assert code == 0, err
        shas.append(_sha(out / "model.ipuexe"))
    assert len(set(shas)) == 1
