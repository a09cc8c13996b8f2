"""Per-tile storage placement by memory class, with lifetimes, around the support memory.

Tiles that hold the same buffers (and the same support size) share one placement, so the
allocator runs once per distinct tile *signature*, not once per tile.  Within a signature,
buffers are placed largest first at the lowest aligned address where they overlap no
placed buffer whose lifetime overlaps theirs (a byte is reused once its value is dead);
when that leaves one without room, longest-lived first, then in program order
(``PLACEMENT_ORDERS``).
``Ipu21Interleaved`` buffers (AMP operands) go at or above ``0x80000``; ``Ipu21Standard``
buffers go below it when they fit there, anywhere free otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from ipu_stack.lowering.program import Buffer, Program
from ipu_stack.target import MemoryClass, Target
from ipu_stack.util.errors import PlacementError

SUPPORT = 0xFFFFFFFF  # the reference's u32::MAX marker for support allocations


@dataclass
class Placement:
    """``addresses[buffer, tile]`` (-1 where the buffer is not on the tile) and support sizes."""

    addresses: np.ndarray
    support_bytes: np.ndarray
    peak_bytes: np.ndarray  # per tile: support + the most bytes live at any step
    peak_step: np.ndarray

    def address(self, buffer: int, tiles: np.ndarray) -> np.ndarray:
        if buffer < 0:
            return np.zeros(len(tiles), dtype=np.int64)
        return self.addresses[buffer, tiles]


def _overlaps(a: Buffer, b: Buffer) -> bool:
    return a.first <= b.last and b.first <= a.last


def _free_ranges(
    taken: list[tuple[int, int]], start: int, end: int
) -> list[tuple[int, int]]:
    free = []
    cursor = start
    for lo, hi in sorted(taken):
        if hi <= cursor:
            continue
        if lo > cursor:
            free.append((cursor, min(lo, end)))
        cursor = max(cursor, hi)
    if cursor < end:
        free.append((cursor, end))
    return [(lo, hi) for lo, hi in free if lo < hi]


@numba.njit(cache=True, nogil=True)
def _fit_all(nbytes: np.ndarray, first: np.ndarray, last: np.ndarray, align: np.ndarray,
             start: np.ndarray, low_end: np.ndarray, end: np.ndarray, support_lo: int,
             support_hi: int) -> np.ndarray:
    """First-fit addresses of buffers in placement order (-1: does not fit).

    Buffer ``k`` goes at the lowest ``align[k]``-ed address in ``[start[k], low_end[k])``
    (when ``low_end[k] >= 0``), else in ``[start[k], end[k])``, that overlaps no placed
    buffer live at the same time, nor the support range.  The free gaps are those of
    :func:`_free_ranges`: the taken ranges sorted as ``(lo, hi)`` tuples, a gap wherever a
    range starts beyond the running end of those before it."""
    count = nbytes.size
    address = np.full(count, -1, dtype=np.int64)
    placed = np.zeros(count, dtype=np.int64)  # indices of placed buffers, in order
    used = 0
    keys = np.empty(count + 1, dtype=np.int64)
    for k in range(count):
        taken = 0
        keys[taken] = (support_lo << 32) | support_hi
        taken += 1
        for p in range(used):
            other = placed[p]
            if first[other] <= last[k] and first[k] <= last[other]:
                keys[taken] = (address[other] << 32) | (address[other] + nbytes[other])
                taken += 1
        ranges = np.sort(keys[:taken])
        for limit in (low_end[k], end[k]):
            if limit < 0:
                continue
            cursor = start[k]
            found = -1
            for r in range(taken + 1):
                if r < taken:
                    lo, hi = ranges[r] >> 32, ranges[r] & 0xFFFFFFFF
                else:
                    lo, hi = limit, limit
                if lo > cursor or r == taken:
                    gap_end = min(lo, limit)
                    at = -(-cursor // align[k]) * align[k]
                    if cursor < gap_end and at + nbytes[k] <= gap_end:
                        found = at
                        break
                cursor = max(cursor, hi)
            if found >= 0:
                address[k] = found
                placed[used] = k
                used += 1
                break
    return address


PLACEMENT_ORDERS = (
    lambda b: (-b.nbytes, b.first, b.id),
    lambda b: (-(b.last - b.first), -b.nbytes, b.first, b.id),
    lambda b: (b.first, -b.nbytes, b.id),
)
"""The orders the first fit tries, until one places every buffer: largest first; then the
longest-lived first (the weights and other whole-program buffers packed low, the transients
fitted around them), which leaves fewer holes where large transients of different
lifetimes interleave with long-lived buffers; then in program order (the first made first,
each transient going low beside the ones that died before it, as a stack grows).  The third
is what places siglip-vision's 9 groups of 162 tiles: the other two left an 8 KB standard
buffer of the last layer without a hole on tile 159 at every memory share tried."""


def place_signature(
    buffers: list[Buffer], support: int, target: Target, tile: int
) -> tuple[dict[int, int], PlacementError | None]:
    """Addresses for one tile signature, and the first failure (naming the tile), if any.

    A buffer that does not fit is left unplaced and the rest are still placed, so the
    reports written after a failure show as much of the tile as possible.  The first fit
    runs as one compiled loop (:func:`_fit_all`): a tower's tiles hold hundreds of buffers,
    and a Python scan per buffer was the compile's largest cost.
    """
    base = target.memory_base
    support_range = (base, base + support)
    by_id = {b.id: b for b in buffers}

    def column(values: list[int]) -> np.ndarray:
        return np.array(values, dtype=np.int64).reshape(-1)

    def fit(order: list[Buffer]) -> np.ndarray:
        ranges = [target.class_range(b.memory_class) for b in order]
        return _fit_all(
            column([b.nbytes for b in order]), column([b.first for b in order]),
            column([b.last for b in order]),
            column([target.alignment(b.memory_class) for b in order]),
            column([lo for lo, _ in ranges]),
            column([target.interleaved_base if b.memory_class is MemoryClass.STANDARD else -1
                    for b in order]), column([hi for _, hi in ranges]),
            support_range[0], support_range[1])

    order = sorted(buffers, key=PLACEMENT_ORDERS[0])
    addresses = fit(order)
    for key in PLACEMENT_ORDERS[1:]:  # a failure names what the first order left out
        if (addresses >= 0).all():
            break
        other = sorted(buffers, key=key)
        placed_other = fit(other)
        if (placed_other >= 0).all():
            order, addresses = other, placed_other
    placed = {b.id: (int(a), int(a) + b.nbytes) for b, a in zip(order, addresses, strict=True)
              if a >= 0}
    failure: PlacementError | None = None
    if (addresses < 0).any():  # the first that did not fit, named with what was live
        missing = int(np.argmax(addresses < 0))
        buffer = order[missing]
        before = {b.id: placed[b.id] for b in order[:missing] if b.id in placed}
        taken = [support_range] + [
            before[other] for other in before if _overlaps(by_id[other], buffer)]
        class_start, class_end = target.class_range(buffer.memory_class)
        failure = PlacementError(
            f"placement failed: tile {tile} has insufficient "
            f"{buffer.memory_class.value} SRAM for {buffer.nbytes} bytes",
            _details(buffer, taken, before, by_id, support, class_start, class_end,
                     target.alignment(buffer.memory_class)),
        )
        failure.tile = tile
        failure.interleaved = buffer.memory_class is MemoryClass.INTERLEAVED
        failure.shortfall = _unplaced_peak([b for b, a in zip(order, addresses, strict=True)
                                            if a < 0])
    return {bid: lo for bid, (lo, _) in placed.items()}, failure


def _unplaced_peak(unplaced: list[Buffer]) -> int:
    """The most bytes of ``unplaced`` buffers live at one step: how much the tile is short.
    A lower bound when fragmentation, not the total, made them fail, so a retry that frees
    this much may fail again (and then frees more)."""
    steps = max(b.last for b in unplaced) + 1
    live = np.zeros(steps, dtype=np.int64)
    for b in unplaced:
        live[b.first:b.last + 1] += b.nbytes
    return int(live.max())


def _details(
    buffer: Buffer,
    taken: list[tuple[int, int]],
    placed: dict[int, tuple[int, int]],
    by_id: dict[int, Buffer],
    support: int,
    start: int,
    end: int,
    align: int,
) -> str:
    live = [(SUPPORT, start, support)] + [
        (bid, lo, hi - lo) for bid, (lo, hi) in sorted(placed.items(), key=lambda x: x[1])
        if _overlaps(by_id[bid], buffer)
    ]
    return (
        f"alignment={align} lifetime=(first={buffer.first}, last={buffer.last}) "
        f"free_ranges={_free_ranges(taken, start, end)} "
        f"live_allocations={[(v if v != SUPPORT else 'u32::MAX', a, n) for v, a, n in live]} "
        f"value={buffer.name!r} type={buffer.description}"
    )


def place_storage(program: Program, support_bytes: np.ndarray, target: Target) -> Placement:
    """Place every buffer on every tile that holds it."""
    tiles = target.tiles
    member = np.zeros((tiles, len(program.buffers)), dtype=bool)
    for buffer in program.buffers:
        member[buffer.tiles, buffer.id] = True
    signature = np.concatenate([member.astype(np.int64), support_bytes[:, None]], axis=1)
    unique, first_tile, inverse = np.unique(signature, axis=0, return_index=True,
                                            return_inverse=True)
    inverse = inverse.ravel()
    addresses = np.full((len(program.buffers), tiles), -1, dtype=np.int64)
    steps = len(program.initialize) + len(program.run)
    peak = np.zeros(tiles, dtype=np.int64)
    peak_step = np.zeros(tiles, dtype=np.int64)
    first_failure: PlacementError | None = None
    for index, row in enumerate(unique):
        present = [program.buffers[i] for i in np.flatnonzero(row[:-1])]
        tile = int(first_tile[index])
        chosen, failure = place_signature(present, int(row[-1]), target, tile)
        if failure is not None:
            if first_failure is None:
                first_failure = failure
            first_failure.shortfall = max(first_failure.shortfall, failure.shortfall)
        members = np.flatnonzero(inverse == index)
        for bid, address in chosen.items():
            addresses[bid, members] = address
        live = np.zeros(max(steps, 1), dtype=np.int64)
        for b in present:
            live[b.first : b.last + 1] += b.nbytes
        peak[members] = int(row[-1]) + int(live.max())
        peak_step[members] = int(live.argmax())
    placement = Placement(addresses, support_bytes.astype(np.int64), peak, peak_step)
    if first_failure is not None:
        first_failure.placement = placement  # the partial placement, for the reports
        raise first_failure
    return placement


def fragmentation(placement: Placement, program: Program, target: Target) -> dict[str, float]:
    """How much address range placement used beyond the bytes ever live at once.

    Per tile, ``extent`` is the highest byte any buffer (or support) occupies, from the
    memory base; ``peak`` is support plus the most bytes live at one step.  The wasted share
    ``1 - peak / extent`` is 0 for a perfect packing; it is reported for the busiest tile and
    as the worst over all tiles (interleaved buffers sit above 0x80000 by rule, which a tile
    with little standard data pays for as a gap; the busiest-tile figure is the one that
    decides what fits).
    """
    nbytes = np.array([b.nbytes for b in program.buffers], dtype=np.int64)[:, None]
    ends = np.where(placement.addresses >= 0, placement.addresses + nbytes, 0).max(axis=0)
    extent = np.maximum(ends - target.memory_base, placement.support_bytes)
    waste = 1.0 - placement.peak_bytes / np.maximum(extent, 1)
    busiest = int(np.argmax(placement.peak_bytes))
    return {"busiest_tile": round(float(waste[busiest]), 4),
            "worst_tile": round(float(waste.max()), 4),
            "busiest_extent_bytes": int(extent[busiest])}
