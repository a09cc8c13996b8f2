"""Multicasts to replica groups reduce to unicast over one virtual receiver per group.

Compiled phases broadcast blocks to their replicas: every transfer's destinations lie inside
one replica group (all of it, or all but the tile that already holds the data), and a tile
belongs to one group.  Serialising a group's receptions on one virtual receive port is then
always valid (a chunk reaches all its destinations at once and no member receives two
chunks in a cycle), and the phase becomes a unicast phase that the exact scheduler finishes
at its own bound.  That bound is the real endpoint bound whenever some member of each group
receives every word sent to the group, which is the case for replica broadcasts; the caller
checks, and falls back to list scheduling otherwise.

When a tile belongs to several replica groups (a GEMM phase gathering A blocks over grid
rows and B blocks over grid columns at once) the groups overlap and the reduction does not
apply to the whole phase.  ``layers`` then splits the phase into layers in which distinct
destination sets never overlap (a greedy colouring of the overlap graph of the sets); each
layer reduces on its own, and running the layers one after another is exact when every
tile receives from one group per layer, as on a grid (the bound is then a sum over layers).
"""

from __future__ import annotations

import numpy as np

from ipu_stack.exchange.model import Transfers


def _set_digests(t: Transfers) -> np.ndarray:
    """An order-free fingerprint of each transfer's destination set: a sum of per-tile random
    salts (wrapping int64), by ``add.reduceat`` over the contiguous destination lists."""
    salt = np.random.default_rng(12345).integers(1, 2**62, t.tiles, dtype=np.int64)
    return np.add.reduceat(salt[t.dst], t.dst_offsets[:-1])


def _distinct_sets(t: Transfers) -> tuple[np.ndarray, np.ndarray]:
    """``(set_of, representative)``: each transfer's destination-set index, and one transfer
    holding each distinct set.  Components and layers depend only on the distinct sets,
    which compiled phases have a few thousand of among half a million transfers."""
    _, representative, set_of = np.unique(_set_digests(t), return_index=True,
                                          return_inverse=True)
    return set_of.ravel(), representative


def _set_members(t: Transfers, representative: np.ndarray) -> tuple[np.ndarray, ...]:
    """The distinct sets' tiles in CSR form: ``(tiles, offsets, set of each entry)``."""
    fan = t.fanout[representative]
    offsets = np.zeros(fan.size + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(fan)
    index = np.repeat(t.dst_offsets[representative] - offsets[:-1], fan) + np.arange(offsets[-1])
    owner = np.repeat(np.arange(fan.size, dtype=np.int64), fan)
    return t.dst[index].astype(np.int64), offsets, owner


def _components(t: Transfers, representative: np.ndarray) -> np.ndarray:
    """Label each tile with the smallest tile it shares a destination set with (label
    propagation over the distinct sets only)."""
    dst, offsets, owner = _set_members(t, representative)
    label = np.arange(t.tiles, dtype=np.int64)
    while True:
        low = np.minimum.reduceat(label[dst], offsets[:-1])
        before = label.copy()
        np.minimum.at(label, dst, low[owner])
        label = label[label]  # path halving
        if np.array_equal(label, before):
            return label


def group_reduction(t: Transfers) -> Transfers | None:
    """The unicast phase over virtual group receivers (None for a phase with no transfers)."""
    if t.count == 0:
        return None
    _, representative = _distinct_sets(t)
    label = _components(t, representative)
    first = t.dst[t.dst_offsets[:-1]]
    groups, virtual = np.unique(label[first], return_inverse=True)
    return Transfers.from_arrays(
        t.tiles + len(groups), t.src, np.arange(t.count + 1, dtype=np.int64),
        t.tiles + virtual.ravel(), t.words,
    )


MAX_SETS = 4096  # beyond this many distinct destination sets the phase is not replica-shaped
MAX_LAYERS = 4


def layers(t: Transfers) -> list[np.ndarray] | None:
    """Transfer indices per layer, or None when the phase does not split into a few layers of
    replica groups (too many distinct destination sets, or too many overlaps)."""
    if t.count == 0:
        return None
    set_of, representative = _distinct_sets(t)
    sets = representative
    if sets.size > MAX_SETS:
        return None
    # sets containing each tile (distinct (tile, set) pairs), then overlapping set pairs
    dst, _, members = _set_members(t, representative)
    pair = np.unique(dst * sets.size + members)
    tile, member = pair // sets.size, pair % sets.size
    starts = np.flatnonzero(np.r_[True, tile[1:] != tile[:-1]])
    width = np.diff(np.r_[starts, tile.size])
    if int(width.max()) > MAX_LAYERS:
        return None
    colour = np.full(sets.size, -1, dtype=np.int64)
    conflicts: list[set[int]] = [set() for _ in range(sets.size)]
    for k in np.flatnonzero(width > 1).tolist():
        group = member[starts[k] : starts[k] + width[k]].tolist()
        for a in group:
            conflicts[a].update(group)
    for a in range(sets.size):
        used = {int(colour[b]) for b in conflicts[a] if b != a}
        free = [c for c in range(MAX_LAYERS) if c not in used]
        if not free:
            return None  # more than MAX_LAYERS mutually overlapping sets: not replica-shaped
        colour[a] = free[0]
    layer = colour[set_of]
    return [np.flatnonzero(layer == c) for c in range(int(colour.max()) + 1)]


def subset(t: Transfers, rows: np.ndarray) -> Transfers:
    """The phase restricted to transfers ``rows`` (in that order)."""
    fan = t.fanout[rows]
    offsets = np.zeros(rows.size + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(fan)
    idx = np.repeat(t.dst_offsets[rows] - offsets[:-1], fan) + np.arange(offsets[-1])
    return Transfers(t.tiles, t.src[rows], offsets, t.dst[idx], t.words[rows])
