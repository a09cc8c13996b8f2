"""The compile stages, one function each, named for what it does (``pipeline.STAGES`` pairs
each with the name the reference logs it under).

A stage takes the :class:`~ipu_stack.phases.state.Build` record, reads what earlier stages
left there, sets its own artifact and returns the extra fields for its ``package build phase
finished`` line.  Only ``ipu_stack.pipeline`` orders and runs them.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from pathlib import Path
from typing import Any

import numpy as np

from ipu_stack import __version__
from ipu_stack import package as packaging
from ipu_stack.codegen.emit import emit_program
from ipu_stack.contract import to_manifest
from ipu_stack.exchange import table_bytes
from ipu_stack.ir.graph import Graph
from ipu_stack.ir.names import Part, refuse_absent_layers
from ipu_stack.lowering.driver import decode_step, lower_windows
from ipu_stack.lowering.program import Exchange
from ipu_stack.memory.categories import describe, tile_categories
from ipu_stack.memory.placement import Placement, fragmentation, place_storage
from ipu_stack.memory.report import write_memory_profile, write_placement_html
from ipu_stack.memory.support import support_bytes
from ipu_stack.phases.costing import (
    finalist_choices,
    gemm_modes,
    kernel_instances,
    loop_summary,
    memory_summary,
    refined_estimate,
    reuse_fields,
    schedule_program,
    stage_shape,
    to_transfers,
)
from ipu_stack.phases.state import Build
from ipu_stack.planning.fit import (
    MemoryBudget,
    SideBySide,
    fit_plans,
    need,
    planned_bytes,
    planned_cycles,
)
from ipu_stack.planning.gemm import (
    GemmPlan,
    gemm_search,
    lean_col_block,
    resident_bytes,
    transient_bytes,
)
from ipu_stack.planning.repeat import find_layer_loop, loop_fields
from ipu_stack.planning.stages import GemmStage, find_stages, sibling_runs, stage_parts
from ipu_stack.target import timing
from ipu_stack.util.errors import CompileError, PlacementError
from ipu_stack.util.log import event, phase
from ipu_stack.workloads.calibration import cache_folder
from ipu_stack.workloads.footprint import check_fits

LOG = logging.getLogger("ipu_stack.package.build")
TABLE_PHASES = 12
"""The exchange phases a memory profile names for its tile's exchange tables."""
Fields = dict[str, Any]


def build_graph_and_tilings(build: Build) -> Fields:
    """Build the graph, group it into stages and enumerate each GEMM stage's tilings."""
    if "graph" not in build.prepared:
        check_fits(build.workload, build.params, build.options.target, 1)
        cache = Path(build.options.cache_dir) if build.options.cache_dir else None
        with cache_folder(cache):
            build.prepared["graph"], build.prepared["tensors"] = build.workload.build(
                build.params)
        refuse_absent_layers(build.params, (v.name for v in build.prepared["graph"].values))
    graph, tensors = build.prepared["graph"], build.prepared["tensors"]
    build.graph, build.tensors = graph, tensors
    build.all_stages = find_stages(graph)
    build.stages = build.all_stages
    if build.options.share_layers:
        build.loop = find_layer_loop(graph, build.all_stages)
        if build.loop is not None:
            build.stages = build.loop.compact(build.all_stages)
            event(LOG, "found identical layers", **loop_fields(build.loop),
                  planned_stages=len(build.stages), graph_stages=len(build.all_stages))
    searched: dict[str, tuple[list[GemmPlan], list[GemmPlan]]] = {}
    for stage in build.stages:
        if not isinstance(stage, GemmStage):
            build.candidates.append([None])
            build.fronts.append([])
            continue
        shape = stage_shape(graph, stage, int(build.target.tiles_per_shared_exchange_bus)
                            if build.options.paired_exchange else 1)
        key = repr(dataclasses.replace(shape, op=0))  # repeated layers search once
        if key not in searched:
            with phase(LOG, "gemm_candidates", stage=stage.index):
                searched[key] = gemm_search(
                    shape, build.target, keep=build.options.finalists,
                    mode=build.options.gemm_mode,
                    min_col_block=lean_col_block(shape, build.options.lean_table_rows))
        found, front = searched[key]
        if not found:
            raise CompileError(f"no GEMM tiling of stage {stage.index} fits {build.target.name}")
        build.candidates.append([dataclasses.replace(p, shape=shape) for p in found])
        build.fronts.append([dataclasses.replace(p, shape=shape) for p in front])
    return {"stages": len(build.stages)}


def row_stage_bytes(graph: Graph, stage: Any, tiles: int) -> int:
    """A row stage's inputs and output on one tile: whole rows spread over the tiles (the
    stage's per-row parameters, a scale or a shift, are small and left out; a biased
    softmax's tables whose rows repeat are copied beside the scores' rows, so they count
    as many rows as the scores)."""
    out = graph.value(stage.out).type
    rows = -(-out.rows // tiles)
    row = sum(graph.value(v).type.cols * graph.value(v).type.precision.itemsize
              for v in stage.inputs if graph.value(v).type.rows == out.rows
              or stage.kind == "biased_softmax")
    return rows * (row + out.cols * out.precision.itemsize)


def repeats(build: Build) -> list[int]:
    """How many times each planned stage runs (the loop body's once per layer)."""
    if build.loop is None:
        return [1] * len(build.stages)
    return [build.loop.multiplicity(i) for i in range(len(build.stages))]


def body_gemm_stages(build: Build, times: list[int]) -> list[int]:
    """The layer loop body's GEMM stages (those run once per layer), in order: what
    ``body_hints`` and a compile's ``body_plans`` are listed by."""
    return [i for i, (stage, n) in enumerate(zip(build.stages, times, strict=True))
            if n > 1 and isinstance(stage, GemmStage)]


def pin_body_plans(build: Build, times: list[int]) -> bool:
    """Take ``build.body_hints`` as the layer loop body's GEMM plans (the k-th hint for the
    body's k-th GEMM stage), each the only choice its stage has; whether every hint was
    found among its stage's candidates (if not, nothing is pinned).

    Why: pipeline groups run side by side and share the chip's supersteps; a group whose
    layers are planned otherwise than the slowest group's (less memory beside a stem: an MLP
    GEMM in 4 row chunks instead of 3) misaligns every layer's supersteps with it."""
    body = body_gemm_stages(build, times)
    if len(body) != len(build.body_hints):
        return False
    chosen = {}
    for index, hint in zip(body, build.body_hints, strict=True):
        found = [p for p in [*build.candidates[index], *build.fronts[index]]
                 if p is not None and p.describe() == hint]
        if not found:
            return False
        chosen[index] = found[0]
    for index, plan in chosen.items():
        build.candidates[index], build.fronts[index] = [plan], []
    return True


def side_by_side_choice(build: Build, plans: list) -> list[list]:
    """For a decode step, whose sibling GEMM stages run side by side (``lowering.fuse``):
    the first finalist with each run of siblings that together need more than the chip's
    tiles planned on a share of the tiles each, in proportion to its output columns (its
    weights: q against k and v), so that they run on tiles of their own (a finalist of its
    own: the refined estimate of every finalist decides).  None when the program is not a
    decode step or every run fits already."""
    assert build.graph is not None
    pairs = list(zip(build.stages, plans, strict=True))
    if not decode_step(build.graph, pairs):
        return []
    chosen, changed = list(plans), False
    for run in sibling_runs(build.stages):
        if sum(plans[i].tiles_used for i in run) <= build.target.tiles:
            continue
        columns = sum(plans[i].shape.cols for i in run)
        shared = {}
        for i in run:  # an even share each: the grids start on even tiles
            tiles = build.target.tiles * plans[i].shape.cols // columns // 2 * 2
            found, _ = gemm_search(plans[i].shape, build.target.with_tiles(max(tiles, 2)),
                                   keep=1, mode=build.options.gemm_mode)
            if found:
                shared[i] = dataclasses.replace(found[0], shape=plans[i].shape)
        if len(shared) == len(run):  # the whole run, or none of it
            for i, plan in shared.items():
                chosen[i] = plan
            changed = True
    return [chosen] if changed else []


def side_by_side_sharing(build: Build, plans: list) -> SideBySide:
    """The sibling runs a decode step lowers side by side (``lowering.driver``), whose
    weights then need not share a tile; none elsewhere."""
    assert build.graph is not None
    if not build.options.fuse_supersteps or not decode_step(
            build.graph, list(zip(build.stages, plans, strict=True))):
        return SideBySide()
    return SideBySide(tuple(tuple(run) for run in sibling_runs(build.stages)),
                      build.target.tiles)


def choose_fitting_plans(build: Build) -> Fields:
    """Choose finalist plan sets that fit the memory budget (trading cycles for bytes)."""
    assert build.graph is not None
    budget = dataclasses.replace(
        MemoryBudget.for_target(build.target, build.options.memory_proportion,
                                build.options.support_reserve,
                                build.options.interleaved_reserve),
        row_bytes=max((row_stage_bytes(build.graph, s, build.target.tiles)
                       for s in build.stages if not isinstance(s, GemmStage)), default=0))
    build.budget = budget
    times = repeats(build)
    if build.body_hints:
        pinned = pin_body_plans(build, times)
        event(LOG, "took the layer body's plans asked for" if pinned
              else "kept its own layer body plans: a plan asked for is not a candidate",
              stages=len(build.body_hints))
    choices = finalist_choices(build.candidates, build.options.finalists)
    extra = side_by_side_choice(build, choices[0]) if (
        build.options.fuse_supersteps and choices and not build.body_hints) else []
    for number, plans in enumerate(choices + extra):
        try:
            fitted, moves = fit_plans(plans, build.fronts, budget, times,
                                      side_by_side_sharing(build, plans))
        except CompileError as why:
            if number < len(choices):
                raise
            event(LOG, "the side-by-side plans do not fit", reason=str(why))
            continue
        build.traded += moves
        if moves:
            event(LOG, "traded cycles for memory", moves=moves, budget_bytes=budget.bytes,
                  estimated_bytes=need(fitted, times))
        if fitted not in build.finalists:
            build.finalists.append(fitted)
    for index, plans in enumerate(build.finalists):
        event(
            LOG, "retained operator-plan finalist", finalist=index,
            values=len(build.graph.values), operations=len(build.graph.operations),
            estimated_cycles=planned_cycles(plans, times),
            estimated_exchange_cycles=sum(n * p.exchange_cycles for p, n in zip(plans, times, strict=True)
                                          if p),
            resident_bytes=sum(n * resident_bytes(p) for p, n in zip(plans, times, strict=True) if p),
            peak_transient_bytes=max((transient_bytes(p) for p in plans if p), default=0),
            peak_total_bytes=need(plans, times),
            active_tile_counts="{" + ", ".join(str(p.tiles_used) for p in plans if p) + "}",
            plans="[" + "; ".join(p.describe() for p in plans if p) + "]",
        )
    return {"finalists": len(build.finalists)}


def lower_and_schedule_finalists(build: Build) -> Fields:
    """Lower every finalist, schedule its exchanges physically, keep the cheapest.  A
    program fused with its neighbours (``options.fuse_window``) is also lowered unfused: a
    fused phase may schedule above its parts' bounds, so fusion is kept only where the
    estimate of what it schedules is lower (the package's options then say which)."""
    assert build.graph is not None
    options, memo = build.options, build.memo
    best = None
    before = memo.counts() if memo is not None else {}
    phases = 0
    for index, plans in enumerate(build.finalists):
        staged = list(zip(build.stages, plans, strict=True))
        windows = [options.fuse_window]
        if options.fuse_window and options.fuse_supersteps and not decode_step(build.graph,
                                                                                  staged):
            windows.append(0)
        programs = lower_windows(build.graph, staged, build.target, options.paired_exchange,
                                 build.loop, options.fuse_supersteps,
                                 options.lean_table_rows > 0, tuple(windows))
        for window, program in zip(windows, programs, strict=True):
            schedules = schedule_program(program, build.target, memo, options.paired_exchange)
            phases += len(schedules)
            estimate = refined_estimate(plans, program, schedules, build.target, repeats(build))
            event(
                LOG, "scheduled operator-plan finalist", finalist=index, fuse_window=window,
                analytical_cycles=estimate["analytical_cycles"],
                analytical_exchange_cycles=estimate["analytical_exchange_cycles"],
                scheduled_exchange_cycles=estimate["scheduled_exchange_cycles"],
                refined_cycles=estimate["cycles"],
            )
            if best is None or estimate["cycles"] < best[3]["cycles"]:
                best = (index, plans, program, estimate, schedules, window)
    assert best is not None
    selected, build.plans, build.program, build.estimate, build.schedules, window = best
    if window != options.fuse_window:  # the package says how it was lowered
        build.options = dataclasses.replace(options, fuse_window=window)
    event(LOG, "selected physically scheduled operator-plan finalist", selected=selected,
          fuse_window=window)
    return reuse_fields(phases, before, memo)


def list_kernel_instances(build: Build) -> Fields:
    """Every distinct kernel instance the chosen program calls."""
    assert build.program is not None
    event(LOG, "lowered graph for package construction",
          logical_shards=sum(len(b.tiles) for b in build.program.buffers),
          exchange_phases=len(build.program.exchanges()))
    build.instances = kernel_instances(build.program)
    return {"instances": len(build.instances)}


def size_support_memory(build: Build) -> Fields:
    """Support memory per tile: runtime, host code, kernel code and exchange tables."""
    target, program = build.target, build.program
    assert program is not None
    tables = np.zeros(target.tiles, dtype=np.int64)
    by_index = {i: step for _, i, step in program.steps() if isinstance(step, Exchange)}
    build.table_phases = []
    for index, schedule in build.schedules.items():
        phase_tables = table_bytes(schedule, to_transfers(by_index[index], target),
                                   int(target.exchange_table_bytes_per_send),
                                   timing.p("send_words"))
        tables += phase_tables
        build.table_phases.append((by_index[index].name, phase_tables))
    build.support = support_bytes(program, tables, target)
    event(LOG, "allocated package support memory",
          linked_end=target.memory_base + int(target.runtime_support_bytes),
          exchange_table_bytes=int(tables.max()),
          generated_code_bytes=int(build.support["code"].max()),
          support_bytes=int(build.support["total"].max()))
    return {}


def place_buffers(build: Build) -> Fields:
    """Addresses for every buffer by liveness and memory class; on failure the failure
    carries the writing of its reports (:func:`write_failure_reports`)."""
    program, target = build.program, build.target
    assert program is not None
    try:
        build.placement = place_storage(program, build.support["total"], target)
    except PlacementError as failure:
        if build.budget is not None:  # what the next try's memory is sized from
            failure.planned_bytes = planned_bytes(build.plans, repeats(build),
                                                  build.budget.row_bytes)
        if isinstance(failure.placement, Placement) and failure.tile is not None:
            filled = tile_categories(program, failure.placement, build.support, failure.tile)
            failure.args = (f"{failure} (tile {failure.tile} holds {describe(filled)} bytes)",)
            build.filled = filled
        if isinstance(failure.placement, Placement):
            failure.write_reports = functools.partial(write_failure_reports, build, failure)
        raise
    build.waste = fragmentation(build.placement, program, target)
    build.filled = tile_categories(program, build.placement, build.support,
                                   int(np.argmax(build.placement.peak_bytes)))
    event(LOG, "placed storage", peak_tile=int(np.argmax(build.placement.peak_bytes)),
          peak_bytes=int(build.placement.peak_bytes.max()),
          **{f"fragmentation_{k}": v for k, v in build.waste.items()})
    return {}


def write_failure_reports(build: Build, failure: PlacementError) -> None:
    """The memory profile and placement page of a program that did not place, so the user
    can see why it does not fit; written when the compile has no try left (a retry that
    places writes its own), since a tower's page takes seconds and most failures are
    retried."""
    assert build.program is not None and isinstance(failure.placement, Placement)
    tile = failure.tile
    write_memory_profile(build.reports / "memory-profile.json", build.program,
                         failure.placement, build.target, scope="failed",
                         filled=None if tile is None else (tile, build.filled),
                         tables=None if tile is None else (tile, tables_by_phase(build, tile)))
    write_placement_html(build.reports / "placement.html", build.program, failure.placement,
                         build.support, build.target,
                         title=f"{_title(build)} (failed: {failure})", parts=_parts(build))


def tables_by_phase(build: Build, tile: int, most: int = TABLE_PHASES) -> list[list]:
    """The exchange phases whose tables take the most of ``tile``'s memory, ``[name,
    bytes]`` most first: where a tile short of memory could win it back (a phase of many
    small transfers costs a table entry for each)."""
    ranked = sorted(((int(found[tile]), name) for name, found in build.table_phases
                     if found[tile]), key=lambda item: (-item[0], item[1]))
    return [[name, size] for size, name in ranked[:most]]


def write_memory_reports(build: Build) -> Fields:
    """The planner memory profile (JSON) and the exact tile placement (HTML)."""
    assert build.program is not None and build.placement is not None
    fullest = int(np.argmax(build.placement.peak_bytes))
    build.profile = write_memory_profile(
        build.reports / "memory-profile.json", build.program, build.placement, build.target,
        scope="final", filled=(fullest, build.filled),
        tables=(fullest, tables_by_phase(build, fullest)))
    write_placement_html(build.reports / "placement.html", build.program, build.placement,
                         build.support, build.target, title=_title(build), parts=_parts(build))
    return {}


def emit_device_program(build: Build) -> Fields:
    """Tile programs, exchange tables and host streams at their placed addresses."""
    assert build.program is not None and build.placement is not None
    event(LOG, "costed final placed program", final_cycles=build.estimate["cycles"],
          final_exchange=build.estimate["scheduled_exchange_cycles"])
    build.device_program = emit_program(build.program, build.placement, build.schedules,
                                        build.target)
    build.fragment, build.arrays = to_manifest(build.device_program)
    return {}


def write_package(build: Build) -> Fields:
    """``model.ipuexe``: the manifest (plans, modes, estimate, memory) and the arrays."""
    assert build.program is not None and build.placement is not None
    workload, params = build.workload, build.params
    manifest = {
        "workload": {"name": workload.name, "identifier": workload.identifier(params),
                     "params": params},
        "options": build.options.to_json(),
        "tensors": build.program.tensors,
        "estimate": build.estimate,
        "plans": [p.describe() for p in build.plans if p],
        "parts": [[index, *part.to_json()] for index, part in sorted(_parts(build).items())],
        "gemm_modes": gemm_modes(build.stages, build.plans, build.loop),
        "layer_loop": loop_summary(build.program, build.placement),
        "memory": {**memory_summary(build.placement, build.support, build.target, build.waste),
                   "effective_peak_bytes": int(build.profile["effective_peak_bytes"]),
                   "peak_tile_by_category": build.filled},
        **build.fragment,
    }
    build.package = Path(build.out_dir) / "model.ipuexe"
    event(LOG, "writing application package", tiles=build.target.tiles)
    packaging.write_package(build.package, target=build.target.name, compiler_version=__version__,
                  manifest=manifest, arrays=build.arrays)
    event(LOG, "application package written", path=str(build.package))
    return {}


def _parts(build: Build) -> dict[int, Part]:
    """The model part of each stage the program was lowered from (``ir.names``)."""
    assert build.graph is not None
    return stage_parts(build.graph, build.stages)


def _title(build: Build) -> str:
    return f"{build.workload.identifier(build.params)} tile placement"
