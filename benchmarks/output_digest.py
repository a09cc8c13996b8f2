"""Digests of every builtin workload's device outputs, to show a change keeps them bit for bit.

Runs ``ipu-stack bench CASE --json --save-tensors DIR`` for each case and prints one JSON line
per case: the verdict, the cycles, the planner's estimate and its error against them, and
the sha256 of each output array's bytes.  Run it before
and after a change of the simulator or the numerics and compare the two files::

    python benchmarks/output_digest.py > before.jsonl      # on the old tree
    python benchmarks/output_digest.py > after.jsonl       # on the new tree
    diff before.jsonl after.jsonl

``--quick`` takes the small cases only (a few minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

CASES: list[list[str]] = [
    ["siglip-mlp"],
    ["siglip-mlp", "--precision", "f16"],
    ["attention"],
    ["vit-layer"],
    ["siglip-attention"],
    ["siglip-layer"],
    ["siglip-layer", "--gemm-mode", "f16"],
    ["pe-block"],
    ["siglip-vision", "--layers", "2"],
    ["pe-vision", "--layers", "2", "--batch", "2"],
]
QUICK = [c for c in CASES if c[0] in ("siglip-mlp", "attention", "vit-layer")]


def digest(case: list[str], cache: Path) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        done = subprocess.run(
            [sys.executable, "-m", "ipu_stack.cli", "bench", *case, "--json", "--cache-dir",
             str(cache), "--save-tensors", folder, "--out", str(Path(folder) / "pkg")],
            capture_output=True, text=True)
        if done.returncode not in (0, 1):
            return {"case": " ".join(case), "error": done.stderr.strip().splitlines()[-1:]}
        record = json.loads(done.stdout)
        with np.load(Path(folder) / "outputs.npz") as outputs:
            hashes = {name: hashlib.sha256(np.ascontiguousarray(outputs[name]).tobytes())
                      .hexdigest()[:16] for name in sorted(outputs.files)}
    return {"case": " ".join(case), "numericalTest": record["numericalTest"],
            "cycles": record["cycles"], "estimatedCycles": record["estimatedCycles"],
            "estimateError": record["estimateError"], "outputs": hashes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the small cases only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        for case in QUICK if args.quick else CASES:
            print(json.dumps(digest(case, Path(cache))), flush=True)


if __name__ == "__main__":
    main()
