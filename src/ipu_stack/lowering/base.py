"""What every kind of stage lowering shares: where each value lies, and the helpers that move it.

A tensor on the machine is a list of :class:`Piece` s, each a block layout of a rectangle of
the tensor in one buffer (attention heads give one piece per head).  :class:`LoweringBase`
holds the :class:`Program` being built and ``where`` (value to pieces), and gives the stage
lowerings (``lowering.gemm_stage``, ``lowering.row_stage``) their common steps: gathering a
value into a layout, emitting an exchange phase with its local copies, host-written weights
and row parameters, landing the inputs, reading the outputs and the per-stage probe reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ipu_stack.ir.graph import Graph, state_writes, table_row_index
from ipu_stack.ir.layout import BlockLayout
from ipu_stack.ir.one_pass import rms_blocks
from ipu_stack.ir.precision import Precision
from ipu_stack.kernels.base import KernelInstance
from ipu_stack.kernels.copy import copy_params
from ipu_stack.lowering.program import Call, ComputeSet, HostRead, HostWrite, Program
from ipu_stack.lowering.transfers import (
    LocalCopy,
    TransferBuilder,
    add_layout_transfers,
    add_row_moves,
)
from ipu_stack.planning.stages import GemmStage, Stage
from ipu_stack.target import MemoryClass, Target
from ipu_stack.util.errors import CompileError

PARAM_BLOCK = 64  # columns per holder tile of a per-layer row parameter inside a loop
# transfers one tile may receive in one gather before the value goes through whole rows
# first (8 bytes of exchange table each: 1024 is 8 KB of one tile's memory for one phase)
FRAGMENT_LIMIT = 1024
# the same for a GEMM's A operand in a lean program (``LoweringBase.lean``)
LEAN_FRAGMENT_LIMIT = 128
# replicated per-row parameters (norm scales and shifts outside a layer loop) a tile may
# hold before the program is lowered lean: a model of many stages that do not repeat (Swin's
# four stages of different widths) would otherwise hold every one of them on every tile
REPLICA_BUDGET = 32 * 1024


@dataclass(frozen=True)
class Piece:
    """The rectangle of a tensor at ``(row0, col0)`` held in ``layout`` in ``buffer``."""

    row0: int
    col0: int
    layout: BlockLayout
    buffer: int


@dataclass
class BodyState:
    """What lowering a loop body records: per-layer weights written so far, and the carried
    values (``lowering.loop`` reads it back)."""

    slot_weights: frozenset[int]
    carried_in: int
    carried_out: int
    weights: list[tuple[int, BlockLayout, MemoryClass, int]] = field(default_factory=list)


# rows up to which whole rows land on the chip's last tiles, not its first: a GEMM grid
# starts at tile 0, and a row already on a tile of the grid it feeds costs that tile an
# on-tile copy in a compute superstep of its own (a decode step's few rows, every stage)
FEW_ROWS = 32
# a decode step's rows up to this many are split by columns where they are wide (RMS norms,
# residual adds, casts: ``LoweringBase.row_layout``); NormCE's split kernel runs up to three
# rows a call over its six workers, more rows are cheaper a row a tile
SPLIT_ROWS = 3
# a decode step's last tiles: its few rows land there and its RoPE heads run there, and its
# KV cache is held below them, so a head's keys reach the cache's holders by exchange and
# never by an on-tile copy in a superstep of its own
ROW_BAND = 2 * FEW_ROWS


def landing_layout(rows: int, cols: int, precision: Precision, target: Target) -> BlockLayout:
    """Whole rows spread evenly over the tiles (host landing and row stages); a few rows
    (``FEW_ROWS``) from the last tile down."""
    row_block = -(-rows // target.tiles)
    blocks = -(-rows // row_block)
    spread = (np.arange(blocks, dtype=np.int64) * target.tiles) // blocks
    if rows <= FEW_ROWS:
        spread = target.tiles - 1 - spread
    return BlockLayout(rows, cols, precision, row_block, cols, spread.reshape(blocks, 1, 1))


def column_layout(rows: int, cols: int, precision: Precision, blocks: int,
                  target: Target) -> BlockLayout:
    """Few rows split by columns into ``blocks`` equal blocks, one a tile from the last
    tile down (where a decode step's rows land whole)."""
    tiles = (target.tiles - 1 - np.arange(blocks, dtype=np.int32)).reshape(1, blocks, 1)
    return BlockLayout(rows, cols, precision, rows, cols // blocks, tiles)


def same_layout(held: BlockLayout, wanted: BlockLayout) -> bool:
    """Whether a value held in ``held`` is already in ``wanted``: the same blocks, precision
    and tiles (a layout compares by identity)."""
    return (held.row_block, held.col_block, held.precision) == (
        wanted.row_block, wanted.col_block, wanted.precision) and np.array_equal(
        held.tiles, wanted.tiles)


def group_calls(keys: dict[tuple, list[int]]) -> list[tuple[tuple, np.ndarray]]:
    """Each call shape of ``keys`` with its tiles as a sorted int32 array, in shape order."""
    return [(key, np.array(sorted(tiles), dtype=np.int32)) for key, tiles in sorted(keys.items())]


class LoweringBase:
    """The program being built, where each value lies, and the steps every stage uses."""

    def __init__(self, graph: Graph, target: Target, paired: bool = False) -> None:
        self.graph = graph
        self.target = target
        self.paired = paired
        self.program = Program()
        self.where: dict[int, list[Piece]] = {}
        # set while the body of a layer loop is lowered (``lowering.loop``)
        self.body: BodyState | None = None
        # GEMM A operands already gathered, by value and block layout: q, k and v read the
        # same normed rows in the same tiling, and one gather serves all three (values never
        # change once made; cleared where the loop body begins and ends)
        self.gathered: dict[tuple, int] = {}
        # a lean program (``lowering.driver``: its stages outside any loop would replicate
        # more than ``REPLICA_BUDGET`` of parameters a tile) keeps its norms' parameters on
        # holder tiles and gathers each per stage, and moves a GEMM's A operand through whole
        # rows past ``LEAN_FRAGMENT_LIMIT`` transfers a tile: each costs an exchange phase,
        # and saves the replicas and exchange-table entries of stages that do not repeat
        self.lean = False
        # all-gathers among many tiles stay multicasts (``lowering.driver.lower``)
        self.multicast_gathers = False
        # a program of few rows (a decode step) puts each GEMM's grid after the one before
        # (``next_grid_tile``) and its independent supersteps are fused (``lowering.fuse``):
        # the stages that do not depend on each other then run side by side
        self.spread = False
        self.grid_cursor = 0
        self.grid_starts: dict[int, int] = {}  # stage index -> its grid's first tile
        self.row_cursor = target.tiles - 2
        self.cache_turns: dict[int, int] = {}  # cache stage -> its turn (``lowering.cache``)
        states = state_writes(graph)
        for value in graph.values:  # a state is declared as such: resident, written in place
            role = "state" if value.id in states else value.role
            self.program.tensors[value.name] = {"role": role, **value.type.to_json()}

    def _matrix(self, value_id: int) -> tuple[int, int, Precision]:
        ttype = self.graph.value(value_id).type
        return ttype.rows, ttype.cols, ttype.precision

    def _name(self, value_id: int) -> str:
        return self.graph.value(value_id).name

    def next_grid_tile(self, stage: int, span: int) -> int:
        """The first tile of stage ``stage``'s GEMM grid of ``span`` tiles (every row chunk
        of the stage on the same grid): where the previous grid ended (an even tile, so
        paired tiles stay pairs), or, when it would not fit there, the even tile where it
        ends nearest the chip's last (the farthest from the grids just before)."""
        if stage not in self.grid_starts:
            fits = self.grid_cursor + span <= self.target.tiles
            start = self.grid_cursor if fits else max((self.target.tiles - span) // 2 * 2, 0)
            self.grid_cursor = start + span + span % 2
            self.grid_starts[stage] = start
        return self.grid_starts[stage]

    def reserve_grids(self, spans: list[int]) -> None:
        """Before sibling GEMM stages (they read the same operand, and run side by side):
        start them at tile 0 when their grids would not all fit after the previous grid."""
        if self.grid_cursor + sum(span + span % 2 for span in spans) > self.target.tiles:
            self.grid_cursor = 0

    def next_row_tile(self, count: int) -> int:
        """The highest of ``count`` tiles, counted down, for a row stage that runs a block
        a tile: below the previous such stage's, from the tile below the last one (where few
        rows land, and a tile cannot send to itself) down to ``ROW_BAND`` tiles below the
        top."""
        floor = max(self.target.tiles - ROW_BAND, 0)
        start = self.row_cursor if self.row_cursor - count + 1 >= floor else \
            self.target.tiles - 2
        start = min(max(start, count - 1), self.target.tiles - 1)  # no tile below 0
        self.row_cursor = start - count
        return start

    def row_layout(self, rows: int, cols: int, precision: Precision) -> BlockLayout:
        """Where an elementwise row stage or an RMS norm runs: a decode step's few wide
        rows (``spread``, at most ``SPLIT_ROWS``, an RMS norm's blocks ``rms_blocks``) split
        by columns over a tile a block, so no tile runs or receives a whole row; otherwise
        whole rows (``landing_layout``).  The residual stream's adds, norms and casts all
        land so, and pass their values on without an exchange."""
        blocks = rms_blocks(cols) if self.spread and rows <= SPLIT_ROWS else 1
        if blocks == 1:
            return landing_layout(rows, cols, precision, self.target)
        return column_layout(rows, cols, precision, blocks, self.target)

    # ------------------------------------------------------------------ helpers
    def gather(
        self, builder: TransferBuilder, value_id: int, dst: BlockLayout, dst_buf: int,
        origin: tuple[int, int] = (0, 0),
    ) -> None:
        """Transfers filling ``dst`` (a window of the value at ``origin``) from its pieces."""
        r0, c0 = origin
        for piece in self.where[value_id]:
            lay = piece.layout
            if (piece.row0 >= r0 + dst.rows or r0 >= piece.row0 + lay.rows
                    or piece.col0 >= c0 + dst.cols or c0 >= piece.col0 + lay.cols):
                continue
            add_layout_transfers(builder, self._name(value_id), lay, piece.buffer, dst, dst_buf,
                                 (piece.row0, piece.col0), origin)

    def gather_whole(self, builder: TransferBuilder, value_id: int,
                     targets: list[tuple[BlockLayout, int, tuple[int, int]]], stage: str,
                     limit: int = FRAGMENT_LIMIT) -> None:
        """Gather ``value_id`` into every ``(layout, buffer, origin)`` of ``targets``; when
        that would land more than ``FRAGMENT_LIMIT`` transfers on one tile (a block of
        many rows assembled from narrow column blocks, row by row), move the value into
        whole rows first (one extra phase) and gather from those: each transfer then
        carries a whole row's share, and every transfer costs its receiver an
        exchange-table entry."""
        trial = TransferBuilder(builder.name)
        for layout, buffer, origin in targets:
            self.gather(trial, value_id, layout, buffer, origin)
        pieces = self.where[value_id]
        in_rows = len(pieces) == 1 and pieces[0].layout.col_block == pieces[0].layout.cols
        if trial.most_received() <= limit or in_rows:
            builder.absorb(trial)
            return
        rows, cols, precision = self._matrix(value_id)
        layout = landing_layout(rows, cols, precision, self.target)
        staging = TransferBuilder(f"{stage}.rows")
        buffer = self._in_row_layout(staging, value_id, layout, f"{stage}.whole")
        self.emit_exchange(staging)
        self.where[value_id] = [Piece(0, 0, layout, buffer)]
        for layout, target, origin in targets:
            self.gather(builder, value_id, layout, target, origin)

    def emit_exchange(self, builder: TransferBuilder) -> None:
        exchange = builder.build()
        if exchange.transfers:
            self.program.run.append(exchange)
        self._local_copies(f"{builder.name}.copy", builder.local)

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

    def _host_weight(self, value_id: int, layout: BlockLayout, memory_class: MemoryClass) -> int:
        name = self._name(value_id)
        buffer = self.program.add_buffer(name, layout.used_tiles(), layout.block_bytes,
                                         memory_class, f"weight {name}: {layout.describe()}",
                                         layout)
        self.program.initialize.append(HostWrite(name, layout, buffer))
        if self.body is not None and value_id in self.body.slot_weights:
            self.body.weights.append((value_id, layout, memory_class, buffer))
        return buffer

    def _row_param(self, builder: TransferBuilder, value_id: int, shared: BlockLayout,
                   stage: int) -> int:
        """A ``[1, cols]`` parameter (layer-norm scale or shift) on every row tile.

        Outside a loop it is written there by the host.  A per-layer parameter inside a
        loop body would cost its full size on every row tile for every layer, so it is kept
        in column blocks on a few holder tiles instead and gathered into a row buffer by the
        stage's exchange (the per-layer address table points the sends at layer ``k``'s
        blocks).  A decode step's rows are few (``spread``): each layer's parameter is
        written on its row tiles, so its norms gather nothing but the row."""
        in_loop = self.body is not None and value_id in self.body.slot_weights
        if self.spread or not in_loop and (self.body is not None or not self.lean):
            return self._host_weight(value_id, shared, MemoryClass.STANDARD)
        cols = shared.cols
        block = min(cols, PARAM_BLOCK)
        blocks = -(-cols // block)
        stride = max(self.target.tiles // blocks, 1)
        made = len(self.body.weights) if self.body is not None else len(self.program.initialize)
        offset = (stage * 7 + made * 3) % stride
        holders = (np.arange(blocks) * stride + offset) % self.target.tiles
        held = BlockLayout(1, cols, shared.precision, 1, block,
                           holders.reshape(1, blocks, 1).astype(np.int32))
        buffer = self._host_weight(value_id, held, MemoryClass.STANDARD)
        self.where[value_id] = [Piece(0, 0, held, buffer)]
        return self._in_row_layout(builder, value_id, shared, f"stage{stage}.{self._name(value_id)}")

    def result_buffer(self, value_id: int, layout: BlockLayout) -> int:
        """A new buffer for a stage's result in ``layout``."""
        name = self._name(value_id)
        return self.program.add_buffer(name, layout.used_tiles(), layout.block_bytes,
                                       MemoryClass.STANDARD, f"{name}: {layout.describe()}",
                                       layout)

    def mapped_rows(self, builder: TransferBuilder, value_id: int, layout: BlockLayout,
                    where: tuple[int, int], what: str) -> int:
        """A buffer holding a table's rows in ``layout``'s rows by ``where``, its ``(block,
        repeat)`` (:func:`~ipu_stack.ir.graph.table_row_index`): the table is held once in
        whole rows spread over the tiles (written by the host, or landed as an input), and
        each call's exchange moves each row to the rows that add it. A Swin layer's relative
        position bias is the same for every image (``(1, 1)``: row ``r`` adds table row ``r
        mod P``): held at the scores' size it would cost each layer the batch's multiple of
        its bytes; its shift mask, one ``[T, T]`` block a window, serves that window's every
        head (``(T, H)``)."""
        rows, cols, precision = self._matrix(value_id)
        if value_id not in self.where:
            held = landing_layout(rows, cols, precision, self.target)
            self.where[value_id] = [Piece(0, 0, held, self._host_weight(
                value_id, held, MemoryClass.STANDARD))]
        pieces = self.where[value_id]
        if len(pieces) != 1 or pieces[0].layout.col_block != cols or \
                pieces[0].layout.pitch != layout.pitch:
            raise CompileError(f"{self._name(value_id)}: a repeated table is held in whole "
                               "rows")
        buffer = self.program.add_buffer(
            f"{what}.rows", layout.used_tiles(), layout.block_bytes, MemoryClass.STANDARD,
            f"{self._name(value_id)} in blocks of {where[0]} rows, each {where[1]} times: "
            f"{layout.describe()}", layout)
        # whole stored rows: a row of an odd number of halves moves with its padding word
        add_row_moves(builder, table_row_index(layout.rows, rows, *where), 1,
                      (pieces[0].layout, pieces[0].buffer), (layout, buffer), layout.pitch)
        return buffer

    def land_inputs(self, in_rows: frozenset[int] = frozenset()) -> None:
        """Every input written by the host where it lands: whole rows spread over the
        tiles, the ids on the last tile, and the inputs of ``in_rows`` in ``row_layout``."""
        for value in self.graph.by_role("input"):
            rows, cols, precision = self._matrix(value.id)
            layout = landing_layout(rows, cols, precision, self.target)
            if value.id in in_rows:
                layout = self.row_layout(rows, cols, precision)
            if precision.is_integer:  # ids: whole on one tile, broadcast from there in one
                layout = BlockLayout(rows, cols, precision, rows, cols,  # send a reader
                                     np.full((1, 1, 1), self.target.tiles - 1, np.int32))
            buffer = self.program.add_buffer(
                value.name, layout.used_tiles(), layout.block_bytes, MemoryClass.STANDARD,
                f"input {value.name}: {value.type}", layout,
            )
            self.program.run.append(HostWrite(value.name, layout, buffer))
            self.where[value.id] = [Piece(0, 0, layout, buffer)]


    def _in_row_layout(self, builder: TransferBuilder, value_id: int, layout: BlockLayout,
                       what: str) -> int:
        """A buffer holding ``value_id`` in ``layout``: reused if it is already there."""
        pieces = self.where[value_id]
        if len(pieces) == 1 and pieces[0].row0 == pieces[0].col0 == 0 and same_layout(
                pieces[0].layout, layout):
            return pieces[0].buffer
        buffer = self.program.add_buffer(
            f"{what}.rows", layout.used_tiles(), layout.block_bytes, MemoryClass.STANDARD,
            f"{self._name(value_id)} in rows: {layout.describe()}", layout,
        )
        self.gather(builder, value_id, layout, buffer)
        return buffer


    def read_outputs(self) -> None:
        for value in self.graph.by_role("output"):
            for piece in self.where[value.id]:
                self.program.run.append(HostRead(value.name, piece.layout, piece.buffer,
                                                 (piece.row0, piece.col0)))

    def checkpoint(self, stage: Stage, index: int) -> None:
        """Probe read of a stage's result, right after the stage: the simulator hands it to
        the verdict, which judges every stage on the device's own inputs (not device
        traffic: the device does not count it as host bytes)."""
        value = self.graph.value(stage.out)
        if value.role == "output":
            return
        operation = stage.operations[-1] if isinstance(stage, GemmStage) else stage.op
        for piece in self.where[stage.out]:
            self.program.run.append(HostRead(value.name, piece.layout, piece.buffer,
                                             (piece.row0, piece.col0), index, operation))
