"""Lower planned GEMM stages into buffers, compute sets, exchange phases and host streams.

Per stage (see ``planning.gemm``):
1. exchange ``A`` from where its producer left it into ``[br, bk]`` blocks replicated over the
   column groups (interleaved memory: an AMP operand);
2. compute set ``gemm``: one AMP call per tile into an F32 partial;
3. with depth splits, exchange ``reduce``: each tile sends the rows the other depth tiles
   finish; 4. compute set ``reduce``: sum, then the fused chain, into the stage output.
Weights and biases are written by the host in ``initialize`` straight into their blocks.
"""

from __future__ import annotations

import numpy as np

from ipu_stack.ir.graph import Graph
from ipu_stack.ir.layout import BlockLayout, round_up
from ipu_stack.ir.precision import Precision
from ipu_stack.kernels.base import KernelInstance
from ipu_stack.kernels.copy import copy_params
from ipu_stack.kernels.epilogue import epilogue_params
from ipu_stack.kernels.gemm import gemm_params
from ipu_stack.lowering.program import Call, ComputeSet, HostRead, HostWrite, Program
from ipu_stack.lowering.transfers import LocalCopy, TransferBuilder, add_layout_transfers
from ipu_stack.planning.gemm import GemmPlan
from ipu_stack.planning.stages import GemmStage
from ipu_stack.target import MemoryClass, Target


def landing_layout(rows: int, cols: int, precision: Precision, target: Target) -> BlockLayout:
    """Where the host lands an input: whole rows spread evenly over the tiles."""
    row_block = -(-rows // target.tiles)
    blocks = -(-rows // row_block)
    spread = (np.arange(blocks, dtype=np.int64) * target.tiles) // blocks
    return BlockLayout(rows, cols, precision, row_block, cols, spread.reshape(blocks, 1, 1))


def _group_calls(keys: dict[tuple, list[int]]) -> list[tuple[tuple, np.ndarray]]:
    return [(key, np.array(sorted(tiles), dtype=np.int32)) for key, tiles in sorted(keys.items())]


class Lowering:
    """Builds a :class:`Program` stage by stage."""

    def __init__(self, graph: Graph, target: Target) -> None:
        self.graph = graph
        self.target = target
        self.program = Program()
        self.where: dict[int, tuple[BlockLayout, int]] = {}
        for value in graph.values:
            self.program.tensors[value.name] = {
                "role": value.role,
                **value.type.to_json(),
            }

    def _matrix(self, value_id: int) -> tuple[int, int, Precision]:
        ttype = self.graph.value(value_id).type
        return ttype.rows, ttype.cols, ttype.precision

    def land_inputs(self) -> None:
        for value in self.graph.by_role("input"):
            rows, cols, precision = self._matrix(value.id)
            layout = landing_layout(rows, cols, precision, self.target)
            buffer = self.program.add_buffer(
                value.name, layout.used_tiles(), layout.block_bytes, MemoryClass.STANDARD,
                f"input {value.name}: {value.type}",
            )
            self.program.run.append(HostWrite(value.name, layout, buffer))
            self.where[value.id] = (layout, buffer)

    def _local_copies(self, name: str, copies: list[LocalCopy]) -> None:
        if not copies:
            return
        groups: dict[tuple, list[LocalCopy]] = {}
        for copy in copies:
            key = (copy.rows, copy.row_bytes, copy.src_pitch, copy.dst_pitch, copy.src_buf,
                   copy.dst_buf, copy.src_off, copy.dst_off)
            groups.setdefault(key, []).append(copy)
        compute = ComputeSet(name)
        for key, members in sorted(groups.items()):
            rows, row_bytes, src_pitch, dst_pitch, src_buf, dst_buf, src_off, dst_off = key
            tiles = np.array(sorted({c.tile for c in members}), dtype=np.int32)
            instance = KernelInstance("copy", copy_params(rows, row_bytes, src_pitch, dst_pitch))
            compute.calls.append(
                Call(instance, tiles, [(src_buf, np.full(len(tiles), src_off)),
                                       (dst_buf, np.full(len(tiles), dst_off))])
            )
        self.program.run.append(compute)

    def stage(self, stage: GemmStage, plan: GemmPlan) -> None:
        g = self.graph
        m, k, a_prec = self._matrix(stage.a)
        _, n, b_prec = self._matrix(stage.b)
        out_prec = g.value(stage.out).type.precision
        r_n, c_n, d_n = plan.row_splits, plan.col_splits, plan.depth_splits
        br, bk, bn, sub = plan.row_block, plan.depth_block, plan.col_block, plan.sub_rows
        grid = np.arange(r_n * c_n * d_n, dtype=np.int32).reshape(r_n, c_n, d_n)
        name = f"stage{stage.index}"

        # 1. A operand: blocks (r, d) replicated over c, in interleaved memory.
        a_layout = BlockLayout(m, k, a_prec, br, bk, grid.transpose(0, 2, 1).copy())
        a_buf = self.program.add_buffer(
            f"{name}.a", a_layout.used_tiles(), a_layout.block_bytes, MemoryClass.INTERLEAVED,
            f"{g.value(stage.a).name} as AMP left operand: {a_layout.describe()}",
        )
        src_layout, src_buf = self.where[stage.a]
        builder = TransferBuilder(f"{name}.a")
        add_layout_transfers(builder, g.value(stage.a).name, src_layout, src_buf, a_layout, a_buf)
        self.program.run.append(builder.build())
        self._local_copies(f"{name}.a.copy", builder.local)

        # Weights: blocks (d, c) replicated over r, written by the host once.
        b_layout = BlockLayout(k, n, b_prec, bk, bn, grid.transpose(2, 1, 0).copy())
        b_buf = self.program.add_buffer(
            g.value(stage.b).name, b_layout.used_tiles(), b_layout.block_bytes,
            MemoryClass.INTERLEAVED, f"weight {g.value(stage.b).name}: {b_layout.describe()}",
        )
        self.program.initialize.append(HostWrite(g.value(stage.b).name, b_layout, b_buf))

        # 2. GEMM into F32 partials.
        partial_pitch = round_up(bn * 4, 4)
        p_buf = self.program.add_buffer(
            f"{name}.partial", grid.ravel(), br * partial_pitch, MemoryClass.STANDARD,
            f"F32 partial [{br}, {bn}] of {g.value(stage.out).name}",
        )
        rows_valid = a_layout.valid_rows()
        depth_valid = a_layout.valid_cols()
        cols_valid = b_layout.valid_cols()
        groups: dict[tuple, list[int]] = {}
        for r in range(r_n):
            for c in range(c_n):
                for d in range(d_n):
                    key = (int(rows_valid[r]), int(depth_valid[d]), int(cols_valid[c]))
                    groups.setdefault(key, []).append(int(grid[r, c, d]))
        compute = ComputeSet(f"{name}.gemm")
        for (rows, depth, cols), tiles in _group_calls(groups):
            if rows == 0:
                continue
            params = gemm_params(a_prec, b_prec, rows, depth, cols, a_layout.pitch,
                                 b_layout.pitch, partial_pitch, plan.split)
            zero = np.zeros(len(tiles), dtype=np.int64)
            compute.calls.append(
                Call(KernelInstance("gemm", params), tiles, [(a_buf, zero), (b_buf, zero),
                                                             (p_buf, zero)])
            )
        self.program.run.append(compute)

        # 3. Reduce-scatter of the partials over the depth tiles.
        recv_buf = -1
        if d_n > 1:
            slot = sub * partial_pitch
            recv_buf = self.program.add_buffer(
                f"{name}.received", grid.ravel(), (d_n - 1) * slot, MemoryClass.STANDARD,
                f"{d_n - 1} received F32 partial slices [{sub}, {bn}]",
            )
            d_src, d_dst = np.meshgrid(np.arange(d_n), np.arange(d_n), indexing="ij")
            mask = d_src != d_dst
            d_src, d_dst = d_src[mask], d_dst[mask]
            slot_index = d_src - (d_src > d_dst)
            builder = TransferBuilder(f"{name}.reduce")
            src_tiles = grid[:, :, d_src].reshape(-1)
            dst_tiles = grid[:, :, d_dst].reshape(-1, 1)
            count = r_n * c_n
            builder.add(src_tiles, p_buf, np.tile(d_dst * slot, count), slot // 4, dst_tiles,
                        recv_buf, np.tile(slot_index * slot, count))
            self.program.run.append(builder.build())

        # 4. Reduce + fused chain into the stage output.
        out_layout = BlockLayout(
            m, n, out_prec, sub, bn, grid.transpose(0, 2, 1).reshape(r_n * d_n, c_n, 1).copy()
        )
        out_buf = self.program.add_buffer(
            g.value(stage.out).name, out_layout.used_tiles(), out_layout.block_bytes,
            MemoryClass.STANDARD, f"{g.value(stage.out).name}: {out_layout.describe()}",
        )
        bias_buf, bias_prec = -1, None
        if stage.bias is not None:
            bias_prec = g.value(stage.bias).type.precision
            bias_layout = BlockLayout(1, n, bias_prec, 1, bn,
                                      grid.transpose(1, 0, 2).reshape(1, c_n, r_n * d_n).copy())
            bias_buf = self.program.add_buffer(
                g.value(stage.bias).name, bias_layout.used_tiles(), bias_layout.block_bytes,
                MemoryClass.STANDARD, f"bias {g.value(stage.bias).name}",
            )
            self.program.initialize.append(
                HostWrite(g.value(stage.bias).name, bias_layout, bias_buf)
            )
        sub_valid = out_layout.valid_rows()
        groups = {}
        for r in range(r_n):
            for d in range(d_n):
                for c in range(c_n):
                    key = (int(sub_valid[r * d_n + d]), int(cols_valid[c]), d)
                    groups.setdefault(key, []).append(int(grid[r, c, d]))
        compute = ComputeSet(f"{name}.reduce")
        chain = [[kind, prec] for kind, prec in stage.chain]
        for (rows, cols, d), tiles in _group_calls(groups):
            if rows == 0:
                continue
            params = epilogue_params(d_n, rows, cols, partial_pitch, chain, bias_prec, out_prec,
                                     out_layout.pitch)
            ones = np.ones(len(tiles), dtype=np.int64)
            compute.calls.append(
                Call(KernelInstance("reduce", params), tiles, [
                    (p_buf, ones * d * sub * partial_pitch),
                    (recv_buf, ones * 0),
                    (bias_buf, ones * 0),
                    (out_buf, ones * 0),
                ])
            )
        self.program.run.append(compute)
        self.where[stage.out] = (out_layout, out_buf)

    def read_outputs(self) -> None:
        for value in self.graph.by_role("output"):
            layout, buffer = self.where[value.id]
            self.program.run.append(HostRead(value.name, layout, buffer))


def lower(graph: Graph, plans: list[tuple[GemmStage, GemmPlan]], target: Target) -> Program:
    """The whole program for ``graph`` under the chosen stage plans."""
    lowering = Lowering(graph, target)
    lowering.land_inputs()
    for stage, plan in plans:
        lowering.stage(stage, plan)
    lowering.read_outputs()
    program = lowering.program
    program.compute_lifetimes()
    end = len(program.initialize) + len(program.run) - 1
    for step in program.initialize:
        program.buffers[step.buffer].last = end  # weights stay resident across runs
    return program
