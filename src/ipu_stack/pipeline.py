"""The ordered compile phases, each timed and logged in the reference's words.

``compile_workload`` runs: construct_mid (graph, stages, gemm_candidates) -> lower_mid
(finalists) -> select_finalist (lower and physically schedule each finalist's exchanges,
keep the cheapest) -> plan_kernels -> compile_kernels -> size_tile_code -> place_storage ->
emit_tile_code -> write the package.  Only this module chains stages.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ipu_stack import __version__
from ipu_stack.codegen.emit import emit_program
from ipu_stack.exchange import (
    Schedule,
    ScheduleMemo,
    ScheduleStore,
    Transfers,
    schedule_exchange,
    table_bytes,
)
from ipu_stack.exchange.instructions import instruction_horizon
from ipu_stack.ir.graph import Graph
from ipu_stack.kernels.base import KernelInstance
from ipu_stack.kernels.cache import compile_kernels, default_cache_dir
from ipu_stack.lowering.lower import lower
from ipu_stack.lowering.program import Exchange, Program
from ipu_stack.memory.placement import Placement, fragmentation, place_storage
from ipu_stack.memory.report import write_memory_profile, write_placement_html
from ipu_stack.memory.support import support_bytes
from ipu_stack.package import write_package
from ipu_stack.planning.fit import MemoryBudget, fit_plans, need
from ipu_stack.planning.gemm import (
    GemmPlan,
    GemmShape,
    gemm_search,
    resident_bytes,
    transient_bytes,
)
from ipu_stack.planning.stages import GemmStage, find_stages
from ipu_stack.target import Target, get_target, timing
from ipu_stack.util.errors import CompileError, PlacementError
from ipu_stack.util.log import Progress, event, phase
from ipu_stack.workloads.base import Workload

LOG = logging.getLogger("ipu_stack.package.build")


@dataclass(frozen=True)
class CompileOptions:
    """Frozen compile options; their JSON is recorded in the package."""

    target: str = "ipu21"
    finalists: int = 3
    cache_dir: str | None = str(default_cache_dir())
    diagnostics: bool = False
    memory_proportion: float = 0.9
    paired_exchange: bool = False  # target option: tile pairs share an exchange bus
    gemm_mode: str = "auto"  # auto (the planner picks per stage), fp8 or f16
    # Neither changes the package (a reused or cached schedule is the one scheduling gives),
    # so neither is recorded in it.
    reuse_schedules: bool = True
    exchange_cache: bool = False  # also keep schedules on disk under cache_dir/exchange

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "finalists": self.finalists,
                "diagnostics": self.diagnostics, "memory_proportion": self.memory_proportion,
                "paired_exchange": self.paired_exchange, "gemm_mode": self.gemm_mode}


@dataclass
class CompileResult:
    package: Path
    graph: Graph
    tensors: dict[str, np.ndarray]
    estimate: dict[str, int]
    timings: dict[str, float] = field(default_factory=dict)
    plans: list[str] = field(default_factory=list)
    peak_bytes: int = 0
    active_tiles: int = 0


def stage_shape(graph: Graph, stage: GemmStage) -> GemmShape:
    """The per-group GEMM a stage computes (``head_matmul``: one image and head)."""
    a = graph.value(stage.a).type
    b = graph.value(stage.b).type
    groups = 1
    rows, depth, cols = a.rows, a.cols, b.cols
    if stage.kind == "head_matmul":
        heads, tokens = int(stage.attrs["heads"]), int(stage.attrs["tokens"])
        groups = (b.rows // tokens) * heads
        head_dim = b.cols // heads
        if stage.attrs["mode"] == "qk":
            rows, depth, cols = tokens, head_dim, tokens
        else:
            rows, depth, cols = tokens, tokens, head_dim
    return GemmShape(
        op=stage.index,
        rows=rows,
        depth=depth,
        cols=cols,
        a_itemsize=a.precision.itemsize,
        fp8=a.precision.is_fp8 and b.precision.is_fp8,
        chain=stage.chain,
        has_bias=stage.bias is not None,
        groups=groups,
        b_resident=graph.value(stage.b).role == "weight",
        out_itemsize=graph.value(stage.out).type.precision.itemsize,
    )


def schedule_program(
    program: Program, target: Target, memo: ScheduleMemo | None = None, paired: bool = False
) -> dict[int, Schedule]:
    """Schedule every exchange phase; keys are global step indices.

    With ``memo``, a phase identical to one scheduled before (in this program, another
    finalist's or an earlier placement attempt's) reuses that schedule.
    """
    schedules: dict[int, Schedule] = {}
    phase_index = 0
    exchanges = [(index, step) for _, index, step in program.steps()
                 if isinstance(step, Exchange)]
    progress = Progress("scheduling exchange phases", len(exchanges))
    for index, step in exchanges:
        transfers = to_transfers(step, target)
        if memo is None:
            schedules[index] = schedule_exchange(transfers, phase=phase_index, paired=paired)
        else:
            schedules[index] = memo.schedule(transfers, phase=phase_index, paired=paired)
        phase_index += 1
        progress.step(step.name)
    progress.close()
    return schedules


def to_transfers(step: Exchange, target: Target) -> Transfers:
    return Transfers(target.tiles, step.src_tile, step.dst_offsets, step.dst_tile, step.words)


def row_stage_cycles(program: Program, target: Target) -> int:
    """The analytical cost of row and copy compute sets: the busiest call plus a sync."""
    total = 0
    for step in program.compute_sets():
        families = {call.instance.family for call in step.calls}
        if families & {"row", "copy"}:
            total += max(call.instance.cost(target) for call in step.calls)
            total += timing.p("sync")
    return total


def scheduled_exchange_cycles(program: Program, schedules: dict[int, Schedule],
                              target: Target) -> int:
    """Every phase at its instruction-level horizon + the measured phase cost + a sync."""
    by_index = {i: step for _, i, step in program.steps() if isinstance(step, Exchange)}
    total = 0
    for index, schedule in schedules.items():
        horizon, _ = instruction_horizon(schedule, to_transfers(by_index[index], target))
        total += timing.estimate_exchange_phase(horizon) + timing.p("sync")
    return total


def refined_estimate(
    plans: list[GemmPlan | None], program: Program, schedules: dict[int, Schedule], target: Target
) -> dict[str, int]:
    """The compiler's cost: analytical compute plus the scheduled exchange horizons."""
    gemms = [p for p in plans if p is not None]
    compute = sum(p.estimated_cycles - p.exchange_cycles for p in gemms)
    compute += row_stage_cycles(program, target)
    analytical_exchange = sum(p.exchange_cycles for p in gemms)
    scheduled = scheduled_exchange_cycles(program, schedules, target)
    return {
        "analytical_cycles": compute + analytical_exchange,
        "analytical_exchange_cycles": analytical_exchange,
        "scheduled_exchange_cycles": scheduled,
        "cycles": compute + scheduled,
        "compute_cycles": compute,
    }


def _finalists(
    candidates: list[list[GemmPlan | None]], count: int
) -> list[list[GemmPlan | None]]:
    depth = max(len(c) for c in candidates)
    out = []
    for rank in range(min(count, depth)):
        out.append([c[min(rank, len(c) - 1)] for c in candidates])
    return out


MIN_PROPORTION = 0.45


def compile_workload(
    workload: Workload,
    params: dict[str, Any],
    out_dir: Path,
    options: CompileOptions = CompileOptions(),
) -> CompileResult:
    """Compile ``workload`` with ``params`` into ``out_dir/model.ipuexe``.

    The planner's memory estimate cannot see support memory (exchange tables grow with the
    program) or fragmentation exactly, so when placement fails the compile is planned again
    with 0.1 less of tile memory, down to ``MIN_PROPORTION``.  One schedule memo serves every
    attempt: most phases of a retry are the ones the failed attempt already scheduled.
    """
    memo = None
    if options.reuse_schedules:
        store = None
        if options.exchange_cache and options.cache_dir:
            store = ScheduleStore(Path(options.cache_dir))
        memo = ScheduleMemo(store)
    proportion = options.memory_proportion
    while True:
        try:
            return _compile_once(workload, params, out_dir,
                                 dataclasses.replace(options, memory_proportion=proportion),
                                 memo)
        except PlacementError as failure:
            if proportion - 0.1 < MIN_PROPORTION:
                raise
            proportion = round(proportion - 0.1, 2)
            event(LOG, "placement failed, planning again with less memory", level=logging.WARNING,
                  reason=str(failure), memory_proportion=proportion)


def _compile_once(
    workload: Workload,
    params: dict[str, Any],
    out_dir: Path,
    options: CompileOptions,
    memo: ScheduleMemo | None = None,
) -> CompileResult:
    """One attempt at the whole compile under ``options.memory_proportion``."""
    target = get_target(options.target)
    timings: dict[str, float] = {}
    start = time.perf_counter()
    with phase(LOG, "construct_mid"):
        graph, tensors = workload.build(params)
        stages = find_stages(graph)
        candidates: list[list[GemmPlan | None]] = []
        fronts: list[list[GemmPlan]] = []
        searched: dict[str, tuple[list[GemmPlan], list[GemmPlan]]] = {}
        for stage in stages:
            if not isinstance(stage, GemmStage):
                candidates.append([None])
                fronts.append([])
                continue
            shape = stage_shape(graph, stage)
            key = repr(dataclasses.replace(shape, op=0))  # repeated layers search once
            if key not in searched:
                with phase(LOG, "gemm_candidates", stage=stage.index):
                    searched[key] = gemm_search(shape, target, keep=options.finalists,
                                                mode=options.gemm_mode)
            found, front = searched[key]
            if not found:
                raise CompileError(f"no GEMM tiling of stage {stage.index} fits {target.name}")
            candidates.append([dataclasses.replace(p, shape=shape) for p in found])
            fronts.append([dataclasses.replace(p, shape=shape) for p in front])
    with phase(LOG, "lower_mid"):
        budget = MemoryBudget.for_target(target, options.memory_proportion)
        finalists = []
        for plans in _finalists(candidates, options.finalists):
            fitted, moves = fit_plans(plans, fronts, budget)
            if moves:
                event(LOG, "traded cycles for memory", moves=moves, budget_bytes=budget.bytes,
                      estimated_bytes=need(fitted))
            if fitted not in finalists:
                finalists.append(fitted)
        for index, plans in enumerate(finalists):
            event(
                LOG, "retained operator-plan finalist", finalist=index,
                values=len(graph.values), operations=len(graph.operations),
                estimated_cycles=sum(p.estimated_cycles for p in plans if p),
                estimated_exchange_cycles=sum(p.exchange_cycles for p in plans if p),
                resident_bytes=sum(resident_bytes(p) for p in plans if p),
                peak_transient_bytes=max((transient_bytes(p) for p in plans if p), default=0),
                peak_total_bytes=need(plans),
                active_tile_counts="{" + ", ".join(str(p.tiles_used) for p in plans if p) + "}",
                plans="[" + "; ".join(p.describe() for p in plans if p) + "]",
            )
    with phase(LOG, "select_finalist") as info:
        best = None
        before = memo.counts() if memo is not None else {}
        phases = 0
        for index, plans in enumerate(finalists):
            program = lower(graph, list(zip(stages, plans, strict=True)), target,
                            diagnostics=options.diagnostics, paired=options.paired_exchange)
            schedules = schedule_program(program, target, memo, options.paired_exchange)
            phases += len(schedules)
            estimate = refined_estimate(plans, program, schedules, target)
            event(
                LOG, "scheduled operator-plan finalist", finalist=index, mapped=False,
                analytical_cycles=estimate["analytical_cycles"],
                analytical_exchange_cycles=estimate["analytical_exchange_cycles"],
                scheduled_exchange_cycles=estimate["scheduled_exchange_cycles"],
                refined_cycles=estimate["cycles"],
            )
            if best is None or estimate["cycles"] < best[3]["cycles"]:
                best = (index, plans, program, estimate, schedules)
        assert best is not None
        selected, plans, program, estimate, schedules = best
        info.update(_reuse_fields(phases, before, memo))
        event(LOG, "selected physically scheduled operator-plan finalist", selected=selected,
              mapped=False)
    exchanges = program.exchanges()
    event(LOG, "lowered graph for package construction",
          logical_shards=sum(len(b.tiles) for b in program.buffers),
          exchange_phases=len(exchanges))
    with phase(LOG, "plan_kernels") as info:
        instances = kernel_instances(program)
        info["instances"] = len(instances)
    with phase(LOG, "compile_kernels") as info:
        cache = Path(options.cache_dir) if options.cache_dir else None
        info.update(compile_kernels(instances, target, cache))
    with phase(LOG, "size_tile_code"):
        tables = np.zeros(target.tiles, dtype=np.int64)
        by_index = {i: step for _, i, step in program.steps() if isinstance(step, Exchange)}
        for index, schedule in schedules.items():
            tables += table_bytes(schedule, to_transfers(by_index[index], target),
                                  int(target.exchange_table_bytes_per_send),
                                  timing.p("send_words"))
        support = support_bytes(program, tables, target)
    event(LOG, "allocated package support memory",
          linked_end=target.memory_base + int(target.runtime_support_bytes),
          exchange_table_bytes=int(tables.max()),
          generated_code_bytes=int(support["code"].max()),
          support_bytes=int(support["total"].max()))
    reports = Path(out_dir) / "memory"
    title = f"{workload.identifier(params)} tile placement"
    try:
        with phase(LOG, "place_storage"):
            placement = place_storage(program, support["total"], target)
    except PlacementError as failure:
        if isinstance(failure.placement, Placement):
            # still write the reports, so the user can see why it does not fit
            write_memory_profile(reports / "memory-profile.json", program, failure.placement,
                                 target, scope="failed")
            write_placement_html(reports / "placement.html", program, failure.placement,
                                 support, target, title=f"{title} (failed: {failure})")
        raise
    waste = fragmentation(placement, program, target)
    event(LOG, "placed storage", peak_tile=int(np.argmax(placement.peak_bytes)),
          peak_bytes=int(placement.peak_bytes.max()),
          **{f"fragmentation_{k}": v for k, v in waste.items()})
    with phase(LOG, "write_memory_reports"):
        profile = write_memory_profile(reports / "memory-profile.json", program, placement,
                                       target, scope="final")
        write_placement_html(reports / "placement.html", program, placement, support, target,
                             title=title)
    event(LOG, "costed final placed program", final_cycles=estimate["cycles"],
          final_exchange=estimate["scheduled_exchange_cycles"])
    with phase(LOG, "emit_tile_code"):
        fragment, arrays = emit_program(program, placement, schedules)
    manifest = {
        "workload": {"name": workload.name, "identifier": workload.identifier(params),
                     "params": params},
        "options": options.to_json(),
        "tensors": program.tensors,
        "estimate": estimate,
        "plans": [p.describe() for p in plans if p],
        "gemm_modes": gemm_modes(stages, plans),
        "memory": {**_memory_summary(placement, support, target, waste),
                   "effective_peak_bytes": int(profile["effective_peak_bytes"])},
        **fragment,
    }
    path = Path(out_dir) / "model.ipuexe"
    event(LOG, "writing application package", tiles=target.tiles)
    write_package(path, target=target.name, compiler_version=__version__, manifest=manifest,
                  arrays=arrays)
    event(LOG, "application package written", path=str(path))
    timings["compile"] = time.perf_counter() - start
    active = np.unique(np.concatenate([b.tiles for b in program.buffers]))
    return CompileResult(
        package=path, graph=graph, tensors=tensors, estimate=estimate, timings=timings,
        plans=[p.describe() for p in plans if p], peak_bytes=int(placement.peak_bytes.max()),
        active_tiles=len(active),
    )


def _reuse_fields(
    phases: int, before: dict[str, int], memo: ScheduleMemo | None
) -> dict[str, int]:
    """This attempt's exchange phases by origin, for the ``select_finalist`` log line."""
    if memo is None:
        return {"exchange_phases": phases, "scheduled_phases": phases, "reused_phases": 0}
    delta = {k: v - before[k] for k, v in memo.counts().items()}
    fields = {"exchange_phases": phases, "scheduled_phases": delta["scheduled"],
              "reused_phases": delta["reused"]}
    if memo.store is not None:
        fields["cached_phases"] = delta["loaded"]
        fields["rejected_cache_entries"] = delta["rejected"]
    return fields


def _memory_summary(
    placement: Placement, support: dict, target: Target, waste: dict[str, float]
) -> dict[str, Any]:
    peak = placement.peak_bytes
    busiest = int(np.argmax(peak))
    return {
        "fragmentation": waste,
        "memory_base": target.memory_base,
        "memory_end": target.memory_end,
        "support_bytes_max": int(support["total"].max()),
        "peak_tile": busiest,
        "peak_bytes": int(peak[busiest]),
        "peak_step": int(placement.peak_step[busiest]),
    }


def gemm_modes(stages: list, plans: list[GemmPlan | None]) -> dict[str, dict[str, Any]]:
    """Per matmul operation (by id): the GEMM mode its stage runs in and its depth block,
    which the host reference needs to round where the device rounds."""
    modes: dict[str, dict[str, Any]] = {}
    for stage, plan in zip(stages, plans, strict=True):
        if isinstance(stage, GemmStage) and plan is not None:
            modes[str(stage.operations[0])] = {"mode": plan.mode,
                                               "depth_block": plan.depth_block}
    return modes


def kernel_instances(program: Program) -> list[KernelInstance]:
    """Every distinct kernel instance the program calls, in name order (deterministic)."""
    return sorted({c.instance for cs in program.compute_sets() for c in cs.calls},
                  key=lambda k: k.name)
