"""The numerical verdict at depth: siglip-layer stacks of 1, 2, 4 and 8 layers, FP8 and F16.

Usage: ``python benchmarks/verdict_depth.py [--blocks 1,2,4,8] [--precisions fp8,f16]
[workload options]``.  Prints, per stack, the verdict's parts (worst stage agreement in ulps
and share of differing elements, noise and tail ratios against the float64 model), the
maximum absolute error against the device-precision reference, and the verdict's own time
against the simulation time (the limit: at most 20 % more).  Figures go into
docs/tolerance.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

FIELDS = ("numericalTest", "failedParts", "stageAgreement", "stageMismatch", "worstStage",
          "noiseRatio", "tailRatio", "maximumAbsoluteError", "cycles", "simulateSeconds",
          "verdictSeconds")


def run(blocks: int, precision: str, extra: list[str]) -> dict:
    command = [sys.executable, "-m", "ipu_stack.cli", "--quiet", "bench", "siglip-layer",
               "--blocks", str(blocks), "--precision", precision, "--json",
               "--out", f"artifacts/verdict-depth-{precision}-{blocks}", *extra]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = done.stdout.strip().splitlines()
    if not lines:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr else "no output"}
    record = json.loads(lines[-1])
    picked = {k: record.get(k) for k in FIELDS}
    picked["verdictShare"] = round(record["verdictSeconds"] / record["simulateSeconds"], 3)
    return picked


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", default="1,2,4,8")
    parser.add_argument("--precisions", default="fp8,f16")
    args, extra = parser.parse_known_args()
    for precision in args.precisions.split(","):
        for blocks in (int(b) for b in args.blocks.split(",")):
            print(json.dumps({"blocks": blocks, "precision": precision,
                              **run(blocks, precision, extra)}), flush=True)
