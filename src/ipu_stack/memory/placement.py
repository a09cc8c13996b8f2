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
    :func:`_free_ranges`: the taken ranges in ``(lo, hi)`` order, a gap wherever a range
    starts beyond the running end of those before it.  The placed ranges are kept in that
    order as they are placed (an insertion), so each buffer scans them once, skipping those
    not live beside it, rather than sorting the live ones again (a tile of a thousand
    buffers: the sorts made placement a quarter of a Swin-L compile)."""
    count = nbytes.size
    address = np.full(count, -1, dtype=np.int64)
    # placed ranges sorted by (lo, hi); entry 0 is the support range, live throughout
    lo_of = np.empty(count + 1, dtype=np.int64)
    hi_of = np.empty(count + 1, dtype=np.int64)
    owner = np.empty(count + 1, dtype=np.int64)  # -1: the support range
    lo_of[0], hi_of[0], owner[0] = support_lo, support_hi, -1
    ranges = 1
    for k in range(count):
        for limit in (low_end[k], end[k]):
            if limit < 0:
                continue
            cursor = start[k]
            found = -1
            for r in range(ranges + 1):
                if r < ranges:
                    other = owner[r]
                    if other >= 0 and not (first[other] <= last[k] and first[k] <= last[other]):
                        continue
                    lo, hi = lo_of[r], hi_of[r]
                else:
                    lo, hi = limit, limit
                if lo > cursor or r == ranges:
                    gap_end = min(lo, limit)
                    at = -(-cursor // align[k]) * align[k]
                    if cursor < gap_end and at + nbytes[k] <= gap_end:
                        found = at
                        break
                cursor = max(cursor, hi)
            if found >= 0:
                address[k] = found
                at_end = found + nbytes[k]
                slot = ranges
                while slot > 0 and (lo_of[slot - 1] > found or (
                        lo_of[slot - 1] == found and hi_of[slot - 1] > at_end)):
                    lo_of[slot], hi_of[slot], owner[slot] = \
                        lo_of[slot - 1], hi_of[slot - 1], owner[slot - 1]
                    slot -= 1
                lo_of[slot], hi_of[slot], owner[slot] = found, at_end, k
                ranges += 1
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


@dataclass(frozen=True)
class BufferTable:
    """Every buffer's first-fit operands as columns indexed by buffer id, and its rank in
    each of ``PLACEMENT_ORDERS``, made once a program: a tile signature's buffers are then
    put in an order by their ranks (each order ends in the id, so the ranks of a subset
    sort it as sorting the subset would) and their columns taken by index, where building
    them buffer by buffer for every signature took a quarter of a tower's compile."""

    columns: np.ndarray  # [7, buffers]: bytes, first, last, alignment, start, below, end
    ranks: np.ndarray  # [orders, buffers]

    @classmethod
    def of(cls, buffers: list[Buffer], target: Target) -> BufferTable:
        """The table of ``buffers``, indexed by their positions (a program's: its ids)."""
        ranges = [target.class_range(b.memory_class) for b in buffers]
        columns = np.array([
            [b.nbytes for b in buffers], [b.first for b in buffers], [b.last for b in buffers],
            [target.alignment(b.memory_class) for b in buffers], [lo for lo, _ in ranges],
            [target.interleaved_base if b.memory_class is MemoryClass.STANDARD else -1
             for b in buffers], [hi for _, hi in ranges]], dtype=np.int64).reshape(7, -1)
        ranks = np.empty((len(PLACEMENT_ORDERS), len(buffers)), dtype=np.int64)
        for row, key in enumerate(PLACEMENT_ORDERS):
            ranks[row, sorted(range(len(buffers)), key=lambda i, k=key: k(buffers[i]))] = \
                np.arange(len(buffers))
        return cls(columns, ranks)


def place_signature(
    buffers: list[Buffer], support: int, target: Target, tile: int,
    table: BufferTable | None = None,
) -> tuple[dict[int, int], PlacementError | None]:
    """Addresses for one tile signature, and the first failure (naming the tile), if any.

    A buffer that does not fit is left unplaced and the rest are still placed, so the
    reports written after a failure show as much of the tile as possible.  The first fit
    runs as one compiled loop (:func:`_fit_all`): a tower's tiles hold hundreds of buffers,
    and a Python scan per buffer was the compile's largest cost.  ``table``: the program's
    :class:`BufferTable` (made here for ``buffers`` alone when not given).
    """
    base = target.memory_base
    support_range = (base, base + support)
    by_id = {b.id: b for b in buffers}
    if table is None:  # by their positions in ``buffers``
        table, ids = BufferTable.of(buffers, target), np.arange(len(buffers))
    else:
        ids = np.array([b.id for b in buffers], dtype=np.int64)
    return _place_ordered(buffers, table, ids, support_range, target, tile, by_id, support)


def _place_ordered(buffers: list[Buffer], table: BufferTable, ids: np.ndarray,
                   support_range: tuple[int, int], target: Target, tile: int,
                   by_id: dict[int, Buffer], support: int
                   ) -> tuple[dict[int, int], PlacementError | None]:
    """:func:`place_signature`'s fit in each order until one places every buffer, and the
    failure of the first where none does; ``ids`` index ``table`` for ``buffers``."""
    def fit(order: np.ndarray) -> np.ndarray:
        c = table.columns[:, ids[order]]
        return _fit_all(c[0], c[1], c[2], c[3], c[4], c[5], c[6], support_range[0],
                        support_range[1])

    order = np.argsort(table.ranks[0, ids])
    addresses = fit(order)
    for rank in table.ranks[1:]:  # a failure names what the first order left out
        if (addresses >= 0).all():
            break
        other = np.argsort(rank[ids])
        placed_other = fit(other)
        if (placed_other >= 0).all():
            order, addresses = other, placed_other
    ordered = [buffers[i] for i in order]
    placed = {b.id: (int(a), int(a) + b.nbytes) for b, a in zip(ordered, addresses, strict=True)
              if a >= 0}
    failure: PlacementError | None = None
    if (addresses < 0).any():  # the first that did not fit, named with what was live
        missing = int(np.argmax(addresses < 0))
        buffer = ordered[missing]
        before = {b.id: placed[b.id] for b in ordered[:missing] if b.id in placed}
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
        failure.shortfall = _unplaced_peak([b for b, a in zip(ordered, addresses, strict=True)
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
    """Place every buffer on every tile that holds it: once for each distinct signature
    (the buffers a tile holds and its support bytes), in the order numpy's sorted unique
    rows give them."""
    tiles = target.tiles
    member = np.zeros((tiles, len(program.buffers)), dtype=bool)
    for buffer in program.buffers:
        member[buffer.tiles, buffer.id] = True
    # a tile's signature: the buffers it holds (bits, in id order) and its support bytes
    support_key = np.asarray(support_bytes, dtype=">u8").reshape(-1, 1).view(np.uint8)
    first_tile, inverse = distinct_rows(np.concatenate([np.packbits(member, axis=1),
                                                        support_key], axis=1))
    table = BufferTable.of(program.buffers, target)
    nbytes, first, last = table.columns[0], table.columns[1], table.columns[2]
    addresses = np.full((len(program.buffers), tiles), -1, dtype=np.int64)
    steps = max(len(program.initialize) + len(program.run), 1)
    peak = np.zeros(tiles, dtype=np.int64)
    peak_step = np.zeros(tiles, dtype=np.int64)
    first_failure: PlacementError | None = None
    for index, tile in enumerate(first_tile):
        ids = np.flatnonzero(member[tile])
        support = int(support_bytes[tile])
        chosen, failure = place_signature([program.buffers[i] for i in ids], support, target,
                                          int(tile), table)
        if failure is not None:
            if first_failure is None:
                first_failure = failure
            first_failure.shortfall = max(first_failure.shortfall, failure.shortfall)
        members = np.flatnonzero(inverse == index)
        if chosen:
            placed = np.fromiter(chosen, dtype=np.int64, count=len(chosen))
            addresses[placed[:, None], members[None, :]] = np.fromiter(
                chosen.values(), dtype=np.int64, count=len(chosen))[:, None]
        change = np.zeros(steps + 1, dtype=np.int64)  # bytes live at each step
        used = ids[(first[ids] >= 0) & (first[ids] < steps)]  # a buffer no step touches: none
        np.add.at(change, first[used], nbytes[used])
        np.add.at(change, np.minimum(last[used] + 1, steps), -nbytes[used])
        live = np.cumsum(change[:steps])
        peak[members] = support + int(live.max())
        peak_step[members] = int(live.argmax())
    placement = Placement(addresses, support_bytes.astype(np.int64), peak, peak_step)
    if first_failure is not None:
        first_failure.placement = placement  # the partial placement, for the reports
        raise first_failure
    return placement


def distinct_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The first index of each distinct row of the integer matrix ``rows``, in the order
    ``np.unique(rows, axis=0)`` gives them, and each row's index into them.  Each row is
    one string of bytes that sorts as the row does (``uint8`` columns as they are, other
    integers big-endian with the sign bit flipped), so numpy sorts one string a row where
    ``axis=0`` compares rows column by column (~100 ms for a chip's tiles, and a row of
    tens of thousands of columns for a tower's placement)."""
    if rows.dtype != np.uint8:
        rows = (rows.astype(np.int64).view(np.uint64) ^ np.uint64(1 << 63)).astype(">u8")
    raw = np.ascontiguousarray(rows).view(np.uint8).reshape(len(rows), -1)
    keys = raw.view(np.dtype((np.void, raw.shape[1]))).ravel()
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    return first, inverse.ravel()


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
