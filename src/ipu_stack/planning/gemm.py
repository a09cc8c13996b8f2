"""GEMM tilings: split rows (R), columns (C) and depth (D) of ``[M, K] x [K, N]`` over tiles.

Tile ``(r, c, d)`` holds an A block ``[br, bk]`` (broadcast to the C column groups), a
resident weight block ``[bk, bn]`` and computes a partial ``[br, bn]``: FP16 in the native
FP8 mode, F32 in the F16 mode (after an FP8 -> F16 cast when the operands are FP8).  With
D > 1 the partials are reduce-scattered: tile ``(r, c, d)`` finishes rows
``[d * br/D, (d+1) * br/D)`` of its block.  The analytical cost adds, for the busiest tile,
the A exchange (receive words), the GEMM kernel, the reduction exchange and the epilogue
kernel, each phase with the sync before it and the measured phase cost
(``target.timing``).  Both modes are searched when the operands are FP8; the planner
keeps whichever is cheaper (``mode`` forces one).

**Row chunks.**  A plan may run its rows in ``row_chunks`` chunks one after another on the
same tiles: the weight block stays resident once, while the A block, the partials and the
received slices exist for one chunk at a time.  That is what lets a small tile group (a
pipeline stage) run a whole image's GEMM: ``R1 x C x D`` over 729 rows would need the
image's A block and partials on each tile at once.  Each chunk pays its own phases and
syncs, so chunks never save cycles; the memory fitter takes them only when bytes are short.
Rows are computed the same way whichever chunk holds them, so chunking changes no bits.

**Streamed weights.**  A plan with R row groups keeps R copies of its weight block, one per
row group: with a tower's 27 layers resident, only single-copy (R1) plans fit, and those
broadcast the whole activation to every column tile.  A streamed plan holds the weights
once, each block cut into R slices spread over its R row-group tiles, and gathers the block
onto those tiles with one exchange phase per run (every tile receives the slices it lacks:
a weight block of a few tens of KB is far fewer words than the activation block an R1 plan
gathers).  The arithmetic is the resident plan's, bit for bit.

**Waves.**  A ``head_matmul`` stage's groups (a head of an image, or of a window) each take
tiles of their own.  Where they outnumber the tiles (Swin-L at batch 4: 1,536 window-head
products), they run in ``waves`` rounds one after another, each round's groups side by side
on tiles of their own: each round pays its own phases and syncs, and every round's output
stays until the next stage reads it.

**Swapped operands.**  At one row a pass loads a 16-column x depth weight block for 16
products (164 cycles).  A swapped plan (poplin's ``swapOperands``, which its planner tries
first for a matmul: ``lib/poplin/ConvPlan.cpp``) makes the row the AMP's weights, loaded
once a depth pass, and streams the weight block's columns through the workers as rows, 4
cycles each: ``out^T = W^T x^T``.  Each tile keeps its block transposed (``[bn, bk]``, in
standard memory: only the row sits in interleaved memory), its partial is a ``[1, bn]``
row, and the depth partials are reduce-scattered by columns: tile ``(r, c, d)`` finishes
columns ``[d * bn/D, (d+1) * bn/D)`` of its block.  Each output is the same depth blocks'
partials, added owner first as a plain plan adds them (the owner now a column's depth
tile: ``ir.interpret.swapped_split``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ipu_stack.ir.layout import WORD, round_up
from ipu_stack.kernels.epilogue import partials_are_result
from ipu_stack.kernels.gemm import partial_itemsize
from ipu_stack.planning.costs import (
    estimate_chain,
    estimate_exchange_phase,
    estimate_gemm,
    estimate_reduce,
)
from ipu_stack.target import Target
from ipu_stack.target.timing import p
from ipu_stack.util.errors import CompileError


@dataclass(frozen=True)
class GemmShape:
    """What the planner needs to know of one fused GEMM stage."""

    op: int
    rows: int
    depth: int
    cols: int
    a_itemsize: int
    fp8: bool
    chain: tuple = ()
    has_bias: bool = False
    groups: int = 1
    b_resident: bool = True
    out_itemsize: int = 2
    # a softmax reads the output: in place when the plan's blocks hold whole rows (C = 1),
    # else after an exchange that gathers it into whole rows (a second copy on each tile)
    rows_read_in_place: bool = False
    # tiles per shared exchange bus when the compile pairs its exchanges (1: unpaired): A's
    # broadcast to its C column replicas, laid out side by side (``lowering``), then reaches
    # whole tile pairs and moves two words a cycle
    pair_lanes: int = 1


@dataclass(frozen=True)
class GemmPlan:
    """One tiling of a GEMM stage and its analytical cost breakdown (busiest tile)."""

    shape: GemmShape
    row_splits: int
    col_splits: int
    depth_splits: int
    row_block: int
    depth_block: int
    col_block: int
    mode: str
    costs: dict[str, int] = field(default_factory=dict, compare=False, hash=False)
    row_chunks: int = 1
    streamed: bool = False  # weights stored once, gathered onto the R row groups per run
    waves: int = 1  # rounds of groups where they outnumber the tiles (module docstring)
    swapped: bool = False  # the weights stream through the AMP, the row is its weights

    @property
    def slice_shape(self) -> tuple[int, int]:
        """``(rows, cols)`` of the output slice each depth tile finishes: a ``D``-th of
        the block's rows, or of its columns when the operands are swapped."""
        if self.swapped:
            return self.row_block, self.col_block // self.depth_splits
        return self.row_block // self.depth_splits, self.col_block

    @property
    def wave_groups(self) -> int:
        """The groups each wave runs side by side (the last may run fewer)."""
        return -(-self.shape.groups // self.waves)

    @property
    def tiles_used(self) -> int:
        return self.row_splits * self.col_splits * self.depth_splits

    @property
    def sub_rows(self) -> int:
        return self.slice_shape[0]

    @property
    def estimated_cycles(self) -> int:
        return sum(self.costs.values())

    @property
    def exchange_cycles(self) -> int:
        return (self.costs.get("a_exchange", 0) + self.costs.get("b_exchange", 0)
                + self.costs.get("reduce_exchange", 0) + self.costs.get("rows_exchange", 0))

    def tile(self, r: int, c: int, d: int) -> int:
        """Tile of block ``(r, c, d)``: depth groups adjacent so reductions stay local."""
        return (r * self.col_splits + c) * self.depth_splits + d

    def describe(self) -> str:
        chunks = f" in {self.row_chunks} row chunks" if self.row_chunks > 1 else ""
        streamed = " weights streamed" if self.streamed else ""
        waves = f" in {self.waves} waves" if self.waves > 1 else ""
        swapped = " operands swapped" if self.swapped else ""
        return (
            f"R{self.row_splits}xC{self.col_splits}xD{self.depth_splits} "
            f"blocks {self.row_block}x{self.depth_block}x{self.col_block} mode={self.mode}"
            f"{chunks}{streamed}{waves}{swapped}"
        )

    def chunks(self) -> list[tuple[int, GemmPlan]]:
        """``(first row, plan of the chunk)`` for each row chunk, in order (one chunk: the
        plan itself)."""
        if self.row_chunks == 1:
            return [(0, self)]
        out, row0 = [], 0
        for rows in chunk_sizes(self.shape.rows, self.row_chunks):
            plan = cost_plan(replace(self.shape, rows=rows, rows_read_in_place=False),
                             self.row_splits, self.col_splits, self.depth_splits,
                             mode=self.mode)
            assert plan is not None
            out.append((row0, plan))
            row0 += rows
        return out


ROW_CHUNKS = (2, 3, 4, 6, 8, 12, 16)
"""The row chunk counts the search tries (with one row split: chunks replace row splits
where the weights must stay single)."""


def chunk_sizes(rows: int, chunks: int) -> list[int]:
    """``rows`` cut into ``chunks`` runs as even as possible, the longer ones first."""
    return [rows // chunks + (i < rows % chunks) for i in range(chunks)]


def cast_elements(shape: GemmShape, mode: str, br: int, bk: int, bn: int) -> int:
    """Operand elements an F16-mode call casts from FP8 (0 in FP8 mode or on F16 data)."""
    return br * bk + bk * bn if mode == "f16" and shape.fp8 else 0


def cost_plan(
    shape: GemmShape, r: int, c: int, d: int, target: Target | None = None, mode: str = "fp8",
    chunks: int = 1, streamed: bool = False, swapped: bool = False,
) -> GemmPlan | None:
    """Build and cost the plan with R=r, C=c, D=d splits in ``mode`` over ``chunks`` row
    chunks (each costed at its own size), or None if invalid; ``streamed``: the weights
    held once, spread over all the plan's tiles, and gathered onto the R row groups by an
    exchange each run; ``swapped``: the row as the AMP's weights (module docstring)."""
    if swapped:
        return None if chunks > 1 or streamed else _cost_swapped(shape, r, c, d, mode)
    if streamed:
        if r < 2 or chunks > 1 or not shape.b_resident or shape.groups != 1:
            return None
        plan = cost_plan(shape, r, c, d, target, mode)
        if plan is None:
            return None
        words = plan.depth_block * round_up(plan.col_block * shape.a_itemsize, WORD) // WORD
        return replace(plan, streamed=True,
                       costs={**plan.costs, "b_exchange": estimate_exchange_phase(words)})
    if chunks > 1:
        if chunks > shape.rows:
            return None
        parts = [cost_plan(replace(shape, rows=rows, rows_read_in_place=False), r, c, d,
                           target, mode)
                 for rows in sorted(set(chunk_sizes(shape.rows, chunks)))]
        if any(part is None for part in parts):
            return None
        sizes = chunk_sizes(shape.rows, chunks)
        costs: dict[str, int] = {}
        for part in parts:
            assert part is not None
            times = sizes.count(part.shape.rows)
            for key, value in part.costs.items():
                if key == "b_exchange":  # B's blocks do not depend on the rows: gathered once
                    costs[key] = max(costs.get(key, 0), value)
                else:
                    costs[key] = costs.get(key, 0) + times * value
        first = parts[-1]  # the longest chunk: its blocks bound the buffers
        assert first is not None
        costs.update(_rows_gather(shape, r * c * d, c))
        return replace(first, shape=shape, costs=costs, row_chunks=chunks)
    fp8_mode = mode == "fp8"
    step = p("amp_f8_depth") if fp8_mode else p("amp_f16_depth")
    br = round_up(-(-shape.rows // r), d)
    bk = round_up(-(-shape.depth // d), step)
    bn = round_up(-(-shape.cols // c), p("amp_out_columns"))
    if (r - 1) * br >= shape.rows or (d - 1) * bk >= shape.depth or (c - 1) * bn >= shape.cols:
        return None
    a_words = br * round_up(bk * shape.a_itemsize, WORD) // WORD
    costs = {
        "a_exchange": estimate_exchange_phase(a_exchange_words(shape, a_words, c)),
        "gemm": estimate_gemm(br, bk, bn, fp8_mode,
                              cast_elements=cast_elements(shape, mode, br, bk, bn)),
    }
    if not shape.b_resident:  # an activation B (attention's k, v): a phase of its own
        costs["b_exchange"] = estimate_exchange_phase(
            bk * round_up(bn * shape.a_itemsize, WORD) // WORD)
    sub = br // d
    item = partial_itemsize(mode)
    if d > 1:
        costs["reduce_exchange"] = estimate_exchange_phase((d - 1) * sub * bn * item // WORD)
    chain = [list(step_) for step_ in shape.chain]
    if not partials_are_result(d, mode, chain, shape.has_bias):  # else no reduce kernel
        # the received slots, summed, hold a merged bias + GELU's bias copies (F16 bias)
        room = (d - 1) * sub * bn * item // 2 if shape.has_bias else 0
        # a full block is dense: the lowering lays partials and result bn columns apart
        costs["epilogue"] = (estimate_reduce(sub * bn, d, f32_partials=not fp8_mode,
                                             dense=True)
                             + estimate_chain(chain, sub, bn, room))
    costs.update(_rows_gather(shape, r * c * d, c))
    return GemmPlan(shape, r, c, d, br, bk, bn, mode, costs)


SWAP_ROWS = 3
"""The most rows a swapped plan takes (one a row group: its row is the AMP's weights)."""
SWAP_ALIGN = 4
"""A swapped plan's column slices are whole words of FP8 output (4 columns)."""


def _cost_swapped(shape: GemmShape, r: int, c: int, d: int, mode: str) -> GemmPlan | None:
    """The swapped plan with R=r (one row a row group), C=c, D=d, or None if invalid
    (module docstring): every one of the ``c x d`` column slices holds columns."""
    if r != shape.rows or r > SWAP_ROWS or not shape.b_resident or shape.groups != 1:
        return None
    fp8_mode = mode == "fp8"
    bk = round_up(-(-shape.depth // d), p("amp_f8_depth") if fp8_mode else p("amp_f16_depth"))
    sub = round_up(-(-shape.cols // (c * d)), SWAP_ALIGN)
    if (d - 1) * bk >= shape.depth or -(-shape.cols // sub) != c * d:
        return None
    bn, item = sub * d, partial_itemsize(mode)
    a_words = round_up(bk * shape.a_itemsize, WORD) // WORD
    costs = {
        "a_exchange": estimate_exchange_phase(a_exchange_words(shape, a_words, c)),
        "gemm": estimate_gemm(bn, bk, 1, fp8_mode,
                              cast_elements=cast_elements(shape, mode, 1, bk, bn)),
    }
    if d > 1:
        costs["reduce_exchange"] = estimate_exchange_phase((d - 1) * sub * item // WORD)
    chain = [list(step_) for step_ in shape.chain]
    if not partials_are_result(d, mode, chain, shape.has_bias):
        room = (d - 1) * sub * item // 2 if shape.has_bias else 0
        costs["epilogue"] = (estimate_reduce(sub, d, f32_partials=not fp8_mode, dense=True)
                             + estimate_chain(chain, 1, sub, room))
    costs.update(_rows_gather(shape, r * c * d, c * d))
    return GemmPlan(shape, r, c, d, 1, bk, bn, mode, costs, swapped=True)


def swapped_col_splits(shape: GemmShape, r: int, d: int, tiles: int) -> int:
    """The most column groups a swapped plan with R=r, D=d can have on ``tiles`` (each of
    its ``C x D`` slices at least :data:`SWAP_ALIGN` columns and none empty), or 0."""
    c = min(tiles // (r * d), shape.cols // (SWAP_ALIGN * d))
    while c >= 1:
        sub = round_up(-(-shape.cols // (c * d)), SWAP_ALIGN)
        if -(-shape.cols // sub) == c * d:
            return c
        c -= 1
    return 0


def a_exchange_words(shape: GemmShape, a_words: int, col_splits: int) -> int:
    """The busiest tile's receive cycles for its A block of ``a_words`` words: half of
    them when the exchange is paired and the block's C replicas, side by side from an even
    tile, fill whole pairs (an even C), every word otherwise."""
    lanes = shape.pair_lanes
    if lanes > 1 and col_splits % lanes == 0:
        return -(-a_words // lanes)
    return a_words


def gathered_row_bytes(shape: GemmShape, tiles: int, col_splits: int) -> int:
    """Bytes a tile receives when a softmax must gather the output into whole rows (its
    rows spread evenly over the plan's tiles, as ``lowering``'s landing layout spreads
    them), or 0 when the plan's blocks already hold whole rows or nothing reads it so."""
    if not shape.rows_read_in_place or col_splits == 1:
        return 0
    return -(-shape.rows // tiles) * round_up(shape.cols * shape.out_itemsize, WORD)


def _rows_gather(shape: GemmShape, tiles: int, col_splits: int) -> dict[str, int]:
    nbytes = gathered_row_bytes(shape, tiles, col_splits)
    return {"rows_exchange": estimate_exchange_phase(nbytes // WORD)} if nbytes else {}


def resident_bytes(plan: GemmPlan) -> int:
    """Bytes a tile keeps for the whole program: its weight block (and bias slice)."""
    s = plan.shape
    if not s.b_resident:
        return 0
    if plan.swapped:  # the block transposed: a row of depth a column
        weight = plan.col_block * round_up(plan.depth_block * s.a_itemsize, WORD)
    else:
        rows = -(-plan.depth_block // plan.row_splits) if plan.streamed else plan.depth_block
        weight = rows * round_up(plan.col_block * s.a_itemsize, WORD)
    bias = round_up(plan.col_block * 2, WORD) if s.has_bias else 0
    return weight + bias


def interleaved_transient_bytes(plan: GemmPlan) -> int:
    """The transient bytes that must sit in interleaved memory (``lowering.gemm_stage``
    places them there): an activation B operand (a swapped plan's row), the partial sums
    and the F16 operand copies."""
    s = plan.shape
    if plan.swapped:  # its row, loaded as the AMP's weights
        b = plan.row_block * round_up(plan.depth_block * s.a_itemsize, WORD)
    elif plan.streamed or not s.b_resident:  # B's blocks gathered each run
        b = plan.depth_block * round_up(plan.col_block * s.a_itemsize, WORD)
    else:
        b = 0
    partial = plan.row_block * plan.col_block * partial_itemsize(plan.mode)
    scratch = 2 * cast_elements(s, plan.mode, plan.row_block, plan.depth_block, plan.col_block)
    return b + partial + scratch


def transient_bytes(plan: GemmPlan) -> int:
    """Bytes a tile holds only while the stage runs (operands, partials, result)."""
    s = plan.shape
    # a swapped plan's row is its AMP weights, counted in interleaved memory
    a = 0 if plan.swapped else plan.row_block * round_up(plan.depth_block * s.a_itemsize, WORD)
    rows, cols = plan.slice_shape
    received = (plan.depth_splits - 1) * rows * cols * partial_itemsize(plan.mode)
    # every chunk's output stays until the next stage reads it (and is copied into whole rows
    # when a softmax reads it and the blocks are not whole rows)
    out = plan.waves * plan.row_chunks * rows * round_up(cols * s.out_itemsize, WORD)
    if partials_are_result(plan.depth_splits, plan.mode, [list(c) for c in s.chain],
                           s.has_bias):  # the partials are read in place: one copy a chunk
        out -= plan.row_block * plan.col_block * partial_itemsize(plan.mode)
    gathered = gathered_row_bytes(s, plan.tiles_used, plan.col_splits)
    return a + interleaved_transient_bytes(plan) + received + out + gathered


def plan_tile_bytes(plan: GemmPlan) -> int:
    """Bytes one tile of the plan holds while the stage runs."""
    return resident_bytes(plan) + transient_bytes(plan)


def pareto(plans: list[GemmPlan]) -> list[GemmPlan]:
    """Plans no other plan beats on cycles, resident bytes and transient bytes at once, in
    order of cycles.  Transient bytes are a dimension of their own: two tilings that keep the
    same weight block can differ twofold in the operand block they gather, and a tower whose
    tiles are full of weights needs the smaller one."""
    ordered = sorted(plans, key=lambda p: (p.estimated_cycles, resident_bytes(p),
                                           transient_bytes(p)))
    front: list[GemmPlan] = []
    for plan in ordered:
        r, t = resident_bytes(plan), transient_bytes(plan)
        if not any(resident_bytes(f) <= r and transient_bytes(f) <= t for f in front):
            front.append(plan)
    return front


def gemm_modes(shape: GemmShape, requested: str = "auto") -> tuple[str, ...]:
    """The GEMM modes a stage may use: FP8 operands run natively (FP16 partials) or as F16
    after a cast; F16 operands only as F16.  ``requested`` (auto, fp8, f16) narrows it."""
    modes = ("fp8", "f16") if shape.fp8 else ("f16",)
    if requested == "auto":
        return modes
    return tuple(m for m in modes if m == requested) or modes


def gemm_candidates(shape: GemmShape, target: Target, keep: int = 4) -> list[GemmPlan]:
    """The ``keep`` fastest tilings (see :func:`gemm_search`)."""
    return gemm_search(shape, target, keep)[0]


def gemm_search(
    shape: GemmShape, target: Target, keep: int = 4, mode: str = "auto",
    min_col_block: int = 0,
) -> tuple[list[GemmPlan], list[GemmPlan]]:
    """Enumerate tilings that use most of the machine: the ``keep`` fastest, and the Pareto
    front of cycles against resident bytes (what the memory fitter trades along).

    A stage of ``groups`` independent GEMMs (attention heads) gives each group an equal
    share of the tiles.  For each row and depth split, the column split is the largest that
    the tiles allow (more columns only shrink the per-tile work); ties break towards fewer
    tiles.  ``min_col_block``: no column block narrower (where the GEMM has the columns):
    wider blocks send a row's columns in fewer, larger transfers, so the exchange tables
    that support memory holds for them are smaller.
    """
    waves = -(-shape.groups // target.tiles)  # rounds of groups (module docstring)
    tiles = target.tiles // -(-shape.groups // waves)
    col_groups = -(-shape.cols // p("amp_out_columns"))
    if min_col_block:  # at most as many column blocks as keep each that wide
        col_groups = min(col_groups, max(1, shape.cols // min_col_block))
    plans: dict[tuple, GemmPlan] = {}
    budget = target.memory_end - target.memory_base - int(target.runtime_support_bytes)
    smallest = 1 << 62
    for gemm_mode in gemm_modes(shape, mode):
        step = p("amp_f8_depth") if gemm_mode == "fp8" else p("amp_f16_depth")
        max_depth = -(-shape.depth // step)
        for d in range(1, min(max_depth, tiles) + 1):
            for r in range(1, min(shape.rows, tiles // d) + 1):
                # a row a row group (its own blocks, whatever a plain plan makes of them)
                _keep_swapped(plans, shape, r, d, tiles, gemm_mode, budget)
                c = min(tiles // (r * d), col_groups)
                if c < 1:
                    continue
                # shrink C to what the column block needs (before judging the plan: C
                # column groups of 16 may leave the last ones empty)
                col_block = round_up(-(-shape.cols // c), p("amp_out_columns"))
                plan = cost_plan(shape, r, -(-shape.cols // col_block), d, target, gemm_mode)
                if plan is None:
                    continue
                plan = in_waves(plan, waves)
                if plan_tile_bytes(plan) > budget:
                    smallest = min(smallest, plan_tile_bytes(plan))
                    continue
                _keep_best(plans, plan)
                # the same tiling with its weights held once and gathered per run
                streamed = cost_plan(shape, r, -(-shape.cols // col_block), d, target,
                                     gemm_mode, streamed=True)
                if streamed is not None and plan_tile_bytes(streamed) <= budget:
                    _keep_best(plans, streamed)
            # row chunks (module docstring): one weight copy (R1), the rows in turn
            c = min(tiles // d, col_groups)
            col_block = round_up(-(-shape.cols // c), p("amp_out_columns"))
            for chunks in ROW_CHUNKS:
                plan = cost_plan(shape, 1, -(-shape.cols // col_block), d, target, gemm_mode,
                                 chunks)
                if plan is None:
                    continue
                plan = in_waves(plan, waves)
                if plan_tile_bytes(plan) <= budget:
                    _keep_best(plans, plan)
    if not plans:
        if smallest < 1 << 62:
            raise CompileError(
                f"stage {shape.op} does not fit: its smallest tiling needs {smallest} bytes "
                f"per tile, a tile has {budget}"
            )
        return [], []
    ranked = sorted(
        plans.values(),
        key=lambda plan: (plan.estimated_cycles, plan.tiles_used, plan.row_splits,
                          plan.depth_splits, plan.mode, plan.row_chunks, plan.streamed,
                          plan.swapped),
    )
    return ranked[:keep], pareto(ranked)


def lean_col_block(shape: GemmShape, lean_rows: int) -> int:
    """The narrowest column block ``CompileOptions.lean_table_rows`` (``lean_rows``; 0: off)
    lets :func:`gemm_search` give ``shape``: two AMP column groups where the GEMM has more
    rows than that and its columns span more than one group, else 0 (any width)."""
    group = int(p("amp_out_columns"))
    return 2 * group if lean_rows and shape.rows > lean_rows and shape.cols > group else 0


def in_waves(plan: GemmPlan, waves: int) -> GemmPlan:
    """``plan`` (one group's tiling) run in ``waves`` rounds: every phase and compute set
    once a round."""
    if waves == 1:
        return plan
    return replace(plan, waves=waves,
                   costs={key: value * waves for key, value in plan.costs.items()})


def _keep_swapped(plans: dict[tuple, GemmPlan], shape: GemmShape, r: int, d: int, tiles: int,
                  mode: str, budget: int) -> None:
    """Keep the swapped plan with R=r, D=d and the most column groups, where there is one
    and it fits ``budget``."""
    if r != shape.rows or r > SWAP_ROWS:
        return
    c = swapped_col_splits(shape, r, d, tiles)
    plan = cost_plan(shape, r, c, d, mode=mode, swapped=True) if c else None
    if plan is not None and plan_tile_bytes(plan) <= budget:
        _keep_best(plans, plan)


def _keep_best(plans: dict[tuple, GemmPlan], plan: GemmPlan) -> None:
    """Keep the cheaper (then smaller) of two plans with the same blocks and mode."""
    key = (plan.row_block, plan.depth_block, plan.col_block, plan.mode, plan.row_chunks,
           plan.streamed, plan.swapped)
    best = plans.get(key)
    if best is None or (plan.estimated_cycles, plan.tiles_used) < (
        best.estimated_cycles,
        best.tiles_used,
    ):
        plans[key] = plan
