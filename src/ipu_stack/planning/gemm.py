"""GEMM tilings: split rows (R), columns (C) and depth (D) of ``[M, K] x [K, N]`` over tiles.

Tile ``(r, c, d)`` holds an A block ``[br, bk]`` (broadcast to the C column groups), a
resident weight block ``[bk, bn]`` and computes an F32 partial ``[br, bn]``.  With D > 1 the
partials are reduce-scattered: tile ``(r, c, d)`` finishes rows ``[d * br/D, (d+1) * br/D)``
of its block.  The analytical cost adds, for the busiest tile, the A exchange (receive
words), the GEMM kernel, the reduction exchange and the epilogue kernel, each phase with its
exchange overhead and sync (``target``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ipu_stack.ir.layout import WORD, round_up
from ipu_stack.kernels.epilogue import EPILOGUE
from ipu_stack.kernels.gemm import best_split, gemm_cycles
from ipu_stack.target import Target
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
    split: str
    costs: dict[str, int] = field(default_factory=dict, compare=False, hash=False)

    @property
    def tiles_used(self) -> int:
        return self.row_splits * self.col_splits * self.depth_splits

    @property
    def sub_rows(self) -> int:
        return self.row_block // self.depth_splits

    @property
    def estimated_cycles(self) -> int:
        return sum(self.costs.values())

    @property
    def exchange_cycles(self) -> int:
        return self.costs.get("a_exchange", 0) + self.costs.get("reduce_exchange", 0)

    def tile(self, r: int, c: int, d: int) -> int:
        """Tile of block ``(r, c, d)``: depth groups adjacent so reductions stay local."""
        return (r * self.col_splits + c) * self.depth_splits + d

    def describe(self) -> str:
        return (
            f"R{self.row_splits}xC{self.col_splits}xD{self.depth_splits} "
            f"blocks {self.row_block}x{self.depth_block}x{self.col_block} split={self.split}"
        )


def _phase_overhead(target: Target) -> int:
    return int(target.exchange_fixed_cycles) + int(target.sync_cycles)


def cost_plan(shape: GemmShape, r: int, c: int, d: int, target: Target) -> GemmPlan | None:
    """Build and cost the plan with R=r, C=c, D=d splits, or None if it is not valid."""
    step = int(target.amp_f8_depth if shape.fp8 else target.amp_f16_depth)
    br = round_up(-(-shape.rows // r), d)
    bk = round_up(-(-shape.depth // d), step)
    bn = round_up(-(-shape.cols // c), int(target.amp_out_columns))
    if (r - 1) * br >= shape.rows or (d - 1) * bk >= shape.depth or (c - 1) * bn >= shape.cols:
        return None
    split = best_split(br, bk, bn, shape.fp8, target)
    words = WORD
    a_words = br * round_up(bk * shape.a_itemsize, words) // words
    costs = {
        "a_exchange": a_words + _phase_overhead(target),
        "gemm": gemm_cycles(br, bk, bn, shape.fp8, split, target) + int(target.sync_cycles),
    }
    sub = br // d
    if d > 1:
        costs["reduce_exchange"] = (d - 1) * sub * bn + _phase_overhead(target)
    chain = [list(step_) for step_ in shape.chain]
    epilogue = EPILOGUE.cost(
        {
            "parts": d,
            "rows": sub,
            "cols": bn,
            "chain": chain,
        },
        target,
    )
    costs["epilogue"] = epilogue + int(target.sync_cycles)
    return GemmPlan(shape, r, c, d, br, bk, bn, split, costs)


def resident_bytes(plan: GemmPlan) -> int:
    """Bytes a tile keeps for the whole program: its weight block (and bias slice)."""
    s = plan.shape
    if not s.b_resident:
        return 0
    weight = plan.depth_block * round_up(plan.col_block * s.a_itemsize, WORD)
    bias = round_up(plan.col_block * 2, WORD) if s.has_bias else 0
    return weight + bias


def transient_bytes(plan: GemmPlan) -> int:
    """Bytes a tile holds only while the stage runs (operands, partials, result)."""
    s = plan.shape
    a = plan.row_block * round_up(plan.depth_block * s.a_itemsize, WORD)
    b = 0 if s.b_resident else plan.depth_block * round_up(plan.col_block * s.a_itemsize, WORD)
    partial = plan.row_block * plan.col_block * 4
    received = (plan.depth_splits - 1) * plan.sub_rows * plan.col_block * 4
    out = plan.sub_rows * round_up(plan.col_block * s.out_itemsize, WORD)
    return a + b + partial + received + out


def plan_tile_bytes(plan: GemmPlan) -> int:
    """Bytes one tile of the plan holds while the stage runs."""
    return resident_bytes(plan) + transient_bytes(plan)


def pareto(plans: list[GemmPlan]) -> list[GemmPlan]:
    """Plans no other plan beats on both cycles and resident bytes, fewest bytes last."""
    ordered = sorted(plans, key=lambda p: (p.estimated_cycles, resident_bytes(p)))
    front: list[GemmPlan] = []
    for plan in ordered:
        if not front or resident_bytes(plan) < resident_bytes(front[-1]):
            front.append(plan)
    return front


def gemm_candidates(shape: GemmShape, target: Target, keep: int = 4) -> list[GemmPlan]:
    """The ``keep`` fastest tilings (see :func:`gemm_search`)."""
    return gemm_search(shape, target, keep)[0]


def gemm_search(
    shape: GemmShape, target: Target, keep: int = 4
) -> tuple[list[GemmPlan], list[GemmPlan]]:
    """Enumerate tilings that use most of the machine: the ``keep`` fastest, and the Pareto
    front of cycles against resident bytes (what the memory fitter trades along).

    A stage of ``groups`` independent GEMMs (attention heads) gives each group an equal
    share of the tiles.  For each row and depth split, the column split is the largest that
    the tiles allow (more columns only shrink the per-tile work); ties break towards fewer
    tiles.
    """
    tiles = target.tiles // shape.groups
    step = int(target.amp_f8_depth if shape.fp8 else target.amp_f16_depth)
    col_groups = -(-shape.cols // int(target.amp_out_columns))
    max_depth = -(-shape.depth // step)
    plans: dict[tuple[int, int, int], GemmPlan] = {}
    budget = target.memory_end - target.memory_base - int(target.runtime_support_bytes)
    smallest = 1 << 62
    for d in range(1, min(max_depth, tiles) + 1):
        for r in range(1, min(shape.rows, tiles // d) + 1):
            c = min(tiles // (r * d), col_groups)
            if c < 1:
                continue
            plan = cost_plan(shape, r, c, d, target)
            if plan is None:
                continue
            # shrink C to what the column block needs
            c_needed = -(-shape.cols // plan.col_block)
            if c_needed != c:
                plan = cost_plan(shape, r, c_needed, d, target) or plan
            if plan_tile_bytes(plan) > budget:
                smallest = min(smallest, plan_tile_bytes(plan))
                continue
            key = (plan.row_block, plan.depth_block, plan.col_block)
            best = plans.get(key)
            if best is None or (plan.estimated_cycles, plan.tiles_used) < (
                best.estimated_cycles,
                best.tiles_used,
            ):
                plans[key] = plan
    if not plans:
        if smallest < 1 << 62:
            raise CompileError(
                f"stage {shape.op} does not fit: its smallest tiling needs {smallest} bytes "
                f"per tile, a tile has {budget}"
            )
        return [], []
    ranked = sorted(
        plans.values(),
        key=lambda p: (p.estimated_cycles, p.tiles_used, p.row_splits, p.depth_splits),
    )
    return ranked[:keep], pareto(ranked)
