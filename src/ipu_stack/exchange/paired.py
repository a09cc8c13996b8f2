"""Paired tiles: two tiles share an exchange bus (PopLibs ``getTilesPerSharedExchangeBus``).

The target option (off in the plain model) is modelled as follows.  Tiles ``2k`` and
``2k + 1`` form a pair.  A transfer whose destination set is a union of whole pairs (data
both tiles of every receiving pair take) may be sent in *two lanes*: the source pair sends
64 bits per cycle (super-tile send: the send ports of ``src`` and ``src ^ 1`` are both busy)
and every receiving pair takes them on its shared bus, so a chunk of ``w`` words occupies
its ports for ``ceil(w / 2)`` cycles instead of ``w``.  Everything else is the plain model:
one lane, one word per cycle per port.

The verifier checks lanes like any other field (``verify.py``): a two-lane chunk needs a
paired schedule, an eligible transfer, and both source send ports free.  The paired lower
bound relaxes the endpoint bound accordingly (see ``paired_lower_bound``).
"""

from __future__ import annotations

import numpy as np

from ipu_stack.exchange.model import Transfers
from ipu_stack.exchange.multicast import port_lists, schedule_tasks

LANES = 2  # tiles per shared exchange bus on ipu21 (target/machine.py)


def pair_eligible(t: Transfers) -> np.ndarray:
    """Per transfer: True when its destinations are whole tile pairs (and tiles pair up)."""
    if t.count == 0 or t.tiles % LANES:
        return np.zeros(t.count, dtype=bool)
    owner = t.dst_transfer()
    dst = t.dst.astype(np.int64)
    key = owner * t.tiles + dst
    order = np.sort(key)
    partner = owner * t.tiles + (dst ^ 1)
    hit = np.searchsorted(order, partner)
    found = order[np.minimum(hit, order.size - 1)] == partner
    missing = np.zeros(t.count, dtype=bool)
    missing[owner[~found]] = True
    return ~missing


def paired_lower_bound(t: Transfers) -> int:
    """A lower bound on any schedule that may send eligible transfers in two lanes.

    Per receive port and per send port: the one-lane words plus half (rounded up) of the
    eligible words; per source pair: half the pair's sent words (a pair sends at most two
    words per cycle).  Each is necessary, so their maximum is a lower bound."""
    if t.count == 0:
        return 0
    eligible = pair_eligible(t)
    words = t.words.astype(np.int64)
    one = np.where(eligible, 0, words)
    two = np.where(eligible, words, 0)
    src = t.src.astype(np.int64)
    send_one = np.bincount(src, weights=one, minlength=t.tiles).astype(np.int64)
    send_two = np.bincount(src, weights=two, minlength=t.tiles).astype(np.int64)
    owner = t.dst_transfer()
    recv_one = np.bincount(t.dst, weights=one[owner], minlength=t.tiles).astype(np.int64)
    recv_two = np.bincount(t.dst, weights=two[owner], minlength=t.tiles).astype(np.int64)
    send_total = send_one + send_two
    pair_total = send_total.reshape(-1, LANES).sum(axis=1) if t.tiles % LANES == 0 else send_total
    half = lambda x: -(-x // LANES)  # noqa: E731 - ceiling halves, used four times
    return int(max(
        (send_one + half(send_two)).max(), (recv_one + half(recv_two)).max(), half(pair_total).max()
    ))


def schedule_paired(t: Transfers, balance: float = 1.0) -> tuple[np.ndarray, ...]:
    """Chunks ``(transfer, start, words, lanes)``: eligible transfers in two lanes.

    Each transfer becomes a task over its ports (two send ports for two-lane transfers)
    lasting ``ceil(words / lanes)`` cycles, scheduled by rounds of global rematching; a
    task's chunks are then given words in start order, two per cycle, the odd word last."""
    eligible = pair_eligible(t)
    poff, pl = port_lists(t, eligible)
    lanes = np.where(eligible, LANES, 1).astype(np.int64)
    words = t.words.astype(np.int64)
    cycles = -(-words // lanes)
    task, start, run = schedule_tasks(2 * t.tiles, poff, pl, cycles, balance)
    order = np.lexsort((start, task))
    task, start, run = task[order], start[order], run[order]
    carried = np.cumsum(run * lanes[task])
    head = np.r_[True, task[1:] != task[:-1]]
    before = carried - run * lanes[task]
    before -= np.repeat(before[head], np.diff(np.r_[np.flatnonzero(head), task.size]))
    after = before + run * lanes[task]
    cap = words[task]
    sent = np.minimum(after, cap) - np.minimum(before, cap)
    return task, start, sent, lanes[task]

