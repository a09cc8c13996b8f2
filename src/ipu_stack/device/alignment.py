"""How the chip runs tile groups side by side: their supersteps merged into the chip's, and a
chip's step timed from what its groups executed.

All tiles of a chip sync together before each exchange phase, and a superstep is a compute
phase or an exchange phase for every tile at once. Groups that run different programs at the
same time (the layer groups of a pipeline step) therefore share supersteps: a merged
superstep holds at most one superstep of each group, all of the same kind, and lasts as long
as the longest of them; a group with nothing of that kind to do waits. Between two syncs a
group's compute sets need not wait for the others', so a merged compute superstep is an
upper bound there. Which supersteps share is the compiler's choice; :func:`merge` takes the
one with the fewest cycles for each pair of sequences (an alignment by dynamic programming,
like an edit distance whose match costs the longer of the two and whose gap costs the
superstep alone), folding the groups in one at a time. Identical programs align superstep
for superstep; a first group's stem lines up beside the other groups' input steps, and its
layer loop with theirs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

KINDS = {"compute": 0, "exchange": 1}


@dataclass(frozen=True)
class Merged:
    """The merged supersteps: kind, cycles, and for each group the index of its superstep
    in each merged one (-1: the group waits)."""

    kinds: np.ndarray  # int8 [n]
    cycles: np.ndarray  # int64 [n]
    members: np.ndarray  # int64 [groups, n]

    @property
    def total(self) -> int:
        return int(self.cycles.sum())


@numba.njit(cache=True)
def _align(ka, ca, kb, cb):  # pragma: no cover - compiled
    """Fewest-cycle alignment of two sequences; returns the path as (i, j) pairs with -1
    for a gap, in order."""
    n, m = len(ca), len(cb)
    cost = np.zeros((n + 1, m + 1), dtype=np.int64)
    move = np.zeros((n + 1, m + 1), dtype=np.int8)  # 0 match, 1 a alone, 2 b alone
    for i in range(1, n + 1):
        cost[i, 0] = cost[i - 1, 0] + ca[i - 1]
        move[i, 0] = 1
    for j in range(1, m + 1):
        cost[0, j] = cost[0, j - 1] + cb[j - 1]
        move[0, j] = 2
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            best = cost[i - 1, j] + ca[i - 1]
            how = 1
            alone_b = cost[i, j - 1] + cb[j - 1]
            if alone_b < best:
                best, how = alone_b, 2
            if ka[i - 1] == kb[j - 1]:
                both = cost[i - 1, j - 1] + max(ca[i - 1], cb[j - 1])
                if both <= best:
                    best, how = both, 0
            cost[i, j] = best
            move[i, j] = how
    path_a = np.empty(n + m, dtype=np.int64)
    path_b = np.empty(n + m, dtype=np.int64)
    k = 0
    i, j = n, m
    while i > 0 or j > 0:
        how = move[i, j]
        if how == 0:
            path_a[k], path_b[k] = i - 1, j - 1
            i, j = i - 1, j - 1
        elif how == 1:
            path_a[k], path_b[k] = i - 1, -1
            i -= 1
        else:
            path_a[k], path_b[k] = -1, j - 1
            j -= 1
        k += 1
    return path_a[:k][::-1].copy(), path_b[:k][::-1].copy()


def merge(sequences: list[tuple[list[str], list[int]]]) -> Merged:
    """Merge each group's ``(kinds, cycles)`` superstep sequence (see the module)."""
    kinds0, cycles0 = sequences[0]
    kinds = np.array([KINDS[k] for k in kinds0], dtype=np.int8)
    cycles = np.array(cycles0, dtype=np.int64)
    members = np.arange(len(cycles), dtype=np.int64)[None, :]
    for group_kinds, group_cycles in sequences[1:]:
        kb = np.array([KINDS[k] for k in group_kinds], dtype=np.int8)
        cb = np.array(group_cycles, dtype=np.int64)
        path_a, path_b = _align(kinds, cycles, kb, cb)
        take_a, take_b = path_a >= 0, path_b >= 0
        merged_kinds = np.where(take_a, kinds[np.maximum(path_a, 0)], kb[np.maximum(path_b, 0)])
        merged_cycles = np.maximum(np.where(take_a, cycles[np.maximum(path_a, 0)], 0),
                                   np.where(take_b, cb[np.maximum(path_b, 0)], 0))
        old = np.where(take_a[None, :], members[:, np.maximum(path_a, 0)], -1)
        members = np.vstack([old, np.where(take_b, path_b, -1)[None, :]])
        kinds, cycles = merged_kinds.astype(np.int8), merged_cycles
    return Merged(kinds, cycles, members)


def chip_step_cycles(runs: list[tuple[list[str], list[int]]], handoff_cycles: int) -> int:
    """One chip's step as the chip runs it: the supersteps each busy group executed
    (``(kinds, cycles)`` each), merged where they share the chip's syncs, then the chip's
    hand-off phase (0 when no group passes an activation on this step)."""
    return merge(runs).total + handoff_cycles


__all__ = ["KINDS", "Merged", "chip_step_cycles", "merge"]
