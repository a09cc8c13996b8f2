"""Lowering a cache write (``cache_write``: a KV cache's rows written at runtime positions;
``cache_fill``: a prompt's rows written at the positions it fills).

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

from dataclasses import dataclass

import numpy as np

from ipu_stack.ir.layout import BlockLayout
from ipu_stack.kernels.base import KernelInstance
from ipu_stack.kernels.copy import copy_params
from ipu_stack.kernels.slice import multiupdate_params
from ipu_stack.lowering.base import ROW_BAND, LoweringBase, Piece
from ipu_stack.lowering.program import Call, ComputeSet
from ipu_stack.lowering.transfers import TransferBuilder
from ipu_stack.planning.stages import RowStage
from ipu_stack.target import MemoryClass
from ipu_stack.util.errors import CompileError


def cache_blocking(batch: int, positions: int, kv_heads: int, tiles: int) -> int:
    """Positions a holder keeps: the smallest divisor of ``positions`` that spreads the cache
    over at most ``tiles`` holders (a block never straddles two sequences).  A layer loop
    keeps every layer's cache on the same holders, so the more holders, the less each tile
    holds; a cache's positions are whole blocks of ``ir.graph.POSITION_GRAIN`` (the graph's
    rule), so small divisors exist."""
    for rows in range(1, positions + 1):
        if positions % rows == 0 and batch * kv_heads * (positions // rows) <= tiles:
            return rows
    raise CompileError(f"a KV cache of {batch} sequences and {kv_heads} heads needs more "
                       f"holder tiles than the chip's {tiles}")


def cache_holders(batch: int, blocks: int, kv_heads: int, tiles: np.ndarray,
                  between: bool = False) -> np.ndarray:
    """``[batch, position blocks, kv heads]`` holder tiles, spread evenly over ``tiles``
    (at most one holder a tile: :func:`cache_blocking`); ``between``: half a stride on, so
    that where the holders are at least two tiles apart, a layer's second cache (its
    values) sits on tiles of its own and its writes run beside the keys' writes."""
    count = batch * blocks * kv_heads
    spread = (np.arange(count, dtype=np.int64) * len(tiles)
              + (len(tiles) // 2 if between else 0)) // count
    return tiles[spread].astype(np.int32).reshape(batch, blocks, kv_heads)


@dataclass(frozen=True)
class CacheBlocks:
    """A layer's cache as the chip holds it: ``holders[b, p, h]`` keeps positions
    ``[p x block, (p + 1) x block)`` of sequence ``b`` for key/value head ``h``."""

    batch: int
    positions: int
    width: int
    block: int
    holders: np.ndarray
    layout: BlockLayout
    buffer: int


class CacheLowering(LoweringBase):
    """The cache-write stages of a :class:`~ipu_stack.lowering.lower.Lowering` (module
    docstring)."""

    def _cache(self, stage: RowStage, state_id: int, avoid: np.ndarray | None = None
               ) -> CacheBlocks:
        """The stage's cache blocks, its buffer written by the host in ``initialize``
        (positions and heads that divide the state: the graph's rule); no holder on the
        tiles of ``avoid`` (those holding the rows written: a tile cannot send to itself,
        so a holder there would copy its rows across in a superstep of its own)."""
        state = self.graph.value(state_id).type
        heads = int(stage.attrs.get("kv_heads", 1))
        positions = int(stage.attrs["positions"])
        batch = state.rows // positions
        width = state.cols // heads
        tiles = self.target.tiles
        if self.spread and batch * heads <= tiles - ROW_BAND:  # below a decode step's rows
            tiles -= ROW_BAND
        candidates = np.arange(tiles, dtype=np.int32)
        if avoid is not None and batch * heads <= tiles - len(avoid):
            candidates = np.setdiff1d(candidates, avoid)
        block = cache_blocking(batch, positions, heads, len(candidates))
        turn = self.cache_turns.setdefault(stage.index, len(self.cache_turns))
        holders = cache_holders(batch, positions // block, heads, candidates, turn % 2 == 1)
        layout = BlockLayout(state.rows, state.cols, state.precision, block, width,
                             holders.reshape(-1, heads, 1))
        buffer = self._host_weight(state_id, layout, MemoryClass.STANDARD)
        self.where[stage.out] = [Piece(0, 0, layout, buffer)]
        return CacheBlocks(batch, positions, width, block, holders, layout, buffer)

    def cache_write_stage(self, stage: RowStage) -> None:
        """Rows written at runtime slots: popops ``MultiUpdate`` on every holder of each
        sequence (module docstring)."""
        g = self.graph
        state_id, rows_id, slots_id = stage.inputs
        cache = self._cache(stage, state_id, np.unique(np.concatenate(
            [piece.layout.used_tiles() for piece in self.where[rows_id]])))
        rows, precision = g.value(rows_id).type, cache.layout.precision
        written = rows.rows // cache.batch  # rows each sequence writes in one call
        holders, blocks = cache.holders, cache.positions // cache.block
        name = f"stage{stage.index}"
        builder = TransferBuilder(f"{name}.rows")
        fresh = BlockLayout(rows.rows, rows.cols, precision, written, cache.width,
                            holders.transpose(0, 2, 1).copy())
        fresh_buf = self._in_row_layout(builder, rows_id, fresh, f"{name}.fresh")
        slots_type = g.value(slots_id).type
        slots = BlockLayout(slots_type.rows, 1, slots_type.precision, written, 1,
                            holders.reshape(cache.batch, 1, -1))
        slots_buf = self._in_row_layout(builder, slots_id, slots, f"{name}.slots")
        self.emit_exchange(builder)
        compute = ComputeSet(f"{name}.update")
        for sequence in range(cache.batch):
            for position_block in range(blocks):
                first = sequence * cache.positions + position_block * cache.block
                params = multiupdate_params(written, cache.block,
                                            cache.width * precision.itemsize,
                                            precision.itemsize, fresh.pitch,
                                            cache.layout.pitch, first)
                tiles = np.sort(holders[sequence, position_block])
                zero = np.zeros(len(tiles), dtype=np.int64)
                compute.calls.append(Call(KernelInstance("multiupdate", params), tiles,
                                          [(slots_buf, zero), (fresh_buf, zero),
                                           (cache.buffer, zero)]))
        self.program.run.append(compute)

    def cache_fill_stage(self, stage: RowStage) -> None:
        """A prompt's rows written at the positions they fill (known when compiling): each
        holder of those positions receives its block's rows in one static exchange and
        copies them into the cache (a layer loop's cache is a per-layer slot, which a copy
        call can address on every pass and an exchange cannot)."""
        state_id, rows_id = stage.inputs
        cache = self._cache(stage, state_id)
        rows = self.graph.value(rows_id).type
        given = rows.rows // cache.batch  # positions each sequence fills
        used = -(-given // cache.block)  # the position blocks holding them
        precision = cache.layout.precision
        name = f"stage{stage.index}"
        holding = cache.holders[:, :used]
        fresh_buf = self.program.add_buffer(
            f"{name}.fresh", holding.ravel(), cache.block * cache.layout.pitch,
            MemoryClass.STANDARD, f"{self._name(rows_id)} by cache block")
        builder = TransferBuilder(f"{name}.rows")
        for sequence in range(cache.batch):
            window = BlockLayout(given, rows.cols, precision, cache.block, cache.width,
                                 holding[sequence][:, :, None].copy())
            self.gather(builder, rows_id, window, fresh_buf, (sequence * given, 0))
        self.emit_exchange(builder)
        compute = ComputeSet(f"{name}.fill")
        row_bytes = cache.width * precision.itemsize
        for position_block in range(used):
            count = min(cache.block, given - position_block * cache.block)
            tiles = np.sort(holding[:, position_block].ravel())
            zero = np.zeros(len(tiles), dtype=np.int64)
            params = copy_params(count, row_bytes, cache.layout.pitch, cache.layout.pitch)
            compute.calls.append(Call(KernelInstance("copy", params), tiles,
                                      [(fresh_buf, zero), (cache.buffer, zero)]))
        self.program.run.append(compute)
