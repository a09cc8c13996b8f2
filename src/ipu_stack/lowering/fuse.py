"""Superstep fusion: independent compute sets share one superstep, independent exchange
phases one phase.

Why: the lowering emits each stage's steps one after another, and each step is a
superstep of the chip: a compute set at its busiest tile, an exchange phase at the sync
before it (``sync`` in the price table) and the measured cost of a phase besides its
horizon.  Where the rows are few (a decode step: one row a sequence) those fixed costs are
most of a stage's time, and stages that do not depend
on each other (a layer's q, k and v projections, its gate and up projections, the two cache
writes) pay them once each.  Here every step moves to the earliest superstep of its kind
after the steps it depends on, and joins the step there: a compute set's calls run beside
the other's (a tile that has calls from both runs them one after the other, so a merged
superstep never takes longer than the two apart), an exchange phase's transfers are
scheduled with the other's.

A step depends on an earlier one when either writes a buffer the other reads or writes
(buffers, not bytes: placement has not yet shared memory between buffers, and runs after
this, from the new order's lifetimes).  A kernel operand the kernel writes counts as read
as well (partials accumulate in place).  Host reads and writes are never merged: each goes
right after what it depends on (and after the host steps there, in their order).  A fused
phase may schedule above its bound where its parts would each have met theirs (a GEMM's A
and B blocks come from different replica groups): it still saves a phase's fixed cost, and
the estimate prices the schedule it gets.  A layer loop's body is fused on its own (its
steps run once a pass), and so are the steps before and after it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from ipu_stack.lowering.program import ComputeSet, Exchange, Loop, Program, Step, step_access

# Every other program (a tower, an encoder, a prompt's pass) fuses too, but only with the
# last few supersteps: a step fused far back keeps its buffers alive from there, and whole
# stages' operands and partials then live together.  Measured on Swin-L F16 at batch 1
# (4,947,413 cycles unfused): a window of 2 supersteps 4,933,992, 3 4,909,718, 5 4,877,346,
# 8 4,855,004; 12, 20 and no bound do not place (a tile's partials of several stages
# together).  At 8 SigLIP so400m takes 6,340,609 (6,391,856) and the CLIP text encoder at
# batch 4 1,327,253 (1,350,180).  A program that does not place so is lowered unfused
# (``pipeline.Attempts``).
NEIGHBOUR_WINDOW = 8


@dataclass
class Superstep:
    """Steps that run as one: all compute sets, all exchange phases, or one host step."""

    kind: str
    steps: list[Step] = field(default_factory=list)


def step_kind(step: Step) -> str:
    """Which steps may share a superstep: compute sets with compute sets, exchange phases
    with exchange phases; a host step shares with nothing."""
    if isinstance(step, ComputeSet):
        return "compute"
    if isinstance(step, Exchange):
        return "exchange"
    return "host"


def merged(superstep: Superstep) -> Step:
    """The one step a superstep's steps become (named after them, ``+`` between)."""
    steps = superstep.steps
    if len(steps) == 1:
        return steps[0]
    name = "+".join(s.name for s in steps)  # type: ignore[union-attr]
    if superstep.kind == "compute":
        return ComputeSet(name, [c for s in steps for c in s.calls])  # type: ignore[union-attr]
    phases: list[Exchange] = steps  # type: ignore[assignment]
    starts = np.cumsum([0] + [int(s.dst_offsets[-1]) for s in phases[:-1]])
    return Exchange(
        name,
        np.concatenate([s.src_tile for s in phases]),
        np.concatenate([s.src_buf for s in phases]),
        np.concatenate([s.src_off for s in phases]),
        np.concatenate([s.words for s in phases]),
        np.concatenate([np.zeros(1, dtype=phases[0].dst_offsets.dtype)]
                       + [s.dst_offsets[1:] + start for s, start in zip(phases, starts,
                                                                        strict=True)]),
        np.concatenate([s.dst_tile for s in phases]),
        np.concatenate([s.dst_buf for s in phases]),
        np.concatenate([s.dst_off for s in phases]),
    )


def fuse_steps(steps: list[Step], window: int = 0) -> list[Step]:
    """``steps`` (no loop among them) as fused supersteps, each step at the earliest
    superstep of its kind after every step it depends on (``window``: and among the last
    ``window`` supersteps; 0, anywhere)."""
    out: list[Superstep] = []
    last_write: dict[int, int] = {}  # buffer -> the latest superstep that writes it
    last_read: dict[int, int] = {}
    for step in steps:
        kind = step_kind(step)
        reads, writes = step_access(step)
        reads |= writes  # a written operand is read too (partials accumulate in place)
        earliest = max([last_write.get(b, -1) + 1 for b in reads]
                       + [last_read.get(b, -1) + 1 for b in writes] + [0])
        if kind == "host":  # after the host steps already there: they keep their order
            place = earliest
            while place < len(out) and out[place].kind == "host":
                place += 1
            out.insert(place, Superstep(kind, [step]))
            for table in (last_write, last_read):
                for b, position in table.items():
                    if position >= place:
                        table[b] = position + 1
        else:
            if window:
                earliest = max(earliest, len(out) - window)
            place = next((p for p in range(earliest, len(out)) if out[p].kind == kind),
                         len(out))
            if place == len(out):
                out.append(Superstep(kind))
            out[place].steps.append(step)
        for b in writes:
            last_write[b] = max(last_write.get(b, -1), place)
        for b in reads:
            last_read[b] = max(last_read.get(b, -1), place)
    return [merged(s) for s in out]


HOIST_BYTES = 1024
"""The most a tile's destination buffer of a phase moved before a loop may hold: it is
then held for the whole loop, not shared with the body's other buffers."""


def loop_invariant(body: list[Step], loop: Loop, nbytes: dict[int, int]
                   ) -> tuple[list[Step], list[Step]]:
    """The body's exchange phases that move the same bytes on every pass, and the rest.

    A phase is invariant when nothing in the body writes what it reads and it reads no
    per-layer weight (a loop's slot, which each pass redirects) nor writes one, and nothing
    else in the body writes what it writes or reads it before it: moved before the loop it
    runs once, not once a layer, and every pass reads what it left (a decode step's RoPE
    angles, the same for every layer).  Only small ones move (``HOIST_BYTES`` a tile,
    ``nbytes`` of each buffer)."""
    access = [step_access(step) for step in body]
    writers = Counter(b for _, writes in access for b in writes)
    slots = {slot.buffers[0] for slot in loop.slots}
    invariant, rest, read_before = [], [], set()
    for step, (reads, writes) in zip(body, access, strict=True):
        if isinstance(step, Exchange) and not reads & (writers.keys() | slots) \
                and not writes & (read_before | slots) \
                and all(writers[b] == 1 and nbytes[b] <= HOIST_BYTES for b in writes):
            invariant.append(step)
        else:
            rest.append(step)
        read_before |= reads
    return invariant, rest


def fuse_supersteps(program: Program, window: int = 0) -> int:
    """Fuse ``program``'s run steps in place (the loop's body on its own, its invariant
    phases moved before it: :func:`loop_invariant`; ``window`` as :func:`fuse_steps`
    takes it); returns how many steps the run program has fewer."""
    before = len(program.run)
    found = program.loop()
    if found is None:
        program.run = fuse_steps(program.run, window)
    else:
        index = found[0] - len(program.initialize)
        loop = program.run[index]
        assert isinstance(loop, Loop)
        hoisted, body = loop_invariant(program.run[index + 1:index + 1 + loop.length], loop,
                                       {b.id: b.nbytes for b in program.buffers})
        body = fuse_steps(body, window)
        after = program.run[index + 1 + loop.length:]
        program.run = (fuse_steps(program.run[:index] + hoisted, window) + [loop] + body
                       + fuse_steps(after, window))
        loop.length = len(body)
    return before - len(program.run)
