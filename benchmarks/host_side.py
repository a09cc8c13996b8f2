"""The host side's two evaluations of a tower, each timed on one core.

Usage: ``python benchmarks/host_side.py WORKLOAD [workload options, e.g. --layers 3]``.

A run's host side evaluates the whole tower twice an image: the reference at device
precision (FP8 operands, FP16 partials after every 32-deep pass, the package's GEMM modes)
and the float64 model that fidelity is measured against.  The 4-image pipeline run's CPU an
image is this plus the device's simulation, so these two figures bound what the run can
gain from the host side (docs/benchmarks.md, issue 21).  The workload is compiled (layers
strategy) into a temporary folder for its GEMM modes; then each evaluation runs alone, BLAS
on one thread as in a run.
"""

from __future__ import annotations

import logging
import sys
import tempfile
import time
from pathlib import Path

from threadpoolctl import threadpool_limits

from ipu_stack.cli import parse_workload
from ipu_stack.ir.interpret import evaluate_float64_steps, evaluate_steps
from ipu_stack.ir.values import CompactValues
from ipu_stack.pipeline import CompileOptions, compile_workload
from ipu_stack.runtime.session import hold_weights, load_package


def _drain(steps) -> None:  # type: ignore[no-untyped-def]
    for _ in steps:
        pass


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: host_side.py WORKLOAD [workload options]", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(levelname)5s %(name)s: %(message)s")
    workload, params = parse_workload(argv[0], argv[1:])
    with tempfile.TemporaryDirectory() as folder:
        result = compile_workload(workload, params, Path(folder), CompileOptions())
        modes = load_package(result.package).manifest.get("gemm_modes", {})
    graph, tensors = result.graph, result.tensors
    hold_weights(graph, tensors)
    outputs = {v.name for v in graph.by_role("output")}
    with threadpool_limits(limits=1, user_api="blas"):
        started = time.perf_counter()
        _drain(evaluate_steps(graph, tensors, modes, CompactValues()))
        reference = time.perf_counter() - started
        started = time.perf_counter()
        _drain(evaluate_float64_steps(graph, tensors, outputs))
        model = time.perf_counter() - started
    print(f"workload={workload.identifier(params)} referenceSeconds={reference:.2f} "
          f"modelSeconds={model:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
