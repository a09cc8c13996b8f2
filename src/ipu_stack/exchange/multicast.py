"""Multicast scheduling: event-driven greedy list scheduling ("compact streams").

A multicast occupies its source's send port and all its destinations' receive ports for the
same cycles, so exact scheduling is hypergraph colouring (NP-hard); we use list scheduling,
which is fast and, with the right priority, close to the endpoint bound on real plans.

At each event (cycle at which some port frees) the pending transfers that touch a freed port
and whose ports are all free are candidates.  Candidates are started greedily in priority
order, resolved in vectorised rounds: a candidate starts when it has the highest priority at
every one of its ports; each round starts at least the globally best candidate, so rounds end.
A started transfer runs to completion, so every transfer is exactly one chunk (smallest
possible exchange tables).  A transfer is only re-examined when one of its ports frees, which
is exactly when it can have become startable, so nothing starves and the work is proportional
to ``sum(ports per transfer x events per port)``.

Priorities (both are tried when the phase is small enough, the shorter schedule wins):

* ``compact-streams``: largest pending load at the transfer's busiest port (critical path);
* ``balanced-compact-streams``: the same, plus the words still to be received at all of the
  transfer's destinations, favouring wide multicasts that block many ports.
"""

from __future__ import annotations

import heapq

import numpy as np

from ipu_stack.exchange.model import Transfers, port_loads
from ipu_stack.exchange.unicast import gather_ranges


class _Greedy:
    def __init__(self, t: Transfers, balanced: bool) -> None:
        self.t = t
        self.balanced = balanced
        n, tiles = t.count, t.tiles
        self.fan = t.fanout
        owner = t.dst_transfer()
        self.send_order = np.argsort(t.src, kind="stable")
        self.send_ptr = np.zeros(tiles + 1, dtype=np.int64)
        self.send_ptr[1:] = np.cumsum(np.bincount(t.src, minlength=tiles))
        recv_order = np.argsort(t.dst, kind="stable")
        self.recv_list = owner[recv_order]
        self.recv_ptr = np.zeros(tiles + 1, dtype=np.int64)
        self.recv_ptr[1:] = np.cumsum(np.bincount(t.dst, minlength=tiles))
        self.send_load, self.recv_load = port_loads(t)
        self.send_busy = np.zeros(tiles, dtype=np.int64)
        self.recv_busy = np.zeros(tiles, dtype=np.int64)
        self.pending = np.ones(n, dtype=bool)
        self.mark = np.zeros(n, dtype=bool)
        self.best_send = np.zeros(tiles, dtype=np.int64)
        self.best_recv = np.zeros(tiles, dtype=np.int64)
        self.start = np.zeros(n, dtype=np.int64)

    def _candidates(self, send_ports: np.ndarray, recv_ports: np.ndarray) -> np.ndarray:
        """Pending transfers touching the freed ports, deduplicated."""
        sp, rp = self.send_ptr, self.recv_ptr
        a = self.send_order[gather_ranges(sp[send_ports], sp[send_ports + 1] - sp[send_ports])]
        b = self.recv_list[gather_ranges(rp[recv_ports], rp[recv_ports + 1] - rp[recv_ports])]
        cand = np.concatenate((a, b))
        cand = cand[self.pending[cand]]
        self.mark[cand] = True
        cand = np.flatnonzero(self.mark) if cand.size > self.t.count // 8 else np.unique(cand)
        self.mark[cand] = False
        return cand

    def _start(self, cand: np.ndarray, now: int) -> list[int]:
        """Start candidates whose ports are all free, best first; return their end cycles."""
        t = self.t
        ends: list[int] = []
        # cheap filters first: the send port, then the first destination
        cand = cand[self.send_busy[t.src[cand]] <= now]
        cand = cand[self.recv_busy[t.dst[t.dst_offsets[cand]]] <= now]
        while cand.size:
            fan = self.fan[cand]
            rows = np.repeat(np.arange(cand.shape[0]), fan)
            dst_idx = gather_ranges(t.dst_offsets[cand], fan)
            dsts = t.dst[dst_idx]
            blocked = np.bincount(rows, weights=self.recv_busy[dsts] > now, minlength=cand.size)
            ok = (blocked == 0) & (self.send_busy[t.src[cand]] <= now)
            keep = np.flatnonzero(ok)
            if keep.size == 0:
                break
            cand, fan = cand[keep], fan[keep]
            rows = np.repeat(np.arange(cand.shape[0]), fan)
            dsts = t.dst[gather_ranges(t.dst_offsets[cand], fan)]
            srcs = t.src[cand]
            crit = np.maximum(self.send_load[srcs], 0)
            recv_max = np.zeros(cand.shape[0], dtype=np.int64)
            np.maximum.at(recv_max, rows, self.recv_load[dsts])
            key = np.maximum(crit, recv_max)
            if self.balanced:
                key = key + np.bincount(rows, weights=self.recv_load[dsts]).astype(np.int64)
            n1 = np.int64(t.count + 1)
            key = key * n1 + (t.count - cand)  # unique keys: ties go to the lower index
            self.best_send[srcs] = -1
            np.maximum.at(self.best_send, srcs, key)
            self.best_recv[dsts] = -1
            np.maximum.at(self.best_recv, dsts, key[rows])
            lost = np.bincount(rows, weights=self.best_recv[dsts] != key[rows], minlength=cand.shape[0])
            win = (self.best_send[srcs] == key) & (lost == 0)
            winners = cand[win]
            words = t.words[winners]
            end = now + words
            self.start[winners] = now
            self.pending[winners] = False
            self.send_busy[t.src[winners]] = end
            win_rows = np.flatnonzero(win[rows])
            end_of_row = np.zeros(cand.shape[0], dtype=np.int64)
            end_of_row[win] = end
            self.recv_busy[dsts[win_rows]] = end_of_row[rows[win_rows]]
            np.subtract.at(self.send_load, t.src[winners], words)
            np.subtract.at(self.recv_load, dsts[win_rows], t.words[cand[rows[win_rows]]])
            ends.extend(np.unique(end).tolist())
            cand = cand[~win]
        return ends

    def run(self) -> np.ndarray:
        """Simulate events until every transfer has started; return start cycles."""
        tiles = self.t.tiles
        everyone = np.arange(tiles, dtype=np.int64)
        events: list[int] = []
        seen: set[int] = set()
        now = 0
        freed_send, freed_recv = everyone, everyone
        while True:
            cand = self._candidates(freed_send, freed_recv)
            for end in self._start(cand, now):
                if end not in seen:
                    seen.add(end)
                    heapq.heappush(events, end)
            if not events:
                break
            now = heapq.heappop(events)
            seen.discard(now)
            freed_send = np.flatnonzero(self.send_busy == now)
            freed_recv = np.flatnonzero(self.recv_busy == now)
        if self.pending.any():
            raise AssertionError("greedy multicast scheduler left transfers unscheduled")
        return self.start


def schedule_multicast(t: Transfers, balanced: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One chunk per transfer ``(transfer, start, words)`` by greedy list scheduling."""
    if t.count == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    start = _Greedy(t, balanced).run()
    return np.arange(t.count, dtype=np.int64), start, t.words.astype(np.int64)
