"""Measure the error of each GEMM mode: device outputs against the ideal float64 forward pass
and against the device-precision reference.

Usage: ``python benchmarks/mode_errors.py [WORKLOAD [workload options]]`` (default
siglip-mlp).  For each mode (``fp8``: native FP8 with FP16 partials; ``f16``: F16 with F32
partials after casting the FP8 operands) it compiles, runs on the simulator, and prints the
maximum and RMS error of every output against ``ir.interpret.evaluate_float64`` (no rounding
anywhere: the ideal answer from the same FP8 inputs and weights) and the maximum error
against the device-precision reference that ``numericalTest`` uses.  Figures go into
docs/tolerance.md.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import tempfile
from pathlib import Path

import numpy as np

from ipu_stack.cli import parse_workload
from ipu_stack.ir.interpret import evaluate_float64
from ipu_stack.pipeline import CompileOptions, compile_workload
from ipu_stack.runtime.execute import run_package
from ipu_stack.runtime.session import load_package


def measure(name: str, argv: list[str], mode: str) -> dict[str, float | str]:
    workload, params = parse_workload(name, argv)
    with tempfile.TemporaryDirectory() as out, contextlib.redirect_stderr(io.StringIO()):
        compiled = compile_workload(workload, params, Path(out),
                                    CompileOptions(cache_dir=None, gemm_mode=mode))
        result = run_package(load_package(compiled.package), compiled.graph, compiled.tensors,
                             Path(out) / "lock")
    ideal = evaluate_float64(compiled.graph, compiled.tensors)
    worst: dict[str, float | str] = {"mode": mode, "numericalTest": "PASS" if result.passed
                                     else "FAIL"}
    for output, device in result.outputs.items():
        error = device.astype(np.float64) - ideal[output].reshape(device.shape)
        scale = float(np.sqrt(np.mean(ideal[output] ** 2)))
        worst.update({
            "maxAbsVsFloat64": round(float(np.abs(error).max()), 5),
            "rmsVsFloat64": round(float(np.sqrt(np.mean(error**2))), 6),
            "rmsRelativeToOutputRms": round(float(np.sqrt(np.mean(error**2))) / scale, 5),
            "maxAbsVsDeviceReference": round(result.comparisons[output].max_abs_error, 6),
            "cycles": result.run.cycles,
        })
    return worst


if __name__ == "__main__":
    logging.disable(logging.CRITICAL)
    name = sys.argv[1] if len(sys.argv) > 1 else "siglip-mlp"
    for gemm_mode in ("fp8", "f16"):
        print(name, " ".join(sys.argv[2:]), measure(name, sys.argv[2:], gemm_mode))
