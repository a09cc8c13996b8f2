"""The compiler: named stages in three steps, each stage timed and logged in the reference's words.

A stage is a function of the :class:`~ipu_stack.phases.state.Build` record
(``ipu_stack.phases.stages``), named for what it does; its ``logged_as`` is the phase name
the reference logs (``phase=place_storage``), which the log lines and the ``--dump-stages``
files keep.  The stages run in three steps, each with a typed result:

* :func:`plan` (build_graph_and_tilings, choose_fitting_plans): the finalist plans that fit
  the memory budget, a :class:`~ipu_stack.phases.state.Planned`;
* :func:`lower_and_place` (lower_and_schedule_finalists, list_kernel_instances,
  size_support_memory, place_buffers): the chosen program, scheduled and placed, a
  :class:`~ipu_stack.phases.state.Placed`;
* :func:`emit` (write_memory_reports, emit_device_program, write_package): the written
  package, an :class:`~ipu_stack.phases.state.Emitted`.

The steps are apart because the compile repeats the first two (a placement that fails is
planned again for less memory; one with room to spare, for that room) and writes only once.
Between stages the lowered program and the placement are verified when
``CompileOptions.verify_stages`` is set or the environment sets ``IPU_STACK_VERIFY_STAGES``
(``lowering.verify``, ``memory.verify``).  Only this module chains the stages.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ipu_stack.exchange import ScheduleMemo, ScheduleStore
from ipu_stack.lowering.driver import decode_step
from ipu_stack.lowering.verify import verify_program
from ipu_stack.memory.placement import Placement
from ipu_stack.memory.verify import verify_placement
from ipu_stack.phases import stages as phases
from ipu_stack.phases.costing import (
    refined_estimate,
    schedule_program,
    stage_shape,
    superstep_estimates,
    to_transfers,
)
from ipu_stack.phases.dump import dump_stage
from ipu_stack.phases.state import (
    Build,
    CompileOptions,
    CompileResult,
    Emitted,
    Placed,
    Planned,
)
from ipu_stack.planning.fit import DoesNotFit, usable_bytes
from ipu_stack.planning.gemm import lean_col_block
from ipu_stack.planning.stages import GemmStage, find_stages
from ipu_stack.util.errors import CompileError, PlacementError
from ipu_stack.util.heap import keep_freed_memory
from ipu_stack.util.log import event, phase
from ipu_stack.workloads.base import Workload

__all__ = ["EMITTING", "LOWERING", "PLANNING", "STAGES", "VERIFY_ENV", "CompileOptions",
           "CompileResult", "CompileStage", "Emitted", "Placed", "Planned", "compile_workload",
           "emit", "lower_and_place", "plan", "plan_workload", "refined_estimate",
           "schedule_program", "stage_shape", "to_transfers", "verifying"]

LOG = logging.getLogger("ipu_stack.package.build")
VERIFY_ENV = "IPU_STACK_VERIFY_STAGES"  # set to 1: verify between stages, whatever the options


@dataclasses.dataclass(frozen=True)
class CompileStage:
    """One stage: ``name`` says what it does, ``logged_as`` is the reference's phase name
    (the ``phase=`` of its log line and the name of its ``--dump-stages`` file), ``run``
    sets its artifact on the build and returns its log line's extra fields, and ``verify``
    (when set) checks that artifact before the next stage reads it."""

    name: str
    logged_as: str
    run: Callable[[Build], dict[str, Any]]
    verify: Callable[[Build, str], None] | None = None

    @property
    def number(self) -> int:
        """Its place in the compile, from 1 (the ``NN`` of its dump file)."""
        return STAGES.index(self) + 1


def _verify_lowered(build: Build, where: str) -> None:
    assert build.program is not None
    verify_program(build.program, build.target, where)


def _verify_placed(build: Build, where: str) -> None:
    assert build.program is not None and build.placement is not None
    verify_placement(build.program, build.placement, build.target, where)


PLANNING = (
    CompileStage("build_graph_and_tilings", "construct_mid", phases.build_graph_and_tilings),
    CompileStage("choose_fitting_plans", "lower_mid", phases.choose_fitting_plans),
)
LOWERING = (
    CompileStage("lower_and_schedule_finalists", "select_finalist",
                 phases.lower_and_schedule_finalists, _verify_lowered),
    CompileStage("list_kernel_instances", "plan_kernels", phases.list_kernel_instances),
    CompileStage("size_support_memory", "size_tile_code", phases.size_support_memory),
    CompileStage("place_buffers", "place_storage", phases.place_buffers, _verify_placed),
)
EMITTING = (
    CompileStage("write_memory_reports", "write_memory_reports", phases.write_memory_reports),
    CompileStage("emit_device_program", "emit_tile_code", phases.emit_device_program),
    CompileStage("write_package", "write_package", phases.write_package),
)
STAGES = PLANNING + LOWERING + EMITTING

MIN_PROPORTION = 0.45
# a placement failure plans again for the planner's estimate of the failed plans less what
# placement found no room for and this margin (a share of the tile bytes the planner plans
# for): the estimate misses support memory that grows with the program, and fragmentation
RETRY_MARGIN = 0.005
# ... and at least this much less, doubled with every failed try, so a retry never repeats
# the failed choice and a program that keeps failing reaches the floor in a few tries; but
# one of the first NEAR_MISS_TRIES tries that missed by at most NEAR_MISS bytes steps back
# by MIN_RETRY_STEP only: plans that all but fit keep their speed (Swin-L at F16 misses by
# 32 bytes on its second try; the doubled step cost it 1 %)
MIN_RETRY_STEP = 0.005
NEAR_MISS = 1024
NEAR_MISS_TRIES = 3
# the room a placed program leaves on its fullest tile is planned for again when it is at
# least SLACK_MIN bytes, less SLACK_MARGIN (other plans bring other exchange tables and code),
# and the new plans are placed only if estimated SLACK_GAIN faster
SLACK_MIN = 8 * 1024
SLACK_MARGIN = 4 * 1024
SLACK_GAIN = 0.002
# a side-by-side decode step short of interleaved memory plans for this much less of it a
# try, up to the most (then for less memory in all, as any program)
INTERLEAVED_RESERVE_STEP = 8 * 1024
INTERLEAVED_RESERVE_MOST = 32 * 1024
# a compile whose plans did not place also runs its tries with GEMMs of more rows than
# this in column blocks 32 wide at least (``CompileOptions.lean_table_rows``,
# :meth:`Tries.leaner`): exchange tables are support memory the planner does not count, and
# a row's columns split over narrow blocks move in many small transfers (Swin-L's stage 1,
# 9,216 rows a GEMM).  Assumed; Swin-L F16 places (gathers as unicasts) at 5,087,364 cycles
# with every GEMM held to 32 columns, 5,058,155 over 500 rows, 4,955,319 over 1,000,
# 4,945,595 over 3,000
LEAN_TABLE_ROWS = 1000


def retry_proportion(failure: PlacementError, proportion: float, usable: int,
                     tries: int = 1) -> float:
    """The memory proportion of the next try after the ``tries``-th failure (``failure``,
    at ``proportion``): sized by the bytes placement could not place, so a tile 128 bytes
    short gives up a little memory (and keeps its fast plans, ``NEAR_MISS``) while a tile
    100 KB short jumps at once."""
    near = 0 < failure.shortfall <= NEAR_MISS and tries <= NEAR_MISS_TRIES
    wanted = proportion - MIN_RETRY_STEP * 2 ** (0 if near else tries - 1)
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
    room is planned for once more (:func:`_into_slack`).  Plans that did not place are also
    tried with fewer exchange transfers (:meth:`Tries.leaner`), and the faster placed
    program is kept.  One schedule memo serves every attempt: most phases of a retry are
    the ones the failed attempt already scheduled.
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
    prepared: dict[str, Any] = {}
    start = time.perf_counter()
    dump = Path(options.dump_stages) if options.dump_stages else None
    floor = MIN_PROPORTION if min_proportion is None else min_proportion
    tried = Tries(workload, params, Path(out_dir), memo, prepared, body_hints, floor)
    build, planned, placed, attempt = tried.place(options, dump)
    # plans that did not place are tried again with fewer exchange transfers (a capacity
    # probe's only where nothing placed: it asks only whether the model fits)
    if attempt.placement_failed and not options.lean_table_rows and not body_hints and \
            (options.slack or build is None):
        build, planned, placed, attempt = tried.leaner(options, (build, planned, placed, attempt),
                                                       dump)
    if build is None or planned is None or placed is None:
        assert attempt.failure is not None
        raise attempt.failure
    options, tries, proportion = attempt.options, attempt.tries, attempt.proportion
    # the room left is planned for where the plans are the ones asked for (no retry, the
    # whole memory, the layer body not pinned to another program's plans) and leaner than
    # the fastest: only then can more memory buy cycles
    if options.slack and tries == 0 and proportion == 1.0 and not body_hints and planned.traded:
        build = _into_slack(build, planned, placed, dump)
    emit(build, dump)
    result = _result(build)
    result.timings["compile"] = time.perf_counter() - start  # every attempt
    return result


@dataclasses.dataclass
class Attempts:
    """A compile's tries: the options and memory proportion of the next one, after each
    failure (:meth:`after`)."""

    options: CompileOptions
    proportion: float
    floor: float
    usable: int
    tries: int = 0  # placement failures answered with less memory
    placement_failed: bool = False  # any try's plans did not place
    failure: CompileError | None = None  # why the last try failed, when nothing was left
    failed_bytes: int = 1 << 62  # what the last plans that did not place planned a tile
    leanest: bool = False  # this try plans for the leanest plans' bytes
    # whether the leanest plans are tried at all: not where another chain already placed
    # (the leanest plans are the slowest; they could only lose to it)
    leanest_wanted: bool = True

    def after(self, failure: CompileError, build: Build) -> None:
        """The next try after ``failure``: a side-by-side decode step short of interleaved
        memory plans for a little less of it (``INTERLEAVED_RESERVE_STEP`` at a time, up to
        ``INTERLEAVED_RESERVE_MOST``), else it is lowered one stage after another from the
        memory asked for; any program then plans for less memory in all
        (:func:`retry_proportion`) down to the floor, and where that leaves no plan, for
        the leanest plans, once; where those or the floor do not place a program fused with
        its neighbours, the compile starts over unfused.  Raises ``failure`` when nothing is
        left to try (where the leanest plans did not place, an error that says by how
        much)."""
        options = self.options
        placing = isinstance(failure, PlacementError)
        self.placement_failed |= placing
        # a side-by-side decode step that did not place, now or on an earlier try (which
        # left it planning for less interleaved memory)
        side_by_side = options.fuse_supersteps and (options.interleaved_reserve > 0 or (
            placing and bool(build.plans) and decode_step(
                build.graph, list(zip(build.stages, build.plans, strict=True)))))
        if side_by_side and placing and failure.interleaved and \
                options.interleaved_reserve < INTERLEAVED_RESERVE_MOST:
            # side by side, one stage's weights share tiles with its siblings'
            self.options = dataclasses.replace(options, interleaved_reserve=min(
                INTERLEAVED_RESERVE_MOST, options.interleaved_reserve
                + max(INTERLEAVED_RESERVE_STEP, 2 * failure.shortfall)))
            event(LOG, "planning again with less interleaved memory: the side-by-side "
                  "decode step did not place", reason=str(failure),
                  interleaved_reserve=self.options.interleaved_reserve)
            return
        if side_by_side:  # grids side by side overlap where one after another they would not
            self.options = dataclasses.replace(options, fuse_supersteps=False,
                                               interleaved_reserve=0)
            self.proportion, self.tries = options.memory_proportion, 0
            self.failed_bytes, self.leanest = 1 << 62, False
            event(LOG, "lowering one stage after another: the side-by-side decode step "
                  "did not place", reason=str(failure))
            return
        # where the fused chain is spent (the leanest plans, or the floor, did not place a
        # fused program), the compile starts over unfused: steps fused with their
        # neighbours keep buffers alive together (``lowering.fuse.NEIGHBOUR_WINDOW``)
        if placing and getattr(build, "options", options).fuse_window and not side_by_side \
                and (self.leanest or self.proportion <= self.floor):
            self.options = dataclasses.replace(options, fuse_window=0)
            self.proportion, self.tries = options.memory_proportion, 0
            self.failed_bytes, self.leanest = 1 << 62, False
            event(LOG, "lowering without fusing neighbouring supersteps: the fused programs "
                  "did not place", reason=str(failure))
            return
        if placing and self.leanest:
            raise leanest_did_not_place(failure, build)
        if isinstance(failure, DoesNotFit) and self.placement_failed and self.leanest_wanted:
            # less memory left no plan: the leanest plans are what is left to try, where
            # they are leaner than the plans that did not place
            leanest = math.ceil(failure.leanest_bytes / self.usable * 1000) / 1000
            if self.proportion < leanest and failure.leanest_bytes < self.failed_bytes:
                self.proportion, self.leanest = leanest, True
                event(LOG, "planning for the leanest plans: less memory leaves no plan",
                      leanest_bytes=failure.leanest_bytes, memory_proportion=leanest)
                return
        if not placing or self.proportion <= self.floor:
            raise failure
        self.tries += 1
        self.failed_bytes = failure.planned_bytes or int(self.proportion * self.usable)
        # the last try is at the floor
        self.proportion = max(retry_proportion(failure, self.proportion, self.usable,
                                               self.tries), self.floor)
        event(LOG, "planning again with less memory: the plans did not place",
              reason=str(failure), short_bytes=failure.shortfall,
              planned_bytes=failure.planned_bytes, memory_proportion=self.proportion)


def leanest_did_not_place(failure: PlacementError, build: Build) -> CompileError:
    """Why a program does not fit when even its leanest plans do not place: how many tiles
    the support memory the planner does not count (exchange tables, code) pushes over, and
    by how much, beside what the first tile that failed holds."""
    planned = f"about {failure.planned_bytes} bytes a tile: " if failure.planned_bytes else ""
    over = ""
    placement = failure.placement
    if isinstance(placement, Placement):
        capacity = build.target.memory_end - build.target.memory_base
        excess = placement.peak_bytes - capacity
        if (excess > 0).any():
            over = (f"{int((excess > 0).sum())} tiles need up to {int(excess.max())} bytes "
                    "more than a tile holds at their peak; ")
    return CompileError(f"does not fit: the leanest plans ({planned}weights and the largest "
                        f"stage's operands and partials) do not place: {over}{failure} (use "
                        "fewer layers or a smaller batch)")


Tried = tuple[Build | None, Planned | None, Placed | None, Attempts]
"""A chain of tries: the placed build, its plans and placement (``None`` where nothing
placed), and the attempts that led there."""


@dataclasses.dataclass
class Tries:
    """One compile's chains of tries, sharing the prepared graph and the schedule memo."""

    workload: Workload
    params: dict[str, Any]
    out_dir: Path
    memo: ScheduleMemo | None
    prepared: dict[str, Any]
    body_hints: tuple[str, ...]
    floor: float

    def place(self, options: CompileOptions, dump: Path | None, leanest: bool = True,
              reports: bool = True) -> Tried:
        """Plan, lower and place with ``options``, trying again as :class:`Attempts` says
        when the plans do not place; where nothing is left to try, no build and the
        attempts with their last failure (``leanest``: whether the leanest plans are
        tried where less memory leaves no plan; ``reports``: whether the last program that
        did not place then writes its memory reports)."""
        attempt = Attempts(options, options.memory_proportion, self.floor,
                           usable_bytes(options.machine(), options.support_reserve),
                           leanest_wanted=leanest)
        unplaced: PlacementError | None = None  # the last program that did not place
        while True:
            build = Build(self.workload, self.params, self.out_dir,
                          dataclasses.replace(attempt.options,
                                              memory_proportion=attempt.proportion),
                          options.machine(), self.memo, self.prepared, self.body_hints)
            try:
                planned = plan(build, dump)
                return build, planned, lower_and_place(build, dump), attempt
            except CompileError as failure:
                if isinstance(failure, PlacementError):
                    unplaced = failure
                try:
                    attempt.after(failure, build)  # the next try's options, or raises
                except CompileError as last:
                    attempt.failure = last
                    if reports and unplaced is not None and unplaced.write_reports is not None:
                        unplaced.write_reports()  # why the last that did not place failed
                    return None, None, None, attempt

    def leaner(self, options: CompileOptions, first: Tried, dump: Path | None) -> Tried:
        """The compile's tries again for fewer exchange transfers: the big GEMMs in wide
        column blocks (``LEAN_TABLE_ROWS``) and all-gathers among many peers kept as
        multicasts (``lowering.gemm_stage.MULTICAST_GATHER_PEERS``), kept where they place
        and schedule faster than ``first`` (or where ``first`` did not place).

        Why: exchange tables are support memory the fitter does not count, so plans that
        did not place were planned for less memory, which costs cycles everywhere; fewer,
        larger transfers may buy back more than they cost.  Which way it goes depends on
        the model (Swin-L F16 batch 1: 4,931,705 cycles against 5,160,951; FP8 batch 2 keeps
        the first chain), so both are placed and the faster is taken."""
        graph = self.prepared.get("graph")
        if graph is None or not any(
                lean_col_block(stage_shape(graph, stage), LEAN_TABLE_ROWS)
                for stage in find_stages(graph) if isinstance(stage, GemmStage)):
            return first  # no GEMM whose column blocks the lean plans would widen
        # its failure never writes the reports: the first chain's program is emitted (and
        # writes its own) or its failure is the one raised (and wrote them)
        lean = self.place(dataclasses.replace(options, lean_table_rows=LEAN_TABLE_ROWS), None,
                          leanest=first[2] is None, reports=False)
        _, _, placed, _ = first
        _, _, lean_placed, lean_attempt = lean
        if lean_placed is None:
            event(LOG, "kept the first plans: with fewer exchange transfers they do not place",
                  reason=str(lean_attempt.failure))
            return first
        fields = {"estimated_cycles": lean_placed.estimate["cycles"],
                  "first_estimated_cycles": None if placed is None
                  else placed.estimate["cycles"], "lean_table_rows": LEAN_TABLE_ROWS}
        if placed is not None and placed.estimate["cycles"] <= lean_placed.estimate["cycles"]:
            event(LOG, "kept the first plans: with fewer exchange transfers they schedule no "
                  "faster", **fields)
            return first
        event(LOG, "took the plans with fewer exchange transfers", **fields)
        if dump is not None and lean[0] is not None:
            for stage in PLANNING + LOWERING:
                _dump(lean[0], stage, dump)
        return lean


def _into_slack(build: Build, planned: Planned, placed: Placed, dump: Path | None) -> Build:
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
    target, options = build.target, build.options
    tile = target.memory_end - target.memory_base
    slack = tile - placed.peak_bytes
    if slack < SLACK_MIN:
        return build
    wanted = planned.budget.bytes + slack - SLACK_MARGIN
    reserve = max(0, tile - wanted)
    trial = Build(build.workload, build.params, build.out_dir,
                  dataclasses.replace(options, support_reserve=reserve), target, build.memo,
                  build.prepared, build.body_hints)
    replanned = plan(trial, None)
    before, after = planned.best_cycles(), replanned.best_cycles()
    fields = {"slack_bytes": slack, "support_reserve": reserve,
              "budget_bytes": replanned.budget.bytes,
              "estimated_cycles": after, "first_estimated_cycles": before}
    if after > before * (1 - SLACK_GAIN):
        event(LOG, "kept the first plans: the placed slack plans no faster", **fields)
        return build
    try:
        replaced = lower_and_place(trial, None)
    except PlacementError as failure:
        event(LOG, "kept the first plans: the plans for the placed slack do not place",
              reason=str(failure), **fields)
        return build
    fields.update(final_cycles=replaced.estimate["cycles"],
                  first_final_cycles=placed.estimate["cycles"])
    if replaced.estimate["cycles"] >= placed.estimate["cycles"]:
        event(LOG, "kept the first plans: the placed slack schedules no faster", **fields)
        return build
    event(LOG, "planned again into the placed slack", **fields)
    if dump is not None:
        for stage in PLANNING + LOWERING:
            _dump(trial, stage, dump)
    return trial


def plan(build: Build, dump: Path | None = None) -> Planned:
    """Build the graph and choose the finalist plans that fit the memory budget."""
    _run_stages(build, PLANNING, dump)
    assert build.budget is not None
    return Planned(tuple(tuple(plans) for plans in build.finalists), build.budget,
                   build.traded, tuple(phases.repeats(build)))


def lower_and_place(build: Build, dump: Path | None = None) -> Placed:
    """Lower and schedule the planned finalists, keep the cheapest, size its support memory
    and place its buffers (a :class:`PlacementError` when they do not fit)."""
    _run_stages(build, LOWERING, dump)
    assert build.program is not None and build.placement is not None
    return Placed(tuple(build.plans), build.program, build.schedules, build.estimate,
                  build.support, build.placement)


def emit(build: Build, dump: Path | None = None) -> Emitted:
    """Write the memory reports, emit the device program and write the package."""
    _run_stages(build, EMITTING, dump)
    assert build.package is not None and build.device_program is not None
    return Emitted(build.package, build.device_program)


def verifying(options: CompileOptions) -> bool:
    """Whether the stage verifiers run: ``options.verify_stages``, or ``VERIFY_ENV`` set to
    anything but empty or 0 (so a test suite verifies every compile it makes)."""
    return options.verify_stages or os.environ.get(VERIFY_ENV, "") not in ("", "0")


def _run_stages(build: Build, stages: tuple[CompileStage, ...], dump: Path | None) -> None:
    """``stages`` on ``build`` in order, each timed and logged under its reference name,
    verified where it has a verifier and verifying is on (:func:`verifying`), and dumped to
    ``dump``."""
    if dump is not None:
        dump.mkdir(parents=True, exist_ok=True)
    verify = verifying(build.options)
    for stage in stages:
        with phase(LOG, stage.logged_as) as fields:
            fields.update(stage.run(build))
        if verify and stage.verify is not None:
            stage.verify(build, f"after stage {stage.name} ({stage.logged_as})")
        if dump is not None:
            _dump(build, stage, dump)


def _dump(build: Build, stage: CompileStage, dump: Path) -> None:
    written = dump_stage(dump, stage.number, stage.name, stage.logged_as, build)
    if written is not None:
        event(LOG, "dumped stage artifact", stage=stage.logged_as, path=str(written))


def plan_workload(workload: Workload, params: dict[str, Any], options: CompileOptions,
                  prepared: dict[str, Any] | None = None) -> dict[str, int]:
    """Only :func:`plan` (build_graph_and_tilings, choose_fitting_plans): whether the plans
    fit the memory budget (a :class:`CompileError` if not) and their analytical GEMM cycles,
    for a choice between layouts that would cost a whole compile each."""
    build = Build(workload, params, Path("."), options, options.machine(), None,
                  prepared if prepared is not None else {})
    return {"gemm_cycles": plan(build).cycles(0)}


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
        body_plans=[chosen.describe()
                    for i in phases.body_gemm_stages(build, phases.repeats(build))
                    if (chosen := build.plans[i]) is not None],
        peak_bytes=int(build.placement.peak_bytes.max()), active_tiles=len(active),
        device_program=build.device_program, superstep_kinds=kinds, superstep_cycles=cycles,
        superstep_names=names,
    )
