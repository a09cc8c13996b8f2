"""Benchmark the SigLIP MLP end to end: compile and simulate time, peak memory, cycles.

Usage: ``python benchmarks/bench_mlp.py [--tokens N ...]``; prints the benchmark record and
the process's peak resident memory.  Figures go into docs/benchmarks.md.
"""

from __future__ import annotations

import json
import resource
import sys
import tempfile
from contextlib import redirect_stdout
from io import StringIO

from ipu_stack.cli import main


def run(argv: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as out:
        buffer = StringIO()
        with redirect_stdout(buffer):
            code = main(["--quiet", "bench", "siglip-mlp", "--json", "--out", out, *argv])
        record = json.loads(buffer.getvalue().strip().splitlines()[-1])
        record["exitCode"] = code
    record["peakResidentMiB"] = round(
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1
    )
    return record


if __name__ == "__main__":
    result = run(sys.argv[1:])
    for key in ("numericalTest", "workload", "cycles", "estimatedCycles", "exchangeCycles",
                "computeCycles", "efficiencyPercent", "maximumAbsoluteError", "compileSeconds",
                "simulateSeconds", "peakResidentMiB", "peakTileBytes"):
        print(f"{key}={result[key]}")
