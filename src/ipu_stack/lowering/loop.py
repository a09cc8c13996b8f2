"""Lowering a layer loop: the body once, per-layer weight slots, per-pass probe names.

``lower`` calls :meth:`LoopLowering.begin` before the first stage of the repeated block and
:meth:`LoopLowering.end` after its last.  In between, the ordinary stage lowering runs for
iteration 0 while :class:`~ipu_stack.lowering.base.BodyState` records every per-layer
weight it writes and lets the block's last stage write the carried value straight into the
buffer the block read it from.  ``end`` then

* moves the carried value there if the last stage could not (a different layout);
* makes the :class:`~ipu_stack.lowering.program.Loop` step's slots: for each per-layer
  weight, one buffer and one host write per further layer, in the same layout;
* names each probe read of the body for every pass (tensor, checkpoint, operation), the
  checkpoints numbered in execution order;
* points the stages after the loop at the last pass's carried value.
"""

from __future__ import annotations

from ipu_stack.lowering.base import BodyState, Piece, same_layout
from ipu_stack.lowering.lower import Lowering
from ipu_stack.lowering.program import HostRead, HostWrite, Loop, Slot
from ipu_stack.lowering.transfers import TransferBuilder
from ipu_stack.planning.repeat import LayerLoop


class LoopLowering:
    """The loop-specific half of lowering (module docstring)."""

    def __init__(self, lowering: Lowering, loop: LayerLoop) -> None:
        self.lowering = lowering
        self.loop = loop
        self.step = Loop("layers", loop.count, 0)
        self.at = -1
        self.first_checkpoint = 0

    def begin(self, checkpoints: int) -> None:
        program = self.lowering.program
        pieces = self.lowering.where[self.loop.carried_in]
        # a value held in pieces (a GEMM's row chunks) cannot be carried from pass to pass:
        # it lands in whole rows first, as a decode step's carried value does
        if self.lowering.spread or len(pieces) != 1 or pieces[0].row0 or pieces[0].col0:
            self.land_carried()
        self.at = len(program.run)
        program.run.append(self.step)
        self.first_checkpoint = checkpoints
        self.lowering.body = BodyState(frozenset(self.loop.slot_weights), self.loop.carried_in,
                                       self.loop.carried_out)
        self.lowering.gathered.clear()  # a body pass sees nothing gathered before the loop

    def land_carried(self) -> None:
        """Before the loop, the carried value into whole rows (``row_layout``: a decode
        step's few wide rows split by columns), where a decode step's residual adds make
        it: the last add of each pass then writes it in place, and no pass ends with a
        carry exchange (a decode step's row a sequence makes that a phase a layer); and
        where it is held in pieces, which a pass could not carry."""
        lowering = self.lowering
        value = self.loop.carried_in
        pieces = lowering.where[value]
        kind = lowering.graph.value(value).type
        layout = lowering.row_layout(kind.rows, kind.cols, kind.precision)
        if len(pieces) == 1 and not pieces[0].row0 and not pieces[0].col0 and same_layout(
                pieces[0].layout, layout):
            return
        builder = TransferBuilder("layers.land")
        buffer = lowering.result_buffer(value, layout)
        lowering.gather(builder, value, layout, buffer)
        lowering.emit_exchange(builder)
        lowering.where[value] = [Piece(0, 0, layout, buffer)]

    def end(self, checkpoints: int) -> int:
        """Close the body; returns the next checkpoint number after every pass's probes."""
        lowering, loop = self.lowering, self.loop
        body = lowering.body
        assert body is not None
        carried = lowering.where[loop.carried_in][0]
        if [p.buffer for p in lowering.where[loop.carried_out]] != [carried.buffer]:
            builder = TransferBuilder("layers.carry")
            lowering.gather(builder, loop.carried_out, carried.layout, carried.buffer)
            lowering.emit_exchange(builder)
        program = lowering.program
        self.step.length = len(program.run) - self.at - 1
        self.step.slots = [self._slot(*weight) for weight in body.weights]
        lowering.body = None
        lowering.gathered.clear()  # what the body gathered holds the last pass's values
        last = loop.value(loop.count - 1, loop.carried_out)
        lowering.where[last] = [carried]
        return self._name_passes(checkpoints)

    def _slot(self, value_id: int, layout, memory_class, first: int) -> Slot:
        """Layer ``k``'s copy of a per-layer weight: same layout, its own buffer."""
        program, graph = self.lowering.program, self.lowering.graph
        buffers = [first]
        for k in range(1, self.loop.count):
            name = graph.value(self.loop.value(k, value_id)).name
            buffer = program.add_buffer(name, layout.used_tiles(), layout.block_bytes,
                                        memory_class, f"weight {name}: {layout.describe()}",
                                        layout)
            program.initialize.append(HostWrite(name, layout, buffer))
            buffers.append(buffer)
        return Slot(buffers)

    def _name_passes(self, checkpoints: int) -> int:
        """Every pass's (tensor, checkpoint, operation) for each probe read in the body."""
        graph, loop = self.lowering.graph, self.loop
        body = self.lowering.program.run[self.at + 1 : self.at + 1 + self.step.length]
        reads = [s for s in body if isinstance(s, HostRead) and s.checkpoint is not None]
        names = {v.name: v.id for v in graph.values}
        order = sorted({r.checkpoint for r in reads if r.checkpoint is not None})
        number = self.first_checkpoint
        renumbered: list[dict[int, int | None]] = []
        for k in range(loop.count):
            ids: dict[int, int | None] = {}
            for checkpoint in order:
                read = next(r for r in reads if r.checkpoint == checkpoint)
                value = loop.value(k, names[read.tensor])
                if graph.value(value).role == "output":
                    ids[checkpoint] = None  # a graph output: read as one, not probed
                else:
                    ids[checkpoint] = number
                    number += 1
            renumbered.append(ids)
        for read in reads:
            passes = []
            for k in range(loop.count):
                new = renumbered[k][read.checkpoint]
                value = graph.value(loop.value(k, names[read.tensor]))
                operation = None if read.operation is None else loop.operations[k].get(
                    read.operation, read.operation)
                passes.append((value.name, new, operation) if new is not None
                              else (None, None, None))
            read.passes = passes
        assert number - self.first_checkpoint >= checkpoints - self.first_checkpoint
        return number
