"""Run a package on the simulated device and check it: the ``run`` and ``bench`` commands.

Reads the package, takes hardware ownership, loads it, calls ``initialize`` with the weights
and ``run`` with the inputs, evaluates the host reference at device precision, applies the
tolerance policy and builds the benchmark record (the fields of reference log 004).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Generator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from ipu_stack import __version__
from ipu_stack.device import HardwareLock, SimulatedIpu
from ipu_stack.device.simulator import CallReport
from ipu_stack.ir.graph import Graph, gemm_macs
from ipu_stack.ir.values import CompactValues, DeferredTensors, compact_weights, weight_storer
from ipu_stack.package import Package, read_package
from ipu_stack.runtime.host_process import HostProcess, fork_available
from ipu_stack.runtime.reference import evaluate_float64_steps, evaluate_steps
from ipu_stack.runtime.tolerance import Comparison, compare
from ipu_stack.runtime.verdict import StageJudge, Verdict, log_verdict
from ipu_stack.target import get_target
from ipu_stack.util.errors import UsageError
from ipu_stack.util.heap import keep_freed_memory, release_freed_memory
from ipu_stack.util.log import event

LOG = logging.getLogger("ipu_stack.runtime")
# how far (in bytes of stored values) the host reference may run ahead of the stages judged:
# the reference's values wait there for the device's, so this bounds what a run holds
REFERENCE_AHEAD_BYTES = 256 << 20


@dataclass
class RunResult:
    """Everything a run produced: outputs, cycle reports, the comparison, the verdict."""

    package: Package
    outputs: dict[str, np.ndarray]
    reference: dict[str, np.ndarray]
    comparisons: dict[str, Comparison]
    initialize: CallReport
    run: CallReport
    simulate_seconds: float
    verdict: Verdict = field(default_factory=Verdict)
    reference_source: str = "float64"  # what fidelity measures against: the float64 model or torch

    @property
    def passed(self) -> bool:
        """PASS only when every stage agrees with the host's rerun of it on the device's own
        inputs and the outputs are as close to the float64 model as the precision allows
        (``runtime/verdict.py``)."""
        return self.verdict.passed


def load_package(path: Path, target_name: str = "ipu21") -> Package:
    event(LOG, "reading application package")
    package = read_package(path, expected_target=target_name)
    event(LOG, "application package read", tiles=get_target(target_name).tiles,
          compiler=package.compiler_version)
    return package


def group_program_tiles(package: Package) -> int | None:
    """The tiles a package's program was compiled for when that is part of its chip (one
    pipeline group's program, written under ``DIR/group<N>/`` beside the pipeline's own
    package), else ``None``."""
    options = package.manifest.get("options")
    tiles = options.get("tiles") if isinstance(options, dict) else None
    if "pipeline" in package.manifest or type(tiles) is not int \
            or not 0 < tiles < get_target(package.target).tiles:
        return None  # a whole chip's program (or a malformed record, refused where read)
    return tiles


def refuse_group_program(package: Package, path: Path) -> None:
    """One line, not a device fault, for a run of one group's program on its own: its input
    is the previous group's output, which only the pipeline's package streams in."""
    tiles = group_program_tiles(package)
    if tiles is None:
        return
    whole = Path(path).parent.parent / "model.ipuexe"
    raise UsageError(f"{path} is one pipeline group's program ({tiles} of "
                     f"{get_target(package.target).tiles} tiles), which runs only inside its "
                     f"pipeline: run the pipeline's package"
                     + (f" {whole}" if whole.is_file() else ""))


def hold_weights(graph: Graph, tensors: Mapping[str, np.ndarray]) -> None:
    """Every weight a run needs, made and held as its storage codes (every reader takes
    them through ``np.asarray``); what the compile and the float32 weights left behind is
    given back."""
    keep_freed_memory()
    if isinstance(tensors, DeferredTensors) and tensors.pending:
        # a compile made none of the weights' values; the run needs them all, made on
        # every core (each has its own random stream: the same values whenever made)
        started = time.perf_counter()
        made = tensors.make_all(os.cpu_count() or 1, weight_storer(graph))
        event(LOG, "made weight values", tensors=made,
              elapsed_ms=int((time.perf_counter() - started) * 1000))
    event(LOG, "holding weights in their stored precisions",
          bytes=compact_weights(graph, tensors))
    release_freed_memory()


def run_package(
    package: Package,
    graph: Graph,
    tensors: dict[str, np.ndarray],
    lock_path: Path | None = None,
    wait: bool = True,
    poison: bool = False,
    record: bool = False,
    model: Callable[[Graph, dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None,
) -> RunResult:
    """Load ``package`` on a fresh simulated device, run it and compare with the reference
    (``record``: keep every superstep's record, for an execution profile).

    ``lock_path``: the lock of a shared, named device (``device.device_lock``); ``None``, the
    default, runs on a private device that never waits for another process.

    ``model`` gives the outputs fidelity is measured against (by output name); by default
    the graph in float64 (``evaluate_float64``).  An imported torch program passes PyTorch's
    own float32 outputs (``frontend``), so its verdict says how close the device is to torch
    in units of the noise our device-precision reference has against torch."""
    target = get_target(package.target)
    hold_weights(graph, tensors)
    owner = nullcontext() if lock_path is None else HardwareLock(lock_path, wait=wait)
    name = f"sim://private-{os.getpid()}" if lock_path is None else f"sim://{lock_path.stem}"
    with owner:
        event(LOG, "opening IPU device", path=name)
        device = SimulatedIpu(target, poison=poison, record=record)
        event(LOG, "IPU device attached", path=name)
        device.load(package)
        event(LOG, "application loaded and initial synchronization completed",
              tile_count=target.tiles)
        t0 = time.perf_counter()
        weights = {v.name: tensors[v.name] for v in graph.by_role("weight")}
        inputs = {v.name: tensors[v.name] for v in graph.by_role("input")}
        event(LOG, "prepared reference inputs", elapsed_ms=int((time.perf_counter() - t0) * 1000))
        marks = sum(len(p) for p in package.manifest["programs"].values())
        event(LOG, "starting host exchange session", startup_mark=marks)
        sim_start = time.perf_counter()
        # the host reference and the float64 model need nothing from the device: the host
        # side computes them while the device runs, each with one BLAS thread, so two cores
        # are two lanes; then it judges each stage as the device hands over its probe read.
        # It runs in a forked process (runtime/host_process.py: no turns on the interpreter
        # lock with the device), or on a thread for an imported program (torch's outputs
        # are its fidelity target, and torch is not forked) or where fork does not exist.
        outputs_only = {v.name for v in graph.by_role("output")}
        gemm_modes = package.manifest.get("gemm_modes")
        with threadpool_limits(limits=1, user_api="blas"):
            host: HostProcess | _HostThread = (
                HostProcess(_host_side, graph, tensors, gemm_modes, outputs_only)
                if model is None and fork_available()
                else _HostThread(graph, tensors, gemm_modes, model, outputs_only))
            try:
                init_report = device.call("initialize", weights)
                run_report = device.call("run", inputs, on_probes=host.put)
                host.put(list(run_report.outputs.items()))
                host.put(None)  # nothing more: the host side finishes
            except BaseException:
                host.abandon()
                raise
            simulate = time.perf_counter() - sim_start
            waited = time.perf_counter()
            reference, verdict = host.result()
            waited = time.perf_counter() - waited
    outputs = {}
    comparisons = {}
    for value in graph.by_role("output"):
        out = run_report.outputs[value.name].reshape(value.type.shape)
        outputs[value.name] = out
        comparisons[value.name] = compare(out, reference[value.name],
                                          precision=value.type.precision)
    verdict.seconds = waited  # what the verdict added after the device finished
    log_verdict(verdict, per_stage=bool(package.manifest.get("options", {}).get("diagnostics")),
                source="float64" if model is None else "torch")
    event(LOG, "numerical verdict", numericalTest="PASS" if verdict.passed else "FAIL",
          failedParts=",".join(verdict.failed_parts) or "-", elapsed_ms=int(verdict.seconds * 1000))
    return RunResult(package, outputs, reference, comparisons, init_report, run_report,
                     simulate, verdict, "float64" if model is None else "torch")


class _HostThread:
    """The host side on a thread of this process, with :class:`HostProcess`'s interface:
    for an imported program (torch's outputs are its fidelity target, and torch is not
    forked) or where fork does not exist."""

    def __init__(self, graph: Graph, tensors: dict[str, np.ndarray],
                 gemm_modes: dict[str, dict] | None,
                 model: Callable[[Graph, dict[str, np.ndarray]], dict[str, np.ndarray]] | None,
                 outputs_only: set[str]) -> None:
        self.arrivals: queue.SimpleQueue = queue.SimpleQueue()
        self.abandoned = threading.Event()  # the device failed: the host side stops at once
        self.pool = ThreadPoolExecutor(max_workers=1)
        self.future = self.pool.submit(_host_side, graph, tensors, gemm_modes, model,
                                       outputs_only, self.arrivals, self.abandoned)

    def put(self, items: list | None) -> None:
        self.arrivals.put(items)

    def result(self) -> tuple[Mapping[str, np.ndarray], Verdict]:
        try:
            reference, ideal_values, ideal_seconds, judging = self.future.result()
        finally:
            self.pool.shutdown()
        verdict = judging.finish(ideal_values)
        verdict.ideal_seconds = ideal_seconds
        return reference, verdict

    def abandon(self) -> None:
        self.abandoned.set()
        self.arrivals.put(None)
        self.pool.shutdown()


def _host_side(graph: Graph, tensors: dict[str, np.ndarray],
               gemm_modes: dict[str, dict] | None,
               model: Callable[[Graph, dict[str, np.ndarray]], dict[str, np.ndarray]] | None,
               outputs_only: set[str], arrivals: queue.SimpleQueue,
               abandon: threading.Event | None = None
               ) -> tuple[Mapping[str, np.ndarray], dict[str, np.ndarray], float, StageJudge]:
    """The host's side of a run: the device-precision reference (every value, without the
    weights: the verdict rounds each stage's weights when it reruns it), then the
    stage-by-stage verdict on the device's values as they arrive (``arrivals``: lists of
    ``(name, values)``, ``None`` at the end), with the model fidelity is measured against
    (and its seconds) computed in between."""
    device_done = False
    try:
        reference = CompactValues()
        reference_steps = evaluate_steps(graph, tensors, gemm_modes, reference)
        reference_seconds = 0.0
        judging = StageJudge(graph, tensors, reference, gemm_modes)
        ideal, ideal_seconds = None, 0.0
        if model is not None:  # an imported program's fidelity target: torch's outputs
            started = time.perf_counter()
            ideal, ideal_seconds = model(graph, tensors), time.perf_counter() - started
        model_steps = evaluate_float64_steps(graph, tensors, outputs_only) if ideal is None \
            else None
        while abandon is None or not abandon.is_set():
            while not device_done:  # take whatever the device has handed over
                try:
                    arrived = arrivals.get_nowait()
                except queue.Empty:
                    break
                device_done = arrived is None
                for name, values in arrived or ():
                    judging.arrive(name, values)
            judging.judge_ready()
            started = time.perf_counter()
            if reference_steps is not None and (
                    device_done or reference.nbytes < REFERENCE_AHEAD_BYTES):
                if _advance(reference_steps)[0]:
                    reference_steps = None
                    event(LOG, "evaluated host reference", referencePrecision="device",
                          elapsed_ms=int(reference_seconds * 1000))
                reference_seconds += time.perf_counter() - started
            elif model_steps is not None:
                finished, value = _advance(model_steps)
                if finished:
                    ideal, model_steps = value, None
                ideal_seconds += time.perf_counter() - started
            elif not device_done:  # nothing to do until the device hands something over
                arrived = arrivals.get()
                device_done = arrived is None
                for name, values in arrived or ():
                    judging.arrive(name, values)
            elif reference_steps is None:
                break
        return reference, ideal, ideal_seconds, judging
    except BaseException:
        while not device_done and arrivals.get() is not None:  # let the device finish
            pass
        raise


def _advance(steps: Generator[None, None, Any]) -> tuple[bool, Any]:
    """One step of a generator: whether it has finished, and then its value."""
    try:
        next(steps)
    except StopIteration as done:
        return True, done.value
    return False, None


def verdict_fields(verdict: Verdict) -> dict[str, Any]:
    """The verdict's part of the record: which part failed and where."""
    worst = verdict.worst
    fidelity = verdict.fidelity
    return {
        "failedParts": ",".join(verdict.failed_parts) or "none",
        "stageAgreement": None if worst is None else worst.max_ulps,
        "stageMismatch": None if worst is None else round(worst.mismatch, 6),
        "worstStage": None if worst is None else worst.stage,
        "firstFailingStage": getattr(verdict.first_failure, "stage", None),
        "noiseRatio": None if fidelity is None else round(fidelity.noise_ratio, 4),
        "tailRatio": None if fidelity is None else round(fidelity.tail_ratio, 4),
        "verdictSeconds": round(verdict.seconds, 2),
        "modelSeconds": round(verdict.ideal_seconds, 2),
    }


def gemm_flops(graph: Graph) -> int:
    """Two flops per multiply-accumulate of every GEMM (``ir.graph.gemm_macs``)."""
    return 2 * gemm_macs(graph)


def _loop_fields(manifest: dict[str, Any], layer_cycles: list[int]) -> dict[str, Any]:
    """The layer loop's figures: layers run as one body, cycles per pass, and the bytes per
    tile one more layer would add (none of these without a loop)."""
    loop = manifest.get("layer_loop", {})
    if not loop.get("layers"):
        return {}
    return {"loopLayers": int(loop["layers"]),
            "layerCycles": int(np.mean(layer_cycles)) if layer_cycles else 0,
            "layerCyclesMax": int(max(layer_cycles, default=0)),
            "bytesPerLayer": int(loop["bytes_per_layer_max"])}


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
        "referenceSource": result.reference_source,
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
        "diagnosticCheckpoints": len(result.verdict.stages)
        if manifest.get("options", {}).get("diagnostics") else 0,
        **verdict_fields(result.verdict),
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
        **_loop_fields(manifest, run.layer_cycles),
        "imagesPerSecond": round(int(workload_fields.get("batch", 1)) / seconds, 1)
        if seconds else 0.0,
        "compileSeconds": None if compile_seconds is None else round(compile_seconds, 2),
        "simulateSeconds": round(result.simulate_seconds, 2),
        "compiler": __version__,
    }
    return record
