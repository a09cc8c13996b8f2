"""The lowering driver: stage plans in, the whole :class:`Program` out.

It walks the stages in order on one :class:`~ipu_stack.lowering.lower.Lowering`, handing the
layer loop's body to :class:`~ipu_stack.lowering.loop.LoopLowering` so the body is lowered
once.  Kept apart from both so that ``loop`` can build on ``lower`` without a cycle.
"""

from __future__ import annotations

import dataclasses

from ipu_stack.ir.graph import Graph, state_writes
from ipu_stack.lowering.base import FEW_ROWS, REPLICA_BUDGET
from ipu_stack.lowering.fuse import fuse_supersteps
from ipu_stack.lowering.loop import LoopLowering
from ipu_stack.lowering.lower import Lowering
from ipu_stack.lowering.program import Loop, Program
from ipu_stack.planning.gemm import GemmPlan
from ipu_stack.planning.repeat import LayerLoop
from ipu_stack.planning.stages import GemmStage, Stage, sibling_runs
from ipu_stack.target import Target


def replicated_parameter_bytes(graph: Graph, plans: list[tuple[Stage, GemmPlan | None]],
                               loop: LayerLoop | None) -> int:
    """Bytes of the per-row parameters (a norm's scale and shift, a row stage's bias) that
    the stages outside the layer loop would hold on every tile."""
    total = 0
    for position, (stage, _) in enumerate(plans):
        if isinstance(stage, GemmStage) or (
                loop is not None and loop.start <= position < loop.start + loop.length):
            continue
        out = graph.value(stage.out).type
        total += sum(graph.value(i).type.nbytes for i in stage.inputs[1:]
                     if graph.value(i).role == "weight" and graph.value(i).type.shape == (
                         out.cols,))
    return total


def decode_step(graph: Graph, plans: list[tuple[Stage, GemmPlan | None]]) -> bool:
    """Whether the program is a decode step: it writes a KV cache (state kept on the device
    from call to call) and every GEMM stage multiplies at most ``FEW_ROWS`` rows a group (a
    row a sequence; a prompt's pass that short is lowered alike).  Such a step runs once a
    generated token; its supersteps are mostly the fixed costs of exchange phases and their
    syncs, so its independent stages are lowered to run side by side (``LoweringBase.spread``,
    ``lowering.fuse``).  A longer prompt's pass and the towers are bound by their GEMMs, and
    keep one stage after another."""
    gemms = [plan for _, plan in plans if plan is not None]
    return bool(state_writes(graph)) and bool(gemms) and all(
        plan.shape.rows <= FEW_ROWS for plan in gemms)


def lower(
    graph: Graph,
    plans: list[tuple[Stage, GemmPlan | None]],
    target: Target,
    paired: bool = False,
    loop: LayerLoop | None = None,
    fuse: bool = True,
    multicast_gathers: bool = False,
    window: int = 0,
) -> Program:
    """The whole program for ``graph`` under the chosen stage plans (``paired``: lay GEMM
    grids out for the paired-tiles exchange option), with a probe read of every stage result
    that is not a graph output.  With ``loop``, ``plans`` are the compact stages
    (:meth:`LayerLoop.compact`) and the loop's body is lowered once (``lowering.loop``).
    With ``fuse``, a decode step (:func:`decode_step`) runs its independent stages side by
    side: each GEMM grid after the one before, and the steps fused (``lowering.fuse``);
    any other program's steps are fused within ``window`` supersteps (0: not at all).
    With ``multicast_gathers``, an all-gather among many tiles stays multicasts
    (``lowering.gemm_stage.MULTICAST_GATHER_PEERS``): fewer exchange-table entries."""
    return lower_windows(graph, plans, target, paired, loop, fuse, multicast_gathers,
                         (window,))[0]


def lower_windows(
    graph: Graph, plans: list[tuple[Stage, GemmPlan | None]], target: Target, paired: bool,
    loop: LayerLoop | None, fuse: bool, multicast_gathers: bool, windows: tuple[int, ...],
) -> list[Program]:
    """:func:`lower`'s program for each fusion window of ``windows``, lowered once.

    Why: the compile weighs a program fused with its neighbours against the same program
    unfused, and the two differ only in the fusion pass at the end; lowering was a third
    of a Swin-L compile, half of it lowering the same stages again.  Each window but the
    last fuses a copy (:func:`fork`), the last the lowered program itself."""
    lowering = Lowering(graph, target, paired)
    lowering.lean = replicated_parameter_bytes(graph, plans, loop) > REPLICA_BUDGET
    lowering.multicast_gathers = multicast_gathers
    lowering.spread = fuse and decode_step(graph, plans)
    # a layer loop's carried input (a pipeline group's hand-off) lands where its passes
    # carry it: no landing exchange, and no tile copies its own block across
    lowering.land_inputs(frozenset({loop.carried_in}) if loop is not None and lowering.spread
                         else frozenset())
    _lower_stages(lowering, graph, plans, loop)
    lowering.read_outputs()
    programs = []
    for position, window in enumerate(windows):
        program = lowering.program if position == len(windows) - 1 else fork(lowering.program)
        if lowering.spread:
            fuse_supersteps(program)
        elif fuse and window:
            fuse_supersteps(program, window)
        program.compute_lifetimes()
        end = len(program.initialize) + len(program.run) - 1
        for step in program.initialize:
            program.buffers[step.buffer].last = end  # weights stay resident across runs
        programs.append(program)
    return programs


def fork(program: Program) -> Program:
    """A copy of ``program`` that fusion and lifetimes may change without changing it:
    its own step lists, loop step and buffers (whose lifetimes are set); the steps
    themselves are shared, since fusion makes new steps rather than changing old ones."""
    return Program(
        buffers=[dataclasses.replace(buffer) for buffer in program.buffers],
        initialize=list(program.initialize),
        run=[dataclasses.replace(step) if isinstance(step, Loop) else step
             for step in program.run],
        tensors=dict(program.tensors))


def _lower_stages(lowering: Lowering, graph: Graph, plans: list[tuple[Stage, GemmPlan | None]],
                  loop: LayerLoop | None) -> None:
    """Each stage in order onto ``lowering``, the layer loop's body once, with a probe read
    of every stage result that is not a graph output."""
    looping = LoopLowering(lowering, loop) if loop is not None else None
    checkpoints = 0
    runs = {run[0]: run for run in sibling_runs([stage for stage, _ in plans])}
    for position, (stage, plan) in enumerate(plans):
        if looping is not None and position == looping.loop.start:
            looping.begin(checkpoints)
        if lowering.spread and position in runs:  # siblings' grids one after the other
            lowering.reserve_grids([plans[i][1].tiles_used for i in runs[position]])
        if isinstance(stage, GemmStage):
            assert plan is not None
            lowering.gemm_stage(stage, plan)
        elif stage.kind == "embedding":
            lowering.lookup_stage(stage)
        elif stage.kind == "gather_rows":
            lowering.gather_rows_stage(stage)
        elif stage.kind == "cache_write":
            lowering.cache_write_stage(stage)
        elif stage.kind == "cache_fill":
            lowering.cache_fill_stage(stage)
        elif stage.kind == "argmax":
            lowering.argmax_stage(stage)
        else:
            lowering.row_stage(stage)
        if graph.value(stage.out).role != "output":
            lowering.checkpoint(stage, checkpoints)
            checkpoints += 1
        if looping is not None and position == looping.loop.start + looping.loop.length - 1:
            checkpoints = looping.end(checkpoints)
