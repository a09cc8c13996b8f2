"""Lowering a GEMM stage.

A GEMM stage of G groups (``head_matmul``: one group per image and head) runs every group on
its own tiles (where the groups outnumber the tiles, in waves one after another, each wave's
groups side by side: ``planning.gemm``):
1. one exchange phase gathers every group's ``A`` blocks (replicated over column groups) and,
   when ``B`` is an activation, its ``B`` blocks (the AMP weights, in interleaved memory);
2. compute set ``gemm``: one AMP call per tile into a partial (FP16 in FP8 mode, F32 in F16
   mode, interleaved);
3. with depth splits, exchange ``reduce``: each tile sends the rows the other depth tiles
   finish; 4. compute set ``reduce``: sum, then the fused chain, into the stage output.
Weights are written by the host in ``initialize`` straight into the blocks that use them.

A swapped plan (``planning.gemm``) runs the same four parts with the operands' roles
exchanged: the row's blocks are the AMP's weights (interleaved memory), the weight blocks,
stored transposed in standard memory, stream through the workers, the partial of a tile is
a ``[1, bn]`` row and the reduce-scatter gives each depth tile a ``D``-th of its columns.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ipu_stack.ir.graph import Graph, head_geometry
from ipu_stack.ir.layout import BlockLayout
from ipu_stack.ir.precision import F16, F32, Precision
from ipu_stack.kernels.base import KernelInstance
from ipu_stack.kernels.epilogue import epilogue_params, partials_are_result
from ipu_stack.kernels.gemm import gemm_params, scratch_bytes
from ipu_stack.lowering.base import (
    FRAGMENT_LIMIT,
    LEAN_FRAGMENT_LIMIT,
    LoweringBase,
    Piece,
    group_calls,
)
from ipu_stack.lowering.own_pieces import Cell, OperandNeed, Rect, held_blocks, keep_off_own_pieces
from ipu_stack.lowering.program import Call, ComputeSet
from ipu_stack.lowering.transfers import TransferBuilder
from ipu_stack.planning.gemm import GemmPlan
from ipu_stack.planning.stages import GemmStage
from ipu_stack.target import MemoryClass
from ipu_stack.util.errors import CompileError

# an all-gather among at least this many peers stays multicasts where the program is
# lowered with ``multicast_gathers``: each tile sends its slice once instead of once a peer
# (an exchange-table entry each), and the phase takes one slice's words more than as
# unicasts (1/16 of it at most). Assumed; sensitivity in docs/architecture.md ("Memory")
MULTICAST_GATHER_PEERS = 16


@dataclass(frozen=True)
class Group:
    """One independent GEMM of a stage: where its operands and result sit in the tensors."""

    a_origin: tuple[int, int]
    b_origin: tuple[int, int]
    out_origin: tuple[int, int]
    tile_base: int


def keys_transposed(stage: GemmStage) -> bool:
    """A ``qk`` product reads its B (the keys) transposed: ``[cols, depth]`` blocks."""
    return stage.kind == "head_matmul" and stage.attrs["mode"] == "qk"


def stage_groups(graph: Graph, stage: GemmStage, plan: GemmPlan, row0: int = 0,
                 wave: int = 0, per_wave: int = 0) -> list[Group]:
    """The groups of a GEMM stage (one for ``matmul``, batch x heads for ``head_matmul``),
    for the row chunk that starts at row ``row0`` of each group's A and output; with
    ``per_wave``, only wave ``wave``'s groups, on the tiles from 0."""
    if stage.kind == "matmul":
        return [Group((row0, 0), (0, 0), (row0, 0), 0)]
    geo = head_geometry(stage.attrs, graph.value(stage.b).type)
    t, s, d = geo.tokens, geo.kv_tokens, geo.head_dim
    first = wave * per_wave
    groups = []
    for b in range(geo.batch):
        for h in range(geo.heads):
            g = b * geo.heads + h
            if per_wave and not first <= g < first + per_wave:
                continue
            base = (g - first) * plan.tiles_used
            keys = (b * s, geo.kv_head(h) * d)
            if stage.attrs["mode"] == "qk":
                groups.append(Group((b * t + row0, h * d), keys, (g * t + row0, 0), base))
            else:
                groups.append(Group((g * t + row0, 0), keys, (b * t + row0, h * d), base))
    return groups


@dataclass
class _GemmGrid:
    """What the four parts of a GEMM stage share: the tile grids (one per head group, each
    ``[rows, cols, depth]`` of tile numbers), the operand layouts and the partials' format."""

    stage: GemmStage
    plan: GemmPlan
    name: str
    groups: list
    grids: list[np.ndarray]
    all_tiles: np.ndarray
    a_layouts: list[BlockLayout]
    b_layouts: list[BlockLayout]
    transposed: bool
    partial_prec: Precision
    partial_pitch: int
    cols_valid: np.ndarray


class GemmLowering(LoweringBase):
    """The GEMM stages of a :class:`~ipu_stack.lowering.lower.Lowering` (module docstring)."""

    def gemm_stage(self, stage: GemmStage, plan: GemmPlan) -> None:
        """A GEMM stage in four supersteps' worth of steps: operands to their tiles, the AMP
        into partials, the reduce-scatter of depth partials, the reduce with its fused
        chain into the stage output."""
        pieces: list[Piece] = []
        for wave in range(plan.waves):
            shared: dict[str, int] = {}  # the weight, activation-B and bias buffers, made once
            for row0, chunk in plan.chunks():
                pieces += self._gemm_chunk(stage, plan, chunk, row0, wave, shared)
        self.where[stage.out] = pieces

    def _gemm_chunk(self, stage: GemmStage, plan: GemmPlan, chunk: GemmPlan, row0: int,
                    wave: int, shared: dict[str, int]) -> list[Piece]:
        """One row chunk of one wave: operands, AMP, reduce and epilogue; its output's
        pieces."""
        suffix = (f".w{wave}" if plan.waves > 1 else "") + (
            f".c{row0}" if plan.row_chunks > 1 else "")
        single = plan.waves == 1 and plan.row_chunks == 1 and not plan.streamed
        grid = self._gemm_grid(stage, chunk, row0, suffix, (wave, plan.wave_groups), single)
        a_buf, b_buf = self._gemm_operands(grid, shared)
        p_buf = self._gemm_partials(grid, a_buf, b_buf)
        if partials_are_result(chunk.depth_splits, chunk.mode, stage.chain,
                               stage.bias is not None):
            return self._partials_as_result(grid, p_buf)
        recv_buf = self._gemm_reduce_scatter(grid, p_buf)
        return self._gemm_epilogue(grid, p_buf, recv_buf, shared)

    def _partials_as_result(self, gg: _GemmGrid, p_buf: int) -> list[Piece]:
        """The output's pieces where the partials already are the result
        (``partials_are_result``): the partials' buffer, read in place."""
        layouts = self._out_layouts(gg)
        assert layouts[0].pitch == gg.partial_pitch, "partials and result pitches differ"
        return [Piece(group.out_origin[0], group.out_origin[1], layout, p_buf)
                for group, layout in zip(gg.groups, layouts, strict=True)]

    def _out_layouts(self, gg: _GemmGrid) -> list[BlockLayout]:
        """The stage output's layout in each head group: tile ``(r, c, d)`` holds rows
        ``[d * sub, (d + 1) * sub)`` of row block ``r`` in column block ``c`` (swapped:
        row ``r``'s columns ``[d * sub, (d + 1) * sub)`` of column block ``c``)."""
        plan = gg.plan
        r_n, c_n, d_n = plan.row_splits, plan.col_splits, plan.depth_splits
        out_prec = self.graph.value(gg.stage.out).type.precision
        if plan.swapped:
            rows, cols = plan.slice_shape
            return [BlockLayout(plan.shape.rows, plan.shape.cols, out_prec, rows, cols,
                                grid.reshape(r_n, c_n * d_n, 1).copy()) for grid in gg.grids]
        return [BlockLayout(plan.shape.rows, plan.shape.cols, out_prec, plan.sub_rows,
                            plan.col_block,
                            grid.transpose(0, 2, 1).reshape(r_n * d_n, c_n, 1).copy())
                for grid in gg.grids]

    def _gemm_grid(self, stage: GemmStage, plan: GemmPlan, row0: int = 0,
                   suffix: str = "", wave: tuple[int, int] = (0, 0),
                   single: bool = False) -> _GemmGrid:
        """Which tile holds which (row, column, depth) block, per head group, and the
        operands' block layouts (``row0``: the first row of a row chunk, ``suffix`` its
        buffers' name, ``wave``: the wave and its groups, where the groups run in waves;
        ``single``: the stage's one chunk and wave, whose tiles may trade cells to stay
        off the operand pieces they hold, ``lowering.own_pieces``)."""
        r_n, c_n, d_n = plan.row_splits, plan.col_splits, plan.depth_splits
        bn = plan.col_block
        transposed = keys_transposed(stage)
        groups = stage_groups(self.graph, stage, plan, row0, *wave)
        if self.paired:
            # paired tiles: column blocks innermost, so A's replicas (over c) are adjacent
            # tiles and its broadcasts reach whole tile pairs (two-lane transfers)
            local = np.arange(r_n * d_n * c_n, dtype=np.int32).reshape(r_n, d_n, c_n)
            local = local.transpose(0, 2, 1).copy()
        else:  # depth blocks innermost: the reduce-scatter stays between neighbours
            local = np.arange(r_n * c_n * d_n, dtype=np.int32).reshape(r_n, c_n, d_n)
        grids = [local + group.tile_base for group in groups]
        all_tiles = np.concatenate([grid.ravel() for grid in grids])
        if self.spread:  # after the previous stage's grid, so independent stages can share
            shift = self.next_grid_tile(stage.index, int(all_tiles.max()) + 1)
            grids = [grid + shift for grid in grids]
            all_tiles = all_tiles + shift
        if all_tiles.max() >= self.target.tiles:
            raise CompileError(f"stage {stage.index} needs {all_tiles.max() + 1} tiles")
        name = f"stage{stage.index}{suffix}"
        if single and self.spread:  # a decode step's; chunks and waves share weight blocks
            # a block's extent does not depend on its tile: one group's layouts tell them
            (a_blocks,), (b_blocks,) = self._operand_layouts(stage, plan, grids[:1])
            grids = keep_off_own_pieces(grids, self._operand_needs(
                stage, groups, a_blocks, b_blocks, set(all_tiles.tolist())), self.paired)
            all_tiles = np.concatenate([grid.ravel() for grid in grids])
        a_layouts, b_layouts = self._operand_layouts(stage, plan, grids)
        partial_prec = F16 if plan.mode == "fp8" else F32
        cols_valid = (b_layouts[0].valid_rows() if transposed else b_layouts[0].valid_cols())
        return _GemmGrid(stage, plan, name, groups, grids, all_tiles, a_layouts, b_layouts,
                         transposed, partial_prec, bn * partial_prec.itemsize, cols_valid)

    def _operand_layouts(self, stage: GemmStage, plan: GemmPlan, grids: list[np.ndarray]
                         ) -> tuple[list[BlockLayout], list[BlockLayout]]:
        """A's blocks ``(r, d)`` replicated over the column blocks and B's ``(d, c)`` (a
        ``qk`` product's keys ``(c, d)``) over the row blocks, one layout a head group."""
        g = self.graph
        a_prec = g.value(stage.a).type.precision
        b_prec = g.value(stage.b).type.precision
        m, k, n = plan.shape.rows, plan.shape.depth, plan.shape.cols
        br, bk, bn = plan.row_block, plan.depth_block, plan.col_block
        a_layouts = [BlockLayout(m, k, a_prec, br, bk, grid.transpose(0, 2, 1).copy())
                     for grid in grids]
        if keys_transposed(stage):
            b_layouts = [BlockLayout(n, k, b_prec, bn, bk, grid.transpose(1, 2, 0).copy())
                         for grid in grids]
        else:  # a swapped plan's AMP streams the weight block's columns: stored transposed
            b_layouts = [BlockLayout(k, n, b_prec, bk, bn, grid.transpose(2, 1, 0).copy(),
                                     plan.swapped) for grid in grids]
        return a_layouts, b_layouts

    def _operand_needs(self, stage: GemmStage, groups: list[Group], a_layout: BlockLayout,
                       b_layout: BlockLayout, tiles: set[int]) -> list[OperandNeed]:
        """What the grid's ``tiles`` already hold of A and of an activation B, and which
        block each cell ``(group, r, c, d)`` reads (``lowering.own_pieces``)."""
        qk = keys_transposed(stage)

        def a_need(cell: Cell) -> Rect:
            g, r, _, d = cell
            r0, r1, c0, c1 = a_layout.block_extent(r, d)
            (ro, co) = groups[g].a_origin
            return r0 + ro, r1 + ro, c0 + co, c1 + co

        def b_need(cell: Cell) -> Rect:
            g, _, c, d = cell
            r0, r1, c0, c1 = b_layout.block_extent(*((c, d) if qk else (d, c)))
            (ro, co) = groups[g].b_origin
            return r0 + ro, r1 + ro, c0 + co, c1 + co

        needs = [OperandNeed(held_blocks(self.where.get(stage.a, []), tiles), a_need)]
        if self.graph.value(stage.b).role != "weight" and stage.b in self.where:
            needs.append(OperandNeed(held_blocks(self.where[stage.b], tiles), b_need))
        return needs

    def _gemm_operands(self, gg: _GemmGrid, shared: dict[str, int]) -> tuple[int, int]:
        """A's and B's blocks gathered onto the grid; their buffers.  B's buffer is made by
        the first row chunk and kept in ``shared`` for the others: its blocks do not depend
        on the rows."""
        g, stage, name, groups = self.graph, gg.stage, gg.name, gg.groups
        a_layouts, b_layouts, all_tiles = gg.a_layouts, gg.b_layouts, gg.all_tiles
        # 1. operands: A blocks (r, d) replicated over c; B blocks (d, c) replicated over r.
        # B is the AMP's weights (CWEI), loaded 128 bits at a time from interleaved memory
        # once per pass; A streams through the workers from standard memory.
        # A swapped plan's row is the AMP's weights: interleaved memory.
        swapped = gg.plan.swapped
        key = (stage.a, tuple(gr.a_origin for gr in groups),
               tuple((a.rows, a.cols, a.precision, a.row_block, a.col_block,
                      a.tiles.tobytes()) for a in a_layouts), swapped)
        builder = TransferBuilder(f"{name}.operands")
        if key in self.gathered:
            a_buf = self.gathered[key]
        else:
            a_buf = self.gathered[key] = self.program.add_buffer(
                f"{name}.a", all_tiles, a_layouts[0].block_bytes,
                MemoryClass.INTERLEAVED if swapped else MemoryClass.STANDARD,
                f"{self._name(stage.a)} as AMP {'weights' if swapped else 'input'}: "
                f"{a_layouts[0].describe()}", a_layouts[0],
            )
            self.gather_whole(builder, stage.a, [(a, a_buf, gr.a_origin) for a, gr in
                                                 zip(a_layouts, groups, strict=True)], name,
                              LEAN_FRAGMENT_LIMIT if self.lean else FRAGMENT_LIMIT)
        if "b" in shared:
            b_buf = shared["b"]
        elif g.value(stage.b).role == "weight" and not gg.plan.streamed:
            b_buf = shared["b"] = self._host_weight(
                stage.b, b_layouts[0],
                MemoryClass.STANDARD if swapped else MemoryClass.INTERLEAVED)
        else:
            if gg.plan.streamed:  # held once, spread over the row groups (planning.gemm)
                stored = self._streamed_layout(gg)
                # read only by the exchange: standard memory, leaving interleaved memory to
                # the AMP's operands and the weights resident plans keep there
                held = self._host_weight(stage.b, stored, MemoryClass.STANDARD)
                self.where[stage.b] = [Piece(0, 0, stored, held)]
            b_buf = self.program.add_buffer(
                f"{name}.b", all_tiles, b_layouts[0].block_bytes, MemoryClass.INTERLEAVED,
                f"{self._name(stage.b)} as AMP weights: {b_layouts[0].describe()}",
                b_layouts[0],
            )
            # a phase of its own: a tile's A and B blocks come from different replica
            # groups, and one group per phase lets the scheduler meet the bound exactly
            shared["b"] = b_buf
            self.emit_exchange(builder)
            builder = TransferBuilder(f"{name}.right")
            self.gather_whole(builder, stage.b, [(b, b_buf, gr.b_origin) for b, gr in
                                                 zip(b_layouts, groups, strict=True)], name)
            # an all-gather (streamed weights over the row groups, or an activation's blocks
            # already on the tiles that share them): at its bound as unicasts, unless a
            # program short of memory keeps multicasts among many peers (one send where
            # unicasts take one a peer, each an exchange-table entry; a slice's time more)
            if (gg.plan.streamed or builder.all_gather()) and not (
                    self.multicast_gathers and builder.most_peers() >= MULTICAST_GATHER_PEERS):
                builder.split_multicasts()
        self.emit_exchange(builder)
        return a_buf, b_buf

    def _streamed_layout(self, gg: _GemmGrid) -> BlockLayout:
        """Where a streamed plan holds its weights: the depth cut into ``D x R`` row blocks,
        block ``i`` of column block ``c`` on row group ``i % R`` of depth group ``i // R``,
        so each tile keeps one slice and most of a block's slices sit in its own depth
        group."""
        plan, grid = gg.plan, gg.grids[0]  # [r, c, d] tile numbers (one group: a matmul)
        k, n = plan.shape.depth, plan.shape.cols
        slices = plan.depth_splits * plan.row_splits
        rows = -(-k // slices)
        blocks = -(-k // rows)
        index = np.arange(blocks)
        tiles = grid[index % plan.row_splits, :, index // plan.row_splits]  # [blocks, c]
        return BlockLayout(k, n, gg.b_layouts[0].precision, rows, plan.col_block,
                           tiles[:, :, None].astype(np.int32))

    def _gemm_partials(self, gg: _GemmGrid, a_buf: int, b_buf: int) -> int:
        """The AMP calls, grouped by valid block shape; the partials' buffer."""
        stage, plan, name, grids, all_tiles = gg.stage, gg.plan, gg.name, gg.grids, gg.all_tiles
        a_layouts, b_layouts, transposed = gg.a_layouts, gg.b_layouts, gg.transposed
        partial_prec, partial_pitch, cols_valid = gg.partial_prec, gg.partial_pitch, gg.cols_valid
        a_prec, b_prec = a_layouts[0].precision, b_layouts[0].precision
        br, bn = plan.row_block, plan.col_block
        # 2. GEMM into partials (FP16 in FP8 mode, F32 in F16 mode), in interleaved memory
        # where the AMP reads and writes them 128 bits at a time.
        p_buf = self.program.add_buffer(
            f"{name}.partial", all_tiles, br * partial_pitch, MemoryClass.INTERLEAVED,
            f"{partial_prec} partial [{br}, {bn}] of {self._name(stage.out)}",
        )
        rows_valid = a_layouts[0].valid_rows()
        depth_valid = a_layouts[0].valid_cols()
        calls: dict[tuple, list[int]] = {}
        for grid in grids:
            for (r, c, d), tile in np.ndenumerate(grid):
                key = (int(rows_valid[r]), int(depth_valid[d]), int(cols_valid[c]))
                calls.setdefault(key, []).append(int(tile))
        compute = ComputeSet(f"{name}.gemm")
        instances = []
        for (rows, depth, cols), tiles in group_calls(calls):
            if rows == 0:
                continue
            if plan.swapped:  # out^T = W^T x^T: a partial of ``cols`` rows, one item each
                params = gemm_params(b_prec, a_prec, cols, depth, rows, b_layouts[0].pitch,
                                     a_layouts[0].pitch, partial_prec.itemsize, plan.mode,
                                     b_transposed=True)
            else:
                params = gemm_params(a_prec, b_prec, rows, depth, cols, a_layouts[0].pitch,
                                     b_layouts[0].pitch, partial_pitch, plan.mode, transposed)
            instances.append((KernelInstance("gemm", params), tiles))
        scratch = max((scratch_bytes(i.params) for i, _ in instances), default=0)
        s_buf = -1
        if scratch:  # F16 mode on FP8 data: the F16 copies of the operands
            s_buf = self.program.add_buffer(
                f"{name}.f16", all_tiles, scratch, MemoryClass.INTERLEAVED,
                f"F16 copies of the FP8 operands of {self._name(stage.out)}",
            )
        if plan.swapped:  # the weights stream as the AMP's rows, the row is its weights
            a_buf, b_buf = b_buf, a_buf
        for instance, tiles in instances:
            zero = np.zeros(len(tiles), dtype=np.int64)
            compute.calls.append(Call(instance, tiles, [(a_buf, zero), (b_buf, zero),
                                                        (p_buf, zero), (s_buf, zero)]))
        self.program.run.append(compute)
        return p_buf

    def _gemm_reduce_scatter(self, gg: _GemmGrid, p_buf: int) -> int:
        """Each depth tile sends every other one its slice of the partials; the buffer the
        slices land in (-1 with no depth split)."""
        plan, name, grids, all_tiles = gg.plan, gg.name, gg.grids, gg.all_tiles
        partial_prec, partial_pitch = gg.partial_prec, gg.partial_pitch
        m, r_n, c_n, d_n = plan.shape.rows, plan.row_splits, plan.col_splits, plan.depth_splits
        br, bn, sub = plan.row_block, plan.col_block, plan.sub_rows
        # 3. Reduce-scatter of the partials over the depth tiles.
        recv_buf = -1
        if d_n > 1 and plan.swapped:
            return self._swapped_reduce_scatter(gg, p_buf)
        if d_n > 1:
            slot = sub * partial_pitch
            recv_buf = self.program.add_buffer(
                f"{name}.received", all_tiles, (d_n - 1) * slot, MemoryClass.STANDARD,
                f"{d_n - 1} received {partial_prec} partial slices [{sub}, {bn}]",
            )
            d_src, d_dst = np.meshgrid(np.arange(d_n), np.arange(d_n), indexing="ij")
            mask = d_src != d_dst
            d_src, d_dst = d_src[mask], d_dst[mask]
            slot_index = d_src - (d_src > d_dst)
            builder = TransferBuilder(f"{name}.reduce")
            # only the valid rows of each slice move (a ragged last row block holds fewer)
            valid = np.clip(m - (np.arange(r_n)[:, None] * br + np.arange(d_n)[None, :] * sub),
                            0, sub)  # [r, d_dst]
            for grid in grids:
                for r in range(r_n):
                    rows = valid[r, d_dst]
                    keep = rows > 0
                    if not keep.any():
                        continue
                    count = c_n
                    builder.add(
                        grid[r, :, d_src[keep]].T.reshape(-1), p_buf,
                        np.tile(d_dst[keep] * slot, count),
                        np.tile(-(-rows[keep] * partial_pitch // 4), count),
                        grid[r, :, d_dst[keep]].T.reshape(-1, 1), recv_buf,
                        np.tile(slot_index[keep] * slot, count),
                    )
            self.emit_exchange(builder)
        return recv_buf

    def _swapped_reduce_scatter(self, gg: _GemmGrid, p_buf: int) -> int:
        """A swapped plan's reduce-scatter: depth tile ``d`` of column block ``c`` receives
        every other depth tile's partial of its columns ``[d * sub, (d + 1) * sub)``; the
        buffer the slices land in."""
        plan, grid = gg.plan, gg.grids[0]  # one group: a matmul
        r_n, c_n, d_n = plan.row_splits, plan.col_splits, plan.depth_splits
        sub = plan.slice_shape[1]
        item = gg.partial_prec.itemsize
        slot = sub * item
        recv_buf = self.program.add_buffer(
            f"{gg.name}.received", gg.all_tiles, (d_n - 1) * slot, MemoryClass.STANDARD,
            f"{d_n - 1} received {gg.partial_prec} partial slices [1, {sub}]")
        d_src, d_dst = np.meshgrid(np.arange(d_n), np.arange(d_n), indexing="ij")
        mask = d_src != d_dst
        d_src, d_dst = d_src[mask], d_dst[mask]
        slot_index = d_src - (d_src > d_dst)
        builder = TransferBuilder(f"{gg.name}.reduce")
        for r in range(r_n):
            for c in range(c_n):  # only a slice's valid columns move
                cols = np.clip(plan.shape.cols - (c * plan.col_block + d_dst * sub), 0, sub)
                keep = cols > 0
                builder.add(grid[r, c, d_src[keep]], p_buf, d_dst[keep] * slot,
                            -(-cols[keep] * item // 4), grid[r, c, d_dst[keep]][:, None],
                            recv_buf, slot_index[keep] * slot)
        self.emit_exchange(builder)
        return recv_buf

    def _gemm_epilogue(self, gg: _GemmGrid, p_buf: int, recv_buf: int,
                       shared: dict[str, int]) -> list[Piece]:
        """The reduce kernels with the fused chain, into the stage's output buffer; the
        pieces of the output it wrote (the bias buffer is made once, in ``shared``)."""
        g, stage, plan, name, grids = self.graph, gg.stage, gg.plan, gg.name, gg.grids
        groups, all_tiles, cols_valid = gg.groups, gg.all_tiles, gg.cols_valid
        partial_prec, partial_pitch = gg.partial_prec, gg.partial_pitch
        n = plan.shape.cols
        r_n, c_n, d_n = plan.row_splits, plan.col_splits, plan.depth_splits
        bn, sub = plan.col_block, plan.sub_rows
        out_prec = g.value(stage.out).type.precision
        # 4. Reduce + fused chain into the stage output.
        out_layouts = self._out_layouts(gg)
        out_buf = self.program.add_buffer(
            self._name(stage.out) + name[len(f"stage{stage.index}"):], all_tiles,
            out_layouts[0].block_bytes, MemoryClass.STANDARD,
            f"{self._name(stage.out)}: {out_layouts[0].describe()}", out_layouts[0],
        )
        bias_buf, bias_prec = -1, None
        if stage.bias is not None:
            bias_prec = g.value(stage.bias).type.precision
            bias_layout = BlockLayout(
                1, n, bias_prec, 1, bn,
                grids[0].transpose(1, 0, 2).reshape(1, c_n, r_n * d_n).copy(),
            ) if not plan.swapped else BlockLayout(  # by the depth tiles' column slices
                1, n, bias_prec, 1, plan.slice_shape[1],
                grids[0].transpose(1, 2, 0).reshape(1, c_n * d_n, r_n).copy())
            if "bias" not in shared:
                shared["bias"] = self._host_weight(stage.bias, bias_layout, MemoryClass.STANDARD)
            bias_buf = shared["bias"]
        sub_valid = out_layouts[0].valid_rows()
        slice_cols = out_layouts[0].valid_cols()  # swapped: each depth tile's columns
        calls = {}
        for grid in grids:
            for (r, c, d), tile in np.ndenumerate(grid):
                key = ((int(sub_valid[r]), int(slice_cols[c * d_n + d]), d) if plan.swapped
                       else (int(sub_valid[r * d_n + d]), int(cols_valid[c]), d))
                calls.setdefault(key, []).append(int(tile))
        # a swapped tile's partial is one row of ``bn``: its slice ``d`` and each received
        # slot are ``sub`` items of one row
        if plan.swapped:
            partial_pitch = plan.slice_shape[1] * partial_prec.itemsize
        slice_bytes = sub * partial_pitch
        compute = ComputeSet(f"{name}.reduce")
        chain = [list(step) for step in stage.chain]
        for (rows, cols, d), tiles in group_calls(calls):
            if rows == 0:
                continue
            params = epilogue_params(d_n, rows, cols, partial_pitch, sub, chain, bias_prec,
                                     out_prec, out_layouts[0].pitch, partial_prec)
            ones = np.ones(len(tiles), dtype=np.int64)
            compute.calls.append(Call(KernelInstance("reduce", params), tiles, [
                (p_buf, ones * d * slice_bytes), (recv_buf, ones * 0),
                (bias_buf, ones * 0), (out_buf, ones * 0),
            ]))
        self.program.run.append(compute)
        return [Piece(group.out_origin[0], group.out_origin[1], layout, out_buf)
                for group, layout in zip(groups, out_layouts, strict=True)]

