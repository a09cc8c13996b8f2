"""Lowering a cache write (``cache_write``: a KV cache's rows written at runtime positions).

The cache (``[batch x positions, kv heads x head width]``, a resident state) is held in
blocks of one key/value head's columns and a run of one sequence's positions, each block on
a tile of its own.  The step's new rows of sequence ``b`` and their slots go, in one static
exchange, to every holder of sequence ``b``'s positions (the column block it holds), and each
holder runs popops ``MultiUpdate``: it writes the rows whose slot falls in its positions and
skips the others (``MultiUpdate.cpp:74-77``).  Which holder writes depends on the position;
the exchange and the price (every offset charged as in range, as the vendor's vertex
estimator charges it) do not, so a step's cycles do not depend on the position.  The cache's
readers (the attention products) gather it from these blocks like any activation.
"""

from __future__ import annotations

import numpy as np

from ipu_stack.ir.layout import BlockLayout
from ipu_stack.kernels.base import KernelInstance
from ipu_stack.kernels.slice import multiupdate_params
from ipu_stack.lowering.base import LoweringBase, Piece
from ipu_stack.lowering.program import Call, ComputeSet
from ipu_stack.lowering.transfers import TransferBuilder
from ipu_stack.planning.stages import RowStage
from ipu_stack.target import MemoryClass
from ipu_stack.util.errors import CompileError

# position blocks a sequence's cache is split into at most: more holders make the readers'
# gather wider, but each holder is a MultiUpdate call of its own first row
MAX_POSITION_BLOCKS = 16


def cache_blocking(batch: int, positions: int, kv_heads: int, tiles: int) -> int:
    """Positions a holder keeps: the smallest divisor of ``positions`` that splits each
    sequence into at most ``MAX_POSITION_BLOCKS`` blocks and the whole cache over at most
    ``tiles`` holders (a block never straddles two sequences)."""
    splits = max(1, min(MAX_POSITION_BLOCKS, tiles // max(batch * kv_heads, 1), positions))
    least = -(-positions // splits)
    return next(rows for rows in range(least, positions + 1) if positions % rows == 0)


def cache_holders(batch: int, blocks: int, kv_heads: int, tiles: int) -> np.ndarray:
    """``[batch, position blocks, kv heads]`` holder tiles, spread evenly over the chip."""
    count = batch * blocks * kv_heads
    if count > tiles:
        raise CompileError(f"a KV cache of {batch} sequences and {kv_heads} heads needs "
                           f"{count} holder tiles; the chip has {tiles}")
    spread = (np.arange(count, dtype=np.int64) * tiles) // count
    return spread.astype(np.int32).reshape(batch, blocks, kv_heads)


class CacheLowering(LoweringBase):
    """The cache-write stages of a :class:`~ipu_stack.lowering.lower.Lowering` (module
    docstring)."""

    def cache_write_stage(self, stage: RowStage) -> None:
        g = self.graph
        state_id, rows_id, slots_id = stage.inputs
        state, rows = g.value(state_id).type, g.value(rows_id).type
        heads = int(stage.attrs.get("kv_heads", 1))
        positions = int(stage.attrs.get("positions", 0))
        if positions <= 0 or state.rows % positions or state.cols % heads \
                or rows.rows % (state.rows // positions):
            raise CompileError(f"{self._name(stage.out)}: cache_write needs positions and "
                               "kv_heads that divide its state and rows")
        batch = state.rows // positions
        written = rows.rows // batch  # rows each sequence writes in one call
        width, precision = state.cols // heads, state.precision
        block = cache_blocking(batch, positions, heads, self.target.tiles)
        blocks = positions // block
        holders = cache_holders(batch, blocks, heads, self.target.tiles)
        cache = BlockLayout(state.rows, state.cols, precision, block, width,
                            holders.reshape(batch * blocks, heads, 1))
        cache_buf = self._host_weight(state_id, cache, MemoryClass.STANDARD)
        name = f"stage{stage.index}"
        builder = TransferBuilder(f"{name}.rows")
        fresh = BlockLayout(rows.rows, rows.cols, precision, written, width,
                            holders.transpose(0, 2, 1).copy())
        fresh_buf = self._in_row_layout(builder, rows_id, fresh, f"{name}.fresh")
        slots_type = g.value(slots_id).type
        slots = BlockLayout(slots_type.rows, 1, slots_type.precision, written, 1,
                            holders.reshape(batch, 1, blocks * heads))
        slots_buf = self._in_row_layout(builder, slots_id, slots, f"{name}.slots")
        self.emit_exchange(builder)
        compute = ComputeSet(f"{name}.update")
        for sequence in range(batch):
            for position_block in range(blocks):
                first = sequence * positions + position_block * block
                params = multiupdate_params(written, block, width * precision.itemsize,
                                            precision.itemsize, fresh.pitch, cache.pitch,
                                            first)
                tiles = np.sort(holders[sequence, position_block])
                zero = np.zeros(len(tiles), dtype=np.int64)
                compute.calls.append(Call(KernelInstance("multiupdate", params), tiles,
                                          [(slots_buf, zero), (fresh_buf, zero),
                                           (cache_buf, zero)]))
        self.program.run.append(compute)
        self.where[stage.out] = [Piece(0, 0, cache, cache_buf)]
