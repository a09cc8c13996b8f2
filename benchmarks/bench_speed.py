"""A profile of the tool itself: where a bench run's wall time and memory go.

For each case it runs ``ipu-stack bench CASE --json`` in a fresh process and prints one JSON
line: the compile, simulate and verdict seconds from the record, the process's peak RSS, and
(unless ``--no-profile``) the top functions by own time from a second, profiled run.  It also
prints the BLAS-bound floor of the case: the seconds plain float32 matmuls of the same GEMMs
(every matmul of the graph, one BLAS call each at full depth) take on this machine.

    python benchmarks/bench_speed.py                       # siglip-layer, siglip-vision
    python benchmarks/bench_speed.py --case "siglip-vision --layers 3" --no-profile

The figures in docs/benchmarks.md come from it.
"""

from __future__ import annotations

import argparse
import json
import pstats
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

CASES = ["siglip-layer", "siglip-vision"]

CHILD = """
import cProfile, json, resource, sys
from contextlib import redirect_stdout
from io import StringIO
from ipu_stack.cli import main
argv, stats = json.loads(sys.argv[1]), sys.argv[2]
buffer = StringIO()
profiler = cProfile.Profile() if stats else None
with redirect_stdout(buffer):
    if profiler:
        profiler.enable()
    code = main(argv)
    if profiler:
        profiler.disable()
if profiler:
    profiler.dump_stats(stats)
record = json.loads(buffer.getvalue().strip().splitlines()[-1])
record["exitCode"] = code
record["peakRssMiB"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
# the host side's forked process (verdict/host_process.py): its own peak, to add to ours
record["hostPeakRssMiB"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024
print(json.dumps(record))
"""


def run_case(case: str, folder: Path, cache: Path, stats: Path | None) -> dict:
    argv = ["--quiet", "bench", *shlex.split(case), "--json", "--out", str(folder / "pkg"),
            "--cache-dir", str(cache)]
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(argv), str(stats or "")],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{case}: {done.stderr.strip().splitlines()[-1:]}")
    record = json.loads(done.stdout.strip().splitlines()[-1])
    record["wallSeconds"] = round(time.perf_counter() - started, 1)
    return record


def top_functions(stats: Path, count: int = 5) -> list[dict]:
    table = pstats.Stats(str(stats)).stats  # type: ignore[attr-defined]
    rows = sorted(table.items(), key=lambda item: -item[1][2])[:count]
    return [{"function": f"{Path(file).name}:{line}({name})", "seconds": round(own, 2),
             "calls": calls} for (file, line, name), (_, calls, own, _, _) in rows]


def blas_floor(case: str) -> float:
    """Seconds of one float32 BLAS matmul per matmul of the case's graph (full depth)."""
    from ipu_stack.cli import parse_workload

    words = shlex.split(case)
    workload, params = parse_workload(words[0], words[1:])
    graph = workload.build(params)[0]
    shapes: dict[tuple[int, ...], int] = {}
    for op in graph.operations:
        if op.kind in ("matmul", "head_matmul"):
            a = graph.value(op.inputs[0]).type
            b = graph.value(op.inputs[1]).type
            if op.kind == "matmul":
                key = (a.rows, a.cols, b.shape[-1])
            else:  # per head: tokens x head_dim x tokens (qk) or tokens x tokens x head_dim
                heads, tokens = int(op.attrs["heads"]), int(op.attrs["tokens"])
                head_dim = b.shape[-1] // heads
                batch = b.shape[0] // tokens
                key = ((batch * heads, tokens, head_dim, tokens) if op.attrs["mode"] == "qk"
                       else (batch * heads, tokens, tokens, head_dim))
            shapes[key] = shapes.get(key, 0) + 1
    seconds = 0.0
    rng = np.random.default_rng(0)
    for key, count in shapes.items():
        stack = key[:-3] if len(key) == 4 else ()
        m, k, n = key[-3:]
        a = rng.standard_normal((*stack, m, k), dtype=np.float32)
        b = rng.standard_normal((*stack, k, n), dtype=np.float32)
        started = time.perf_counter()
        np.matmul(a, b)
        seconds += (time.perf_counter() - started) * count
    return seconds


def copy_bandwidth(megabytes: int = 256) -> dict[str, float]:
    """GB/s of a copy into fresh memory (every page a first touch) and into memory already
    held: what freeing and reallocating arrays costs on this machine (``util/heap.py``)."""
    source = np.ones(megabytes << 20, dtype=np.uint8)
    started = time.perf_counter()
    fresh = source.copy()
    first = time.perf_counter() - started
    started = time.perf_counter()
    np.copyto(fresh, source)
    held = time.perf_counter() - started
    return {"firstTouchGBs": round(source.nbytes / first / 1e9, 2),
            "heldGBs": round(source.nbytes / held / 1e9, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", help="a bench command line (repeatable)")
    parser.add_argument("--no-profile", action="store_true", help="skip the profiled run")
    args = parser.parse_args()
    print(json.dumps({"machine": copy_bandwidth()}), flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        folder, cache = Path(scratch), Path(scratch) / "cache"
        for case in args.case or CASES:
            run_case(case, folder, cache, None)  # warm: the kernel and calibration caches
            record = run_case(case, folder, cache, None)
            line = {"case": case, "numericalTest": record["numericalTest"],
                    "cycles": record["cycles"], "compileSeconds": record["compileSeconds"],
                    "simulateSeconds": record["simulateSeconds"],
                    "verdictSeconds": record["verdictSeconds"],
                    "modelSeconds": record["modelSeconds"],
                    "wallSeconds": record["wallSeconds"], "peakRssMiB": record["peakRssMiB"],
                    "hostPeakRssMiB": record["hostPeakRssMiB"],
                    "blasFloorSeconds": round(blas_floor(case), 2)}
            if not args.no_profile:
                stats = folder / "run.prof"
                run_case(case, folder, cache, stats)
                line["topFunctions"] = top_functions(stats)
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
