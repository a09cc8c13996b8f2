"""Compile a tower with the pipeline strategy: layer groups on tile groups, one package.

The planner chooses the grouping (``choose_groups``): for each candidate count G a chip the
tower is cut into groups of consecutive layers (``planning.groups``; the chips' layers are
balanced first, then each chip's groups), each group planned for an equal share of its
chip's tiles, rounded down to an even count so tile pairs stay whole.  The shares stay
equal: all tiles of a chip sync together, so groups side by side share supersteps
(``device.alignment``) and a group on fewer tiles lengthens every superstep it shares;
groups of the same layers on the same tiles align superstep for superstep.  Only the
planning stages run for a candidate: whether every group's plans fit and their analytical
GEMM cycles.  The
slowest group sets the rate, so the candidate whose slowest group is fastest wins; one that
does not fit is dropped with its reason.  Then each distinct group is compiled in full by
the single-program compiler (middle groups with the same number of layers differ only in
their weights' names and share one program; a group alone on its chip is planned again for
the room its placement left); where groups share a chip, a program whose layers are planned
otherwise than the slowest program's is compiled again with its layer plans
(``_align_programs``), so that their supersteps line up.  The hand-offs between groups are
built and scheduled, and the system program (``contract.system``) is verified and written:
its manifest names the groups, their tile ranges and programs, the hand-offs and the step
counts (fill, steady, drain); the group programs are whole packages inside it, each with its
own checksums.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ipu_stack import __version__
from ipu_stack.contract.handoff import handoff_transfers
from ipu_stack.contract.system import (
    GroupSpec,
    Handoff,
    Steps,
    SystemProgram,
    system_to_manifest,
    verify_system,
)
from ipu_stack.device.alignment import merge
from ipu_stack.exchange import schedule_exchange
from ipu_stack.exchange.instructions import instruction_horizon
from ipu_stack.ir.graph import Graph
from ipu_stack.ir.names import refuse_absent_layers
from ipu_stack.package import write_package
from ipu_stack.pipeline import CompileOptions, CompileResult, compile_workload, plan_workload
from ipu_stack.planning.costs import estimate_exchange_phase, estimate_link_phase
from ipu_stack.planning.groups import (
    LayerGroup,
    PipelineError,
    chip_group_layers,
    group_counts,
    group_tiles,
    groupings,
    half_layer_bounds,
    split_at_stages,
    split_tower,
    tower_loop,
)
from ipu_stack.planning.stages import find_stages
from ipu_stack.target import Target, get_target
from ipu_stack.target.links import get_system
from ipu_stack.util.errors import CompileError, UsageError
from ipu_stack.util.log import event
from ipu_stack.workloads.base import Workload
from ipu_stack.workloads.calibration import cache_folder
from ipu_stack.workloads.footprint import check_fits

LOG = logging.getLogger("ipu_stack.strategy")
STRATEGIES = ("layers", "pipeline", "auto")
GROUP_FOLDER = re.compile(r"group[0-9]+(\.aligned)?")
"""The name of a folder a group's program is compiled into (``_compile_programs``)."""
CANDIDATE_MIN_PROPORTION = 0.8
"""How far a candidate grouping that does not place may retry with less memory before the
next candidate is tried (the last one tried gets every retry)."""


@dataclass
class StrategyResult:
    """What a compile made: the package of the chosen strategy, the tower's graph and
    tensors, the planner's estimate and why; a pipeline's also its groups, the tiles each
    has and the distinct programs they run."""

    strategy: str
    package: Path
    graph: Graph
    tensors: Any
    estimate: dict[str, Any]
    reason: str
    timings: dict[str, float] = field(default_factory=dict)
    groups: list[LayerGroup] = field(default_factory=list)
    group_tiles: int = 0
    compiled: list[CompileResult] = field(default_factory=list)

    def program_of(self, group: LayerGroup) -> CompileResult:
        """The compiled program ``group`` runs: groups of one signature share one, and
        ``compiled`` holds them in the order of their first groups."""
        first = _distinct(self.groups)
        return self.compiled[sorted(set(first.values())).index(first[group.index])]


def _layers(done: CompileResult, reason: str, start: float | None = None) -> StrategyResult:
    """The layers strategy's result (``start``: when the compile that chose it began)."""
    timings = dict(done.timings)
    if start is not None:
        timings["compile"] = time.perf_counter() - start
    return StrategyResult("layers", done.package, done.graph, done.tensors, done.estimate,
                          reason, timings)


def group_workload(workload: Workload, group: LayerGroup, tensors: Any) -> Workload:
    """The group's graph as a workload the single-program compiler takes."""
    return Workload(
        name=workload.name, description=f"{workload.description} (layer group {group.index})",
        parameters=workload.parameters, build=lambda params: (group.graph, tensors),
        identifier=lambda params: f"{workload.identifier(params)}.group{group.index}",
        benchmark_fields=workload.benchmark_fields)


def _distinct(groups: list[LayerGroup]) -> dict[int, int]:
    """Group index -> the index of the first group with the same signature (its program)."""
    seen: dict[str, int] = {}
    return {g.index: seen.setdefault(g.signature(), g.index) for g in groups}


@dataclass
class Candidate:
    """A grouping that plans: ``count`` groups a chip, the slowest group's GEMM cycles, why,
    the groups and the tiles of each."""

    count: int
    slowest: int
    reason: str
    groups: list[LayerGroup]
    tiles: int


def choose_groups(workload: Workload, params: dict[str, Any], graph: Graph, tensors: Any,
                  options: CompileOptions, counts: tuple[int, ...],
                  refused: list[str] | None = None) -> list[Candidate]:
    """Each candidate that fits, best first (``refused`` collects each other candidate's
    reason).  A count is the groups on each of ``options.chips`` chips: the tower is cut
    into ``count x chips`` groups, each planned for its share of its chip's tiles."""
    chip = get_target(options.target).tiles
    chips = max(1, options.chips)
    refused = [] if refused is None else refused
    stages = find_stages(graph)
    layers = tower_loop(graph, stages).count
    ranked, lighter = [], None
    for count, shares, lighter_last in groupings(graph, stages, layers, chips, counts):
        try:
            groups = split_tower(graph, chip_group_layers(layers, chips, count)) \
                if shares is None else split_at_stages(
                    graph, half_layer_bounds(graph, shares, stages), stages)
        except PipelineError as why:
            event(LOG, "pipeline candidate refused", groups=count, chips=chips,
                  reason=str(why))
            refused.append(f"{count} groups: {why}")
            continue
        tiles = group_tiles(chip, count)
        slowest, failed = 0, None
        for index in sorted(set(_distinct(groups).values())):
            group = groups[index]
            try:
                planned = plan_workload(group_workload(workload, group, tensors), params,
                                        dataclasses.replace(options, tiles=tiles))
            except CompileError as why:
                failed = str(why)
                break
            slowest = max(slowest, planned["gemm_cycles"])
        where = (f"{count} group{'s' if count > 1 else ''} a chip" if chips > 1
                 else f"{count} groups")
        if shares is not None:
            where += f" cut inside layers ({','.join(f'{x:g}' for x in shares)} layers)"
        if failed is not None:
            event(LOG, "pipeline candidate does not fit", groups=count, chips=chips,
                  tiles=tiles, reason=failed)
            refused.append(f"{where}: {failed}")
            continue
        event(LOG, "pipeline candidate planned", groups=count, chips=chips, tiles=tiles,
              slowest_gemm_cycles=slowest, **({} if shares is None else {
                  "layer_shares": ",".join(f"{x:g}" for x in shares)}))
        ranked.append(Candidate(count, slowest, f"{where} of {tiles} tiles: the slowest "
                                f"group's GEMMs are {slowest} cycles", groups, tiles))
        lighter = ranked[-1] if lighter_last else lighter
    ranked.sort(key=lambda c: (c.slowest, c.count))
    # the lighter last chip only where it ranks first: elsewhere the cuts tried before it
    # keep their order (the last one tried gets every retry)
    return [c for c in ranked if c is not lighter or c is ranked[0]]


def compile_pipeline(workload: Workload, params: dict[str, Any], out_dir: Path,
                     options: CompileOptions, groups: int | None = None,
                     most_groups: int | None = None) -> StrategyResult:
    """Choose the grouping (or take ``groups``; at most ``most_groups`` a chip), compile
    every distinct group and write ``out_dir/model.ipuexe`` holding them and the
    hand-offs."""
    start = time.perf_counter()
    get_system(options.target, options.chips)  # --chips in range, or one line why not
    check_fits(workload, params, options.target, options.chips)
    cache = Path(options.cache_dir) if options.cache_dir else None
    with cache_folder(cache):
        graph, tensors = workload.build(params)
    refuse_absent_layers(params, (v.name for v in graph.values))
    counts = group_counts(tower_loop(graph).count, max(1, options.chips), groups,
                          None if groups else most_groups)
    refused: list[str] = []
    ranked = choose_groups(workload, params, graph, tensors, options, counts, refused)
    if not ranked:
        raise PipelineError(f"{graph.name} cannot be pipelined: " + "; ".join(refused))
    failures = []
    for number, candidate in enumerate(ranked):
        # a grouping that places only with much less memory than planned gives way to the
        # next one; the last one tried gets every retry
        floor = None if number == len(ranked) - 1 else CANDIDATE_MIN_PROPORTION
        try:
            result = _compile_groups(workload, params, Path(out_dir), options, graph, tensors,
                                     candidate, floor)
        except CompileError as why:
            failures.append(f"{candidate.count} groups: {why}")
            event(LOG, "pipeline candidate failed to compile", groups=candidate.count,
                  reason=str(why))
            continue
        result.timings["compile"] = time.perf_counter() - start
        return result
    # cuts of the same count that fail alike are said once
    raise PipelineError("no pipeline grouping compiles: " + "; ".join(dict.fromkeys(failures)))


def _compile_groups(workload: Workload, params: dict[str, Any], out_dir: Path,
                    options: CompileOptions, graph: Graph, tensors: Any,
                    candidate: Candidate,
                    min_proportion: float | None = None) -> StrategyResult:
    """Compile each distinct group of ``candidate``, build the system program joining them
    and write the package."""
    chips = max(1, options.chips)
    groups, tiles = candidate.groups, candidate.tiles
    program_of = _distinct(groups)
    event(LOG, "pipeline grouping chosen", groups=len(groups), chips=chips, tiles=tiles,
          layers=",".join(str(g.layers) for g in groups), programs=len(set(program_of.values())),
          reason=candidate.reason)
    compiled = _compile_programs(workload, params, out_dir, options, groups, tensors, tiles,
                                 min_proportion)
    system = _system_program(options, groups, compiled, program_of, tiles, candidate.reason)
    verify_system(system, get_target(options.target))
    estimate = _step_estimate([compiled[program_of[g.index]] for g in groups],
                              system.handoffs, system.per_chip)
    package = _write_system_package(workload, params, out_dir, options, system, compiled,
                                    program_of, estimate)
    return StrategyResult("pipeline", package, graph, tensors, estimate, candidate.reason,
                          groups=groups, group_tiles=tiles,
                          compiled=[compiled[i] for i in sorted(compiled)])


def _compile_programs(workload: Workload, params: dict[str, Any], out_dir: Path,
                      options: CompileOptions, groups: list[LayerGroup], tensors: Any,
                      tiles: int, min_proportion: float | None) -> dict[int, CompileResult]:
    """Each distinct group's program (by its first group's index), compiled for ``tiles``;
    where groups share a chip, aligned to the slowest one's layer plans."""
    per_chip = len(groups) // max(1, options.chips)
    compiled: dict[int, CompileResult] = {}
    for index in sorted(set(_distinct(groups).values())):
        try:
            compiled[index] = compile_workload(
                group_workload(workload, groups[index], tensors), params,
                out_dir / f"group{index}",
                dataclasses.replace(options, tiles=tiles, dump_stages=None
                                    if not options.dump_stages
                                    else str(Path(options.dump_stages) / f"group{index}"),
                                    # groups side by side take the slowest one's layer plans
                                    slack=options.slack and per_chip == 1,
                                    fuse_window=_side_by_side_window(options, per_chip)),
                min_proportion)
        except CompileError as why:
            raise CompileError(f"group {index}: {why}") from why
    if per_chip > 1:  # groups side by side on a chip
        _align_programs(workload, params, out_dir, options, groups, tensors, tiles, compiled,
                        min_proportion)
    return compiled


def _system_program(options: CompileOptions, groups: list[LayerGroup],
                    compiled: dict[int, CompileResult], program_of: dict[int, int],
                    tiles: int, reason: str) -> SystemProgram:
    """The groups on their chips' tiles and the hand-offs between them, typed."""
    chip = get_target(options.target)
    per_chip = len(groups) // max(1, options.chips)
    slot = {index: k for k, index in enumerate(sorted(compiled))}
    specs = []
    for group in groups:
        template = groups[program_of[group.index]]
        names = [v.name for v in group.graph.values]
        specs.append(GroupSpec(
            group.index, group.index // per_chip, (group.index % per_chip) * tiles, tiles,
            slot[program_of[group.index]], group.first, group.layers, group.input_name,
            group.output_name, tuple(group.source_ops),
            tuple((t.name, own) for t, own in zip(template.graph.values, names, strict=True)
                  if t.name != own)))
    handoffs = tuple(_handoff(groups, compiled, program_of, specs, k, chip)
                     for k in range(len(groups) - 1))
    return SystemProgram(chip.name, max(1, options.chips), chip.tiles, tiles, tuple(specs),
                         handoffs, len(compiled), Steps(len(groups) - 1, len(groups) - 1),
                         reason)


def _handoff(groups: list[LayerGroup], compiled: dict[int, CompileResult],
             program_of: dict[int, int], specs: list[GroupSpec], k: int,
             chip: Target) -> Handoff:
    """Group ``k``'s output into group ``k + 1``: the transfers the two programs imply,
    scheduled as an exchange phase on one chip, or carried by the link between two."""
    sender, receiver = groups[k], groups[k + 1]
    send_spec, receive_spec = specs[k], specs[k + 1]
    send_program = compiled[program_of[sender.index]].device_program
    receive_program = compiled[program_of[receiver.index]].device_program
    assert send_program is not None and receive_program is not None
    transfers, nbytes = handoff_transfers(
        send_program, send_spec.local(sender.output_name), receive_program,
        receive_spec.local(receiver.input_name or ""), send_spec.tile_base,
        receive_spec.tile_base, chip.tiles)
    route = (send_spec.chip, receive_spec.chip)
    if route[0] != route[1]:
        return Handoff(k, k + 1, sender.output_name, nbytes, route, transfers, None,
                       estimate_link_phase(int(transfers.words.sum()) * 4, chip.clock_hz))
    schedule = schedule_exchange(transfers, phase=k)
    horizon, _ = instruction_horizon(schedule, transfers)
    return Handoff(k, k + 1, sender.output_name, nbytes, route, transfers, schedule,
                   estimate_exchange_phase(horizon))


def _write_system_package(workload: Workload, params: dict[str, Any], out_dir: Path,
                          options: CompileOptions, system: SystemProgram,
                          compiled: dict[int, CompileResult], program_of: dict[int, int],
                          estimate: dict[str, Any]) -> Path:
    """``out_dir/model.ipuexe``: the system's records, the group programs as packages of
    their own, the hand-offs' arrays."""
    records, arrays = system_to_manifest(system)
    order = sorted(compiled)
    arrays.update({f"program.{k}": np.frombuffer(compiled[index].package.read_bytes(), np.uint8)
                   for k, index in enumerate(order)})
    manifest = {
        "workload": {"name": workload.name, "identifier": workload.identifier(params),
                     "params": params},
        "options": options.to_json(),
        "strategy": "pipeline",
        "estimate": estimate,
        # what the runtime reports from: each program's plans and its fullest tile
        "plans": [f"group {g.index}: {plan}" for g in system.groups
                  if program_of[g.index] == g.index for plan in compiled[g.index].plans],
        "memory": {"peak_bytes": max(c.peak_bytes for c in compiled.values()),
                   "group_peak_bytes": [int(compiled[program_of[g.index]].peak_bytes)
                                        for g in system.groups]},
        **records,
    }
    package = out_dir / "model.ipuexe"
    write_package(package, target=system.target, compiler_version=__version__,
                  manifest=manifest, arrays=arrays)
    event(LOG, "pipeline package written", path=str(package), groups=len(system.groups),
          chips=system.chips, estimated_step_cycles=estimate["cycles"],
          alignment_cycles=max(estimate["alignment_cycles"], default=0))
    return package


def _side_by_side_window(options: CompileOptions, per_chip: int) -> int:
    """The fusion window of a group's program: none where groups share a chip.  Fusion joins
    a step with its neighbours, and a first group's stem shifts where its layers' steps join,
    so side-by-side groups stop sharing supersteps (siglip-vision's 3 groups of 9 layers:
    a step of 5,398,389 cycles fused, 693,169 of them waiting for the others, against
    4,715,573 unfused)."""
    return options.fuse_window if per_chip == 1 else 0


def _align_programs(workload: Workload, params: dict[str, Any], out_dir: Path,
                    options: CompileOptions, groups: list[LayerGroup], tensors: Any,
                    tiles: int, compiled: dict[int, CompileResult],
                    min_proportion: float | None) -> None:
    """Compile again (into ``group<N>.aligned``), with the slowest program's layer plans,
    each program whose layers are planned otherwise; the new one is kept only when it takes
    them all and is no slower than the slowest program, so the step estimate never grows.

    Why: the chip syncs all its tiles together, so side-by-side groups share supersteps
    (``device.alignment``), and the slowest group sets each shared one's length.  A first
    group that holds the stem has less memory for its layers and may plan a GEMM otherwise
    (fc1 in 4 row chunks beside the others' 3).  Then no superstep of its layers lines up
    with theirs, and the chip runs them one after another.  The other programs have the
    memory for the slowest one's
    plans, which makes them no faster than it but lets the chip run every group's layers
    side by side."""
    pace = max(compiled, key=lambda index: int(compiled[index].estimate["cycles"]))
    hints = tuple(compiled[pace].body_plans)
    if not hints:  # no layer loop: nothing to line up
        return
    for index, result in list(compiled.items()):
        if index == pace or tuple(result.body_plans) == hints \
                or len(result.body_plans) != len(hints):
            continue
        try:
            again = compile_workload(
                group_workload(workload, groups[index], tensors), params,
                out_dir / f"group{index}.aligned",
                dataclasses.replace(options, tiles=tiles, dump_stages=None,
                                    fuse_window=_side_by_side_window(options, len(groups)
                                                                     // max(1, options.chips))),
                min_proportion, body_hints=hints)
        except CompileError as why:
            event(LOG, "group keeps its own layer plans", group=index, slowest=pace,
                  reason=str(why))
            continue
        if tuple(again.body_plans) == hints and \
                int(again.estimate["cycles"]) <= int(compiled[pace].estimate["cycles"]):
            compiled[index] = again
            event(LOG, "group takes the slowest group's layer plans", group=index,
                  slowest=pace, estimated_cycles=again.estimate["cycles"])


def pipeline_rate(estimate: dict[str, Any], work: float, in_flight: int | None) -> float:
    """A pipeline's estimated passes a second times a pass's ``work`` (images times the
    clock).  Independent images (``in_flight`` None) keep every group busy: one pass a steady
    step.  ``in_flight`` passes that each wait for their own previous one (generate's
    micro-batches, a token a step) go through the groups one after another: each pass takes
    every group's program and hand-off in turn, and ``in_flight`` of them share that time,
    however many groups there are (at one, a group's tiles wait while the others run)."""
    step = max(int(estimate["cycles"]), 1)
    if in_flight is None:
        return work / step
    one_pass = sum(estimate["group_cycles"]) + sum(estimate["handoff_cycles"]) \
        + sum(estimate["link_cycles"])
    return work * in_flight / max(one_pass, in_flight * step, 1)


def _step_estimate(compiled: list[CompileResult], handoffs: tuple[Handoff, ...],
                   per_chip: int) -> dict[str, Any]:
    """The planner's steady step (every group busy; ``compiled``: each group's program).

    Each chip: its groups' priced supersteps merged as the chip runs them side by side
    (``device.alignment``: a shared superstep lasts as long as its longest member), then
    its on-chip hand-off; the slowest chip, then the link hand-off (every card syncs, then
    the links carry at once).  ``alignment_cycles``: what sharing supersteps costs over each
    chip's slowest group alone."""
    group_cycles = [int(c.estimate["cycles"]) for c in compiled]
    chips = len(group_cycles) // per_chip
    chip_cycles, alignment = [], []
    for chip in range(chips):
        own = range(chip * per_chip, (chip + 1) * per_chip)
        on_chip = [h.estimated_cycles for h in handoffs if not h.link and h.sender in own]
        merged = merge([(compiled[g].superstep_kinds, compiled[g].superstep_cycles)
                        for g in own]).total
        alignment.append(merged - max(group_cycles[g] for g in own))
        chip_cycles.append(merged + max(on_chip, default=0))
    links = [h.estimated_cycles for h in handoffs if h.link]
    step = max(chip_cycles) + max(links, default=0)
    return {"cycles": step, "group_cycles": group_cycles, "chip_cycles": chip_cycles,
            "alignment_cycles": alignment,
            "handoff_cycles": [h.estimated_cycles for h in handoffs if not h.link],
            "link_cycles": links}


def compile_strategy(workload: Workload, params: dict[str, Any], out_dir: Path,
                     options: CompileOptions, images: int | None = None,
                     in_flight: int | None = None) -> StrategyResult:
    """Compile (``_compile_strategy``) and remove the group programs in ``out_dir`` that the
    package does not hold: a folder compiled before with another grouping (or strategy)
    would otherwise sit beside the new package as if it were one of its parts."""
    result = _compile_strategy(workload, params, out_dir, options, images, in_flight)
    remove_stale_programs(Path(out_dir), {Path(c.package).parent.name for c in result.compiled})
    return result


def remove_stale_programs(out_dir: Path, kept: set[str]) -> list[str]:
    """Remove ``out_dir``'s group program folders (``group<N>``, ``group<N>.aligned``,
    holding a ``model.ipuexe``) not named in ``kept``; return their names.  Only folders of
    that shape are touched: nothing else a user keeps in an output folder is removed."""
    removed = []
    for folder in sorted(out_dir.glob("group*")):
        if folder.name in kept or not GROUP_FOLDER.fullmatch(folder.name) \
                or folder.is_symlink() or not (folder / "model.ipuexe").is_file():
            continue
        shutil.rmtree(folder)
        removed.append(folder.name)
    if removed:
        event(LOG, "stale group programs removed", folder=str(out_dir),
              programs=",".join(removed))
    return removed


def _compile_strategy(workload: Workload, params: dict[str, Any], out_dir: Path,
                      options: CompileOptions, images: int | None = None,
                      in_flight: int | None = None) -> StrategyResult:
    """Compile with ``options.strategy``: ``layers`` (one program over the chip),
    ``pipeline`` (layer groups; ``options.groups`` of them, or the planner's choice, of at
    most ``images`` groups a chip when a run will stream that many) or ``auto`` (both; the
    higher estimated images/s wins (:func:`pipeline_rate`: ``in_flight`` passes at once),
    and when the model cannot be pipelined within memory, layers, with the reason
    logged)."""
    strategy, groups = options.strategy, options.groups or None
    if strategy not in STRATEGIES:
        raise UsageError(f"strategy {strategy!r} is not one of {', '.join(STRATEGIES)}")
    if options.chips > 1 and strategy == "layers":
        raise UsageError(f"--chips {options.chips} pipelines the tower over the chips; the "
                         "layers strategy runs on one chip")
    start = time.perf_counter()
    if strategy == "pipeline" or (strategy == "auto" and (groups or options.chips > 1)):
        return compile_pipeline(workload, params, out_dir, options, groups, images)
    if strategy == "layers":
        return _layers(compile_workload(workload, params, out_dir, options), "requested")
    try:
        piped: StrategyResult | None = compile_pipeline(
            workload, params, out_dir / "pipeline", options, most_groups=images)
    except (PipelineError, CompileError) as why:
        piped, reason = None, f"no pipeline: {why}"
    done = compile_workload(workload, params, out_dir, options)
    if piped is not None:
        clock, batch = get_target(options.target).clock_hz, int(params.get("batch", 1))
        layers_rate = batch * clock / max(int(done.estimate["cycles"]), 1)
        piped_rate = pipeline_rate(piped.estimate, batch * clock, in_flight)
        if piped_rate > layers_rate:
            reason = (f"pipeline {piped_rate:.1f} images/s estimated against layers "
                      f"{layers_rate:.1f}")
            event(LOG, "strategy chosen", strategy="pipeline", reason=reason)
            return dataclasses.replace(piped, reason=reason, timings={
                "compile": time.perf_counter() - start})
        reason = (f"layers {layers_rate:.1f} images/s estimated against pipeline "
                  f"{piped_rate:.1f}")
    event(LOG, "strategy chosen", strategy="layers", reason=reason)
    return _layers(done, reason, start)


__all__ = ["StrategyResult", "choose_groups", "compile_pipeline", "compile_strategy",
           "pipeline_rate"]
