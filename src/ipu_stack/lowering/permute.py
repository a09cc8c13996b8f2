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

from ipu_stack.ir.layout import WORD
from ipu_stack.lowering.base import LoweringBase, Piece, landing_layout
from ipu_stack.lowering.transfers import TransferBuilder, add_row_moves
from ipu_stack.planning.stages import RowStage
from ipu_stack.util.errors import CompileError


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
        builder = TransferBuilder(f"{name}.gather")
        add_row_moves(builder, stage.attrs["index"].rows, int(stage.attrs.get("group", 1)),
                      (source, src_buf), (out, out_buf), row_bytes)
        self.emit_exchange(builder)
        self.where[stage.out] = [Piece(0, 0, out, out_buf)]
