"""Lowering a lookup stage (``embedding``: a table's rows picked by runtime ids).

The table is split by columns over the tiles (a word-aligned block of columns each) and,
where the chip has tiles to spare, by rows too: ``G`` row groups of ``C`` column blocks on
``G x C`` holders, so a 49,408-row vocabulary costs each of 1,152 tiles 66 KB rather than
each of 384 tiles 198 KB; however few the ids, enough row groups that no holder keeps more
than ``HOLDER_MOST_BYTES`` of the table. The ids, landed whole on one tile, are broadcast to
every holder (one static send). Each holder runs popops ``MultiSlice`` over its rows: with one row group
that is the result (the vendor's unplanned ``createSliceableTensor`` split); with several,
each zeroes its candidate rows first (popops Fill) and writes the ids it holds, and the row
groups' candidates are summed by a reduce-scatter and a reduce, as the vendor combines
``multiUpdateAdd``'s row groups (zero, update, reduce). Exactly one group holds an id, so the
sum is that row's value exactly. Every exchange is static and every price assumes every id
in range (the vendor's vertex estimator does), so a step's cycles do not depend on the ids.
"""

from __future__ import annotations

import numpy as np

from ipu_stack.ir.layout import WORD, BlockLayout, round_up
from ipu_stack.kernels.base import KernelInstance
from ipu_stack.kernels.epilogue import epilogue_params
from ipu_stack.kernels.slice import multislice_params
from ipu_stack.lowering.base import LoweringBase, Piece, group_calls
from ipu_stack.lowering.program import Call, ComputeSet
from ipu_stack.lowering.transfers import TransferBuilder
from ipu_stack.planning.stages import RowStage
from ipu_stack.target import MemoryClass
from ipu_stack.util.errors import CompileError


def lookup_block(width: int, itemsize: int, tiles: int) -> int:
    """Columns of the table a holder keeps: the fewest whole words that spread the width
    over at most ``tiles`` tiles."""
    per_word = max(1, WORD // itemsize)
    return round_up(max(-(-width // tiles), 1), per_word)


HOLDER_MOST_BYTES = 256 << 10  # the most of a table one holder keeps (41 % of a tile)


def lookup_groups(vocab: int, count: int, column_blocks: int, tiles: int,
                  block_bytes: int = 0) -> tuple[int, int]:
    """``(row groups, rows a group)``: as many groups as the tiles left by the column blocks
    allow, no more than the ids (each group finishes a share of them) or the rows; and at
    least as many as keep a holder's rows of ``block_bytes`` each (its column block) within
    ``HOLDER_MOST_BYTES``, however few the ids: a decode step's one id a sequence would
    otherwise leave a Gemma-sized vocabulary's table on one row group, 1 MB a holder."""
    spare = max(1, tiles // column_blocks)
    needed = -(-vocab * block_bytes // HOLDER_MOST_BYTES)
    groups = max(1, min(spare, max(count, needed), vocab))
    rows = -(-vocab // groups)
    return -(-vocab // rows), rows


def lookup_holders(groups: int, column_blocks: int, tiles: np.ndarray) -> np.ndarray:
    """The holder tile of each (row group, column block), spread evenly over ``tiles``."""
    spread = (np.arange(groups * column_blocks, dtype=np.int64) * len(tiles)) // (
        groups * column_blocks)
    return tiles[spread].astype(np.int32).reshape(groups, column_blocks)


class LookupLowering(LoweringBase):
    """The lookup stages of a :class:`~ipu_stack.lowering.lower.Lowering` (module docstring)."""

    def lookup_stage(self, stage: RowStage) -> None:
        g = self.graph
        ids_id, table_id = stage.inputs
        count = g.value(ids_id).type.rows
        vocab, width = g.value(table_id).type.rows, g.value(table_id).type.cols
        precision = g.value(table_id).type.precision
        if g.value(stage.out).type.precision != precision:
            raise CompileError(f"{self._name(stage.out)}: a lookup copies the table's "
                               f"{precision} rows; it cannot store {g.value(stage.out).type}")
        candidates = np.arange(self.target.tiles, dtype=np.int64)
        if self.spread:  # off the tiles its rows land on next: a tile cannot send to itself
            candidates = np.setdiff1d(candidates, self.row_layout(
                count, width, precision).tiles.ravel())
        block = lookup_block(width, precision.itemsize, len(candidates))
        columns = -(-width // block)
        groups, rows = lookup_groups(vocab, count, columns, len(candidates),
                                     block * precision.itemsize)
        holders = lookup_holders(groups, columns, candidates)
        table = BlockLayout(vocab, width, precision, rows, block, holders[:, :, None])
        name = f"stage{stage.index}"
        builder = TransferBuilder(f"{name}.ids")
        if g.value(table_id).role == "weight":
            table_buf = self._host_weight(table_id, table, MemoryClass.STANDARD)
        else:  # an activation (a pooled row's source): gathered into the table's layout in
            # a phase of its own (with the ids' broadcast, the scheduler misses the bound)
            gather = TransferBuilder(f"{name}.table")
            table_buf = self._in_row_layout(gather, table_id, table, f"{name}.table")
            self.emit_exchange(gather)
        ids = BlockLayout(count, 1, g.value(ids_id).type.precision, count, 1,
                          holders.reshape(1, 1, -1))
        ids_buf = self._in_row_layout(builder, ids_id, ids, f"{name}.ids")
        self.emit_exchange(builder)
        found = BlockLayout(count, width, precision, count, block, holders[:1, :, None])
        pitch = found.pitch
        label = self._name(stage.out) if groups == 1 else f"{name}.found"
        found_buf = self.program.add_buffer(
            label, holders.ravel(), count * pitch, MemoryClass.STANDARD,
            f"{self._name(stage.out)} rows found: {found.describe()}", found)
        compute = ComputeSet(f"{name}.lookup")
        calls: dict[tuple, list[int]] = {}
        for group in range(groups):
            held = min(rows, vocab - group * rows)
            for tile, cols in zip(holders[group], found.valid_cols(), strict=True):
                calls.setdefault((group * rows, held, int(cols)), []).append(int(tile))
        for (first, held, cols), tiles in group_calls(calls):
            zero = np.zeros(len(tiles), dtype=np.int64)
            params = multislice_params(count, held, cols * precision.itemsize,
                                       precision.itemsize, table.pitch, pitch, first,
                                       fill=groups > 1)
            compute.calls.append(Call(KernelInstance("multislice", params), tiles,
                                      [(ids_buf, zero), (table_buf, zero), (found_buf, zero)]))
        self.program.run.append(compute)
        if groups == 1:
            self.where[stage.out] = [Piece(0, 0, found, found_buf)]
            return
        self._combine_groups(stage, holders, found, found_buf)

    def _combine_groups(self, stage: RowStage, holders: np.ndarray, found: BlockLayout,
                        found_buf: int) -> None:
        """Sum the row groups' candidates: group ``k``'s holder of a column block finishes
        the ids ``[k s, (k + 1) s)``, receiving them from the other groups' holders."""
        groups = holders.shape[0]
        count, width, precision, pitch = found.rows, found.cols, found.precision, found.pitch
        share = -(-count // groups)
        out = BlockLayout(count, width, precision, share, found.col_block, holders[:, :, None])
        name = f"stage{stage.index}"
        received = self.program.add_buffer(
            f"{name}.received", holders.ravel(), (groups - 1) * share * pitch,
            MemoryClass.STANDARD, f"{groups - 1} received {precision} candidate slices "
            f"[{share}, {found.col_block}]")
        builder = TransferBuilder(f"{name}.combine")
        valid = out.valid_rows()
        for source in range(groups):
            for target in range(groups):
                if source == target or valid[target] == 0:
                    continue
                slot = source if source < target else source - 1
                builder.add(holders[source], found_buf, np.full(holders.shape[1],
                                                                 target * share * pitch),
                            np.full(holders.shape[1], valid[target] * pitch // WORD),
                            holders[target][:, None], received,
                            np.full(holders.shape[1], slot * share * pitch))
        self.emit_exchange(builder)
        out_buf = self.program.add_buffer(
            self._name(stage.out), out.used_tiles(), out.block_bytes, MemoryClass.STANDARD,
            f"{self._name(stage.out)}: {out.describe()}", out)
        compute = ComputeSet(f"{name}.reduce")
        calls: dict[tuple, list[int]] = {}
        cols = out.valid_cols()
        for target in range(groups):
            for tile, width_here in zip(holders[target], cols, strict=True):
                if valid[target]:
                    calls.setdefault((target, int(valid[target]), int(width_here)),
                                     []).append(int(tile))
        chain = [["round", precision.to_json()]]
        for (target, rows, width_here), tiles in group_calls(calls):
            zero = np.zeros(len(tiles), dtype=np.int64)
            params = epilogue_params(groups, rows, width_here, pitch, share, chain, None,
                                     precision, out.pitch, partials=precision)
            compute.calls.append(Call(KernelInstance("reduce", params), tiles, [
                (found_buf, np.full(len(tiles), target * share * pitch, dtype=np.int64)),
                (received, zero), (-1, zero), (out_buf, zero)]))
        self.program.run.append(compute)
        self.where[stage.out] = [Piece(0, 0, out, out_buf)]
