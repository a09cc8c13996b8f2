"""Run any package and build its record: the one entry the ``bench``, ``run``, ``profile`` and
``sweep`` commands share, whatever the strategy and the chip count.

A package is a system of groups (``contract.system``).  A whole-chip program (one group on
every tile) runs on one device in this process with its host side beside it
(``runtime.session``); a system of several groups streams images through them over an
engine (``runtime.stream``).  Either way the run takes the same settings (a shared named
device, poison checks, superstep records for a profile), every image is judged, and one
record builder (``runtime.record``) reports it.  This module also rebuilds the workload a
package was compiled from (``ipu-stack run PACKAGE``), checked against the package's tensors.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ipu_stack.contract import check_metadata, from_manifest
from ipu_stack.contract.system import SystemProgram
from ipu_stack.device import SimulatedIpu
from ipu_stack.ir.graph import Graph, head_geometry
from ipu_stack.package import Package
from ipu_stack.package.records import check_gemm_modes, validate_records
from ipu_stack.runtime.groups import load_groups, read_system
from ipu_stack.runtime.record import run_record
from ipu_stack.runtime.session import RunResult, group_program_tiles, load_package
from ipu_stack.runtime.stream import (
    Model,
    RunSettings,
    StreamRun,
    run_stream,
)
from ipu_stack.runtime.stream import stream_images as make_images
from ipu_stack.target import get_target
from ipu_stack.util.cache import default_cache_dir
from ipu_stack.util.errors import CompileError, PackageError, UsageError
from ipu_stack.util.files import write_atomic
from ipu_stack.util.log import event
from ipu_stack.verdict.tolerance import compare
from ipu_stack.workloads import get_workload
from ipu_stack.workloads.calibration import cache_folder
from ipu_stack.workloads.footprint import check_fits

LOG = logging.getLogger("ipu_stack.runtime")


@dataclass
class Outcome:
    """A finished run: its record, the package and its system, and what ran (a whole-chip
    run's result, or a stream's)."""

    record: dict[str, Any]
    package: Package
    path: Path
    system: SystemProgram
    result: RunResult | StreamRun

    @property
    def passed(self) -> bool:
        return self.result.passed


def check_images(groups: int, chips: int, images: int | None) -> int:
    """The images a run streams: ``images``, at least one a group of a chip (``groups`` a
    chip: the period is an executed step with every group busy).  A whole-chip program runs
    one by default; given more, it runs them one after another on the same loaded chip, as a
    batch larger than one program holds runs as micro-batches of the program's batch."""
    count = images or groups
    if count < groups:
        raise UsageError(f"--images {count} is fewer than the pipeline's {groups} groups"
                         + (" a chip" if chips > 1 else "")
                         + ": a steady step needs one image in each group")
    return count


def run_any(path: Path, graph: Graph, tensors: Any, workload: Any, params: dict[str, Any],
            compile_seconds: float | None, settings: RunSettings) -> Outcome:
    """Load the package at ``path``, run it as its system says and build its record."""
    package = load_package(path)
    system = read_system(package)
    count = check_images(system.per_chip, system.chips, settings.images)
    model = getattr(workload, "reference", None)
    fields = workload.benchmark_fields(params)
    if len(system.groups) == 1 and count == 1:
        if settings.engine not in (None, "inprocess"):
            event(LOG, "--engine has no chips to spread: one program and one image run in "
                  "this process", level=logging.WARNING, engine=settings.engine)
        result = run_package(package, graph, tensors, settings.lock_path, wait=settings.wait,
                             poison=settings.poison, record=settings.record, model=model)
        record = run_record(result, package, system, graph, fields, path, compile_seconds)
        return Outcome(record, package, path, system, result)
    images = make_images(workload, params, graph, tensors, count)
    run = run_stream(package, graph, tensors, images, settings, model,
                     package_bytes=path.read_bytes() if settings.send_package else None)
    record = run_record(run, package, system, graph, fields, path, compile_seconds)
    return Outcome(record, package, path, system, run)


def run_package(package: Package, graph: Graph, tensors: Any, lock_path: Path | None = None,
                wait: bool = True, poison: bool = False, record: bool = False,
                model: Model | None = None) -> RunResult:
    """A whole-chip program run through the one run loop (one chip, one group, one image in
    this process): loaded on a fresh simulated device (``lock_path``: the lock of a shared,
    named device; ``None`` runs on a private one that never waits), run, and checked; the
    result keeps the device's reports (``record``: every superstep's record, for a profile).

    ``model`` gives the outputs fidelity is measured against (by output name); by default
    the graph in float64.  An imported torch program passes PyTorch's own float32 outputs
    (``frontend``), so its verdict says how close the device is to torch in units of the
    noise our device-precision reference has against torch."""
    inputs = {v.name: tensors[v.name] for v in graph.by_role("input")}
    run = run_stream(package, graph, tensors, [inputs], RunSettings(
        engine="inprocess", record=record, poison=poison, lock_path=lock_path, wait=wait),
        model, whole=True)
    (init_report,), (run_report,) = run.initialized[0], run.reports[(0, 0)]
    reference = run.references[0]
    outputs, comparisons = {}, {}
    for value in graph.by_role("output"):
        out = run_report.outputs[value.name].reshape(value.type.shape)
        outputs[value.name] = out
        comparisons[value.name] = compare(out, reference[value.name],
                                          precision=value.type.precision)
    return RunResult(package, outputs, reference, comparisons, init_report, run_report,
                     run.simulate_seconds, run.verdicts[0], run.source, run)


def save_tensors(folder: str | Path, graph: Graph, tensors: Any, outcome: Outcome) -> None:
    """Write ``inputs_weights.npz`` (float32 values, plus every value's precision as JSON in
    ``__precisions__`` and, by matmul result name, the GEMM mode and depth block the package
    ran it in, in ``__gemm_modes__``; a stream's first image) and ``outputs.npz`` (a stream's:
    every image's outputs, named ``image<K>/<output>``), so anyone can check the run with plain numpy."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    precisions = {v.name: v.type.precision.to_json() for v in graph.values}
    result = outcome.result
    if isinstance(result, StreamRun):
        shapes = {v.name: v.type.shape for v in graph.by_role("output")}
        outputs = {f"image{k}/{name}": np.reshape(values, shapes[name])
                   for k, image in enumerate(result.outputs) for name, values in image.items()}
    else:
        outputs = result.outputs
    gemm_modes = outcome.package.manifest.get("gemm_modes") or {}  # one program's
    modes = {graph.value(graph.operations[int(op)].outputs[0]).name: mode
             for op, mode in gemm_modes.items()}

    def dump(name: str, data: Any, meta: bool) -> None:
        arrays = {k: np.asarray(v, dtype=np.float32) for k, v in data.items()}
        if meta:
            arrays["__precisions__"] = np.array(json.dumps(precisions, sort_keys=True))
            arrays["__gemm_modes__"] = np.array(json.dumps(modes, sort_keys=True))
        write_atomic(out / name, lambda handle: np.savez(handle, **arrays))

    dump("inputs_weights.npz", tensors, True)
    dump("outputs.npz", outputs, False)


def gemm_depths(graph: Graph) -> dict[int, int]:
    """The depth each matmul and head_matmul operation of ``graph`` sums over, by id."""
    depths = {}
    for op in graph.operations:
        if op.kind == "matmul":
            depths[op.id] = int(graph.value(op.inputs[0]).type.shape[-1])
        elif op.kind == "head_matmul":
            geo = head_geometry(op.attrs, graph.value(op.inputs[1]).type)
            depths[op.id] = geo.product(op.attrs["mode"])[1]
    return depths


def rebuild_workload(package: Package) -> tuple[Any, dict[str, Any], Graph, Any]:
    """The workload a package was compiled from, rebuilt and checked against the program."""
    check_metadata(package.manifest)
    validate_records(package.manifest)
    system = read_system(package)  # a system's group programs are checked as they load
    if len(system.groups) == 1:
        from_manifest(package.manifest, package.arrays)  # every field typed and bounded
    info = package.manifest["workload"]
    try:
        workload = recorded_workload(info)
        params = workload.resolve(dict(info["params"]))
        # named and sized before it is built: a package's parameters are hostile input too
        if workload.identifier(params) != info["identifier"]:
            raise PackageError(f"package does not match its workload: its parameters make "
                               f"{workload.identifier(params)}, not {info['identifier']}")
        check_fits(workload, params, package.target, max(len(system.groups), 1))
    except (UsageError, CompileError) as exc:
        raise PackageError(f"package names a workload this build cannot make: {exc}") from None
    with cache_folder(default_cache_dir()):
        graph, tensors = workload.build(params)
    if len(system.groups) > 1:
        return workload, params, graph, tensors
    check_gemm_modes(package.manifest, gemm_depths(graph))
    recorded = package.manifest["tensors"]
    for value in graph.values:
        entry = recorded.get(value.name)
        if entry is None or entry.get("shape") != list(value.type.shape) or \
                entry.get("precision") != value.type.precision.to_json():
            raise PackageError(f"package does not match its workload: tensor {value.name} is "
                               f"{value.type} for {info['name']} with the recorded parameters")
    return workload, params, graph, tensors


def recorded_workload(info: dict[str, Any]) -> Any:
    """The workload a package names: a builtin, or the model file it was imported from (the
    same file, checked by its sha256)."""
    from ipu_stack.frontend.names import IMPORTED

    if info.get("name") == IMPORTED:
        from ipu_stack.frontend import reimport

        return reimport(dict(info.get("params", {})))
    return get_workload(info["name"])




def inspect_package(package: Package) -> dict[str, Any]:
    """``ipu-stack inspect``: what the package holds, after every check the device makes at
    load (a system's group programs each loaded on a device of their tiles; a group's
    program alone on the tiles it was compiled for)."""
    check_metadata(package.manifest)
    validate_records(package.manifest)
    m = package.manifest
    system = read_system(package)
    head = {"workload": m["workload"]["identifier"], "target": package.target,
            "compiler": package.compiler_version, "sha256": package.sha256}
    if len(system.groups) > 1:
        groups = load_groups(package, system)  # every group program loaded and checked
        return {**head, "strategy": "pipeline", "chips": system.chips,
                "groups": [{"index": g.index, "chip": g.spec.chip,
                            "tiles": [g.spec.tile_base, g.spec.tile_end],
                            # halves where cut inside a layer
                            "layers": [g.spec.first_layer, g.spec.first_layer + g.spec.layers],
                            "program": g.spec.program, "plans": g.package.manifest["plans"]}
                           for g in groups],
                "handoffs": [{"from": h.sender, "to": h.receiver, "tensor": h.tensor,
                              "bytes": h.nbytes, "transfers": h.transfers.count,
                              "link": h.link} for h in system.handoffs],
                "steps": {"fill": system.steps.fill, "drain": system.steps.drain},
                "estimate": m["estimate"]}
    tiles = group_program_tiles(package)
    target = get_target(package.target)
    SimulatedIpu(target if tiles is None else target.with_tiles(tiles)).load(package)
    # each kernel name once, with how many instances share it (a decode step's argmax has
    # hundreds: one a tile block of the logits)
    named = Counter(k["name"] for k in m["kernels"])
    summary = {**head, "kernels": [name if count == 1 else f"{name} x{count}"
                                   for name, count in named.items()],
               "initialize_steps": len(m["programs"]["initialize"]),
               "run_steps": len(m["programs"]["run"]),
               "exchange_phases": sum(1 for s in m["programs"]["run"] if s["kind"] == "exchange"),
               "estimate": m["estimate"], "plans": m["plans"], "memory": m["memory"]}
    if tiles is not None:
        summary["tiles"] = f"{tiles} of {target.tiles}: one pipeline group's program"
    return summary


__all__ = ["Outcome", "RunSettings", "check_images", "inspect_package", "rebuild_workload",
           "recorded_workload", "run_any", "run_package", "save_tensors"]
