"""Digests of every builtin workload's device outputs, to show a change keeps them bit for bit.

Runs ``ipu-stack bench CASE --json --save-tensors DIR`` for each case and prints one JSON line
per case: the verdict, the cycles, the planner's estimate and its error against them, and
the sha256 of each array ``outputs.npz`` holds (a stream's holds every image's outputs, each
image under its own names).  A stream's line (a pipeline, or a tower over several chips) also
has its ``stepCycles`` and ``imagesPerSecond``.  Where ``bench`` refuses ``--save-tensors``
for a case, the case runs without it and its line has ``"outputs": null``.  Run it on the
tree before a change of the simulator or the numerics and on the tree after it, and compare
the two files::

    python benchmarks/output_digest.py > before.jsonl
    python benchmarks/output_digest.py > after.jsonl
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

TOWER = ["siglip-vision", "--layers", "4", "--image", "28", "--patch", "7", "--dim", "64",
         "--hidden", "96", "--heads", "4"]
TEXT = ["--tokens", "16", "--vocab", "500", "--layers", "2", "--dim", "64", "--heads", "4",
        "--hidden", "96"]
SWIN = ["swin-l", "--batch", "2", "--image", "32", "--window", "4", "--dim", "16", "--depths",
        "2,2", "--stage-heads", "2,4"]
DECODER = ["--tokens", "16", "--vocab", "500", "--layers", "2", "--dim", "64", "--heads", "4",
           "--kv-heads", "2", "--hidden", "96"]
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
    [*TOWER, "--strategy", "pipeline", "--groups", "2", "--images", "3"],
    [*TOWER, "--chips", "2", "--groups", "2", "--images", "2"],
    ["siglip2-giant", "--image", "32", "--patch", "16", "--layers", "2", "--dim", "64",
     "--heads", "4", "--hidden", "96", "--chips", "2"],
    ["pe-giant", "--image", "28", "--patch", "14", "--layers", "4", "--dim", "64", "--heads",
     "4", "--hidden", "96", "--chips", "4"],
    ["clip-text", *TEXT],
    ["bert-base", *TEXT],
    ["roberta-base", *TEXT],
    [*SWIN],
    [*SWIN, "--precision", "f16"],
    ["smollm2-135m", *DECODER],
    ["smollm2-135m", *DECODER, "--context", "32", "--tokens", "1"],
    ["tinyllama-1.1b", *DECODER, "--context", "32", "--tokens", "1", "--batch", "4",
     "--chips", "2"],
    ["smolvlm-256m", "--part", "vision", "--image", "64", "--vision-layers", "1", "--layers",
     "2", "--dim", "64", "--heads", "4", "--kv-heads", "2", "--hidden", "128", "--vocab",
     "256"],
]
QUICK = [c for c in CASES if c[0] in ("siglip-mlp", "attention", "vit-layer")]
STREAM_FIELDS = ("stepCycles", "imagesPerSecond")  # a stream's record only


def bench(case: list[str], cache: Path, folder: Path, save: bool) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "ipu_stack.cli", "bench", *case, "--json", "--cache-dir",
               str(cache), "--out", str(folder / "pkg")]
    if save:
        command += ["--save-tensors", str(folder / "tensors")]
    return subprocess.run(command, capture_output=True, text=True)


def refuses_saving(done: subprocess.CompletedProcess) -> bool:
    """Whether ``bench`` failed only because it refused ``--save-tensors`` (a usage error
    naming the option)."""
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    return done.returncode == 2 and len(errors) == 1 and "--save-tensors" in errors[0]


def hashes(npz: Path) -> dict[str, str]:
    """The sha256 (first 16 hex digits) of the bytes of every array in ``npz``, by name."""
    with np.load(npz) as outputs:
        return {name: hashlib.sha256(np.ascontiguousarray(outputs[name]).tobytes())
                .hexdigest()[:16] for name in sorted(outputs.files)}


def digest(case: list[str], cache: Path) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        done = bench(case, cache, folder, save=True)
        saved = not refuses_saving(done)
        if not saved:
            done = bench(case, cache, folder, save=False)
        if done.returncode not in (0, 1):
            return {"case": " ".join(case), "error": done.stderr.strip().splitlines()[-1:]}
        record = json.loads(done.stdout.strip().splitlines()[-1])
        outputs = hashes(folder / "tensors" / "outputs.npz") if saved else None
    line = {"case": " ".join(case), "numericalTest": record["numericalTest"],
            "cycles": record["cycles"], "estimatedCycles": record["estimatedCycles"],
            "estimateError": record["estimateError"]}
    if "stepCycles" in record:
        line.update({key: record[key] for key in STREAM_FIELDS if key in record})
    return {**line, "outputs": outputs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the small cases only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        for case in QUICK if args.quick else CASES:
            print(json.dumps(digest(case, Path(cache))), flush=True)


if __name__ == "__main__":
    main()
