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


def gemm_operands(n: int, tiles: int = TILES, seed: int = 0) -> Transfers:
    """Both GEMM operands in one phase, as compiled plans gather them: tiles form an
    ``R x C`` grid; A blocks are multicast to every tile of a grid row (replicated over the
    C column groups) and B blocks to every tile of a grid column (replicated over the R
    row groups), each from a storage tile outside the receiving group.  Every tile receives
    from two overlapping replica groups, so the phase splits into two layers."""
    rng = np.random.default_rng(seed)
    rows = max(r for r in range(2, int(tiles**0.5) + 1) if tiles % r == 0) if tiles > 3 else 0
    if rows < 2:
        raise ValueError(f"gemm_operands needs a tile count with a grid factor, got {tiles}")
    cols = tiles // rows
    grid = np.arange(rows * cols).reshape(rows, cols)
    half = max(1, n // 2)
    a_group = np.sort(rng.integers(0, rows, half))
    b_group = np.sort(rng.integers(0, cols, n - half))
    dst = np.concatenate((grid[a_group].reshape(-1), grid[:, b_group].T.reshape(-1)))
    fan = np.concatenate((np.full(half, cols), np.full(n - half, rows)))
    # a source outside its group: another row (A) or another column (B) of the grid
    a_src = grid[(a_group + rng.integers(1, rows, half)) % rows, rng.integers(0, cols, half)]
    b_src = grid[rng.integers(0, rows, n - half), (b_group + rng.integers(1, cols, n - half)) % cols]
    offsets = np.zeros(n + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(fan)
    words = rng.integers(8, 65, n)
    return Transfers.from_arrays(tiles, np.concatenate((a_src, b_src)), offsets, dst, words)


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
    "gemm-operands": gemm_operands,
    "random-multicast": random_multicast,
}
