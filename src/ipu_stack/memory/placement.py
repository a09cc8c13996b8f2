"""Per-tile storage placement by memory class, with lifetimes, around the support memory.

Tiles that hold the same buffers (and the same support size) share one placement, so the
allocator runs once per distinct tile *signature*, not once per tile.  Within a signature,
buffers are placed largest first at the lowest aligned address where they overlap no
placed buffer whose lifetime overlaps theirs (a byte is reused once its value is dead).
``Ipu21Interleaved`` buffers (AMP operands) go at or above ``0x80000``; ``Ipu21Standard``
buffers go below it when they fit there, anywhere free otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def _first_fit_array(lo: np.ndarray, hi: np.ndarray, start: int, end: int, nbytes: int,
                     align: int) -> int | None:
    """The lowest ``align``-ed address of a free gap in ``[start, end)`` that holds
    ``nbytes``, given the taken ranges as arrays (the gaps :func:`_free_ranges` lists: where a
    range, sorted as tuples are, starts beyond the running end of the ranges before it)."""
    order = np.lexsort((hi, lo))
    lo, hi = lo[order], hi[order]
    cursor = np.maximum.accumulate(np.concatenate([[start], hi]))
    gap = lo > cursor[:-1]
    free_lo = np.concatenate([cursor[:-1][gap], cursor[-1:]])
    free_hi = np.concatenate([np.minimum(lo[gap], end), [end]])
    address = -(-free_lo // align) * align
    fits = (free_lo < free_hi) & (address + nbytes <= free_hi)
    if not fits.any():
        return None
    return int(address[np.argmax(fits)])


def place_signature(
    buffers: list[Buffer], support: int, target: Target, tile: int
) -> tuple[dict[int, int], PlacementError | None]:
    """Addresses for one tile signature, and the first failure (naming the tile), if any.

    A buffer that does not fit is left unplaced and the rest are still placed, so the
    reports written after a failure show as much of the tile as possible.  The ranges taken
    by placed buffers whose lifetimes overlap are found with arrays (a tower's tiles hold
    hundreds of buffers: a Python scan per buffer was the compile's largest cost).
    """
    base = target.memory_base
    support_range = (base, base + support)
    placed: dict[int, tuple[int, int]] = {}
    failure: PlacementError | None = None
    order = sorted(buffers, key=lambda b: (-b.nbytes, b.first, b.id))
    by_id = {b.id: b for b in buffers}
    count = len(order)
    # the support range first, then placed buffers in placement order
    lows, highs = np.zeros(count + 1, np.int64), np.zeros(count + 1, np.int64)
    firsts, lasts = np.zeros(count + 1, np.int64), np.zeros(count + 1, np.int64)
    lows[0], highs[0] = support_range
    firsts[0], lasts[0] = np.iinfo(np.int64).min, np.iinfo(np.int64).max
    used = 1
    for buffer in order:
        align = target.alignment(buffer.memory_class)
        live = (firsts[:used] <= buffer.last) & (buffer.first <= lasts[:used])
        lo, hi = lows[:used][live], highs[:used][live]
        class_start, class_end = target.class_range(buffer.memory_class)
        address = None
        if buffer.memory_class is MemoryClass.STANDARD:
            address = _first_fit_array(lo, hi, class_start, target.interleaved_base,
                                       buffer.nbytes, align)
        if address is None:
            address = _first_fit_array(lo, hi, class_start, class_end, buffer.nbytes, align)
        if address is None:
            if failure is None:
                taken = [support_range] + [
                    placed[other] for other in placed if _overlaps(by_id[other], buffer)]
                failure = PlacementError(
                    f"placement failed: tile {tile} has insufficient "
                    f"{buffer.memory_class.value} SRAM for {buffer.nbytes} bytes",
                    _details(buffer, taken, placed, by_id, support, class_start, class_end,
                             align),
                )
                failure.tile = tile
            continue
        placed[buffer.id] = (address, address + buffer.nbytes)
        lows[used], highs[used] = placed[buffer.id]
        firsts[used], lasts[used] = buffer.first, buffer.last
        used += 1
    return {bid: lo for bid, (lo, _) in placed.items()}, failure


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
        if failure is not None and first_failure is None:
            first_failure = failure
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
