"""How the compiler costs a lowered program, and the small records its stages log.

The planner's own estimate (``refined_estimate``): every compute set of the lowered program
at its busiest tile's kernel closed forms, plus every exchange phase at its scheduled,
instruction-level horizon and the measured phase cost (``target.timing``), superstep by
superstep (``superstep_estimates``).  The simulator never calls any of this.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ipu_stack.exchange import Schedule, ScheduleMemo, Transfers, schedule_exchange
from ipu_stack.exchange.instructions import instruction_horizon
from ipu_stack.ir.graph import Graph, head_geometry
from ipu_stack.kernels.base import KernelInstance
from ipu_stack.lowering.program import ComputeSet, Exchange, Loop, Program
from ipu_stack.memory.placement import Placement
from ipu_stack.memory.support import LAYER_ADDRESS_BYTES
from ipu_stack.planning.costs import estimate_exchange_phase, kernel_cost
from ipu_stack.planning.gemm import GemmPlan, GemmShape
from ipu_stack.planning.repeat import LayerLoop
from ipu_stack.planning.stages import GemmStage
from ipu_stack.target import Target
from ipu_stack.util.log import Progress


def stage_shape(graph: Graph, stage: GemmStage, pair_lanes: int = 1) -> GemmShape:
    """The per-group GEMM a stage computes (``head_matmul``: one image and head);
    ``pair_lanes``: tiles per shared exchange bus when the exchange is paired, else 1."""
    a = graph.value(stage.a).type
    b = graph.value(stage.b).type
    groups = 1
    rows, depth, cols = a.rows, a.cols, b.cols
    if stage.kind == "head_matmul":
        geo = head_geometry(stage.attrs, b)
        groups = geo.batch * geo.heads
        rows, depth, cols = geo.product(stage.attrs["mode"])
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
        rows_read_in_place=softmax_reads_in_place(graph, stage.out),
        pair_lanes=pair_lanes,
    )


def softmax_reads_in_place(graph: Graph, value_id: int) -> bool:
    """Whether only softmaxes read ``value_id`` (the lowering runs them where whole-row
    blocks of it lie, with no gather)."""
    users = graph.consumers(value_id)
    return (graph.value(value_id).role == "intermediate" and bool(users)
            and all(op.kind == "softmax" for op in users))


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
    """The analytical cost of row and copy compute sets: the busiest tile (the calls a tile
    runs one after another, so their costs add), as many times as each runs (a loop body's
    once per layer); the sync belongs to the exchange phase that follows."""
    total = 0
    times = program.repeats()
    for _, index, step in program.steps():
        if not isinstance(step, ComputeSet):
            continue
        families = {call.instance.family for call in step.calls}
        if families & {"row", "copy"}:
            total += int(times[index]) * busiest_tile_cycles(step)
    return total


def busiest_tile_cycles(step: ComputeSet) -> int:
    """A compute set's busiest tile: the closed forms of the calls it runs one after
    another, added up."""
    size = max((int(np.max(call.tiles)) + 1 for call in step.calls if len(call.tiles)),
               default=1)
    busy = np.zeros(size, dtype=np.int64)
    for call in step.calls:
        np.add.at(busy, np.asarray(call.tiles, dtype=np.int64), kernel_cost(call.instance))
    return int(busy.max())


def step_prices(program: Program, schedules: dict[int, Schedule],
                target: Target) -> dict[int, tuple[str, int]]:
    """Every compute set and exchange phase of ``program`` priced once, by global step
    index: ``("compute", busiest tile)`` or ``("exchange", the sync before it + scheduled
    horizon + the measured phase cost)`` (``schedule_program`` schedules every phase)."""
    prices: dict[int, tuple[str, int]] = {}
    for _, index, step in program.steps():
        if isinstance(step, ComputeSet):
            prices[index] = ("compute", busiest_tile_cycles(step))
        elif isinstance(step, Exchange):
            horizon, _ = instruction_horizon(schedules[index], to_transfers(step, target))
            prices[index] = ("exchange", estimate_exchange_phase(horizon))
    return prices


def superstep_estimates(program: Program, schedules: dict[int, Schedule], target: Target
                        ) -> tuple[list[str], list[int], list[str]]:
    """The run program's supersteps as the planner prices them (:func:`step_prices`), in
    the order they run (a loop body once per pass): their kinds, cycles and names.

    Why: a pipeline's groups share the chip's supersteps, so a step lasts as long as their
    supersteps merged side by side, not as the slowest group's total.  The strategy merges
    these sequences as the chip runs them, superstep for superstep."""
    prices = step_prices(program, schedules, target)
    base = len(program.initialize)
    order: list[int] = []
    index = 0
    while index < len(program.run):
        step = program.run[index]
        if isinstance(step, Loop):
            order += list(range(base + index + 1, base + index + 1 + step.length)) * step.count
            index += 1 + step.length
        else:
            order.append(base + index)
            index += 1
    order = [i for i in order if i in prices]
    steps = program.initialize + program.run
    return ([prices[i][0] for i in order], [prices[i][1] for i in order],
            [steps[i].name for i in order])  # type: ignore[union-attr]


def refined_estimate(
    plans: list[GemmPlan | None], program: Program, schedules: dict[int, Schedule],
    target: Target, repeats: list[int] | None = None,
) -> dict[str, int]:
    """The compiler's cost of a lowered program (:func:`step_prices`, each step as many
    times as it runs): every compute set at its busiest tile's kernel closed forms, every
    exchange phase at the sync before it and its scheduled horizon, so ``cycles`` is the sum of
    :func:`superstep_estimates`.  ``analytical_cycles``: the stage plans' own closed forms
    (``repeats``: how many times each planned stage runs), which the search ranks plans by;
    a grouped GEMM's plan prices its block where the program runs one call a head, so the
    two can differ by a little."""
    repeats = repeats or [1] * len(plans)
    gemms = [(p, n) for p, n in zip(plans, repeats, strict=True) if p is not None]
    analytical = sum(n * (p.estimated_cycles - p.exchange_cycles) for p, n in gemms) \
        + row_stage_cycles(program, target)
    analytical_exchange = sum(n * p.exchange_cycles for p, n in gemms)
    times = program.repeats()
    totals = {"compute": 0, "exchange": 0}
    for index, (kind, cycles) in step_prices(program, schedules, target).items():
        totals[kind] += int(times[index]) * cycles
    return {
        "analytical_cycles": analytical + analytical_exchange,
        "analytical_exchange_cycles": analytical_exchange,
        "scheduled_exchange_cycles": totals["exchange"],
        "cycles": totals["compute"] + totals["exchange"],
        "compute_cycles": totals["compute"],
    }


def finalist_choices(
    candidates: list[list[GemmPlan | None]], count: int
) -> list[list[GemmPlan | None]]:
    depth = max(len(c) for c in candidates)
    out = []
    for rank in range(min(count, depth)):
        out.append([c[min(rank, len(c) - 1)] for c in candidates])
    return out


def gemm_modes(stages: list, plans: list[GemmPlan | None],
               loop: LayerLoop | None = None) -> dict[str, dict[str, Any]]:
    """Per matmul operation (by id): the GEMM mode its stage runs in, its depth block and
    split, and its row chunks' row blocks, which the host reference needs to round where
    the device rounds and to add float32 partials in the order its depth tiles add them
    (every layer of a loop runs its body's plan)."""
    modes: dict[str, dict[str, Any]] = {}
    for stage, plan in zip(stages, plans, strict=True):
        if isinstance(stage, GemmStage) and plan is not None:
            mode = {"mode": plan.mode, "depth_block": plan.depth_block,
                    "depth_splits": plan.depth_splits, "col_block": plan.col_block,
                    "row_chunks": [[first, chunk.shape.rows, chunk.row_block]
                                   for first, chunk in plan.chunks()]}
            if plan.swapped:  # its depth tiles finish column slices (``ir.interpret``)
                mode["swapped"] = True
            op = stage.operations[0]
            for ops in (loop.operations if loop is not None else ({},)):
                modes[str(ops.get(op, op))] = mode
    return dict(sorted(modes.items(), key=lambda item: int(item[0])))


def kernel_instances(program: Program) -> list[KernelInstance]:
    """Every distinct kernel instance the program calls, in name order (deterministic)."""
    return sorted({c.instance for cs in program.compute_sets() for c in cs.calls},
                  key=lambda k: k.name)


def reuse_fields(
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


def layer_bytes(program: Program, tiles: int) -> np.ndarray:
    """Bytes each tile gives one more layer of a layer loop: a copy of every per-layer
    weight it holds, and that layer's address-table words (0 without a loop)."""
    extra = np.zeros(tiles, dtype=np.int64)
    found = program.loop()
    if found is not None:
        for slot in found[1].slots:
            buffer = program.buffers[slot.buffers[0]]
            extra[buffer.tiles] += buffer.nbytes + LAYER_ADDRESS_BYTES
    return extra


def loop_summary(program: Program, placement: Placement) -> dict[str, int]:
    """The layer loop's shape and what one more layer costs per tile."""
    found = program.loop()
    if found is None:
        return {"layers": 0}
    _, loop = found
    extra = layer_bytes(program, len(placement.peak_bytes))
    peak_tile = int(np.argmax(placement.peak_bytes))
    return {"layers": loop.count, "body_steps": loop.length, "per_layer_weights": len(loop.slots),
            "bytes_per_layer_max": int(extra.max()),
            "bytes_per_layer_peak_tile": int(extra[peak_tile])}


def memory_summary(
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
