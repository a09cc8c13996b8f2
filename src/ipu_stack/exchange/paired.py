"""Paired tiles: two tiles share an exchange bus (PopLibs ``getTilesPerSharedExchangeBus``).

The target option (off in the plain model) is modelled as follows.  Tiles ``2k`` and
``2k + 1`` form a pair.  A transfer whose destination set is a union of whole pairs (data
both tiles of every receiving pair take) may be sent in *two lanes*: the source pair sends
64 bits per cycle (super-tile send: the send ports of ``src`` and ``src ^ 1`` are both busy)
and every receiving pair takes them on its shared bus, so a chunk of ``w`` words occupies
its ports for ``ceil(w / 2)`` cycles instead of ``w``.  Everything else is the plain model:
one lane, one word per cycle per port.

The verifier checks lanes like any other field (``verify.py``): a two-lane chunk needs a
paired schedule, an eligible transfer, and both source send ports free.  Eligibility and
the paired lower bound (``pair_eligible``, ``paired_lower_bound``) live in ``model.py``.
"""

from __future__ import annotations

import numpy as np

from ipu_stack.exchange.model import PAIR_LANES, Transfers, pair_eligible
from ipu_stack.exchange.multicast import port_lists, schedule_tasks


def schedule_paired(t: Transfers, balance: float = 1.0) -> tuple[np.ndarray, ...]:
    """Chunks ``(transfer, start, words, lanes)``: eligible transfers in two lanes.

    Each transfer becomes a task over its ports (two send ports for two-lane transfers)
    lasting ``ceil(words / lanes)`` cycles, scheduled by rounds of global rematching; a
    task's chunks are then given words in start order, two per cycle, the odd word last."""
    eligible = pair_eligible(t)
    poff, pl = port_lists(t, eligible)
    lanes = np.where(eligible, PAIR_LANES, 1).astype(np.int64)
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

