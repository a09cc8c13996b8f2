"""Lowering a fixed row gather (``gather_rows``): rows moved by one exchange, no compute.

The rows a stage picks are known when compiling (a Swin block's window order, its shifted
windows, a patch merging's 2 x 2 neighbours), so the device needs no index: the input lies
in whole rows spread over the tiles, and each picked row is one transfer from the tile
holding it to the tile and offset of the row it becomes (``group`` picked rows side by side
make one result row). Runs of rows that are consecutive on both sides go as one transfer; a
row that stays on its tile is an on-tile copy (a tile cannot send to itself). The result
lies in whole rows spread over the tiles, as every row stage's does, so the norm or the
residual add that reads it finds it in place.
"""

from __future__ import annotations

import numpy as np

from ipu_stack.ir.layout import WORD, BlockLayout
from ipu_stack.lowering.base import LoweringBase, Piece, landing_layout
from ipu_stack.lowering.transfers import LocalCopy, TransferBuilder
from ipu_stack.planning.stages import RowStage
from ipu_stack.util.errors import CompileError


def row_moves(index: np.ndarray, group: int, source: BlockLayout, out: BlockLayout,
              row_bytes: int) -> tuple[np.ndarray, ...]:
    """The runs that move picked rows ``index`` from ``source`` into ``out`` (both whole
    rows): ``(source tile, source offset, target tile, target offset, bytes)`` per run,
    a run being rows consecutive on both sides between the same two tiles."""
    picks = len(index)
    result_row, part = np.divmod(np.arange(picks, dtype=np.int64), group)
    src_tile = source.tiles[index // source.row_block, 0, 0].astype(np.int64)
    src_off = (index % source.row_block) * source.pitch
    dst_tile = out.tiles[result_row // out.row_block, 0, 0].astype(np.int64)
    dst_off = (result_row % out.row_block) * out.pitch + part * row_bytes
    starts = np.ones(picks, dtype=bool)
    starts[1:] = ~((src_tile[1:] == src_tile[:-1]) & (dst_tile[1:] == dst_tile[:-1])
                   & (src_off[1:] == src_off[:-1] + row_bytes)
                   & (dst_off[1:] == dst_off[:-1] + row_bytes))
    first = np.flatnonzero(starts)
    lengths = np.diff(np.append(first, picks))
    return (src_tile[first], src_off[first], dst_tile[first], dst_off[first],
            lengths * row_bytes)


class PermuteLowering(LoweringBase):
    """The row-gather stages of a :class:`~ipu_stack.lowering.lower.Lowering`."""

    def gather_rows_stage(self, stage: RowStage) -> None:
        (x_id,) = stage.inputs
        rows, cols, precision = self._matrix(x_id)
        out_rows, out_cols, out_precision = self._matrix(stage.out)
        row_bytes = cols * precision.itemsize
        if out_precision != precision:
            raise CompileError(f"{self._name(stage.out)}: a row gather copies {precision} "
                               f"rows; it cannot store {out_precision}")
        if row_bytes % WORD:
            raise CompileError(f"{self._name(stage.out)}: a row gather moves whole words; a "
                               f"row of {cols} {precision} is {row_bytes} bytes")
        name = f"stage{stage.index}"
        source = landing_layout(rows, cols, precision, self.target)
        staging = TransferBuilder(f"{name}.rows")
        src_buf = self._in_row_layout(staging, x_id, source, name)
        self.emit_exchange(staging)
        out = landing_layout(out_rows, out_cols, precision, self.target)
        out_buf = self.result_buffer(stage.out, out)
        src_tile, src_off, dst_tile, dst_off, nbytes = row_moves(
            stage.attrs["index"].rows, int(stage.attrs.get("group", 1)), source, out, row_bytes)
        builder = TransferBuilder(f"{name}.gather")
        remote = src_tile != dst_tile
        if remote.any():
            count = int(remote.sum())
            builder.add_flat(src_tile[remote], src_buf, src_off[remote],
                             nbytes[remote] // WORD, np.ones(count, dtype=np.int64),
                             dst_tile[remote], out_buf, dst_off[remote])
        for tile, s_off, d_off, size in zip(src_tile[~remote].tolist(), src_off[~remote].tolist(),
                                            dst_off[~remote].tolist(), nbytes[~remote].tolist(),
                                            strict=True):
            builder.local.append(LocalCopy(tile, src_buf, s_off, size, out_buf, d_off, size,
                                           1, size))
        self.emit_exchange(builder)
        self.where[stage.out] = [Piece(0, 0, out, out_buf)]
