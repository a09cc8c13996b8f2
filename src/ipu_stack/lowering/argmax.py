"""Lowering an argmax stage (each row's largest value's column: a greedy step's next token
chosen where the LM head leaves its logits, so the host reads 4 bytes a sequence instead
of the vocabulary's values).

The first compute set runs where the input lies: every tile holding a block of columns runs
popnn's ``ReduceMaxClassGather`` over each of its rows, one (value, column) pair a worker
(``kernels.argmax``).  A row's pairs, in column order, then go through levels of
``ReduceMaxClassSparse``, 32 pairs a vertex (Loss.cpp's ``partialsSize``), each level an
exchange and a compute set on tiles counted down from the chip's last, until one pair a
row is left; the last level writes the column alone.  Every exchange is static and every
vertex's price depends on counts only, so the step's cycles do not depend on the values.

An input that does not lie in blocks of whole columns of full-width pieces (one copy each)
is first spread in column blocks over the chip.
"""

from __future__ import annotations

import json

import numpy as np

from ipu_stack.ir.layout import WORD, BlockLayout, round_up
from ipu_stack.ir.precision import I32
from ipu_stack.kernels.argmax import (
    PAIR_BYTES,
    SPARSE_PAIRS,
    block_pairs,
    gather_params,
    sparse_params,
)
from ipu_stack.kernels.base import KernelInstance
from ipu_stack.lowering.base import LoweringBase, Piece, group_calls
from ipu_stack.lowering.program import Call, ComputeSet
from ipu_stack.lowering.transfers import TransferBuilder, add_layout_transfers
from ipu_stack.planning.stages import RowStage
from ipu_stack.target import MemoryClass
from ipu_stack.util.errors import CompileError

PAIR_WORDS = PAIR_BYTES // WORD
# a row block narrower than this many columns runs where it lies; a wider one (whole rows
# of a vocabulary on one tile) is spread over the chip first
IN_PLACE_WIDTH = 1024


def _calls(compute: ComputeSet, calls: dict[tuple, list[int]], in_buf: int,
           out_buf: int) -> None:
    """One call a set of tiles with the same parameters (keyed by their JSON), each tile's
    block at offset 0."""
    for (key,), tiles in group_calls(calls):
        zero = np.zeros(len(tiles), dtype=np.int64)
        compute.calls.append(Call(KernelInstance("argmax", json.loads(key)), tiles,
                                  [(in_buf, zero), (out_buf, zero)]))


class ArgmaxLowering(LoweringBase):
    """The argmax stages of a :class:`~ipu_stack.lowering.lower.Lowering` (module
    docstring)."""

    def argmax_stage(self, stage: RowStage) -> None:
        out = self.graph.value(stage.out)
        if not out.type.precision.is_integer:
            raise CompileError(f"argmax {out.name} must be I32 (columns), not "
                               f"{out.type.precision.kind}")
        name = f"stage{stage.index}"
        pieces = self._argmax_input(stage.inputs[0], name)
        pairs, slots = self._gather_pairs(pieces, name)
        level, top = 1, self.target.tiles - 1
        while slots:  # each level on the tiles below the level before: none sends to itself
            pairs, slots, top = self._sparse_level(stage, pairs, slots, top,
                                                   f"{name}.level{level}")
            level += 1

    def _argmax_input(self, value_id: int, name: str) -> list[Piece]:
        """The input's pieces, each full width in column blocks of one copy, all alike; else
        the input spread in column blocks over the chip (one exchange)."""
        rows, cols, precision = self._matrix(value_id)
        pieces = self.where[value_id]
        first = pieces[0].layout
        if all(p.col0 == 0 and p.layout.cols == cols and p.layout.replicas == 1
               and p.layout.col_block == first.col_block and p.layout.row_block ==
               first.row_block for p in pieces) and first.col_block <= IN_PLACE_WIDTH:
            return pieces
        per_word = max(1, WORD // precision.itemsize)
        col_block = round_up(-(-cols // self.target.tiles), per_word)
        blocks = -(-cols // col_block)
        grid = np.arange(blocks, dtype=np.int32).reshape(1, blocks, 1)
        layout = BlockLayout(rows, cols, precision, rows, col_block, grid)
        builder = TransferBuilder(f"{name}.spread")
        buffer = self._in_row_layout(builder, value_id, layout, f"{name}.spread")
        self.emit_exchange(builder)
        return [Piece(0, 0, layout, buffer)]

    def _gather_pairs(self, pieces: list[Piece], name: str) -> tuple[list[Piece], int]:
        """The gather compute set: each row's pairs (the pieces holding them, and how many
        a row), column block by column block in column order."""
        compute = ComputeSet(f"{name}.argmax")
        result: list[Piece] = []
        slots = 0
        for number, piece in enumerate(pieces):
            lay = piece.layout
            widths = lay.valid_cols()
            per_block = block_pairs(int(widths[0]))  # every block's but the last's
            slots = per_block * (len(widths) - 1) + block_pairs(int(widths[-1]))
            pairs = BlockLayout(lay.rows, PAIR_WORDS * slots, I32, lay.row_block,
                                PAIR_WORDS * per_block, lay.tiles)
            label = f"{name}.pairs" + (f".{number}" if len(pieces) > 1 else "")
            buffer = self.program.add_buffer(label, pairs.used_tiles(), pairs.block_bytes,
                                             MemoryClass.STANDARD,
                                             f"{label}: {pairs.describe()}", pairs)
            calls: dict[tuple, list[int]] = {}
            for i, count in enumerate(lay.valid_rows()):
                for j, width in enumerate(widths):
                    tile = int(lay.tiles[i, j, 0])
                    if count and width and tile >= 0:
                        params = gather_params(int(count), int(width), lay.precision, lay.pitch,
                                               j * lay.col_block, pairs.pitch)
                        calls.setdefault((json.dumps(params, sort_keys=True),), []).append(tile)
            _calls(compute, calls, piece.buffer, buffer)
            result.append(Piece(piece.row0, 0, pairs, buffer))
        self.program.run.append(compute)
        return result, slots

    def _level_tiles(self, rows: int, blocks: int, top: int) -> tuple[int, np.ndarray]:
        """A level's row block and its grid of tiles counted down from ``top`` (from the
        chip's last again where they would pass tile 0): as many row blocks as the tiles
        allow beside the level's column blocks."""
        tiles = self.target.tiles
        across = tiles // blocks
        if across == 0:
            raise CompileError(f"an argmax over {blocks} blocks of pairs a row needs more "
                               f"tiles than the chip's {tiles}")
        row_block = -(-rows // across)
        count = -(-rows // row_block) * blocks
        top = top if top - count + 1 >= 0 else tiles - 1
        grid = top - np.arange(count, dtype=np.int32)
        return row_block, grid.reshape(-1, blocks, 1)

    def _sparse_level(self, stage: RowStage, pieces: list[Piece], slots: int, top: int,
                      name: str) -> tuple[list[Piece], int, int]:
        """One level on tiles from ``top`` down: the pairs exchanged into blocks of up to 32
        a row, one sparse call a tile; the pairs it leaves, how many a row (0 after the
        last, which places the stage's result) and the next level's top tile."""
        rows = self.graph.value(stage.out).type.rows
        blocks = -(-slots // SPARSE_PAIRS)
        final = blocks == 1
        row_block, grid = self._level_tiles(rows, blocks, top)
        taken = BlockLayout(rows, PAIR_WORDS * slots, I32, row_block,
                            PAIR_WORDS * min(slots, SPARSE_PAIRS), grid)
        in_buf = self.program.add_buffer(f"{name}.in", taken.used_tiles(), taken.block_bytes,
                                         MemoryClass.STANDARD,
                                         f"{name}.in: {taken.describe()}", taken)
        builder = TransferBuilder(f"{name}.pairs")
        for piece in pieces:
            add_layout_transfers(builder, f"{name}.pairs", piece.layout, piece.buffer, taken,
                                 in_buf, (piece.row0, 0))
        self.emit_exchange(builder)
        words = 1 if final else PAIR_WORDS
        made = BlockLayout(rows, words * blocks, I32, row_block, words, grid)
        out_buf = self.result_buffer(stage.out, made) if final else self.program.add_buffer(
            f"{name}.out", made.used_tiles(), made.block_bytes, MemoryClass.STANDARD,
            f"{name}.out: {made.describe()}", made)
        calls: dict[tuple, list[int]] = {}
        for i, count in enumerate(taken.valid_rows()):
            for j, width in enumerate(taken.valid_cols()):
                if count and width:
                    params = sparse_params(int(count), int(width) // PAIR_WORDS, taken.pitch,
                                           made.pitch, final)
                    calls.setdefault((json.dumps(params, sort_keys=True),), []).append(int(grid[i, j, 0]))
        compute = ComputeSet(f"{name}.argmax")
        _calls(compute, calls, in_buf, out_buf)
        self.program.run.append(compute)
        if final:
            self.where[stage.out] = [Piece(0, 0, made, out_buf)]
            return [], 0, top
        return [Piece(0, 0, made, out_buf)], blocks, int(grid.min()) - 1


__all__ = ["ArgmaxLowering"]
