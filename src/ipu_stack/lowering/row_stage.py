"""Lowering a row stage (norms, softmax, elementwise ops and chains, rope).

A row stage gathers its inputs into a row layout (whole rows spread over the tiles) unless
they are already there, and runs one row kernel; a softmax whose scores already hold whole
rows runs where they lie.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ipu_stack.ir.graph import table_maps
from ipu_stack.ir.layout import BlockLayout
from ipu_stack.ir.precision import F32, Precision
from ipu_stack.kernels.base import KernelInstance
from ipu_stack.kernels.norm import normce_applies
from ipu_stack.kernels.rowwise import row_params
from ipu_stack.lowering.base import FEW_ROWS, LoweringBase, Piece, group_calls, landing_layout
from ipu_stack.lowering.program import Call, ComputeSet
from ipu_stack.lowering.transfers import TransferBuilder
from ipu_stack.planning.stages import RowStage, chain_step
from ipu_stack.target import MemoryClass
from ipu_stack.util.errors import CompileError


def _add_row_calls(compute: ComputeSet, tiles: np.ndarray, valid: np.ndarray,
                   params: Callable[[int], dict[str, Any]], buffers: list[int]) -> None:
    """One row-kernel call for each set of ``tiles`` with the same ``valid`` rows, reading
    and writing ``buffers`` (x, two auxiliaries, out; -1 for none) at offset 0."""
    calls: dict[tuple, list[int]] = {}
    for tile, rows in zip(tiles, valid, strict=True):
        calls.setdefault((int(rows),), []).append(int(tile))
    for (rows,), group in group_calls(calls):
        zero = np.zeros(len(group), dtype=np.int64)
        compute.calls.append(Call(KernelInstance("row", params(rows)), group,
                                  [(buffer, zero) for buffer in buffers]))


def _parameter_layout(base: BlockLayout, precision: Precision) -> BlockLayout:
    """A norm's scale or a bias row (``[1, cols]``) beside rows in ``base``: whole on every
    row tile, or a tile's columns on each tile of rows split by columns."""
    if base.col_block < base.cols:
        return BlockLayout(1, base.cols, precision, 1, base.col_block, base.tiles.copy())
    return BlockLayout(1, base.cols, precision, 1, base.cols, base.tiles.reshape(1, 1, -1).copy())


def _rope_extra(stage: RowStage) -> dict[str, Any]:
    """A rope stage's kernel parameters: its head width, its pairs where they are the
    rotate-half ones, its turned channels where they are fewer than the head's."""
    head = int(stage.attrs["head_dim"])
    rotary = int(stage.attrs.get("rotary", head))
    return {"head_dim": head, **({"pairs": "halves"} if stage.attrs.get("pairs") == "halves"
                                 else {}), **({"rotary": rotary} if rotary < head else {})}


class RowLowering(LoweringBase):
    """The row stages of a :class:`~ipu_stack.lowering.lower.Lowering` (module docstring)."""

    def _whole_row_pieces(self, value_id: int) -> list[Piece] | None:
        """The value's pieces when each holds whole rows in row blocks (no replicas) on
        tiles no other piece uses, so a row kernel can run on each where it lies; else None."""
        pieces = self.where[value_id]
        cols = self.graph.value(value_id).type.cols
        seen: set[int] = set()
        for piece in pieces:
            lay = piece.layout
            if piece.col0 or lay.cols != cols or lay.col_block < cols or lay.replicas != 1:
                return None
            tiles = {int(t) for t in lay.tiles.ravel() if t >= 0}
            if tiles & seen or len(tiles) != lay.grid[0]:
                return None
            seen |= tiles
        return pieces

    def softmax_in_place(self, stage: RowStage) -> bool:
        """A softmax run where its scores lie, when their pieces hold whole rows (a Q.K^T
        plan with one column block, ``GemmShape.rows_read_in_place``): no exchange into the
        landing layout and no second copy of the scores. Each row's arithmetic is the same
        wherever it runs, so the bits are too. False when the scores are not laid out so."""
        pieces = self._whole_row_pieces(stage.inputs[0]) if stage.kind == "softmax" else None
        if pieces is None:
            return False
        _, cols, out_prec = self._matrix(stage.out)
        x_prec = self.graph.value(stage.inputs[0]).type.precision
        compute = ComputeSet(f"stage{stage.index}.{stage.kind}")
        out_pieces = []
        for number, piece in enumerate(pieces):
            lay = piece.layout
            out_layout = BlockLayout(lay.rows, cols, out_prec, lay.row_block, cols, lay.tiles)
            name = self._name(stage.out) + (f".{number}" if len(pieces) > 1 else "")
            out_buf = self.program.add_buffer(name, out_layout.used_tiles(),
                                              out_layout.block_bytes, MemoryClass.STANDARD,
                                              f"{name}: {out_layout.describe()} (in place)",
                                              out_layout)
            valid = lay.valid_rows()
            _add_row_calls(compute, lay.tiles[:, 0, 0][valid > 0], valid[valid > 0],
                           lambda rows, lay=lay, out_layout=out_layout: row_params(
                               "softmax", rows, cols, x_prec, lay.pitch, out_prec,
                               out_layout.pitch, None, 0,
                               scale=float(stage.attrs.get("scale", 1.0))),
                           [piece.buffer, -1, -1, out_buf])
            out_pieces.append(Piece(piece.row0, 0, out_layout, out_buf))
        self.program.run.append(compute)
        self.where[stage.out] = out_pieces
        return True

    def elementwise_in_place(self, stage: RowStage) -> bool:
        """An elementwise product of few rows (``swiglu``, ``mul``: a decode step's row a
        sequence) run in the column blocks where its GEMM left its first input, the other
        gathered beside it: gathered into whole rows, a row lands on one tile, which would
        run the whole row alone (a sum gains nothing: the norm after it gathers the row
        back).  False when the stage or the layouts are not so (the loop's carried value
        keeps its own layout)."""
        rows, cols, out_prec = self._matrix(stage.out)
        g = self.graph
        if stage.kind not in ("swiglu", "mul") or rows > FEW_ROWS or any(
                g.value(i).role == "weight" for i in stage.inputs) or (
                self.body is not None and stage.out == self.body.carried_out):
            return False
        first, other = stage.inputs
        pieces = self.where[first]
        if not self._column_blocks(first):
            return False
        lay = pieces[0].layout
        aux_prec = g.value(other).type.precision
        if any(lay.col_block * p.itemsize % 4 for p in (out_prec, aux_prec)):
            return False
        out = BlockLayout(rows, cols, out_prec, lay.row_block, lay.col_block, lay.tiles)
        second = BlockLayout(rows, cols, aux_prec, lay.row_block, lay.col_block, lay.tiles)
        name = f"stage{stage.index}"
        builder = TransferBuilder(f"{name}.beside")
        aux_buf = self._in_row_layout(builder, other, second, f"{name}.beside")
        self.emit_exchange(builder)
        out_buf = self.result_buffer(stage.out, out)
        x_prec = g.value(first).type.precision
        calls: dict[tuple, list[int]] = {}
        for i, count in enumerate(lay.valid_rows()):
            for j, width in enumerate(lay.valid_cols()):
                if count and width:
                    calls.setdefault((int(count), int(width)), []).append(int(lay.tiles[i, j, 0]))
        compute = ComputeSet(f"{name}.{stage.kind}")
        for (count, width), tiles in group_calls(calls):
            zero = np.zeros(len(tiles), dtype=np.int64)
            params = row_params(stage.kind, count, width, x_prec, lay.pitch, out_prec,
                                out.pitch, aux_prec, second.pitch)
            compute.calls.append(Call(KernelInstance("row", params), tiles,
                                      [(pieces[0].buffer, zero), (aux_buf, zero), (-1, zero),
                                       (out_buf, zero)]))
        self.program.run.append(compute)
        self.where[stage.out] = [Piece(0, 0, out, out_buf)]
        return True

    def _angles(self, builder: TransferBuilder, stage: RowStage, table: BlockLayout,
                name: str) -> list[int]:
        """RoPE's cos and sin in ``table``: a weight (a prompt's positions) written there by
        the host, or the host's input (a decode step's position) gathered there."""
        return [self._host_weight(i, table, MemoryClass.STANDARD)
                if self.graph.value(i).role == "weight" else
                self._in_row_layout(builder, i, table, f"{name}.{self._name(i)}")
                for i in stage.inputs[1:]]

    def _column_blocks(self, value_id: int) -> bool:
        """Whether the value lies in one piece of column blocks, one copy each (a GEMM's
        result), not in whole rows."""
        pieces = self.where[value_id]
        return len(pieces) == 1 and not pieces[0].row0 and not pieces[0].col0 and \
            pieces[0].layout.col_block < pieces[0].layout.cols and \
            pieces[0].layout.replicas == 1

    def rope_by_heads(self, stage: RowStage) -> bool:
        """RoPE on few rows (a decode step's) run a head a tile, each with the angles: in
        whole rows one tile turns every head of the row alone.  False when the stage is not
        so or a head's block is not whole words."""
        rows, cols, out_prec = self._matrix(stage.out)
        if stage.kind != "rope" or rows > FEW_ROWS:
            return False
        g = self.graph
        head = int(stage.attrs["head_dim"])
        x_prec = g.value(stage.inputs[0]).type.precision
        aux_prec = g.value(stage.inputs[1]).type.precision
        extra = _rope_extra(stage)
        half = extra.get("rotary", head) // 2
        if any(width * p.itemsize % 4 for width, p in (
                (head, x_prec), (head, out_prec), (half, aux_prec))):
            return False
        heads = cols // head
        grid = self._head_tiles(heads)
        name = f"stage{stage.index}"
        builder = TransferBuilder(f"{name}.heads")
        x = BlockLayout(rows, cols, x_prec, rows, head, grid)
        x_buf = self._in_row_layout(builder, stage.inputs[0], x, f"{name}.heads")
        table = BlockLayout(rows, half, aux_prec, rows, half, grid.reshape(1, 1, -1))
        aux = self._angles(builder, stage, table, name)
        self.emit_exchange(builder)
        out = BlockLayout(rows, cols, out_prec, rows, head, grid)
        out_buf = self.result_buffer(stage.out, out)
        params = row_params("rope", rows, head, x_prec, x.pitch, out_prec, out.pitch, aux_prec,
                            table.pitch, **extra)
        tiles = np.sort(grid.ravel())
        zero = np.zeros(heads, dtype=np.int64)
        compute = ComputeSet(f"{name}.rope")
        compute.calls.append(Call(KernelInstance("row", params), tiles,
                                  [(x_buf, zero), (aux[0], zero), (aux[1], zero),
                                   (out_buf, zero)]))
        self.program.run.append(compute)
        self.where[stage.out] = [Piece(0, 0, out, out_buf)]
        return True

    def rope_in_place(self, stage: RowStage) -> bool:
        """RoPE on few rows run in the column blocks where its GEMM left them, each block
        with its own pairs' angles: with interleaved pairs (``ir.rope_pairs``) a block
        inside one head holds whole pairs, so no head is gathered first; rotate-half pairs
        where each block is one head (a per-head norm's, ``_heads_layout``).  False when
        the stage or the layout is not so."""
        if stage.kind != "rope" or not self.spread or not self._column_blocks(stage.inputs[0]):
            return False
        rows, cols, out_prec = self._matrix(stage.out)
        g = self.graph
        x_id = stage.inputs[0]
        head = int(stage.attrs["head_dim"])
        if rows > FEW_ROWS:
            return False
        lay = self.where[x_id][0].layout
        block = lay.col_block
        halves = stage.attrs.get("pairs") == "halves"
        if (halves or "rotary" in stage.attrs) and block != head:  # rotate-half pairs, or
            return False  # a part of the head turned, lie in one block only a head wide
        x_prec = g.value(x_id).type.precision
        aux_prec = g.value(stage.inputs[1]).type.precision
        if block % 2 or head % block or cols % block or any(
                width * p.itemsize % 4 for width, p in (
                    (block, x_prec), (block, out_prec), (block // 2, aux_prec))):
            return False
        per_head = head // block
        rotary = int(stage.attrs.get("rotary", head))
        # the angles of block j of every head: replicas over the heads' tiles
        tiles = lay.tiles[:, :, 0].reshape(lay.grid[0], cols // head, per_head)
        table = BlockLayout(rows, rotary // 2, aux_prec, lay.row_block, rotary // per_head // 2,
                            tiles.transpose(0, 2, 1).copy())
        name = f"stage{stage.index}"
        builder = TransferBuilder(f"{name}.angles")
        aux = self._angles(builder, stage, table, name)
        self.emit_exchange(builder)
        out = BlockLayout(rows, cols, out_prec, lay.row_block, block, lay.tiles)
        out_buf = self.result_buffer(stage.out, out)
        compute = ComputeSet(f"{name}.rope")
        valid = np.repeat(lay.valid_rows(), lay.grid[1])
        _add_row_calls(compute, lay.tiles[:, :, 0].ravel()[valid > 0], valid[valid > 0],
                       lambda count: row_params("rope", count, block, x_prec, lay.pitch,
                                                out_prec, out.pitch, aux_prec, table.pitch,
                                                **{**_rope_extra(stage), "head_dim": block}),
                       [self.where[x_id][0].buffer, *aux, out_buf])
        self.program.run.append(compute)
        self.where[stage.out] = [Piece(0, 0, out, out_buf)]
        return True

    def row_stage(self, stage: RowStage) -> None:
        if self.softmax_in_place(stage) or self.elementwise_in_place(stage) or \
                self.rope_in_place(stage) or self.rope_by_heads(stage):
            return
        g = self.graph
        rows, cols, out_prec = self._matrix(stage.out)
        x_prec = g.value(stage.inputs[0]).type.precision
        base = self._heads_layout(stage) or (
            self.row_layout(rows, cols, x_prec) if self._by_columns(stage) else
            landing_layout(rows, cols, x_prec, self.target))
        name = f"stage{stage.index}"
        builder = TransferBuilder(f"{name}.rows")
        x_buf = self._in_row_layout(builder, stage.inputs[0], base, name)
        aux = [-1, -1]
        aux_prec, aux_pitch, extra = None, 0, {}
        op = stage.kind
        if op in ("layer_norm", "rms_norm"):
            aux_prec = g.value(stage.inputs[1]).type.precision
            shared = _parameter_layout(base, aux_prec)
            params = [self._row_param(builder, i, shared, stage.index) for i in stage.inputs[1:]]
            aux = [*params, -1][:2]
            aux_pitch, extra = shared.pitch, {"eps": float(stage.attrs["eps"])}
            if "group" in stage.attrs:  # heads side by side, each normalised on its own
                extra["group"] = int(stage.attrs["group"])
        elif op in ("add", "mul", "swiglu", "biased_softmax"):
            aux_prec = g.value(stage.inputs[1]).type.precision
            layout = BlockLayout(rows, cols, aux_prec, base.row_block, base.col_block,
                                 base.tiles)
            maps = table_maps(g.operations[stage.op].attrs, len(stage.inputs) - 1)
            for number, (value_id, where) in enumerate(zip(stage.inputs[1:], maps,
                                                           strict=True)):
                aux[number] = self._addend(builder, value_id, layout, where,
                                           f"{name}.{('table', 'mask')[number]}")
            aux_pitch = layout.pitch
            if len(maps) == 2:
                extra = {"tables": 2}
        elif op == "rope":
            aux_prec = g.value(stage.inputs[1]).type.precision
            extra = _rope_extra(stage)
            half = extra.get("rotary", extra["head_dim"]) // 2
            table = BlockLayout(rows, half, aux_prec, base.row_block, half, base.tiles)
            aux = self._angles(builder, stage, table, name)
            aux_pitch = table.pitch
        elif op == "softmax":
            extra = {"scale": float(stage.attrs.get("scale", 1.0))}
        else:
            op_node = g.operations[stage.op]
            extra = {"chain": [list(chain_step(g, op_node))]}
            if op_node.kind == "bias_add":
                aux_prec = g.value(stage.inputs[1]).type.precision
                shared = _parameter_layout(base, aux_prec)
                aux[0] = self._row_param(builder, stage.inputs[1], shared, stage.index)
                aux_pitch = shared.pitch
            op = "chain"
        if op == "biased_softmax":
            extra = {**extra, "scale": float(stage.attrs.get("scale", 1.0))}
        self.emit_exchange(builder)
        out_layout = BlockLayout(rows, cols, out_prec, base.row_block, base.col_block,
                                 base.tiles)
        out_buf = self._carried_buffer(stage.out, out_layout, stage.inputs, stage.kind)
        if out_buf < 0:
            out_buf = self.result_buffer(stage.out, out_layout)
        if op == "rms_norm" and base.col_block < cols and "group" not in stage.attrs:
            aux[1], op, extra = self._rms_sums(name, base, x_buf), "rms_scale", {
                **extra, "width": cols}
        compute = ComputeSet(f"{name}.{stage.kind}")
        _add_row_calls(compute, base.tiles.ravel(), np.repeat(base.valid_rows(), base.grid[1]),
                       lambda rows: row_params(op, rows, base.col_block, x_prec, base.pitch,
                                               out_prec, out_layout.pitch, aux_prec, aux_pitch,
                                               **extra),
                       [x_buf, aux[0], aux[1], out_buf])
        self.program.run.append(compute)
        self.where[stage.out] = [Piece(0, 0, out_layout, out_buf)]

    def _heads_layout(self, stage: RowStage) -> BlockLayout | None:
        """A norm of each head of a decode step's few rows (Qwen3's QK-norm): a head a tile,
        below the previous row stage's tiles, so the q and k norms run side by side and the
        RoPE after them turns each head where it lies (``rope_in_place``); None otherwise
        (whole rows, each tile normalising its rows' heads in turn)."""
        rows, cols, out_prec = self._matrix(stage.out)
        if stage.kind != "rms_norm" or "group" not in stage.attrs or not self.spread or \
                rows > FEW_ROWS:
            return None
        head = int(stage.attrs["group"])
        x_prec = self.graph.value(stage.inputs[0]).type.precision
        if any(head * p.itemsize % 4 for p in (x_prec, out_prec)):
            return None
        return BlockLayout(rows, cols, x_prec, rows, head, self._head_tiles(cols // head))

    def _head_tiles(self, heads: int) -> np.ndarray:
        """A stage's grid of one head a tile (``[1, heads, 1]``), counted down below the
        previous such stage's, or below the last tile where few rows and the angles land: a
        tile cannot send to itself, so a head there would cost an on-tile copy superstep."""
        first = self.next_row_tile(heads) if self.spread else self.target.tiles - 2
        return (first - np.arange(heads, dtype=np.int32)).reshape(1, heads, 1)

    def _by_columns(self, stage: RowStage) -> bool:
        """Whether the stage may run split by columns (``LoweringBase.row_layout``): an
        elementwise stage, or an RMS norm on NormCE's loops, whose sums of squares the
        tiles then add up (``_rms_sums``)."""
        if stage.kind in ("layer_norm", "softmax", "biased_softmax", "rope"):
            return False
        if stage.kind != "rms_norm":
            return True
        if "group" in stage.attrs:  # a row of heads: whole rows, each head's sum on its tile
            return False
        x, scale = (self.graph.value(i).type.precision for i in stage.inputs[:2])
        return normce_applies(x, scale, self.graph.value(stage.out).type.cols,
                              float(stage.attrs["eps"]))

    def _rms_sums(self, name: str, base: BlockLayout, x_buf: int) -> int:
        """The first half of an RMS norm split by columns: each tile's sums of squares of
        its block (``rms_sums``), then every tile's sums to every other tile; returns the
        buffer of all blocks' sums (FP32, block-major), which ``rms_scale`` reads."""
        blocks, rows = base.grid[1], base.rows
        tiles = base.tiles.ravel()
        nbytes = 4 * rows
        sums = self.program.add_buffer(f"{name}.sums", np.sort(tiles), blocks * nbytes,
                                       MemoryClass.STANDARD,
                                       f"{name}: sums of squares of {blocks} blocks x {rows} "
                                       "rows, FP32")
        order = np.argsort(tiles, kind="stable")  # block of each call tile, in tile order
        compute = ComputeSet(f"{name}.rms_sums")
        params = row_params("rms_sums", rows, base.col_block, base.precision, base.pitch, F32,
                            nbytes, width=base.cols)
        zero = np.zeros(blocks, np.int64)
        compute.calls.append(Call(KernelInstance("row", params), tiles[order].astype(np.int32),
                                  [(x_buf, zero), (-1, zero), (-1, zero),
                                   (sums, order.astype(np.int64) * nbytes)]))
        self.program.run.append(compute)
        builder = TransferBuilder(f"{name}.sums")
        for block, tile in enumerate(tiles):
            builder.add(np.array([tile]), sums, np.array([block * nbytes]), rows,
                        np.delete(tiles, block), sums, np.array([block * nbytes]))
        self.emit_exchange(builder)
        return sums

    def _addend(self, builder: TransferBuilder, value_id: int, layout: BlockLayout,
                where: tuple[int, int], what: str) -> int:
        """The buffer of a row stage's second operand (a biased softmax's tables) in
        ``layout``: a table's rows that repeat moved there by the exchange, a table of the
        rows' size held there, an activation gathered there."""
        table = self.graph.value(value_id)
        if table.type.precision != layout.precision:
            raise CompileError(f"{table.name}: a softmax's tables share one precision")
        if table.type.rows != layout.rows and (where != (1, 1) or table.role == "weight"):
            return self.mapped_rows(builder, value_id, layout, where, what)
        if table.role == "weight":  # a table (position embeddings, a causal mask)
            return self._host_weight(value_id, layout, MemoryClass.STANDARD)
        return self._in_row_layout(builder, value_id, layout, what.replace("table", "addend"))

    def _carried_buffer(self, value_id: int, layout: BlockLayout, inputs: tuple[int, ...],
                        kind: str = "") -> int:
        """The loop's carried input buffer, when this stage makes the carried output in the
        same layout and does not read the carried input, or reads it element for element (a
        residual ``add``, which then runs in place: each element is read before it is
        written): the next pass then finds its input where the first pass did, with no copy.
        -1 otherwise."""
        body = self.body
        if body is None or value_id != body.carried_out or (
                body.carried_in in inputs and kind != "add"):
            return -1
        pieces = self.where[body.carried_in]
        if len(pieces) != 1 or pieces[0].row0 or pieces[0].col0:
            return -1
        held = pieces[0].layout
        same = (held.rows, held.cols, held.precision, held.row_block, held.col_block) == (
            layout.rows, layout.cols, layout.precision, layout.row_block, layout.col_block)
        return pieces[0].buffer if same and np.array_equal(held.tiles, layout.tiles) else -1

