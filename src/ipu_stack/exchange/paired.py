"""Paired tiles: two tiles share an exchange bus (PopLibs ``getTilesPerSharedExchangeBus``).

The target option (off in the plain model) is modelled as follows.  Tiles ``2k`` and
``2k + 1`` form a pair.  A transfer whose destination set is a union of whole pairs (data
both tiles of every receiving pair take) may be sent in *two lanes*: the source pair sends
64 bits per cycle (super-tile send: the send ports of ``src`` and ``src ^ 1`` are both busy)
and every receiving pair takes them on its shared bus, so a chunk of ``w`` words occupies
its ports for ``ceil(w / 2)`` cycles instead of ``w``.  For a multicast the source's own
partner may be a destination without the source (a replica group feeding itself); a unicast
is never eligible.  Everything else is the plain model: one lane, one word per cycle per port.

Phases whose transfers are all eligible are scheduled exactly on the *pair machine*
(``pair_level``); the scheduler (``scheduler.py``) also runs replica layers one by one and
falls back to the rounds kernel over tasks (``schedule_paired``).

The verifier checks lanes like any other field (``verify.py``): a two-lane chunk needs a
paired schedule, an eligible transfer, and both source send ports free.  Eligibility and
the paired lower bound (``pair_eligible``, ``paired_lower_bound``) live in ``model.py``.
"""

from __future__ import annotations

import numpy as np

from ipu_stack.exchange.model import PAIR_LANES, Transfers, chunk_cycles, pair_eligible
from ipu_stack.exchange.multicast import port_lists, schedule_tasks


def chunk_words(
    task: np.ndarray, start: np.ndarray, run: np.ndarray, lanes: np.ndarray, words: np.ndarray
) -> tuple[np.ndarray, ...]:
    """Chunks of tasks (``run`` cycles each) as chunks of transfers: in start order, each
    chunk moves ``lanes`` words per cycle, the transfer's odd word last.  Returns
    ``(transfer, start, words, lanes)``."""
    order = np.lexsort((start, task))
    task, start, run = task[order], start[order], run[order]
    moved = run * lanes[task]
    head = np.r_[True, task[1:] != task[:-1]]
    before = np.cumsum(moved) - moved
    before -= np.repeat(before[head], np.diff(np.r_[np.flatnonzero(head), task.size]))
    cap = words[task]
    sent = np.minimum(before + moved, cap) - np.minimum(before, cap)
    return task, start, sent, lanes[task]


def schedule_paired(
    t: Transfers, balance: float = 1.0, *, eligible: np.ndarray | None = None
) -> tuple[np.ndarray, ...]:
    """Chunks ``(transfer, start, words, lanes)``: eligible transfers in two lanes.

    Each transfer becomes a task over its ports (two send ports for two-lane transfers)
    lasting ``ceil(words / lanes)`` cycles, scheduled by rounds of global rematching.
    ``eligible`` (``pair_eligible(t)``) may be passed by a caller that has it already."""
    eligible = pair_eligible(t) if eligible is None else eligible
    poff, pl = port_lists(t, eligible)
    lanes = np.where(eligible, PAIR_LANES, 1).astype(np.int64)
    words = t.words.astype(np.int64)
    task, start, run = schedule_tasks(2 * t.tiles, poff, pl, chunk_cycles(words, lanes), balance)
    return chunk_words(task, start, run, lanes, words)


def pair_level(t: Transfers) -> Transfers:
    """The phase on the pair machine, for phases whose transfers are all eligible: one node
    per tile pair (its two send ports act as one send port, its two receive ports as one
    receive port), each transfer from its source's pair to its destinations' pairs in
    ``ceil(words / 2)`` cycles.  Any schedule of it is a two-lane schedule of ``t``, so the
    exact unicast scheduler and the replica-group reduction apply unchanged.

    A transfer whose destinations include its source's partner keeps that pair among its
    destinations (the pair node then sends and receives, which separate ports allow; the
    source's own receive port is reserved too, which is conservative).  Not validated as a
    phase for that reason."""
    owner = t.dst_transfer()
    pair = (t.dst // PAIR_LANES).astype(np.int32)
    if np.all((pair[1:] >= pair[:-1]) | (owner[1:] != owner[:-1])):  # rows ascend
        keep = np.r_[True, (pair[1:] != pair[:-1]) | (owner[1:] != owner[:-1])]
        kept_owner, kept_pair = owner[keep], pair[keep]
    else:
        key = np.unique(owner * (t.tiles // PAIR_LANES) + pair)
        kept_owner, kept_pair = key // (t.tiles // PAIR_LANES), key % (t.tiles // PAIR_LANES)
    offsets = np.zeros(t.count + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(np.bincount(kept_owner, minlength=t.count))
    return Transfers.from_arrays(t.tiles // PAIR_LANES, t.src // PAIR_LANES, offsets, kept_pair,
                                 -(-t.words.astype(np.int64) // PAIR_LANES))
