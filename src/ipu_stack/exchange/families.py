"""Synthetic exchange phases shaped like the plan families the compiler produces.

Used by the tests and ``benchmarks/bench_exchange.py`` so that both measure the same
instances.  All generators are seeded and vectorised; ``n`` is the approximate transfer count.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ipu_stack.exchange.model import Transfers

TILES = 1472


def random_unicast(n: int, tiles: int = TILES, seed: int = 0, max_words: int = 40) -> Transfers:
    """Random source and destination (distinct), 1..max_words words."""
    rng = np.random.default_rng(seed)
    src = rng.integers(0, tiles, n)
    dst = (src + rng.integers(1, tiles, n)) % tiles
    return Transfers.unicast(tiles, src, dst, rng.integers(1, max_words + 1, n))


def transpose(n: int, tiles: int = TILES, seed: int = 0) -> Transfers:
    """All-to-all inside groups of ``g`` tiles (a distributed transpose), equal pieces."""
    rng = np.random.default_rng(seed)
    g = int(np.clip(round(n / tiles) + 1, 2, tiles))
    groups = max(1, min(tiles // g, n // (g * (g - 1)) or 1))
    base = np.arange(groups * g).reshape(groups, g)
    src = np.repeat(base, g, axis=1).reshape(groups, g, g)
    dst = np.broadcast_to(base[:, None, :], (groups, g, g))
    off = src != dst
    piece = np.repeat(rng.integers(4, 33, groups), g * g).reshape(groups, g, g)
    return Transfers.unicast(tiles, src[off], dst[off], piece[off])


def gather(n: int, tiles: int = TILES, seed: int = 0) -> Transfers:
    """Gathers to a few tiles: every target collects from up to ``tiles - 1`` sources."""
    rng = np.random.default_rng(seed)
    targets = max(1, -(-n // (tiles - 1)))
    per = n // targets
    dst = np.repeat(rng.choice(tiles, targets, replace=False), per)
    src = (dst + 1 + np.tile(np.arange(per), targets)) % tiles
    return Transfers.unicast(tiles, src, dst, rng.integers(1, 9, dst.shape[0]))


def reduction(n: int, tiles: int = TILES, seed: int = 0) -> Transfers:
    """Reduce-scatter partials: each tile receives ``k`` equal partials from random tiles."""
    rng = np.random.default_rng(seed)
    k = max(1, n // tiles)
    receivers = min(tiles, n)
    dst = np.repeat(np.arange(receivers), k)
    src = (dst + rng.integers(1, tiles, dst.shape[0])) % tiles
    words = np.repeat(rng.integers(8, 33, receivers), k)
    return Transfers.unicast(tiles, src, dst, words)


def gemm_broadcast(n: int, tiles: int = TILES, seed: int = 0) -> Transfers:
    """GEMM operand broadcasts: replica groups of 4..46 contiguous tiles each receive many
    operand pieces multicast from random storage tiles outside the group."""
    rng = np.random.default_rng(seed)
    g = int(rng.integers(4, 47))
    blocks = tiles // g
    per_block = max(1, n // blocks)
    block = np.repeat(np.arange(blocks), per_block)
    count = block.shape[0]
    first = block * g
    src = (first + g + rng.integers(0, tiles - g, count)) % tiles
    offsets = np.arange(count + 1, dtype=np.int64) * g
    dst = (first[:, None] + np.arange(g)[None, :]).reshape(-1)
    return Transfers.from_arrays(tiles, src, offsets, dst, rng.integers(8, 65, count))


def random_multicast(n: int, tiles: int = TILES, seed: int = 0) -> Transfers:
    """Random source, 1..8 distinct random destinations, 1..40 words."""
    rng = np.random.default_rng(seed)
    fan = rng.integers(1, 9, n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(fan)
    src = rng.integers(0, tiles, n)
    owner = np.repeat(np.arange(n), fan)
    step = np.arange(offsets[-1]) - np.repeat(offsets[:-1], fan)
    # distinct, never the source: a random start plus a stride coprime with nothing needed,
    # since step < fan <= 8 < tiles and the stride keeps values apart modulo tiles
    stride = rng.integers(1, tiles // 9, n)
    dst = (src[owner] + 1 + rng.integers(0, 2, n)[owner] + step * stride[owner]) % tiles
    return Transfers.from_arrays(tiles, src, offsets, dst, rng.integers(1, 41, n))


FAMILIES: dict[str, Callable[..., Transfers]] = {
    "random-unicast": random_unicast,
    "transpose": transpose,
    "gather": gather,
    "reduction": reduction,
    "gemm-broadcast": gemm_broadcast,
    "random-multicast": random_multicast,
}
