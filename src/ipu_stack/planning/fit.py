"""Fit a choice of stage plans into tile memory, trading cycles for bytes.

Weights stay resident for the whole program, so every GEMM stage's weight block adds up on a
tile, while operands, partials and results only live during their stage.  The estimate of a
tile's need is ``sum(resident) + max(transient) + reserve`` (support memory and activations
carried between stages are covered by the reserve and by ``memory_proportion``, the share of
tile memory the planner may plan for, like Poplar's available-memory proportion).

When the fastest plans do not fit, the fitter repeatedly moves one stage along its Pareto
front (fewer resident bytes, more cycles), always taking the move that costs the fewest
cycles per byte saved, until the estimate fits or no stage can shrink further.
"""

from __future__ import annotations

from dataclasses import dataclass

from ipu_stack.planning.gemm import GemmPlan, resident_bytes, transient_bytes
from ipu_stack.target import Target
from ipu_stack.util.errors import CompileError

SUPPORT_RESERVE = 64 * 1024  # assumed: code, exchange tables and carried activations


@dataclass(frozen=True)
class MemoryBudget:
    """What the planner may plan for on one tile."""

    bytes: int

    @staticmethod
    def for_target(target: Target, proportion: float) -> MemoryBudget:
        usable = target.memory_end - target.memory_base - SUPPORT_RESERVE
        return MemoryBudget(int(usable * proportion))


def need(plans: list[GemmPlan | None]) -> int:
    """Estimated bytes per tile for a choice of plans."""
    chosen = [p for p in plans if p is not None]
    if not chosen:
        return 0
    return sum(resident_bytes(p) for p in chosen) + max(transient_bytes(p) for p in chosen)


def fit_plans(
    plans: list[GemmPlan | None],
    fronts: list[list[GemmPlan]],
    budget: MemoryBudget,
) -> tuple[list[GemmPlan | None], int]:
    """Shrink plans along their fronts until they fit; return them and the moves made."""
    current = list(plans)
    moves = 0
    while (now := need(current)) > budget.bytes:
        resident = [resident_bytes(p) if p else 0 for p in current]
        transient = sorted(((transient_bytes(p), i) for i, p in enumerate(current) if p),
                           reverse=True)
        total = sum(resident)
        best: tuple[float, int, GemmPlan] | None = None
        for index, plan in enumerate(current):
            if plan is None:
                continue
            others = next((t for t, i in transient if i != index), 0)
            for option in fronts[index]:
                trial = (total - resident[index] + resident_bytes(option)
                         + max(others, transient_bytes(option)))
                saved = now - trial  # strictly positive: the loop always terminates
                if saved <= 0:
                    continue
                cost = max(option.estimated_cycles - plan.estimated_cycles, 0) / saved
                if best is None or cost < best[0]:
                    best = (cost, index, option)
        if best is None:
            raise CompileError(
                f"does not fit: the leanest plans need about {need(current)} bytes per tile, "
                f"the planner may use {budget.bytes} (raise --memory-proportion or use fewer "
                "blocks or a smaller batch)"
            )
        _, index, option = best
        current[index] = option
        moves += 1
    return current, moves
