"""Checks of a lowered :class:`~ipu_stack.lowering.program.Program` against its target.

Why: a lowering mistake otherwise shows up stages later, as a placement that reuses bytes
still in use, an emitted address outside a buffer, or a simulated fault that names an
address and a tile rather than the buffer and the step at fault.  The pipeline runs this
between stages when ``CompileOptions.verify_stages`` is set (or ``IPU_STACK_VERIFY_STAGES``
is), as xDSL's pass pipeline runs its verifier between passes.  Every check is a few array
operations a step, so it costs little next to lowering itself.  What it checks:

* buffers: on tiles of the target, and the steps that touch one lie inside its lifetime
  (placement reuses a byte outside it);
* compute sets: each call runs on tiles of the target; each operand names a buffer that
  exists and is on every tile of the call, the bytes the kernel accesses lie inside it, and
  an operand the hardware takes only from interleaved memory is in an interleaved buffer;
* exchanges: the transfer arrays agree in length, destinations in CSR order; each transfer
  moves at least one word from a tile to other tiles of the target, at word-aligned
  offsets, inside buffers those tiles hold;
* host streams and the loop: buffers that exist; a loop body inside the run program; each
  per-layer slot's buffers alike in bytes and tiles;
* order: each buffer a step reads was written by an earlier step.

A failure is one :class:`~ipu_stack.util.errors.CompileError` line: the stage, the step
and the problem.
"""

from __future__ import annotations

import numpy as np

from ipu_stack.ir.layout import WORD
from ipu_stack.lowering.program import (
    Buffer,
    Call,
    ComputeSet,
    Exchange,
    HostRead,
    HostWrite,
    Loop,
    Program,
    Step,
    step_access,
    step_buffers,
)
from ipu_stack.target import MemoryClass, Target
from ipu_stack.util.errors import CompileError


class ProgramVerifier:
    """One pass over ``program``'s steps; :meth:`run` raises on the first problem."""

    def __init__(self, program: Program, target: Target, stage: str) -> None:
        self.program, self.target, self.stage = program, target, stage
        self.buffers = program.buffers
        self.nbytes = np.array([b.nbytes for b in program.buffers], dtype=np.int64)
        self.written = np.full(len(program.buffers), -1, dtype=np.int64)  # first write's step

    def fail(self, where: str, problem: str) -> None:
        raise CompileError(f"{self.stage}: {where}: {problem}")

    def run(self) -> None:
        for buffer in self.buffers:
            self.check_tiles(buffer.tiles, f"buffer {buffer.id} ({buffer.name!r})")
        for program, index, step in self.program.steps():
            where = f"{program} step {index} ({_describe(step)})"
            self.check_lifetimes(step, index, where)
            if isinstance(step, ComputeSet):
                self.compute(step, index, where)
            elif isinstance(step, Exchange):
                self.exchange(step, index, where)
            elif isinstance(step, Loop):
                self.loop(step, index, where)
            else:
                self.host(step, index, where)

    # -------------------------------------------------------------- shared checks
    def check_tiles(self, tiles: np.ndarray, where: str) -> None:
        tiles = np.asarray(tiles)
        if len(tiles) and (int(tiles.min()) < 0 or int(tiles.max()) >= self.target.tiles):
            bad = int(tiles.min()) if int(tiles.min()) < 0 else int(tiles.max())
            self.fail(where, f"tile {bad} is not one of {self.target.name}'s "
                             f"{self.target.tiles} tiles")

    def buffer(self, buffer_id: int, where: str) -> Buffer:
        if not 0 <= buffer_id < len(self.buffers):
            self.fail(where, f"names buffer {buffer_id}, which does not exist "
                             f"({len(self.buffers)} buffers)")
        return self.buffers[buffer_id]

    def check_held(self, buffer: Buffer, tiles: np.ndarray, where: str) -> None:
        """Every tile of ``tiles`` holds ``buffer`` (its tiles are sorted and unique)."""
        tiles = np.asarray(tiles, dtype=np.int64)
        at = np.searchsorted(buffer.tiles, tiles)
        held = at < len(buffer.tiles)
        held[held] = buffer.tiles[at[held]] == tiles[held]
        if not held.all():
            tile = int(tiles[np.argmin(held)])
            self.fail(where, f"buffer {buffer.id} ({buffer.name!r}) is not on tile {tile}")

    def read(self, buffer_ids: set[int], index: int, where: str) -> None:
        for buffer_id in sorted(buffer_ids):
            if not 0 <= self.written[buffer_id] < index:
                self.fail(where, f"reads buffer {buffer_id} ({self.buffers[buffer_id].name!r}) "
                                 "before any step writes it")

    def wrote(self, buffer_ids: set[int], index: int) -> None:
        for buffer_id in buffer_ids:
            if self.written[buffer_id] < 0:
                self.written[buffer_id] = index

    def check_lifetimes(self, step: Step, index: int, where: str) -> None:
        for buffer_id in sorted(step_buffers(step)):
            buffer = self.buffer(buffer_id, where)
            if not buffer.first <= index <= buffer.last:
                self.fail(where, f"touches buffer {buffer_id} ({buffer.name!r}) outside its "
                                 f"lifetime [{buffer.first}, {buffer.last}]")

    # -------------------------------------------------------------- steps
    def compute(self, step: ComputeSet, index: int, where: str) -> None:
        for number, call in enumerate(step.calls):
            here = f"{where} call {number} ({call.instance.name})"
            self.check_tiles(call.tiles, here)
            self.call(call, here)
        self.ordered(step, index, where)

    def ordered(self, step: Step, index: int, where: str) -> None:
        """What ``step`` reads was written by an earlier step; note what it writes."""
        reads, writes = step_access(step)
        self.read(reads, index, where)
        self.wrote(writes, index)

    def call(self, call: Call, where: str) -> None:
        """Check ``call``'s operands: held on its tiles, accessed inside their buffers, in
        the memory class the kernel takes."""
        extent = {k: (length, writes) for k, length, writes
                  in call.instance.impl.accesses(call.instance.params)}
        interleaved = set(call.instance.impl.interleaved)
        for k, (buffer_id, offsets) in enumerate(call.operands):
            if buffer_id < 0:
                continue
            buffer = self.buffer(buffer_id, f"{where} operand {k}")
            self.check_held(buffer, call.tiles, f"{where} operand {k}")
            offsets = np.asarray(offsets, dtype=np.int64)
            length, _ = extent.get(k, (0, False))
            if offsets.size and (int(offsets.min()) < 0
                                 or int(offsets.max()) + length > buffer.nbytes):
                self.fail(f"{where} operand {k}", f"accesses bytes "
                          f"[{int(offsets.min())}, {int(offsets.max()) + length}) of buffer "
                          f"{buffer_id} ({buffer.name!r}), which has {buffer.nbytes}")
            if k in interleaved and buffer.memory_class is not MemoryClass.INTERLEAVED:
                self.fail(f"{where} operand {k}", f"buffer {buffer_id} ({buffer.name!r}) is "
                          f"{buffer.memory_class.value}; the kernel takes it only from "
                          "interleaved memory")

    def exchange(self, step: Exchange, index: int, where: str) -> None:
        n, fanout = step.transfers, np.diff(step.dst_offsets)
        if not (len(step.src_buf) == len(step.src_off) == len(step.words) == n
                and len(step.dst_offsets) == n + 1 and int(step.dst_offsets[0]) == 0
                and int(step.dst_offsets[-1]) == len(step.dst_tile) == len(step.dst_buf)
                == len(step.dst_off) and (fanout >= 0).all()):
            self.fail(where, "transfer arrays disagree in length or destination order")
        if n == 0:
            return
        if int(step.words.min()) < 1 or int(fanout.min()) < 1:
            bad = int(np.argmax((step.words < 1) | (fanout < 1)))
            self.fail(where, f"transfer {bad} moves {int(step.words[bad])} words to "
                             f"{int(fanout[bad])} tiles")
        self.check_tiles(step.src_tile, f"{where} sources")
        self.check_tiles(step.dst_tile, f"{where} destinations")
        sender = np.repeat(np.asarray(step.src_tile, dtype=np.int64), fanout)
        if (sender == step.dst_tile).any():
            bad = int(np.argmax(sender == step.dst_tile))
            self.fail(where, f"tile {int(sender[bad])} sends to itself (an on-tile copy is a "
                             "compute call)")
        self.ends(step.src_tile, step.src_buf, step.src_off, step.words, f"{where} sources")
        self.ends(step.dst_tile, step.dst_buf, step.dst_off, np.repeat(step.words, fanout),
                  f"{where} destinations")
        self.ordered(step, index, where)

    def ends(self, tiles: np.ndarray, buffers: np.ndarray, offsets: np.ndarray,
             words: np.ndarray, where: str) -> None:
        """One side of an exchange: held buffers, whole words inside them."""
        for buffer_id in np.unique(buffers).tolist():
            self.check_held(self.buffer(int(buffer_id), where), tiles[buffers == buffer_id],
                            where)
        offsets = np.asarray(offsets, dtype=np.int64)
        end = offsets + np.asarray(words, dtype=np.int64) * WORD
        bad = (offsets < 0) | (offsets % WORD != 0) | (end > self.nbytes[buffers])
        if bad.any():
            k = int(np.argmax(bad))
            buffer = self.buffers[int(buffers[k])]
            self.fail(where, f"bytes [{int(offsets[k])}, {int(end[k])}) of buffer {buffer.id} "
                             f"({buffer.name!r}, {buffer.nbytes} bytes) on tile "
                             f"{int(tiles[k])} are not whole words inside it")

    def host(self, step: HostWrite | HostRead, index: int, where: str) -> None:
        self.buffer(step.buffer, where)
        self.ordered(step, index, where)

    def loop(self, step: Loop, index: int, where: str) -> None:
        end = len(self.program.initialize) + len(self.program.run)
        if step.count < 1 or step.length < 1 or index + step.length >= end:
            self.fail(where, f"a loop of {step.count} passes over {step.length} steps does "
                             f"not fit the {end - index - 1} steps after it")
        for slot in step.slots:
            first = self.buffer(slot.buffers[0], where)
            for buffer_id in slot.buffers[1:]:
                other = self.buffer(buffer_id, where)
                if other.nbytes != first.nbytes or not np.array_equal(other.tiles, first.tiles):
                    self.fail(where, f"per-layer buffer {buffer_id} ({other.name!r}) differs "
                                     f"from its slot's first, buffer {first.id}, in bytes or "
                                     "tiles")


def _describe(step: Step) -> str:
    if isinstance(step, HostWrite | HostRead):
        return f"{type(step).__name__} {step.tensor!r}"
    return f"{type(step).__name__} {step.name!r}"


def verify_program(program: Program, target: Target, stage: str = "lowering") -> None:
    """Raise a one-line :class:`CompileError` (``stage: step: problem``) at the first thing
    wrong with ``program`` on ``target``; return nothing when all is well."""
    ProgramVerifier(program, target, stage).run()
