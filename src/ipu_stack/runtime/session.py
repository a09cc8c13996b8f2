"""Run a package on the simulated device and check it: the ``run`` and ``bench`` commands.

Reads the package, takes hardware ownership, loads it, calls ``initialize`` with the weights
and ``run`` with the inputs, evaluates the host reference at device precision, applies the
tolerance policy and builds the benchmark record (the fields of reference log 004).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from ipu_stack.device import HardwareLock, SimulatedIpu
from ipu_stack.device.simulator import CallReport
from ipu_stack.ir.graph import Graph
from ipu_stack.ir.values import DeferredTensors, compact_weights, weight_storer
from ipu_stack.package import Package, read_package
from ipu_stack.runtime.host_side import start_host_side
from ipu_stack.runtime.tolerance import Comparison, compare
from ipu_stack.runtime.verdict import Verdict, log_verdict
from ipu_stack.target import get_target
from ipu_stack.util.errors import UsageError
from ipu_stack.util.heap import keep_freed_memory, release_freed_memory
from ipu_stack.util.log import event

LOG = logging.getLogger("ipu_stack.runtime")


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
            host = start_host_side(graph, tensors, gemm_modes, outputs_only, model)
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
