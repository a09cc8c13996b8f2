"""The lowered program: per-tile buffers, compute sets, exchange phases and host streams.

This is the contract between lowering and the later stages (placement, scheduling, codegen).
Offsets are bytes from a buffer's start; placement turns ``(buffer, tile)`` into an address.
Steps are numbered globally (``initialize`` first, then ``run``) and buffer lifetimes are
inclusive step ranges, so placement may reuse a byte once its value is dead.

A :class:`Loop` step runs the ``length`` steps after it ``count`` times (identical layers):
the body is lowered once, its activations sit at the same addresses on every pass, and each
per-layer weight has one buffer per layer (a :class:`Slot`); every operand in a slot's first
buffer is resolved, on pass ``k``, to its ``k``-th buffer through the per-layer address table.
A body buffer's lifetime counts body steps once; a buffer that lives across passes (the
carried activations, values from before the loop) is kept live over the whole body.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ipu_stack.ir.layout import BlockLayout
from ipu_stack.kernels.base import KernelInstance
from ipu_stack.target import MemoryClass


@dataclass
class Buffer:
    """Storage of ``nbytes`` on each of ``tiles`` in ``memory_class``, live in [first, last].

    ``description`` is the reference's log text (placement failures print it); ``layout``
    (where the buffer holds the blocks of one) lets the placement page say the type in words
    (:meth:`BlockLayout.human`) without parsing that text back."""

    id: int
    name: str
    tiles: np.ndarray
    nbytes: int
    memory_class: MemoryClass
    description: str
    first: int = -1
    last: int = -1
    layout: BlockLayout | None = None

    def touch(self, step: int) -> None:
        self.first = step if self.first < 0 else min(self.first, step)
        self.last = max(self.last, step)


@dataclass
class Call:
    """One kernel instance run on ``tiles``; operand ``k`` is ``(buffer id, offsets[T])``."""

    instance: KernelInstance
    tiles: np.ndarray
    operands: list[tuple[int, np.ndarray]]


@dataclass
class ComputeSet:
    name: str
    calls: list[Call] = field(default_factory=list)


@dataclass
class Exchange:
    """One exchange phase: ``src_*`` per transfer, ``dst_*`` in CSR order (``dst_offsets``)."""

    name: str
    src_tile: np.ndarray
    src_buf: np.ndarray
    src_off: np.ndarray
    words: np.ndarray
    dst_offsets: np.ndarray
    dst_tile: np.ndarray
    dst_buf: np.ndarray
    dst_off: np.ndarray

    @property
    def transfers(self) -> int:
        return int(len(self.src_tile))


@dataclass
class HostWrite:
    """The host writes every block of ``tensor`` to all its replicas (``layout``) in ``buffer``."""

    tensor: str
    layout: BlockLayout
    buffer: int


@dataclass
class Slot:
    """A per-layer weight: ``buffers[k]`` holds layer ``k``'s value; the body names
    ``buffers[0]``."""

    buffers: list[int]


@dataclass
class Loop:
    """Run the next ``length`` steps ``count`` times; ``slots`` are the per-layer weights."""

    name: str
    count: int
    length: int
    slots: list[Slot] = field(default_factory=list)

    def slot_of(self) -> dict[int, int]:
        """First buffer of each slot -> slot index (what the body's operands name)."""
        return {slot.buffers[0]: index for index, slot in enumerate(self.slots)}


@dataclass
class HostRead:
    """The host reads a piece of ``tensor`` (at ``origin``) from one replica of each block.

    ``checkpoint`` marks a diagnostic read of an intermediate value produced by graph
    operation ``operation`` (``--diagnostics``); plain reads return graph outputs.
    """

    tensor: str
    layout: BlockLayout
    buffer: int
    origin: tuple[int, int] = (0, 0)
    checkpoint: int | None = None
    operation: int | None = None
    # inside a loop body: (tensor, checkpoint, operation) on each pass
    passes: list[tuple[str, int | None, int | None]] | None = None


Step = ComputeSet | Exchange | HostWrite | HostRead | Loop


@dataclass
class Program:
    """Buffers and the two host-callable programs, ``initialize`` and ``run``."""

    buffers: list[Buffer] = field(default_factory=list)
    initialize: list[Step] = field(default_factory=list)
    run: list[Step] = field(default_factory=list)
    tensors: dict[str, dict] = field(default_factory=dict)

    def steps(self) -> list[tuple[str, int, Step]]:
        """All steps with their global index: ``(program, index, step)``."""
        out = [("initialize", i, s) for i, s in enumerate(self.initialize)]
        base = len(self.initialize)
        out += [("run", base + i, s) for i, s in enumerate(self.run)]
        return out

    def exchanges(self) -> list[Exchange]:
        return [s for _, _, s in self.steps() if isinstance(s, Exchange)]

    def compute_sets(self) -> list[ComputeSet]:
        return [s for _, _, s in self.steps() if isinstance(s, ComputeSet)]

    def loop(self) -> tuple[int, Loop] | None:
        """The loop step's global index and the step, if the program has one."""
        for _, index, step in self.steps():
            if isinstance(step, Loop):
                return index, step
        return None

    def repeats(self) -> np.ndarray:
        """How many times each global step runs per call (``count`` inside the loop body)."""
        times = np.ones(len(self.initialize) + len(self.run), dtype=np.int64)
        found = self.loop()
        if found is not None:
            index, loop = found
            times[index + 1 : index + 1 + loop.length] = loop.count
        return times

    def add_buffer(
        self, name: str, tiles: np.ndarray, nbytes: int, memory_class: MemoryClass,
        description: str, layout: BlockLayout | None = None,
    ) -> int:
        buffer = Buffer(
            len(self.buffers),
            name,
            np.unique(np.asarray(tiles, dtype=np.int32)),
            int(nbytes),
            memory_class,
            description,
            layout=layout,
        )
        self.buffers.append(buffer)
        return buffer.id

    def compute_lifetimes(self) -> None:
        """Set each buffer's [first, last] from the steps that touch it."""
        for buffer in self.buffers:
            buffer.first = buffer.last = -1
        for _, index, step in self.steps():
            for buffer_id in step_buffers(step):
                self.buffers[buffer_id].touch(index)
        found = self.loop()
        if found is None:
            return
        index, loop = found
        lo, hi = index + 1, index + loop.length
        for buffer in self.buffers:  # live across passes: keep it over the whole body
            if buffer.first <= hi and buffer.last >= lo and (buffer.first < lo or buffer.last > hi):
                buffer.first, buffer.last = min(buffer.first, index), max(buffer.last, hi)


def step_access(step: Step) -> tuple[set[int], set[int]]:
    """The buffers a step reads and the buffers it writes (a kernel operand the kernel
    writes counts as written; an exchange reads its sources and writes its destinations):
    what the verifier orders and superstep fusion keeps in order."""
    if isinstance(step, ComputeSet):
        reads: set[int] = set()
        writes: set[int] = set()
        for call in step.calls:
            written = {k for k, _, writing in call.instance.impl.accesses(call.instance.params)
                       if writing}
            for k, (buffer_id, _) in enumerate(call.operands):
                if buffer_id >= 0:
                    (writes if k in written else reads).add(buffer_id)
        return reads, writes
    if isinstance(step, Exchange):
        return ({int(b) for b in np.unique(step.src_buf)},
                {int(b) for b in np.unique(step.dst_buf)})
    if isinstance(step, HostRead):
        return {step.buffer}, set()
    if isinstance(step, HostWrite):
        return set(), {step.buffer}
    return set(), set()  # a loop step names its body, not buffers


def step_buffers(step: Step) -> set[int]:
    """Buffers a step reads or writes (a compute set's without asking its kernels which
    operands they write: lifetimes need only the union)."""
    if isinstance(step, ComputeSet):
        return {b for call in step.calls for b, _ in call.operands if b >= 0}
    reads, writes = step_access(step)
    return reads | writes
