"""Two workers against one on an 8-point sweep of siglip-layer.

Usage: ``python benchmarks/bench_sweep.py [workload options]`` (default: siglip-layer at its
full size; the grid is batch=1,2 x precision=fp8,f16 x memory-proportion=0.6,0.9).  Runs the
sweep into two fresh folders with ``--workers 1`` and ``--workers 2`` (warm kernel and numba
caches) and prints the wall time of each and the speed-up.  Figures go into
docs/benchmarks.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GRID = ["--grid", "batch=1,2", "--grid", "precision=fp8,f16",
        "--grid", "memory-proportion=0.6,0.9"]


def sweep(workers: int, extra: list[str]) -> tuple[float, list[dict]]:
    with tempfile.TemporaryDirectory() as out:
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "ipu_stack.cli", "--quiet", "sweep",
                        "siglip-layer", *GRID, *extra, "-o", out, "--workers", str(workers)],
                       check=False, capture_output=True)
        seconds = time.perf_counter() - started
        lines = (Path(out) / "results.jsonl").read_text().splitlines()
        return seconds, [json.loads(line) for line in lines]


if __name__ == "__main__":
    extra = sys.argv[1:]
    one, first = sweep(1, extra)
    two, second = sweep(2, extra)
    statuses = sorted((r["key"], r["status"]) for r in first)
    print(json.dumps({"points": len(first), "statuses": dict(statuses),
                      "sameResults": statuses == sorted((r["key"], r["status"]) for r in second),
                      "oneWorkerSeconds": round(one, 1), "twoWorkerSeconds": round(two, 1),
                      "speedUp": round(one / two, 2)}))
