"""The instruction-level view of a schedule: sends of at most 64 words, aligned starts.

A scheduled chunk becomes ``ceil(words / 64)`` send instructions on its source tile (the
reference's ``PLAN_WORDS``).  The exchange program issues one event per 32-bit word, and a
``sendpicp`` is a two-word instruction that must start 8-byte aligned: a send that would start
on an odd event is shifted one event later, and everything the tile sends after it follows.
Sends after the first of a chunk stay aligned (64 is even), so only a chunk's first send can
shift.  The instruction-level horizon is what the phase really takes before its fixed cost;
it is at least the scheduled horizon and usually equal or a few events more.

Receivers are not re-timed: a receiver points its incoming mux at the sender and takes the
words as they come; the mux latency (52 + 2 x physical row events) is inside the measured
per-phase cost (``target.timing``, ``exchange_phase``).
"""

from __future__ import annotations

import numba
import numpy as np

from ipu_stack.exchange.model import Schedule, Transfers, chunk_cycles
from ipu_stack.target.timing import p


@numba.njit(cache=True, nogil=True)
def _aligned_ends(order, src, start, cycles, align):  # pragma: no cover - compiled
    """Walk each source tile's chunks in start order; shift odd starts to the next even
    event and push later chunks of the tile back by what earlier ones were delayed."""
    horizon = 0
    shifts = 0
    previous_tile = -1
    busy_until = 0
    for k in range(order.shape[0]):
        c = order[k]
        tile = src[c]
        if tile != previous_tile:
            previous_tile = tile
            busy_until = 0
        at = max(start[c], busy_until)
        if at % align != 0:
            at += align - at % align
            shifts += 1
        busy_until = at + cycles[c]
        if busy_until > horizon:
            horizon = busy_until
    return horizon, shifts


def instruction_horizon(schedule: Schedule, transfers: Transfers) -> tuple[int, int]:
    """``(horizon, shifted sends)`` once chunks are issued as aligned send instructions."""
    if schedule.chunks == 0:
        return 0, 0
    src = transfers.src[schedule.chunk_transfer].astype(np.int64)
    start = schedule.chunk_start.astype(np.int64)
    order = np.lexsort((start, src)).astype(np.int64)
    cycles = chunk_cycles(schedule.chunk_words, schedule.chunk_lanes).astype(np.int64)
    horizon, shifts = _aligned_ends(order, src, start, cycles, p("send_alignment_events"))
    return int(max(horizon, schedule.horizon)), int(shifts)


def send_instructions(schedule: Schedule) -> np.ndarray:
    """Send instructions per chunk: ``ceil(words / 64)``."""
    return -(-schedule.chunk_words.astype(np.int64) // p("send_words"))
