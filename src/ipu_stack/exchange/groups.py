"""Multicasts to replica groups reduce to unicast over one virtual receiver per group.

Compiled phases broadcast blocks to their replicas: every transfer's destinations lie inside
one replica group (all of it, or all but the tile that already holds the data), and a tile
belongs to one group.  Serialising a group's receptions on one virtual receive port is then
always valid (a chunk reaches all its destinations at once and no member receives two
chunks in a cycle), and the phase becomes a unicast phase that the exact scheduler finishes
at its own bound.  That bound is the real endpoint bound whenever some member of each group
receives every word sent to the group, which is the case for replica broadcasts; the caller
checks, and falls back to list scheduling otherwise.
"""

from __future__ import annotations

import numpy as np

from ipu_stack.exchange.model import Transfers


def _components(t: Transfers, owner: np.ndarray) -> np.ndarray:
    """Label each tile with the smallest tile it shares a transfer's destinations with."""
    label = np.arange(t.tiles, dtype=np.int64)
    dst = t.dst.astype(np.int64)
    while True:
        low = np.full(t.count, t.tiles, dtype=np.int64)
        np.minimum.at(low, owner, label[dst])
        before = label.copy()
        np.minimum.at(label, dst, low[owner])
        label = label[label]  # path halving
        if np.array_equal(label, before):
            return label


def group_reduction(t: Transfers) -> Transfers | None:
    """The unicast phase over virtual group receivers (None for a phase with no transfers)."""
    if t.count == 0:
        return None
    owner = t.dst_transfer()
    label = _components(t, owner)
    first = t.dst[t.dst_offsets[:-1]]
    groups, virtual = np.unique(label[first], return_inverse=True)
    return Transfers.from_arrays(
        t.tiles + len(groups), t.src, np.arange(t.count + 1, dtype=np.int64),
        t.tiles + virtual.ravel(), t.words,
    )
