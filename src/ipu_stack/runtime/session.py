"""Run a package on the simulated device and check it: the ``run`` and ``bench`` commands.

Reads the package, takes hardware ownership, loads it, calls ``initialize`` with the weights
and ``run`` with the inputs, evaluates the host reference at device precision, applies the
tolerance policy and builds the benchmark record (the fields of reference log 004).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ipu_stack import __version__
from ipu_stack.device import DEFAULT_LOCK, HardwareLock, SimulatedIpu
from ipu_stack.device.simulator import CallReport
from ipu_stack.ir.graph import Graph
from ipu_stack.ir.precision import Precision
from ipu_stack.package import Package, read_package
from ipu_stack.runtime.reference import evaluate
from ipu_stack.runtime.tolerance import Comparison, compare
from ipu_stack.target import get_target
from ipu_stack.util.log import event

LOG = logging.getLogger("ipu_stack.runtime")


@dataclass
class RunResult:
    """Everything a run produced: outputs, cycle reports, the comparison."""

    package: Package
    outputs: dict[str, np.ndarray]
    reference: dict[str, np.ndarray]
    comparisons: dict[str, Comparison]
    initialize: CallReport
    run: CallReport
    simulate_seconds: float
    checkpoints: dict[int, Comparison] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.comparisons.values()) and all(
            c.passed for c in self.checkpoints.values()
        )


def load_package(path: Path, target_name: str = "ipu21") -> Package:
    event(LOG, "reading application package")
    package = read_package(path, expected_target=target_name)
    event(LOG, "application package read", tiles=get_target(target_name).tiles,
          compiler=package.compiler_version)
    return package


def run_package(
    package: Package,
    graph: Graph,
    tensors: dict[str, np.ndarray],
    lock_path: Path = DEFAULT_LOCK,
    wait: bool = True,
    poison: bool = False,
) -> RunResult:
    """Load ``package`` on a fresh simulated device, run it and compare with the reference."""
    target = get_target(package.target)
    with HardwareLock(lock_path, wait=wait):
        event(LOG, "opening IPU device", path="sim://ipu0")
        device = SimulatedIpu(target, poison=poison)
        event(LOG, "IPU device attached", path="sim://ipu0")
        event(LOG, "initializing IPU device")
        event(LOG, "IPU device initialized")
        device.load(package)
        event(LOG, "application loaded and initial synchronization completed",
              tile_count=target.tiles)
        t0 = time.perf_counter()
        weights = {v.name: tensors[v.name] for v in graph.by_role("weight")}
        inputs = {v.name: tensors[v.name] for v in graph.by_role("input")}
        event(LOG, "prepared reference inputs", elapsed_ms=int((time.perf_counter() - t0) * 1000))
        event(LOG, "configured host reference BLAS", threads=os.cpu_count() or 1,
              referencePrecision="device")
        t0 = time.perf_counter()
        reference = evaluate(graph, tensors, package.manifest.get("gemm_modes"))
        event(LOG, "evaluated host reference", elapsed_ms=int((time.perf_counter() - t0) * 1000))
        marks = sum(len(p) for p in package.manifest["programs"].values())
        event(LOG, "starting host exchange session", startup_mark=marks)
        event(LOG, "attaching host exchange pages", pages=2)
        event(LOG, "host exchange session started")
        sim_start = time.perf_counter()
        init_report = device.call("initialize", weights)
        run_report = device.call("run", inputs)
        simulate = time.perf_counter() - sim_start
    outputs = {}
    comparisons = {}
    for value in graph.by_role("output"):
        out = run_report.outputs[value.name].reshape(value.type.shape)
        outputs[value.name] = out
        comparisons[value.name] = compare(out, reference[value.name],
                                          precision=value.type.precision)
    result = RunResult(package, outputs, reference, comparisons, init_report, run_report,
                       simulate)
    precisions = {v.name: v.type.precision for v in graph.values}
    result.checkpoints = check_checkpoints(run_report, reference, precisions)
    return result


SAMPLE_LIMIT = 256


def check_checkpoints(
    report: CallReport, reference: dict[str, np.ndarray], precisions: dict[str, Precision]
) -> dict[int, Comparison]:
    """Compare up to 256 evenly spaced samples of each checkpointed value with the reference."""
    results: dict[int, Comparison] = {}
    for index in sorted(report.checkpoints):
        entry = report.checkpoints[index]
        device = entry["values"].ravel()
        expected = np.asarray(reference[entry["tensor"]], dtype=np.float32).ravel()
        picks = np.unique(np.linspace(0, device.size - 1, SAMPLE_LIMIT).astype(np.int64))
        scale = float(np.max(np.abs(expected))) if expected.size else 0.0
        result = compare(device[picks], expected[picks], scale=scale,
                         precision=precisions.get(entry["tensor"]))
        results[index] = result
        event(LOG, "diagnostic checkpoint", checkpoint=index, operation=entry["operation"],
              tensors=1, samples=len(picks), maximumAbsoluteError=round(result.max_abs_error, 6),
              tensor=entry["tensor"], passed=result.passed)
    if results:
        event(LOG, "diagnostic checkpoints checked", diagnosticCheckpoints=len(results),
              sampleLimit=SAMPLE_LIMIT,
              numericalTest="PASS" if all(r.passed for r in results.values()) else "FAIL")
    return results


def gemm_flops(graph: Graph) -> int:
    flops = 0
    for op in graph.operations:
        if op.kind == "matmul":
            a = graph.value(op.inputs[0]).type
            b = graph.value(op.inputs[1]).type
            flops += 2 * a.rows * a.cols * b.shape[1]
    return flops


def benchmark_fields(
    result: RunResult, graph: Graph, workload_fields: dict[str, Any], package_path: Path,
    compile_seconds: float | None,
) -> dict[str, Any]:
    """The benchmark record, in the order of reference log 004, plus our extra fields."""
    target = get_target(result.package.target)
    manifest = result.package.manifest
    run = result.run
    active = run.tile_busy > run.sync_cycles
    cycles = run.cycles
    seconds = cycles / target.clock_hz
    flops = gemm_flops(graph)
    tflops = flops / seconds / 1e12 if seconds else 0.0
    peak = target.peak_flops() / 1e12
    max_error = max((c.max_abs_error for c in result.comparisons.values()), default=0.0)
    input_bytes = sum(v.type.nbytes for v in graph.by_role("input"))
    weight_bytes = sum(v.type.nbytes for v in graph.by_role("weight"))
    record: dict[str, Any] = {
        "numericalTest": "PASS" if result.passed else "FAIL",
        "workload": manifest["workload"]["identifier"],
        **workload_fields,
        "activeTiles": int(active.sum()),
        "executionTiles": target.tiles,
        "inputBytes": input_bytes,
        "weightBytes": weight_bytes,
        "cycles": cycles,
        "minimumTileCycles": int(run.tile_busy[active].min()) if active.any() else 0,
        "deviceMicroseconds": round(target.cycles_to_us(cycles), 3),
        "effectiveGemmTflops": round(tflops, 3),
        "peakTflops": round(peak, 3),
        "efficiencyPercent": round(100 * tflops / peak, 2),
        "maximumAbsoluteError": round(max_error, 6),
        "diagnosticCheckpoints": len(result.checkpoints),
        "package": str(package_path),
        "estimatedCycles": int(manifest["estimate"]["cycles"]),
        "estimateError": round(abs(int(manifest["estimate"]["cycles"]) - cycles)
                               / max(cycles, 1), 4),
        "hostCycles": run.host_cycles,
        "exchangeCycles": run.exchange_cycles,
        "computeCycles": run.compute_cycles,
        "syncCycles": run.sync_cycles,
        "hostBytes": run.host_bytes,
        **{f"{kind}Cycles": cycles for kind, cycles in sorted(run.breakdown.items())
           if kind not in ("exchange", "sync", "host", "compute")},
        "gemmModes": ",".join(sorted({m["mode"] for m in manifest.get("gemm_modes", {}).values()})),
        "peakTileBytes": int(manifest["memory"]["peak_bytes"]),
        "compileSeconds": None if compile_seconds is None else round(compile_seconds, 2),
        "simulateSeconds": round(result.simulate_seconds, 2),
        "compiler": __version__,
    }
    return record
