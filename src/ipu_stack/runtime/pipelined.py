"""Run a pipeline package: images streamed through layer groups on the simulated chip.

Each group's program (a package inside the pipeline package) is loaded on a simulated
device of the group's tiles, which holds only that group's tile memories; the groups share
no memory, which is what makes them independent on the chip.  An image enters group 0,
and each group's output moves into the next group's input: the bytes the device read out
of the sending group's tiles are written, unchanged, into the receiving group's input blocks
(the same values the on-chip hand-off exchange moves; its cycles are the package's
scheduled hand-off phase, verified and priced by the device's own exchange accounting).

**Timing.**  In step ``s`` group ``g`` works on image ``s - g``: ``G - 1`` fill steps, then
one image leaves per steady step, then ``G - 1`` drain steps.  All tiles sync together and
a superstep is compute or exchange for every tile, so the groups' supersteps share the
chip's (``runtime.alignment``: same-kind supersteps side by side, each shared one as long as
the longest); the step ends with every hand-off in one exchange phase.  A step's cycles are therefore
built from the supersteps each group executed on real bytes for its image of that step.
On the IPU the cycles of a superstep do not depend on the values, so one executed full
step gives the period (tested: two different data sets give the same step cycles).  The
simulator runs the groups' work image by image (the groups share no memory, so the order in
which it runs the parts of a step changes nothing); that lets a host side judge each image
as its probes arrive, and the device go on to the next image while the last one's verdict
finishes (``HOSTS_IN_FLIGHT``).

**Verdict.**  Every image is judged as a layers-strategy run is: each stage against the
host's rerun of it on the device's own inputs, and the tower's output against the float64
model of the whole tower, on the whole tower's graph (group programs name their values as
the tower does; a shared program's names are mapped back).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from ipu_stack import __version__
from ipu_stack.device import SimulatedIpu
from ipu_stack.device.pricing import exchange_cycles
from ipu_stack.device.record import StepRecord
from ipu_stack.device.simulator import CallReport
from ipu_stack.exchange import Schedule, Transfers, verify_schedule
from ipu_stack.exchange.model import chunk_cycles
from ipu_stack.ir.graph import Graph
from ipu_stack.package import Package, read_package_bytes
from ipu_stack.runtime.alignment import merge
from ipu_stack.runtime.host_process import HostProcess, fork_available
from ipu_stack.runtime.session import (
    _host_side,
    _HostThread,
    gemm_flops,
    hold_weights,
    verdict_fields,
)
from ipu_stack.runtime.verdict import Verdict, log_verdict
from ipu_stack.target import get_target, timing
from ipu_stack.util.errors import DeviceError, PackageError
from ipu_stack.util.log import event

LOG = logging.getLogger("ipu_stack.runtime")
# host sides judging at once: the device goes on to the next image while the last one's
# verdict finishes (two lanes on two cores; each host side holds one image's references)
HOSTS_IN_FLIGHT = 2


@dataclass
class GroupRun:
    """One group's executed run on one image: its supersteps' cycles."""

    group: int
    image: int
    cycles: int
    supersteps: list[int]
    host_bytes: int
    kinds: list[str]  # compute or exchange, per superstep


@dataclass
class PipelineRun:
    """Every image's outputs and verdict, and the step timing built from executed runs."""

    images: int
    groups: int
    outputs: list[dict[str, np.ndarray]]
    verdicts: list[Verdict]
    runs: dict[tuple[int, int], GroupRun]
    handoff_cycles: list[int]
    step_cycles: list[int] = field(default_factory=list)
    simulate_seconds: float = 0.0
    verdict_seconds: float = 0.0
    # when recording: each group's superstep records in the profiled step (the first with
    # every group busy), by group
    records: dict[int, list[StepRecord]] = field(default_factory=dict)
    profiled_step: int = -1
    # the largest peak resident memory of the images' host sides (forked processes; 0 when
    # they ran as threads of this process)
    host_peak_bytes: int = 0

    @property
    def passed(self) -> bool:
        return all(v.passed for v in self.verdicts)

    def judge(self, number: int, host: Any, outputs: dict[str, np.ndarray]) -> float:
        """Image ``number``'s verdict from its host side, kept and logged with the image's
        ``outputs`` (a one-chip pipeline's and a multi-chip system's runs take it alike);
        the seconds spent waiting for it."""
        wait = time.perf_counter()
        _, verdict = host.result()
        self.host_peak_bytes = max(self.host_peak_bytes, getattr(host, "peak_bytes", 0))
        verdict.seconds = time.perf_counter() - wait
        log_verdict(verdict, per_stage=False)
        event(LOG, "image judged", image=number,
              numericalTest="PASS" if verdict.passed else "FAIL",
              failedParts=",".join(verdict.failed_parts) or "-")
        self.verdicts.append(verdict)
        self.outputs.append(outputs)
        return verdict.seconds

    @property
    def steady_cycles(self) -> int:
        """A step with every group busy (the period); with fewer images than groups, the
        longest step that ran."""
        full = self.step_cycles[self.groups - 1: self.images] if self.images >= self.groups \
            else []
        return max(full) if full else max(self.step_cycles)


def merged_step(runs: list[GroupRun], handoff: int) -> int:
    """One pipeline step: the groups' supersteps side by side, merged as the chip runs them
    (``runtime.alignment``: same-kind supersteps share, the longest sets the length), then
    the hand-off phase."""
    return merge([(r.kinds, r.supersteps) for r in runs]).total + handoff


def step_schedule(groups: int, images: int) -> list[list[tuple[int, int]]]:
    """``(group, image)`` pairs busy in each step: fill, steady steps, drain."""
    return [[(g, s - g) for g in range(groups) if 0 <= s - g < images]
            for s in range(images + groups - 1)]


class _Group:
    """A group's program loaded on a device of its tiles, with the names it uses."""

    def __init__(self, record: dict[str, Any], package: Package, target_name: str,
                 recording: bool = False, device: bool = True) -> None:
        self.record = record
        self.index = int(record["index"])
        self.package = package
        self.device = SimulatedIpu(get_target(target_name).with_tiles(int(record["tiles"])),
                                   record=recording)
        if device:  # without: the program described, not loaded on tiles
            self.device.load(package)
        self.to_tower = {str(k): str(v) for k, v in (record.get("names") or {}).items()}
        self.from_tower = {v: k for k, v in self.to_tower.items()}
        tensors = package.manifest.get("tensors", {})
        self.weights = [name for name, info in tensors.items() if info.get("role") == "weight"]
        self.inputs = [name for name, info in tensors.items() if info.get("role") == "input"]

    def tower(self, name: str) -> str:
        return self.to_tower.get(name, name)

    def local(self, name: str) -> str:
        return self.from_tower.get(name, name)


def group_programs(package: Package, only: set[int] | None = None) -> dict[int, Package]:
    """The pipeline's group programs by slot (``only``: just those), each read and verified
    as a package of its own."""
    programs = {}
    for k in range(int(package.manifest["pipeline"]["programs"])):
        if only is not None and k not in only:
            continue
        data = package.arrays.get(f"program.{k}")
        if data is None:
            raise PackageError(f"pipeline package lacks its group program {k}")
        programs[k] = read_package_bytes(f"group program {k}", data.tobytes(),
                                         expected_target=package.target)
    return programs


def _load_groups(package: Package, recording: bool = False,
                 chip: int | None = None, devices: bool = True) -> list[_Group]:
    """The groups (``chip``: only that chip's) loaded on devices of their tiles (without
    ``devices``: only their programs read)."""
    pipeline = package.manifest["pipeline"]
    records = [r for r in pipeline["groups"]
               if chip is None or int(r.get("chip", 0)) == chip]
    programs = group_programs(package, {int(r["program"]) for r in records})
    groups = [_Group(r, programs[int(r["program"])], package.target, recording, devices)
              for r in records]
    _check_handoffs(groups, pipeline["handoffs"])
    return groups


def _check_handoffs(groups: list[_Group], handoffs: list[dict[str, Any]]) -> None:
    """Each group's output is the next group's input: the same tensor, shape and precision
    (between the groups loaded here)."""
    loaded = {g.index: g for g in groups}
    for record in handoffs:
        if int(record["from"]) not in loaded or int(record["to"]) not in loaded:
            continue
        sender, receiver = loaded[int(record["from"])], loaded[int(record["to"])]
        name = str(record["tensor"])
        sent = sender.package.manifest["tensors"].get(sender.local(name))
        taken = receiver.package.manifest["tensors"].get(receiver.local(name))
        if sent is None or taken is None or sent.get("shape") != taken.get("shape") or \
                sent.get("precision") != taken.get("precision"):
            raise PackageError(f"pipeline hand-off {name} from group {sender.index} to "
                               f"{receiver.index}: the programs disagree on its type")


def handoff_phase_cycles(package: Package, record: dict[str, Any], chip_tiles: int) -> int:
    """The hand-off phase as the device prices it: its schedule verified against its
    transfers, then timed from the chunks (+ the superstep's sync)."""
    a = package.arrays
    prefix = f"handoff.{int(record['from'])}."
    transfers = Transfers(chip_tiles, a[prefix + "src_tile"], a[prefix + "dst_offsets"],
                          a[prefix + "dst_tile"], a[prefix + "words"])
    starts, words = a[prefix + "chunk_start"], a[prefix + "chunk_words"]
    horizon = int((starts + chunk_cycles(words, None)).max()) if len(starts) else 0
    schedule = Schedule(horizon, int(record["lower_bound"]), str(record["kind"]),
                        a[prefix + "chunk_transfer"], starts, words)
    verify_schedule(transfers, schedule)
    cycles, _, _ = exchange_cycles(transfers.src.astype(np.int64),
                                   schedule.chunk_transfer, starts, words, None)
    return int(cycles) + timing.p("sync")


def inspect_pipeline(package: Package) -> dict[str, Any]:
    """``ipu-stack inspect`` of a pipeline package: its groups and hand-offs, every group
    program loaded (verified) on a device of its tiles."""
    groups = _load_groups(package)
    pipeline = package.manifest["pipeline"]
    return {
        "workload": package.manifest["workload"]["identifier"],
        "target": package.target, "compiler": package.compiler_version,
        "sha256": package.sha256, "strategy": "pipeline",
        "chips": package_chips(package),
        "groups": [{"index": g.index, "chip": int(g.record.get("chip", 0)),
                    "tiles": [int(g.record["tile_base"]),
                                                int(g.record["tile_base"]) + int(g.record["tiles"])],
                    "layers": [g.record["first_layer"],  # halves where cut inside a layer
                               g.record["first_layer"] + g.record["layers"]],
                    "program": int(g.record["program"]), "plans": g.package.manifest["plans"]}
                   for g in groups],
        "handoffs": [{**{k: h[k] for k in ("from", "to", "tensor", "bytes", "transfers")},
                      "link": bool(h.get("link"))} for h in pipeline["handoffs"]],
        "steps": pipeline["steps"],
        "estimate": package.manifest["estimate"],
    }


def _check_tower(groups: list[_Group], graph: Graph) -> None:
    """Every tensor a group program names is the tower's value of that name and type."""
    values = {v.name: v for v in graph.values}
    for group in groups:
        for name, info in group.package.manifest["tensors"].items():
            value = values.get(group.tower(name))
            if value is None or info.get("shape") != list(value.type.shape) or \
                    info.get("precision") != value.type.precision.to_json():
                raise PackageError(f"pipeline group {group.index} does not match its tower: "
                                   f"tensor {group.tower(name)}")


def tower_gemm_modes(groups: list[_Group]) -> dict[str, dict]:
    """Each group's GEMM modes keyed by the tower's operation ids."""
    modes: dict[str, dict] = {}
    for group in groups:
        source = group.record["source_ops"]
        for op, mode in group.package.manifest.get("gemm_modes", {}).items():
            modes[str(source[int(op)])] = mode
    return dict(sorted(modes.items(), key=lambda item: int(item[0])))


def renamed(put: Callable[[list], None], group: _Group) -> Callable[[list], None]:
    """Hand ``put`` (a host side's, or a chip worker's) a group's probe reads under the
    tower's names."""
    def forward(items: list) -> None:
        put([(group.tower(name), values) for name, values in items])
    return forward


def run_through(groups: list[_Group], inputs: Mapping[str, Any],
                on_probes: Callable[[list], None]
                ) -> tuple[dict[str, np.ndarray], list[CallReport]]:
    """One image through ``groups`` in order: a one-chip pipeline's groups, or one chip's in
    a multi-chip worker (the one loop both run).  Each group is fed from the one before; its
    probe reads go to ``on_probes`` under the tower's names as they arrive, and so does each
    hand-off between the groups, as soon as it is made (the verdict judges the next group's
    first stage on it while the device runs).  Returns the last group's output (tower
    names) and each group's run report, in order; the caller sends that output on (to the
    host side, or over a link)."""
    carried = dict(inputs)
    reports: list[CallReport] = []
    for position, group in enumerate(groups):
        feed = {name: carried[group.tower(name)] for name in group.inputs}
        report = group.device.call("run", feed, on_probes=renamed(on_probes, group))
        carried = {group.tower(k): v for k, v in report.outputs.items()}
        if position < len(groups) - 1:
            on_probes(list(carried.items()))
        reports.append(report)
    return carried, reports


def package_chips(package: Package) -> int:
    """The cards a pipeline package spreads its groups over (1 without a system record)."""
    return int(package.manifest.get("system", {}).get("chips", 1))


def run_pipeline(package: Package, graph: Graph, tensors: Mapping[str, np.ndarray],
                 images: list[dict[str, np.ndarray]], record: bool = False) -> PipelineRun:
    """Stream ``images`` (each the tower's inputs by name) through the pipeline
    (``record``: keep the superstep records of the first step with every group busy, for
    an execution profile)."""
    target = get_target(package.target)
    hold_weights(graph, tensors)
    groups = _load_groups(package, record)
    _check_tower(groups, graph)
    pipeline = package.manifest["pipeline"]
    handoffs = [handoff_phase_cycles(package, r, target.tiles) for r in pipeline["handoffs"]]
    for group in groups:
        group.device.call("initialize", {w: tensors[group.tower(w)] for w in group.weights})
    event(LOG, "pipeline loaded", groups=len(groups), tile_count=target.tiles,
          group_tiles=int(pipeline["group_tiles"]))
    modes = tower_gemm_modes(groups)
    outputs_only = {v.name for v in graph.by_role("output")}
    weights = {v.name: tensors[v.name] for v in graph.by_role("weight")}
    result = PipelineRun(len(images), len(groups), [], [], {}, handoffs)
    result.profiled_step = min(len(images), len(groups)) - 1
    started = time.perf_counter()
    pending: list[tuple[int, HostProcess | _HostThread, dict[str, np.ndarray]]] = []
    waited = [0.0]

    def finish() -> None:  # the oldest image's verdict, in image order
        number, host, carried = pending.pop(0)
        waited[0] += result.judge(number, host, {k: np.asarray(v) for k, v in carried.items()})

    with threadpool_limits(limits=1, user_api="blas"):
        try:
            for number, image in enumerate(images):
                own = {**weights, **image}
                host: HostProcess | _HostThread = (
                    HostProcess(_host_side, graph, own, modes, outputs_only)
                    if fork_available() else _HostThread(graph, own, modes, None, outputs_only))
                pending.append((number, host, {}))
                carried, reports = run_through(groups, image, host.put)
                host.put(list(carried.items()))  # the tower's output, judged at once
                for group, report in zip(groups, reports, strict=True):
                    if record and number + group.index == result.profiled_step:
                        result.records[group.index] = [
                            r for r in report.steps if r.kind in ("compute", "exchange")]
                    result.runs[(group.index, number)] = GroupRun(
                        group.index, number, report.cycles, list(report.superstep_cycles),
                        report.host_bytes, list(report.superstep_kinds))
                host.put(None)
                pending[-1] = (number, host, carried)
                while len(pending) >= HOSTS_IN_FLIGHT:
                    finish()
            while pending:
                finish()
        except BaseException:
            for _, host, _ in pending:
                host.abandon()
            raise
    waited = waited[0]
    result.simulate_seconds = time.perf_counter() - started - waited
    result.verdict_seconds = waited
    handoff = max(handoffs, default=0)
    for busy in step_schedule(len(groups), len(images)):
        runs = [result.runs[pair] for pair in busy]
        # the step ends with a hand-off when a group other than the last was busy
        passes_on = any(group < len(groups) - 1 for group, _ in busy)
        result.step_cycles.append(merged_step(runs, handoff if passes_on else 0))
    return result


def pipeline_fields(run: PipelineRun, package: Package, graph: Graph,
                    workload_fields: dict[str, Any], package_path: Any,
                    compile_seconds: float | None) -> dict[str, Any]:
    """The benchmark record of a pipelined run (the layers record's names where they mean
    the same; ``cycles`` is the steady step, the time between two images leaving)."""
    target = get_target(package.target)
    manifest = package.manifest
    pipeline = manifest["pipeline"]
    period = run.steady_cycles
    batch = int(workload_fields.get("batch", 1))
    seconds = period / target.clock_hz
    flops = gemm_flops(graph)
    chips = int(getattr(run, "chips", 1))
    peak = target.peak_flops() * chips
    group_cycles = [max(r.cycles for (g, _), r in run.runs.items() if g == index)
                    for index in range(run.groups)]
    fill = sum(run.step_cycles[: run.groups - 1])
    latency = sum(run.step_cycles[: run.groups])  # the first image's G steps
    estimate = int(manifest["estimate"]["cycles"])
    rate = round(batch * target.clock_hz / period, 1) if period else 0.0
    # the FP8 AMP roofline of the chips used: every MAC at 128 a tile a cycle
    roofline = batch * chips * target.tiles * float(target.amp_f8_macs_per_cycle) * \
        target.clock_hz / max(flops / 2, 1)
    if rate > roofline:
        raise DeviceError(f"{rate} images/s exceeds the FP8 roofline of {chips} chip(s), "
                          f"{roofline:.1f}: the step's pricing is wrong")
    worst = max(run.verdicts, key=lambda v: (not v.passed,
                                             v.fidelity.noise_ratio if v.fidelity else 0.0))
    passed = sum(v.passed for v in run.verdicts)
    return {
        "numericalTest": "PASS" if run.passed else "FAIL",
        "workload": manifest["workload"]["identifier"],
        "strategy": "pipeline",
        **workload_fields,
        "images": run.images,
        "imagesPassed": passed,
        "pipelineGroups": run.groups,
        "groupTiles": int(pipeline["group_tiles"]),
        "groupLayers": ",".join(str(g["layers"]) for g in pipeline["groups"]),
        "executionTiles": target.tiles * chips,
        "cycles": period,
        "stepCycles": period,
        "imagesPerSecond": rate,
        "fp8RooflineImagesPerSecond": round(roofline, 1),
        "latencyMicroseconds": round(target.cycles_to_us(latency), 3),
        "groupCyclesMax": max(group_cycles),
        "groupCyclesMin": min(group_cycles),
        "balance": round(min(group_cycles) / max(max(group_cycles), 1), 4),
        "fillCycles": fill,
        "handoffCycles": max(run.handoff_cycles, default=0),
        # what sharing the chip's supersteps costs the step over its slowest group alone
        "alignmentCycles": period - max(group_cycles) - max(run.handoff_cycles, default=0)
        if chips == 1 else None,
        "totalCycles": sum(run.step_cycles),
        "effectiveGemmTflops": round(flops / seconds / 1e12, 3) if seconds else 0.0,
        "peakTflops": round(peak / 1e12, 3),
        "efficiencyPercent": round(100 * flops / seconds / peak, 2) if seconds else 0.0,
        "peakTileBytes": int(manifest["memory"]["peak_bytes"]),
        **verdict_fields(worst),
        "package": str(package_path),
        "estimatedCycles": estimate,
        "estimateError": round(abs(estimate - period) / max(period, 1), 4),
        "compileSeconds": None if compile_seconds is None else round(compile_seconds, 2),
        "simulateSeconds": round(run.simulate_seconds, 2),
        "hostPeakBytes": run.host_peak_bytes or None,
        "verdictSeconds": round(run.verdict_seconds, 2),
        "compiler": __version__,
    }


def stream_images(workload: Any, params: dict[str, Any], graph: Graph,
                  tensors: Mapping[str, np.ndarray], count: int) -> list[dict[str, np.ndarray]]:
    """``count`` images as the graph's inputs: the workload's own first, then the workload's
    stream (``Workload.stream_input``), or else the first image's rows in a seeded random
    order (the same values, so exactly representable in the input's precision)."""
    first = {v.name: np.asarray(tensors[v.name]) for v in graph.by_role("input")}
    images = [first]
    for index in range(1, count):
        if getattr(workload, "stream_input", None) is not None:
            images.append(workload.stream_input(params, graph, index))
            continue
        rng = np.random.default_rng(index)
        shuffled = {}
        for name, values in first.items():
            rows = values.reshape(-1, values.shape[-1])
            shuffled[name] = rows[rng.permutation(rows.shape[0])].reshape(values.shape)
        images.append(shuffled)
    return images


__all__ = ["GroupRun", "PipelineRun", "inspect_pipeline", "merged_step", "package_chips",
           "pipeline_fields", "renamed", "run_pipeline", "run_through", "step_schedule",
           "stream_images"]
