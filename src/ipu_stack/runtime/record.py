"""The benchmark record: one builder for a whole-chip run and a stream over groups and chips.

Every record has the same core (the verdict, the cycles and the rate, the share of peak, the
estimate against what ran, the package and the seconds); a stream through more than one
group adds the pipeline's fields (``stepCycles``, ``latencyMicroseconds``, the groups'
balance and hand-offs), and one over more than one chip adds the chips' (each chip's step,
the link phase and its share, the bytes a link carries, each worker's peak memory).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ipu_stack import __version__
from ipu_stack.contract.system import SystemProgram
from ipu_stack.device.pricing import host_cycles
from ipu_stack.ir.graph import Graph, gemm_macs, operation_macs
from ipu_stack.package import Package
from ipu_stack.runtime.session import RunResult
from ipu_stack.runtime.stream import StreamRun
from ipu_stack.target import Target, get_target
from ipu_stack.util.errors import DeviceError
from ipu_stack.verdict.judge import Verdict


def verdict_fields(verdict: Verdict) -> dict[str, Any]:
    """The verdict's part of the record: which part failed and where.  "Nothing" is spelled
    one way, ``none``: no part failed, no stage failed, no stage differs at all (then no
    stage is the worst)."""
    worst = verdict.worst
    fidelity = verdict.fidelity
    differs = worst is not None and (worst.max_ulps > 0 or worst.mismatch > 0)
    return {
        "failedParts": ",".join(verdict.failed_parts) or "none",
        "stageAgreement": None if worst is None else worst.max_ulps,
        "stageMismatch": None if worst is None else round(worst.mismatch, 6),
        "worstStage": worst.stage if differs else "none",
        "firstFailingStage": getattr(verdict.first_failure, "stage", None) or "none",
        "noiseRatio": None if fidelity is None else round(fidelity.noise_ratio, 4),
        "tailRatio": None if fidelity is None else round(fidelity.tail_ratio, 4),
        "verdictSeconds": round(verdict.seconds, 2),
        "modelSeconds": round(verdict.ideal_seconds, 2),
    }


def qps_fields(batch: int, device_cycles: int, host_cycles: int, clock_hz: float
               ) -> dict[str, Any]:
    """Queries a second as ByteMLPerf counts them: ``qps`` is the batch over the device's
    time; ``qpsWithHost`` adds the host transfers of that batch at the PCIe rate, not
    overlapped with the device (the figure to set beside PopRT's measured QPS, which include
    its host runtime)."""
    device = device_cycles / clock_hz
    with_host = (device_cycles + host_cycles) / clock_hz
    return {"qps": round(batch / device, 1) if device else 0.0,
            "qpsWithHost": round(batch / with_host, 1) if with_host else 0.0,
            "hostMicroseconds": round(host_cycles / clock_hz * 1e6, 3)}


def roofline_cycles(graph: Graph, modes: dict[str, Any], tiles: int, f16_macs: int,
                    f8_macs: int) -> float:
    """Cycles of every GEMM at the AMP's peak in the mode it ran in (FP8: 128 MAC a tile a
    cycle, F16: 64) on every tile: no run can take fewer."""
    total = 0.0
    for op in graph.operations:
        macs = operation_macs(graph, op)
        if macs:
            fp8 = modes.get(str(op.id), {}).get("mode") == "fp8"
            total += macs / (tiles * (f8_macs if fp8 else f16_macs))
    return total


def program_roofline(graph: Graph, manifest: dict[str, Any], target: Target) -> float:
    """:func:`roofline_cycles` of a whole-chip program on every tile, each GEMM in the mode
    its package runs it in (``manifest["gemm_modes"]``)."""
    return roofline_cycles(graph, manifest.get("gemm_modes", {}), target.tiles,
                           int(target.facts["amp_f16_macs_per_cycle"].value),
                           int(target.amp_f8_macs_per_cycle))


def gemm_flops(graph: Graph) -> int:
    """Two flops per multiply-accumulate of every GEMM (``ir.graph.gemm_macs``)."""
    return 2 * gemm_macs(graph)


def loop_fields(manifest: dict[str, Any], layer_cycles: list[int]) -> dict[str, Any]:
    """The layer loop's figures: layers run as one body, cycles per pass, and the bytes per
    tile one more layer would add (none of these without a loop)."""
    loop = manifest.get("layer_loop", {})
    if not loop.get("layers"):
        return {}
    return {"loopLayers": int(loop["layers"]),
            "layerCycles": int(np.mean(layer_cycles)) if layer_cycles else 0,
            "layerCyclesMax": int(max(layer_cycles, default=0)),
            "bytesPerLayer": int(loop["bytes_per_layer_max"])}


def rate_fields(flops: int, seconds: float, peak_flops: float) -> dict[str, Any]:
    """The GEMMs' flops a second against the peak of the chips used."""
    tflops = flops / seconds / 1e12 if seconds else 0.0
    return {"effectiveGemmTflops": round(tflops, 3), "peakTflops": round(peak_flops / 1e12, 3),
            "efficiencyPercent": round(100 * tflops * 1e12 / peak_flops, 2)}


def source_fields(manifest: dict[str, Any], cycles: int, package_path: Any,
                  compile_seconds: float | None, simulate_seconds: float) -> dict[str, Any]:
    """Where the figures come from: the package, the planner's estimate against what ran,
    the seconds spent compiling and simulating."""
    estimate = int(manifest["estimate"]["cycles"])
    return {"package": str(package_path), "estimatedCycles": estimate,
            "estimateError": round(abs(estimate - cycles) / max(cycles, 1), 4),
            "compileSeconds": None if compile_seconds is None else round(compile_seconds, 2),
            "simulateSeconds": round(simulate_seconds, 2)}


LOG_004_ORDER = ("activeTiles", "executionTiles", "inputBytes", "weightBytes", "cycles",
                 "minimumTileCycles", "deviceMicroseconds", "effectiveGemmTflops", "peakTflops",
                 "efficiencyPercent", "maximumAbsoluteError", "package")
"""The fields reference log 004 reports, in its order, after the workload's own."""


def run_record(ran: RunResult | StreamRun, package: Package, system: SystemProgram,
               graph: Graph, workload_fields: dict[str, Any], package_path: Any,
               compile_seconds: float | None) -> dict[str, Any]:
    """The benchmark record of any run, in the order of reference log 004: the core every
    run has (``cycles`` is the time between two images leaving: a whole-chip run's call, a
    stream's steady step); a whole-chip run of one image adds what its device reported
    (:func:`device_fields`), a stream its images and groups, a run over chips the chips'."""
    run = ran.stream if isinstance(ran, RunResult) else ran
    manifest = package.manifest
    target = get_target(package.target)
    period = run.steady_cycles
    batch = int(workload_fields.get("batch", 1))
    seconds = period / target.clock_hz
    flops = gemm_flops(graph)
    rate = round(batch * target.clock_hz / period, 1) if period else 0.0
    # the FP8 AMP roofline of the chips used: every MAC at 128 a tile a cycle
    fp8_rate = batch * run.chips * target.tiles * float(target.amp_f8_macs_per_cycle) * \
        target.clock_hz / max(flops / 2, 1)
    if rate > fp8_rate:
        raise DeviceError(f"{rate} images/s exceeds the FP8 roofline of {run.chips} chip(s), "
                          f"{fp8_rate:.1f}: the step's pricing is wrong")
    worst = max(run.verdicts, key=lambda v: (not v.passed,
                                             v.fidelity.noise_ratio if v.fidelity else 0.0))
    record: dict[str, Any] = {
        "numericalTest": "PASS" if run.passed else "FAIL",
        "workload": manifest["workload"]["identifier"],
        "referenceSource": run.source,
        "strategy": "pipeline" if run.groups > 1 else "layers", **workload_fields,
        "executionTiles": target.tiles * run.chips,
        "cycles": period,
        "latencyMicroseconds": round(target.cycles_to_us(sum(run.step_cycles[: run.groups])),
                                     3),
        "imagesPerSecond": rate,
        **qps_fields(batch, period, host_cycles(image_host_bytes(run), target.clock_hz),
                     target.clock_hz),
        "fp8RooflineImagesPerSecond": round(fp8_rate, 1),
        **rate_fields(flops, seconds, target.peak_flops() * run.chips),
        "peakTileBytes": int(manifest["memory"]["peak_bytes"]),
        **verdict_fields(worst),
        **source_fields(manifest, period, package_path, compile_seconds, run.simulate_seconds),
        "verdictSeconds": round(run.verdict_seconds, 2),
        "compiler": __version__,
    }
    if "gemm_modes" in manifest:  # one program's modes: a whole-chip program
        roofline = program_roofline(graph, manifest, target)
        if roofline > period:
            raise DeviceError(f"{period} cycles is under the AMP roofline of its GEMMs' "
                              f"modes, {roofline:.0f}: the run's pricing is wrong")
        record["rooflinePercent"] = round(100 * roofline / period, 2) if period else 0.0
    if isinstance(ran, RunResult):
        record.update(device_fields(ran, graph, target))
    else:
        record.update(stream_fields(run, system))
    if run.chips > 1:
        record.update(chip_fields(run, manifest))
    order = ["numericalTest", "workload", "referenceSource", "strategy", *workload_fields,
             *(key for key in LOG_004_ORDER if key in record)]
    return {**{key: record[key] for key in order}, **record}


def device_fields(result: RunResult, graph: Graph, target: Target) -> dict[str, Any]:
    """What the device reported of a whole-chip program's one call: the tiles that worked,
    the bytes in, the kinds of cycles and the busiest tile's work of each kind, the layer
    loop's passes, the largest error against the float64 model."""
    manifest = result.package.manifest
    run = result.run
    active = run.tile_busy > run.sync_cycles
    return {
        "activeTiles": int(active.sum()),
        "minimumTileCycles": int(run.tile_busy[active].min()) if active.any() else 0,
        "inputBytes": sum(v.type.nbytes for v in graph.by_role("input")),
        "weightBytes": sum(v.type.nbytes for v in graph.by_role("weight")),
        "deviceMicroseconds": round(target.cycles_to_us(run.cycles), 3),
        "maximumAbsoluteError": round(max((c.max_abs_error for c in
                                           result.comparisons.values()), default=0.0), 6),
        "diagnosticCheckpoints": len(result.verdict.stages)
        if manifest.get("options", {}).get("diagnostics") else 0,
        "hostCycles": run.host_cycles,
        "exchangeCycles": run.exchange_cycles,
        "computeCycles": run.compute_cycles,
        "syncCycles": run.sync_cycles,
        "hostBytes": run.host_bytes,
        **{f"{kind}Cycles": cycles for kind, cycles in sorted(run.breakdown.items())
           if kind not in ("exchange", "sync", "host", "compute")},
        "gemmModes": ",".join(sorted({m["mode"] for m in manifest.get("gemm_modes", {}).values()})),
        **loop_fields(manifest, run.layer_cycles),
    }


def stream_fields(run: StreamRun, system: SystemProgram) -> dict[str, Any]:
    """A stream's part of its record: its images, its groups and their balance, the fill
    and the hand-offs, and what sharing the chip's supersteps costs."""
    period = run.steady_cycles
    group_cycles = [max(r.cycles for (g, _), r in run.runs.items() if g == index)
                    for index in range(run.groups)]
    return {
        "images": run.images,
        "imagesPassed": sum(v.passed for v in run.verdicts),
        "pipelineGroups": run.groups,
        "groupTiles": system.group_tiles,
        "groupLayers": ",".join(str(g.layers) for g in system.groups),
        "stepCycles": period,
        "groupCyclesMax": max(group_cycles),
        "groupCyclesMin": min(group_cycles),
        "balance": round(min(group_cycles) / max(max(group_cycles), 1), 4),
        "fillCycles": sum(run.step_cycles[: run.groups - 1]),
        "handoffCycles": run.handoff_cycles,
        # what sharing the chip's supersteps costs the step over its slowest group alone
        "alignmentCycles": period - max(group_cycles) - run.handoff_cycles
        if run.chips == 1 else None,
        "totalCycles": sum(run.step_cycles),
        "hostPeakBytes": run.host_peak_bytes or None,
    }


def image_host_bytes(run: StreamRun) -> int:
    """The bytes one image moves over the busiest host link (its inputs in, its outputs
    out; each chip's card has its own): the first image's runs of every group."""
    return max(run.chip_host_bytes(0))


def chip_fields(run: StreamRun, manifest: dict[str, Any]) -> dict[str, Any]:
    """The chips' part of a stream's record: each chip's full step, the link phase and its
    share of the period, the bytes a link carries a step, the bytes each chip's host link
    carries for an image and each worker's peak memory."""
    link = max(run.link_cycles, default=0)
    return {
        "chips": run.chips, "engine": run.engine,
        "groupsPerChip": run.groups // run.chips,
        "chipStepCycles": run.chip_full_cycles,
        "linkCycles": link, "linkBytes": max(run.link_bytes, default=0),
        "linkSharePercent": round(100 * link / max(run.steady_cycles, 1), 2),
        "estimatedLinkCycles": max(manifest["estimate"].get("link_cycles", []), default=0),
        "chipHostBytes": run.chip_host_bytes(0),
        # in this process every chip runs in the one process: there are no workers
        **({} if run.engine == "inprocess" else {"workerPeakBytes": run.worker_peak_bytes}),
    }


__all__ = ["chip_fields", "device_fields", "gemm_flops", "loop_fields", "run_record",
           "stream_fields", "verdict_fields"]
