"""The compiler: an ordered list of named stages, each timed and logged in the reference's words.

``STAGES`` is the whole compile, in order: construct_mid (graph, stages, gemm_candidates) ->
lower_mid (finalists) -> select_finalist (lower and physically schedule each finalist's
exchanges, keep the cheapest) -> plan_kernels -> size_tile_code ->
place_storage -> write_memory_reports -> emit_tile_code -> write_package.  Each stage is a
function of the :class:`~ipu_stack.phases.state.Build` record (``ipu_stack.phases.stages``);
only this module chains them.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ipu_stack.exchange import ScheduleMemo, ScheduleStore
from ipu_stack.phases import stages as phases
from ipu_stack.phases.costing import (
    refined_estimate,
    schedule_program,
    stage_shape,
    superstep_estimates,
    to_transfers,
)
from ipu_stack.phases.dump import dump_stage
from ipu_stack.phases.state import Build, CompileOptions, CompileResult
from ipu_stack.planning.fit import planned_cycles, usable_bytes
from ipu_stack.util.errors import PlacementError
from ipu_stack.util.heap import keep_freed_memory
from ipu_stack.util.log import event, phase
from ipu_stack.workloads.base import Workload

__all__ = ["STAGES", "CompileOptions", "CompileResult", "compile_workload", "plan_workload",
           "refined_estimate",
           "schedule_program", "stage_shape", "to_transfers"]

LOG = logging.getLogger("ipu_stack.package.build")

STAGES: tuple[tuple[str, Callable[[Build], dict[str, Any]]], ...] = (
    ("construct_mid", phases.construct_mid),
    ("lower_mid", phases.lower_mid),
    ("select_finalist", phases.select_finalist),
    ("plan_kernels", phases.plan_kernels),
    ("size_tile_code", phases.size_tile_code),
    ("place_storage", phases.place_storage_stage),
    ("write_memory_reports", phases.write_memory_reports),
    ("emit_tile_code", phases.emit_tile_code),
    ("write_package", phases.write_package_stage),
)

PLANNED = [name for name, _ in STAGES].index("lower_mid") + 1  # plans chosen, not lowered
PLACED = [name for name, _ in STAGES].index("place_storage") + 1  # placed, nothing written
MIN_PROPORTION = 0.45
# a placement failure plans again for the planner's estimate of the failed plans less what
# placement found no room for and this margin (a share of the tile bytes the planner plans
# for): the estimate misses support memory that grows with the program, and fragmentation
RETRY_MARGIN = 0.005
# ... and at least this much less, doubled with every failed try, so a retry never repeats
# the failed choice and a program that keeps failing reaches the floor in a few tries
MIN_RETRY_STEP = 0.005
# the room a placed program leaves on its fullest tile is planned for again when it is at
# least SLACK_MIN bytes, less SLACK_MARGIN (other plans bring other exchange tables and code),
# and the new plans are placed only if estimated SLACK_GAIN faster
SLACK_MIN = 8 * 1024
SLACK_MARGIN = 4 * 1024
SLACK_GAIN = 0.002


def retry_proportion(failure: PlacementError, proportion: float, usable: int,
                     tries: int = 1) -> float:
    """The memory proportion of the next try after the ``tries``-th failure (``failure``,
    at ``proportion``): sized by the bytes placement could not place, so a tile 128 bytes
    short gives up a little memory (and keeps its fast plans) while a tile 100 KB short jumps
    at once."""
    wanted = proportion - MIN_RETRY_STEP * 2 ** (tries - 1)
    if failure.planned_bytes:
        wanted = min(wanted, (failure.planned_bytes - failure.shortfall) / usable
                     - RETRY_MARGIN)
    return math.floor(wanted * 1000) / 1000


def compile_workload(
    workload: Workload,
    params: dict[str, Any],
    out_dir: Path,
    options: CompileOptions | None = None,
    min_proportion: float | None = None,
    body_hints: tuple[str, ...] = (),
) -> CompileResult:
    """Compile ``workload`` with ``params`` into ``out_dir/model.ipuexe``.

    The planner's memory estimate cannot see support memory (exchange tables grow with the
    program) or fragmentation exactly, so when placement fails the compile is planned again
    for less of tile memory (:func:`retry_proportion`), down to ``MIN_PROPORTION`` (or
    ``min_proportion``), which gets the last try.  When it places with room to spare, the
    room is planned for once more (:func:`_into_slack`).  One schedule memo serves every
    attempt: most phases of a retry are the ones the failed attempt already scheduled.
    ``body_hints``: the layer loop body's GEMM plans to take where its stages have them
    (:func:`~ipu_stack.phases.stages.pin_body_plans`).  ``options.slack``: whether the room
    is planned for.
    """
    options = options or CompileOptions()
    keep_freed_memory()
    memo = None
    if options.reuse_schedules:
        store = None
        if options.exchange_cache and options.cache_dir:
            store = ScheduleStore(Path(options.cache_dir))
        memo = ScheduleMemo(store)
    proportion = options.memory_proportion
    floor = MIN_PROPORTION if min_proportion is None else min_proportion
    usable = usable_bytes(options.machine(), options.support_reserve)
    prepared: dict[str, Any] = {}
    start = time.perf_counter()
    tries = 0
    dump = Path(options.dump_stages) if options.dump_stages else None
    while True:
        build = Build(workload, params, Path(out_dir),
                      dataclasses.replace(options, memory_proportion=proportion),
                      options.machine(), memo, prepared, body_hints)
        try:
            _run_stages(build, 0, PLACED, dump)
            break
        except PlacementError as failure:
            tries += 1
            if proportion <= floor:
                raise
            # the last try is at the floor
            proportion = max(retry_proportion(failure, proportion, usable, tries), floor)
            event(LOG, "placement failed, planning again with less memory", level=logging.WARNING,
                  reason=str(failure), short_bytes=failure.shortfall,
                  planned_bytes=failure.planned_bytes, memory_proportion=proportion)
    # the room left is planned for where the plans are the ones asked for (no retry, the
    # whole memory, the layer body not pinned to another program's plans) and leaner than
    # the fastest: only then can more memory buy cycles
    if options.slack and tries == 0 and proportion == 1.0 and not body_hints and build.traded:
        build = _into_slack(build, dump)
    _run_stages(build, PLACED, len(STAGES), dump)
    result = _result(build)
    result.timings["compile"] = time.perf_counter() - start  # every attempt
    return result


def _into_slack(build: Build, dump: Path | None) -> Build:
    """The compile planned again for the room its placement left, where that is faster.

    The planner leaves ``support_reserve`` bytes of a tile for support memory (code,
    exchange tables, carried activations), an assumption made before any program exists.
    Once the program is placed, the fullest tile's free bytes are measured: where they are
    ``SLACK_MIN`` or more, the plans are fitted again with that room (less ``SLACK_MARGIN``,
    since other plans bring other exchange tables), that is with a smaller reserve.  Only
    when the new plans are estimated at least ``SLACK_GAIN`` faster are they lowered,
    scheduled and placed; they are taken when they place and their scheduled estimate is
    lower.  Otherwise the first build stands, and nothing of the trial reaches the output
    folder."""
    assert build.placement is not None and build.budget is not None
    target, options = build.target, build.options
    tile = target.memory_end - target.memory_base
    slack = tile - int(build.placement.peak_bytes.max())
    if slack < SLACK_MIN:
        return build
    wanted = build.budget.bytes + slack - SLACK_MARGIN
    reserve = max(0, tile - wanted)
    trial = Build(build.workload, build.params, build.out_dir,
                  dataclasses.replace(options, support_reserve=reserve), target, build.memo,
                  build.prepared, build.body_hints)
    _run_stages(trial, 0, PLANNED, None)
    before, after = _analytical(build), _analytical(trial)
    fields = {"slack_bytes": slack, "support_reserve": reserve,
              "budget_bytes": trial.budget.bytes if trial.budget else 0,
              "estimated_cycles": after, "first_estimated_cycles": before}
    if after > before * (1 - SLACK_GAIN):
        event(LOG, "kept the first plans: the placed slack plans no faster", **fields)
        return build
    try:
        _run_stages(trial, PLANNED, PLACED, None)
    except PlacementError as failure:
        event(LOG, "kept the first plans: the plans for the placed slack do not place",
              reason=str(failure), **fields)
        return build
    fields.update(final_cycles=trial.estimate["cycles"],
                  first_final_cycles=build.estimate["cycles"])
    if trial.estimate["cycles"] >= build.estimate["cycles"]:
        event(LOG, "kept the first plans: the placed slack schedules no faster", **fields)
        return build
    event(LOG, "planned again into the placed slack", **fields)
    if dump is not None:
        _dump(trial, 0, PLACED, dump)
    return trial


def _analytical(build: Build) -> int:
    """The best finalist's analytical GEMM cycles."""
    times = phases.repeats(build)
    return min(planned_cycles(plans, times) for plans in build.finalists)


def _run_stages(build: Build, first: int, end: int, dump: Path | None) -> None:
    """``STAGES[first:end]`` on ``build``, each timed and logged (and dumped to ``dump``)."""
    if dump is not None:
        dump.mkdir(parents=True, exist_ok=True)
    for number, (name, stage) in enumerate(STAGES[first:end], start=first + 1):
        with phase(LOG, name) as fields:
            fields.update(stage(build))
        if dump is not None:
            _dump(build, number - 1, number, dump)


def _dump(build: Build, first: int, end: int, dump: Path) -> None:
    for number in range(first + 1, end + 1):
        written = dump_stage(dump, number, STAGES[number - 1][0], build)
        if written is not None:
            event(LOG, "dumped stage artifact", stage=STAGES[number - 1][0], path=str(written))


def plan_workload(workload: Workload, params: dict[str, Any], options: CompileOptions,
                  prepared: dict[str, Any] | None = None) -> dict[str, int]:
    """Only the planning stages (construct_mid, lower_mid): whether the plans fit the
    memory budget (a :class:`CompileError` if not) and their analytical GEMM cycles, for a
    choice between layouts that would cost a whole compile each."""
    build = Build(workload, params, Path("."), options, options.machine(), None,
                  prepared if prepared is not None else {})
    _run_stages(build, 0, PLANNED, None)
    return {"gemm_cycles": planned_cycles(build.finalists[0], phases.repeats(build))}


def _result(build: Build) -> CompileResult:
    """What a compile that ran every stage hands back."""
    assert build.package is not None and build.graph is not None
    assert build.program is not None and build.placement is not None
    active = np.unique(np.concatenate([b.tiles for b in build.program.buffers]))
    kinds, cycles, names = superstep_estimates(build.program, build.schedules, build.target)
    return CompileResult(
        package=build.package, graph=build.graph, tensors=build.tensors,
        estimate=build.estimate, timings={},
        plans=[p.describe() for p in build.plans if p],
        body_plans=[plan.describe() for i in phases.body_gemm_stages(build, phases.repeats(build))
                    if (plan := build.plans[i]) is not None],
        peak_bytes=int(build.placement.peak_bytes.max()), active_tiles=len(active),
        device_program=build.device_program, superstep_kinds=kinds, superstep_cycles=cycles,
        superstep_names=names,
    )
