"""Fit a choice of stage plans into tile memory, trading cycles for bytes.

Weights stay resident for the whole program, so every GEMM stage's weight block adds up on a
tile, while operands, partials and results only live during their stage.  A tile's need is
estimated as ``sum(resident) + max(transient) + reserve`` (support memory and activations
carried between stages are covered by the reserve and by ``memory_proportion``, the share of
tile memory the planner may plan for, like Poplar's available-memory proportion).

The fitter tries every cap on the transient bytes (the distinct transient sizes on the
stages' Pareto fronts).  Under a cap each stage may only use plans within it, and resident
bytes must fit in what the cap leaves; starting from each stage's fastest allowed plan it
repeatedly takes the move along a front that costs the fewest cycles per resident byte
saved.  The cheapest fitting choice over all caps wins.  A single greedy over ``need`` would
stall here: moving one stage to a lean plan can raise the shared transient peak even though
moving all of them fits.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from ipu_stack.planning.gemm import (
    GemmPlan,
    interleaved_transient_bytes,
    resident_bytes,
    transient_bytes,
)
from ipu_stack.target import Target
from ipu_stack.util.errors import CompileError

SUPPORT_RESERVE = 64 * 1024  # assumed: code, exchange tables and carried activations
"""What a first plan leaves a tile for support memory.  A compile that placed with room to
spare plans once more with the reserve its placement measured (``pipeline.compile_workload``)."""


class DoesNotFit(CompileError):
    """The leanest plans need more than the budget: ``leanest_bytes`` a tile (weights and
    the largest transients), what a compile that planned for less memory after a placement
    failure tries next (``pipeline.Attempts``)."""

    def __init__(self, message: str, leanest_bytes: int) -> None:
        super().__init__(message)
        self.leanest_bytes = leanest_bytes


@dataclass(frozen=True)
class MemoryBudget:
    """What the planner may plan for on one tile: in all, and in interleaved memory, where
    the AMP's weights and partial sums must sit (a tower's weights fill it first)."""

    bytes: int
    interleaved: int = 1 << 62
    # the largest row stage's inputs and output on one tile (whole rows spread over the
    # tiles): they live while no GEMM stage's transients do, so a tile needs the larger of
    # the two beside its weights; on a small tile group (a pipeline stage) a whole image's
    # attention scores can be the larger
    row_bytes: int = 0

    @staticmethod
    def for_target(target: Target, proportion: float, reserve: int = SUPPORT_RESERVE,
                   interleaved_reserve: int = 0) -> MemoryBudget:
        interleaved = target.memory_end - target.interleaved_base
        return MemoryBudget(int(usable_bytes(target, reserve) * proportion),
                            int(interleaved * proportion) - interleaved_reserve)


@dataclass(frozen=True)
class SideBySide:
    """Runs of sibling GEMM stages (by stage index) that a decode step lowers side by side
    (``lowering.driver``): where a run's grids together take no more than the chip's
    ``tiles``, they are laid one after another, so a tile holds one sibling's weights, not
    every sibling's.  The default, no runs: every stage's weights may share every tile."""

    runs: tuple[tuple[int, ...], ...] = ()
    tiles: int = 0

    def weights(self, plans: list[GemmPlan | None], repeats: list[int],
                interleaved: bool = False) -> int:
        """The most resident bytes a tile holds with ``plans`` (``interleaved``: only
        those the AMP loads from interleaved memory)."""
        def held(index: int) -> int:
            plan = plans[index]
            if plan is None:
                return 0
            return repeats[index] * (interleaved_resident_bytes(plan) if interleaved
                                     else resident_bytes(plan))

        in_runs = {index for run in self.runs for index in run}
        total = sum(held(index) for index in range(len(plans)) if index not in in_runs)
        for run in self.runs:
            spans = sum(p.tiles_used + p.tiles_used % 2 for p in (plans[i] for i in run) if p)
            parts = [held(index) for index in run]
            total += max(parts) if spans <= self.tiles else sum(parts)
        return total


def interleaved_resident_bytes(plan: GemmPlan) -> int:
    """The resident bytes of ``plan`` that sit in interleaved memory, where the AMP reads
    them: none for a streamed plan (only the exchange reads its weights) or a swapped one
    (they stream through the workers), whose weights sit in standard memory."""
    return 0 if plan.streamed or plan.swapped else resident_bytes(plan)


def usable_bytes(target: Target, reserve: int = SUPPORT_RESERVE) -> int:
    """A tile's bytes the planner plans for at memory proportion 1, leaving ``reserve``
    bytes for support memory."""
    return target.memory_end - target.memory_base - reserve


def planned_bytes(plans: list[GemmPlan | None], repeats: list[int], row_bytes: int,
                  sharing: SideBySide = SideBySide()) -> int:
    """What the planner estimates a tile holds with ``plans``: the weights beside the
    larger of the largest GEMM stage's transients and the largest row stage's bytes."""
    transient = max((transient_bytes(p) for p in plans if p), default=0)
    return sharing.weights(plans, repeats) + max(transient, row_bytes)


def _interleaved_resident(plans: list[GemmPlan | None], repeats: list[int],
                          sharing: SideBySide) -> int:
    """The resident weights of ``plans`` that must sit in interleaved memory
    (:func:`interleaved_resident_bytes`), siblings counted as ``sharing`` says."""
    return sharing.weights(plans, repeats, interleaved=True)


def _interleaved_limit(budget: MemoryBudget, plans: list[GemmPlan | None]) -> int:
    """What the weights may take of interleaved memory beside the largest transient."""
    return budget.interleaved - max((interleaved_transient_bytes(p) for p in plans if p),
                                    default=0)


def planned_cycles(plans: list[GemmPlan | None], repeats: list[int]) -> int:
    """The analytical GEMM cycles of a choice of plans, a layer loop's body ``repeats``
    times."""
    return sum(n * p.estimated_cycles for p, n in zip(plans, repeats, strict=True)
               if p is not None)


def need(plans: list[GemmPlan | None], repeats: list[int] | None = None) -> int:
    """Estimated bytes per tile for a choice of plans; a stage that ``repeats`` (a layer
    loop's body) keeps one weight block per layer but its transients once."""
    repeats = repeats or [1] * len(plans)
    chosen = [(p, n) for p, n in zip(plans, repeats, strict=True) if p is not None]
    if not chosen:
        return 0
    return (sum(n * resident_bytes(p) for p, n in chosen)
            + max(transient_bytes(p) for p, _ in chosen))


class PlanSizes:
    """Each candidate plan's bytes by ``id``, and each stage's candidates fastest first,
    counted once for every cap the fitter tries (a Swin-L tower has 137 stages and 1,929
    candidates; a fit moves one stage at a time, so its sums are updated, not recounted)."""

    def __init__(self, plans: list[GemmPlan | None], fronts: list[list[GemmPlan]]) -> None:
        every = [p for front, plan in zip(fronts, plans, strict=True)
                 for p in ([plan] if plan else []) + front]
        self.transient = {id(p): transient_bytes(p) for p in every}
        self.resident = {id(p): resident_bytes(p) for p in every}
        self.interleaved = {id(p): interleaved_resident_bytes(p) for p in every}
        self.interleaved_transient = {id(p): interleaved_transient_bytes(p) for p in every}
        self.fastest_first = [
            sorted([plan, *front], key=lambda p: (p.estimated_cycles, -self.resident[id(p)]))
            if plan else [] for plan, front in zip(plans, fronts, strict=True)]


def _lean_options(stage: int, cap: int, sizes: PlanSizes) -> list[GemmPlan]:
    """A stage's plans within ``cap``, fastest first, each leaner than the one before."""
    lean: list[GemmPlan] = []
    for p in sizes.fastest_first[stage]:  # strictly decreasing resident bytes as cycles grow
        if sizes.transient[id(p)] <= cap and (
                not lean or sizes.resident[id(p)] < sizes.resident[id(lean[-1])]):
            lean.append(p)
    return lean


def _fit_under_cap(
    plans: list[GemmPlan | None], cap: int, budget: MemoryBudget, repeats: list[int],
    sizes: PlanSizes, sharing: SideBySide,
) -> list[GemmPlan | None] | None:
    """Fastest choice with every transient <= cap, the resident sum within what the cap
    leaves of ``budget`` and within interleaved memory, greedily."""
    options: list[list[GemmPlan]] = []
    current: list[GemmPlan | None] = []
    for stage, plan in enumerate(plans):
        if plan is None:
            options.append([])
            current.append(None)
            continue
        lean = _lean_options(stage, cap, sizes)
        if not lean:
            return None
        options.append(lean)
        current.append(lean[0])
    position = [0] * len(current)
    total = sharing.weights(current, repeats)
    held = _interleaved_resident(current, repeats, sharing)
    heap: list[tuple[float, int, int]] = []

    def push(index: int) -> None:
        k = position[index]
        if k + 1 < len(options[index]):
            here, there = options[index][k], options[index][k + 1]
            saved = sizes.resident[id(here)] - sizes.resident[id(there)]
            ratio = max(there.estimated_cycles - here.estimated_cycles, 0) / saved
            # per byte of the whole program: cycles and weights both repeat with the body
            heapq.heappush(heap, (ratio, index, k))

    for index, plan in enumerate(current):
        if plan is not None:
            push(index)
    limit = budget.bytes - max(cap, budget.row_bytes)
    largest = max((sizes.interleaved_transient[id(p)] for p in current if p), default=0)
    while total > limit or held > budget.interleaved - largest:
        if not heap:
            return None
        _, index, k = heapq.heappop(heap)
        if position[index] != k:
            continue
        position[index] = k + 1
        old, new = current[index], options[index][k + 1]
        assert old is not None
        current[index] = new
        if sharing.runs:  # a run's siblings share tiles or not as their spans say
            total = sharing.weights(current, repeats)
            held = _interleaved_resident(current, repeats, sharing)
        else:
            total += repeats[index] * (sizes.resident[id(new)] - sizes.resident[id(old)])
            held += repeats[index] * (sizes.interleaved[id(new)] - sizes.interleaved[id(old)])
        if sizes.interleaved_transient[id(old)] == largest:  # the largest may have left
            largest = max(sizes.interleaved_transient[id(p)] for p in current if p)
        else:
            largest = max(largest, sizes.interleaved_transient[id(new)])
        push(index)
    return current


def fit_plans(
    plans: list[GemmPlan | None],
    fronts: list[list[GemmPlan]],
    budget: MemoryBudget,
    repeats: list[int] | None = None,
    sharing: SideBySide = SideBySide(),
) -> tuple[list[GemmPlan | None], int]:
    """The cheapest choice that fits; also how many stages changed plan.  ``repeats``:
    how many times each stage runs (a layer loop's body stages: once per layer);
    ``sharing``: the sibling stages whose weights need not share a tile."""
    repeats = repeats or [1] * len(plans)

    if planned_bytes(plans, repeats, budget.row_bytes, sharing) <= budget.bytes and \
            _interleaved_resident(plans, repeats, sharing) <= _interleaved_limit(budget, plans):
        return list(plans), 0
    sizes = PlanSizes(plans, fronts)
    caps = sorted(set(sizes.transient.values()))
    best: list[GemmPlan | None] | None = None
    best_cycles = None
    for cap in caps:
        if cap >= budget.bytes:
            break
        choice = _fit_under_cap(plans, cap, budget, repeats, sizes, sharing)
        if choice is None:
            continue
        cycles = planned_cycles(choice, repeats)
        if best_cycles is None or cycles < best_cycles:
            best, best_cycles = choice, cycles
    if best is None:
        weights, transient = _leanest(plans, fronts, caps, repeats, sizes, sharing)
        transient = max(transient, budget.row_bytes)
        if weights + transient <= budget.bytes:  # the tile has room; interleaved memory not
            raise CompileError(
                f"does not fit: the leanest plans need about {weights + transient} bytes per "
                f"tile of the {budget.bytes} the planner may use, but the fitter found no "
                "choice that also keeps the AMP's weights and partials within the "
                f"{budget.interleaved} bytes of interleaved memory it may use (raise "
                "--memory-proportion or use fewer layers or a smaller batch)")
        raise DoesNotFit(
            f"does not fit: the leanest plans need about {weights + transient} bytes per tile "
            f"(weights {weights}, the largest stage's operands and partials {transient}), "
            f"the planner may use {budget.bytes} (raise --memory-proportion or use fewer "
            "layers or a smaller batch)", weights + transient)
    moves = sum(1 for a, b in zip(plans, best, strict=True) if a is not b)
    return best, moves


def _leanest(plans: list[GemmPlan | None], fronts: list[list[GemmPlan]], caps: list[int],
             repeats: list[int], sizes: PlanSizes, sharing: SideBySide) -> tuple[int, int]:
    """The smallest ``weights + transient`` over every cap on the transient bytes: what
    the leanest choice of plans would need (weights counted once per layer, siblings side
    by side as ``sharing`` counts them)."""
    best = (1 << 62, 0)
    for cap in caps:
        leanest: list[GemmPlan | None] = []
        for plan, front in zip(plans, fronts, strict=True):
            allowed = [p for p in [plan, *front] if p and sizes.transient[id(p)] <= cap]
            if plan is not None and not allowed:
                break
            leanest.append(min(allowed, key=lambda p: sizes.resident[id(p)])
                           if allowed else None)
        else:
            weights = sharing.weights(leanest, repeats)
            if weights + cap < sum(best):
                best = (weights, cap)
    return best
