"""The schedule verifier: the only judge of a schedule, independent of how it was made.

It is fully vectorised (sorts and compares whole columns) so that it can check every phase
of a real build, half a million transfers and ~20 M destination entries, at every compile.
Checks, in order, each raising :class:`ScheduleError` that names the first violation:

1. chunk fields: equal lengths, transfer index in range, ``start >= 0``, ``words >= 1``;
   lanes (paired-tiles option only) 1 or 2, two only for transfers to whole tile pairs, a
   chunk then lasting ``ceil(words / 2)`` cycles and also holding the send port of the
   source's pair partner;
2. per transfer (chunks sorted by start): no chunk starts before the previous one ends
   (chunks out of order / overlapping), the chunks cover exactly the transfer's words;
3. per send port and per receive port: intervals sorted by start never overlap;
4. the recorded horizon and lower bound match the chunks and the instance.

A multicast chunk is one record for all destinations, so "received by all destinations in
the same cycles" cannot be violated; step 3 expands it to every destination port.

Cost: everything per chunk is ``O(n log n)``; step 3 is the only step that touches every
destination entry, and it is linear in them.  The chunks are sorted by start once, their
destination entries are laid out in that order (one row copy per chunk, or one segmented
gather when fan-outs differ widely), and a *stable* argsort by tile groups them per port in
start order.  Tiles fit 16 bits, where numpy's stable argsort is a radix sort, so no
destination entry is ever sorted by comparison (a merge sort takes over only for more than
65 535 tiles).  Step 2 sorts only the chunks of transfers that were split.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ipu_stack.exchange.model import (
    PAIR_LANES,
    Schedule,
    ScheduleError,
    Transfers,
    chunk_cycles,
    endpoint_lower_bound,
    pair_eligible,
    paired_lower_bound,
)


def _check_fields(t: Transfers, s: Schedule) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    arrays = (s.chunk_transfer, s.chunk_start, s.chunk_words)
    if any(np.asarray(a).ndim != 1 for a in arrays) or len({a.shape[0] for a in arrays}) != 1:
        raise ScheduleError("chunk arrays must be one-dimensional and of equal length")
    if any(not np.issubdtype(np.asarray(a).dtype, np.integer) for a in arrays):
        raise ScheduleError("chunk arrays must hold integers")
    transfer, start, words = (np.asarray(a, dtype=np.int64) for a in arrays)
    checks = (
        ((transfer < 0) | (transfer >= t.count), "transfer index out of range"),
        (start < 0, "negative start"),
        (words < 1, "words must be >= 1"),
    )
    for bad, text in checks:
        hits = np.flatnonzero(bad)
        if hits.size:
            k = int(hits[0])
            raise ScheduleError(
                f"chunk {k}: {text} (transfer={int(transfer[k])} start={int(start[k])} "
                f"words={int(words[k])} transfers={t.count})"
            )
    return transfer, start, words


def _check_lanes(
    t: Transfers, s: Schedule, transfer: np.ndarray
) -> tuple[np.ndarray, np.ndarray | None]:
    """Lanes per chunk (ones in the plain model); a two-lane chunk needs an eligible
    transfer (destinations whole tile pairs, see ``pair_eligible``).  Returns the lanes and,
    for a paired schedule, the eligibility of every transfer (the paired bound needs it)."""
    if s.chunk_lanes is None:
        return np.ones(transfer.shape[0], dtype=np.int64), None
    lanes = np.asarray(s.chunk_lanes)
    if lanes.ndim != 1 or lanes.shape[0] != transfer.shape[0]:
        raise ScheduleError("chunk lanes must be one-dimensional, one per chunk")
    if not np.issubdtype(lanes.dtype, np.integer):
        raise ScheduleError("chunk lanes must hold integers")
    lanes = lanes.astype(np.int64)
    bad = np.flatnonzero((lanes != 1) & (lanes != PAIR_LANES))
    if bad.size:
        k = int(bad[0])
        raise ScheduleError(f"chunk {k}: lanes must be 1 or {PAIR_LANES}, got {int(lanes[k])}")
    eligible = pair_eligible(t)
    two = np.flatnonzero(lanes == PAIR_LANES)
    if two.size:
        ineligible = two[~eligible[transfer[two]]]
        if ineligible.size:
            k = int(ineligible[0])
            raise ScheduleError(
                f"chunk {k}: two-lane chunk of transfer {int(transfer[k])}, whose destinations "
                f"are not whole tile pairs (tiles={t.tiles})"
            )
    return lanes, eligible


def _check_chunk_order(transfer: np.ndarray, start: np.ndarray, cycles: np.ndarray) -> None:
    """Per transfer, in start order, no chunk starts before the previous one ends.

    Called with the chunks of split transfers only (a transfer sent as one chunk cannot be
    out of order, and most are); the subset keeps the relative order of the chunks, so the
    sort and the first violation are the same as over all chunks.
    """
    order = np.lexsort((start, transfer))
    tr, st, wd = transfer[order], start[order], cycles[order]
    same = tr[1:] == tr[:-1]
    early = np.flatnonzero(same & (st[1:] < st[:-1] + wd[:-1]))
    if early.size:
        k = int(early[0])
        raise ScheduleError(
            f"chunk out of order: transfer {int(tr[k])} chunk at cycle {int(st[k + 1])} starts "
            f"before its previous chunk ends at cycle {int(st[k] + wd[k])}"
        )


def _check_coverage(
    t: Transfers, transfer: np.ndarray, start: np.ndarray, words: np.ndarray, cycles: np.ndarray
) -> None:
    """Chunks of one transfer in order and covering exactly its words (first bad transfer)."""
    split = np.bincount(transfer, minlength=t.count)[transfer] > 1
    if split.any():
        _check_chunk_order(transfer[split], start[split], cycles[split])
    covered = np.bincount(transfer, weights=words, minlength=t.count).astype(np.int64)
    short = np.flatnonzero(covered < t.words)
    over = np.flatnonzero(covered > t.words)
    if short.size and (not over.size or short[0] < over[0]):
        i = int(short[0])
        raise ScheduleError(
            f"uncovered word: transfer {i} word {int(covered[i])} of {int(t.words[i])} is never sent"
        )
    if over.size:
        i = int(over[0])
        raise ScheduleError(
            f"doubly covered word: transfer {i} chunks cover {int(covered[i])} words but it "
            f"has {int(t.words[i])} (word {int(t.words[i]) - 1} covered twice)"
        )


def _narrow_tiles(tile: np.ndarray, spare: int = 0) -> np.ndarray:
    """``tile`` as uint8/uint16 when every value (plus ``spare`` free values above the
    largest, for padding sentinels) fits, else int64: same values, same order.

    Why: numpy's stable argsort is a linear radix sort for integers of at most 16 bits (a
    merge sort otherwise), and a narrow array cuts the memory traffic of every gather.
    Out-of-range tiles (an instance that was never validated) keep the exact wide path.
    """
    if tile.size == 0:
        return tile.astype(np.int64)
    low, high = int(tile.min()), int(tile.max()) + spare
    for dtype in (np.uint8, np.uint16):
        if low >= 0 and high <= np.iinfo(dtype).max:
            return tile.astype(dtype)
    return tile.astype(np.int64)


class _Layout(NamedTuple):
    """Ports of every (chunk, port) entry, chunk after chunk in start order.

    ``owner`` maps a layout position to its chunk: an int ``W`` (chunk = position // W,
    every chunk padded to ``W`` entries) or an array.  Only the ``real`` lowest-sorting
    entries are ports; padding carries a sentinel tile above every real one.
    """

    tile: np.ndarray
    owner: int | np.ndarray
    real: int

    def chunk(self, position: np.ndarray) -> np.ndarray:
        """The chunk (index in start order) of each layout position."""
        if isinstance(self.owner, int):
            return position if self.owner == 1 else position // self.owner
        return self.owner[position]


def _send_layout(t: Transfers, transfer: np.ndarray, lanes: np.ndarray) -> _Layout:
    """One entry per chunk: its source tile; a two-lane chunk also holds the send port of
    the source's pair partner (super-tile send), listed right after it."""
    src = t.src[transfer].astype(np.int64)
    two = lanes == PAIR_LANES
    if not two.any():
        return _Layout(_narrow_tiles(src), 1, transfer.shape[0])
    ports = 1 + two.astype(np.int64)
    owner = np.repeat(np.arange(transfer.shape[0], dtype=np.int64), ports)
    tile = src[owner]
    second = np.flatnonzero(np.r_[False, owner[1:] == owner[:-1]])
    tile[second] ^= 1
    return _Layout(_narrow_tiles(tile), owner, tile.shape[0])


def _receive_layout(t: Transfers, transfer: np.ndarray) -> _Layout:
    """Destination tiles of the chunks (given in start order) laid out chunk after chunk.

    When padding every chunk to the largest fan-out ``W`` at most doubles the entries, each
    chunk becomes one row of a window view (a contiguous row copy, several times cheaper
    than a per-entry gather, and chunk = position // W needs no lookup table); the padding
    gets a sentinel tile above every real one, so it sorts last and is cut off.  Otherwise
    a segmented gather keeps the cost linear in destination entries.
    """
    n = transfer.shape[0]
    fan = t.fanout[transfer]
    real = int(fan.sum())
    width = int(fan.max()) if n else 0
    if 0 < n * width <= 2 * real:
        dst = _narrow_tiles(t.dst, spare=1)
        if dst.dtype != np.int64:
            sentinel = int(dst.max()) + 1
            padded = np.concatenate((dst, np.full(width, sentinel, dtype=dst.dtype)))
            rows = sliding_window_view(padded, width)[t.dst_offsets[transfer]]
            if int(fan.min()) < width:
                rows[np.arange(width)[None, :] >= fan[:, None]] = sentinel
            return _Layout(rows.reshape(-1), width, real)
    index = np.repeat(t.dst_offsets[transfer] - (np.cumsum(fan) - fan), fan)
    index += np.arange(real, dtype=np.int64)
    owner = np.repeat(np.arange(n, dtype=np.int64), fan)
    return _Layout(_narrow_tiles(t.dst)[index], owner, real)


def _check_port(
    port_name: str, layout: _Layout, transfer: np.ndarray, start: np.ndarray, end: np.ndarray
) -> None:
    """Raise on the first overlap at one kind of port.

    ``transfer``/``start``/``end`` describe the chunks sorted by ``(start, chunk index)``.
    A stable sort of the layout by tile yields every port's intervals in ``(start, chunk
    index)`` order: the same order, and so the same first violation, as a lexsort by
    ``(tile, start)`` over all entries.

    In start order, intervals on one port overlap iff one starts before its predecessor
    ends: if ``start[i+1] >= end[i]`` for every i, every later interval starts at or after
    ``start[i+1] >= end[i]``; conversely ``start[i] <= start[i+1] < end[i]`` puts cycle
    ``start[i+1]`` in both (words >= 1).  As starts are sorted, ``start[b] < end[a]`` iff
    ``b < free[a]``, the first chunk starting at or after ``end[a]``: one gather from a
    small table per entry.  Pairs straddling two ports give at most one false candidate
    per port; they are dropped by comparing tiles for the candidates only.
    """
    perm = np.argsort(layout.tile, kind="stable")[: layout.real]
    chunk = layout.chunk(perm)
    free = np.searchsorted(start, end, side="left")
    free = free.astype(np.int32) if free.size <= np.iinfo(np.int32).max else free  # values <= n
    candidates = np.flatnonzero(chunk[1:] < free[chunk[:-1]])
    tile = layout.tile
    clash = candidates[tile[perm[candidates]] == tile[perm[candidates + 1]]]
    if clash.size:
        k = int(clash[0])
        a, b = int(chunk[k]), int(chunk[k + 1])
        raise ScheduleError(
            f"{port_name} port overlap: tile {int(tile[perm[k]])} cycle {int(start[b])} used by "
            f"transfer {int(transfer[a])} (cycles {int(start[a])}..{int(end[a])}) and transfer "
            f"{int(transfer[b])} (from cycle {int(start[b])})"
        )


def verify_schedule(t: Transfers, s: Schedule) -> None:
    """Raise :class:`ScheduleError` naming the first violation; return None if valid."""
    transfer, start, words = _check_fields(t, s)
    lanes, eligible = _check_lanes(t, s, transfer)
    cycles = chunk_cycles(words, lanes)
    _check_coverage(t, transfer, start, words, cycles)
    order = np.argsort(start, kind="stable")
    transfer, start, end, lanes = transfer[order], start[order], start[order] + cycles[order], lanes[order]
    _check_port("send", _send_layout(t, transfer, lanes), transfer, start, end)
    _check_port("receive", _receive_layout(t, transfer), transfer, start, end)
    horizon = int(end.max()) if end.size else 0
    if horizon != s.horizon:
        raise ScheduleError(f"horizon mismatch: recorded {s.horizon}, chunks end at {horizon}")
    bound = endpoint_lower_bound(t) if eligible is None else paired_lower_bound(t, eligible)
    if bound != s.lower_bound:
        raise ScheduleError(f"lower bound mismatch: recorded {s.lower_bound}, instance {bound}")
