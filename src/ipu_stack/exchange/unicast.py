"""Exact unicast scheduling: every unicast phase finishes at its endpoint lower bound ``L``.

The phase is a bipartite multigraph: send ports on one side, receive ports on the other, an
edge of weight ``words`` per transfer.  At time ``now`` a port with ``load`` words left has
``slack = (L - now) - load``; it is *tight* when its slack is 0 and from then on must be busy
every cycle.  The scheduler keeps a matching (the transfers running now) that covers every
tight port, and runs it until an edge runs out or an idle port becomes tight.

Why a covering matching always exists (so the horizon is exactly ``L``).  While every load
is ``<= L - now``, the remaining graph can be padded with idle edges to a ``(L - now)``-
regular graph (send and receive deficits have equal totals); a regular bipartite graph has a
perfect matching (Konig/Hall), and tight ports get no idle edge, so its real edges cover
every tight port.  Hence, given a matching covering all tight ports but one (the *root*), the
symmetric difference with that covering matching holds an alternating path from the root
that ends at a free port or at a non-tight port, which may be dropped.  A breadth-first
search over alternating paths finds one; flipping it keeps every other tight port covered.

Why few chunks.  Matched edges normally run until they are spent.  Between events the
matching is greedily extended among the ports freed at this event, most critical first
(smallest slack), which keeps ports busy and tight events rare; a transfer is split only
when a repair path drops it, and the dropped part resumes later as one more chunk.

Cost.  Events happen at integer cycles and each ends an edge or tightens a port, so there
are at most ``min(L, n + 2 * tiles)`` of them; each does numpy work proportional to the
freed ports' adjacency (``O(n log n)`` sorting overall).
"""

from __future__ import annotations

import numpy as np

from ipu_stack.exchange.dense import dense_size, schedule_dense
from ipu_stack.exchange.model import Transfers, port_loads

DENSE_LIMIT = 4_000_000  # pair-matrix cells up to which the dense scheduler is used


def gather_ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenate ``arange(s, s + l)`` for every (s, l) without a Python loop."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.cumsum(lengths) - lengths
    return np.repeat(starts - offsets, lengths) + np.arange(total, dtype=np.int64)


class _Peeler:
    """State of the covering-matching scheduler (side 0 = send ports, side 1 = receive)."""

    def __init__(self, t: Transfers, bound: int) -> None:
        send, recv = port_loads(t)
        self.bound = bound
        self.tiles = t.tiles
        self.end = (t.src.astype(np.int64), t.dst.astype(np.int64))
        self.rem = t.words.astype(np.int64).copy()
        self.enter = np.zeros(t.count, dtype=np.int64)
        self.load = (send.copy(), recv.copy())
        self.match = (np.full(t.tiles, -1, dtype=np.int64), np.full(t.tiles, -1, dtype=np.int64))
        self.visited = (np.zeros(t.tiles, dtype=bool), np.zeros(t.tiles, dtype=bool))
        self.parent = np.full(t.tiles, -1, dtype=np.int64)
        self.scratch = np.zeros(t.tiles, dtype=np.int64)
        self.best = np.zeros(t.tiles, dtype=np.int64)
        self.seen = (np.zeros(t.tiles, dtype=bool), np.zeros(t.tiles, dtype=bool))
        self.live = int(np.count_nonzero(self.rem))
        self.fill_rounds = 2
        self.out_edge: list[np.ndarray] = []
        self.out_start: list[np.ndarray] = []
        self.out_end: list[np.ndarray] = []
        self.repairs = 0
        self.now = 0
        self._rebuild()

    def _rebuild(self) -> None:
        """(Re)build both adjacencies (CSR per side) from live edges.

        The first build sorts (largest weight first); later ones only drop spent edges,
        which keeps the order and costs one linear pass."""
        if not hasattr(self, "adj"):
            live = np.flatnonzero(self.rem > 0)
            self.adj = []
            for side in (0, 1):
                order = np.lexsort((-self.rem[live], self.end[side][live]))
                self.adj.append(live[order])
        else:
            self.adj = [adj[self.rem[adj] > 0] for adj in self.adj]
        self.adj_other = []
        self.ptr = []
        for side in (0, 1):
            adj = self.adj[side]
            ptr = np.zeros(self.tiles + 1, dtype=np.int64)
            ptr[1:] = np.cumsum(np.bincount(self.end[side][adj], minlength=self.tiles))
            self.adj_other.append(self.end[1 - side][adj].astype(np.int32))
            self.ptr.append(ptr)
        self.live_at_rebuild = self.adj[0].size

    def _best_per(self, groups: np.ndarray, key: np.ndarray) -> np.ndarray:
        """Mask choosing one entry of largest ``key`` per group (no full sort needed)."""
        best = self.best
        best[groups] = -1
        np.maximum.at(best, groups, key)
        top = np.flatnonzero(key == best[groups])
        return top[self._one_per(groups[top])]

    def _one_per(self, keys: np.ndarray) -> np.ndarray:
        """Mask choosing exactly one entry per distinct key (the last, in practice the first of
        a reversed order), far cheaper than ``np.unique`` for the small arrays used here."""
        positions = np.arange(keys.shape[0], dtype=np.int64)
        self.scratch[keys[::-1]] = positions[::-1]
        return self.scratch[keys] == positions

    def _edges_of(self, side: int, ports: np.ndarray) -> np.ndarray:
        """Live edges at ``ports`` of ``side`` (adjacency order)."""
        ptr = self.ptr[side]
        edges = self.adj[side][gather_ranges(ptr[ports], ptr[ports + 1] - ptr[ports])]
        return edges[self.rem[edges] > 0]

    def _slack(self, side: int, ports: np.ndarray) -> np.ndarray:
        return (self.bound - self.now) - self.load[side][ports]

    def _emit(self, edges: np.ndarray) -> None:
        """Record chunks for edges leaving the matching now."""
        edges = edges[self.enter[edges] < self.now]
        if edges.size:
            self.out_edge.append(edges)
            self.out_start.append(self.enter[edges].copy())
            self.out_end.append(np.full(edges.shape[0], self.now, dtype=np.int64))

    def _set(self, edges: np.ndarray) -> None:
        self.match[0][self.end[0][edges]] = edges
        self.match[1][self.end[1][edges]] = edges
        self.enter[edges] = self.now

    def _fill(self, freed: tuple[np.ndarray, np.ndarray]) -> None:
        """Greedily match free ports among themselves, starting from the just-freed ones
        (only a just-freed port can have gained a free partner), most critical first."""
        ports = list(freed)
        for _ in range(self.fill_rounds):
            found = []
            for side in (0, 1):
                ports[side] = ports[side][self.match[side][ports[side]] < 0]
                ptr = self.ptr[side]
                starts, stops = ptr[ports[side]], ptr[ports[side] + 1]
                idx = gather_ranges(starts, stops - starts)
                idx = idx[self.match[1 - side][self.adj_other[side][idx]] < 0]
                found.append(self.adj[side][idx])
            edges = np.concatenate(found)
            edges = edges[self.rem[edges] > 0]
            if edges.size == 0:
                break
            senders, receivers = self.end[0][edges], self.end[1][edges]
            key = self.load[0][senders] + self.load[1][receivers]
            keep = self._best_per(receivers, key)
            chosen = keep[self._best_per(senders[keep], key[keep])]
            self._set(edges[chosen])
            # only ports that lost a conflict can still find a partner in the next round
            for side, ends in ((0, senders), (1, receivers)):
                seen = self.seen[side]
                seen[ends] = True
                mine = ports[side][seen[ports[side]]]
                seen[ends] = False
                ports[side] = mine

    def _repair(self, side: int, root: int) -> None:
        """Cover tight free port ``root`` by an alternating path (BFS, vectorised per level)."""
        other = 1 - side
        touched: list[tuple[int, np.ndarray]] = [(side, np.array([root]))]
        self.visited[side][root] = True
        frontier = np.array([root], dtype=np.int64)
        stop = -1
        while frontier.size:
            edges = self._edges_of(side, frontier)
            ports = self.end[other][edges]
            fresh = ~self.visited[other][ports]
            ports, first = np.unique(ports[fresh], return_index=True)
            edges = edges[fresh][first]
            self.visited[other][ports] = True
            self.parent[ports] = edges
            touched.append((other, ports))
            partner_edge = self.match[other][ports]
            partner = np.where(partner_edge >= 0, self.end[side][partner_edge], 0)
            loose = (partner_edge < 0) | (self._slack(side, partner) > 0)
            hits = np.flatnonzero(loose)
            if hits.size:
                stop = int(ports[hits[0]])
                break
            nxt = partner[~self.visited[side][partner]]
            self.visited[side][nxt] = True
            touched.append((side, nxt))
            frontier = nxt
        for s, arr in touched:
            self.visited[s][arr] = False
        if stop < 0:
            raise AssertionError("no covering matching: the endpoint bound was violated")
        self.repairs += 1
        dropped = int(self.match[other][stop])
        if dropped >= 0:  # the stop port's partner is not tight: drop its edge
            self.match[side][self.end[side][dropped]] = -1
            self.match[other][stop] = -1
            self._emit(np.array([dropped]))
        port = stop
        while True:
            edge = int(self.parent[port])
            mine = int(self.end[side][edge])
            old = int(self.match[side][mine])
            self._set(np.array([edge]))
            if old < 0:
                break
            self._emit(np.array([old]))
            port = int(self.end[other][old])

    def run(self) -> None:
        """Advance event by event until every word is sent (at exactly ``bound``)."""
        everyone = np.arange(self.tiles, dtype=np.int64)
        self._fill((everyone, everyone))
        while True:
            matched = self.match[0][self.match[0] >= 0]
            step = int(self.rem[matched].min()) if matched.size else self.bound - self.now
            for side in (0, 1):
                idle = (self.match[side] < 0) & (self.load[side] > 0)
                if idle.any():
                    slack = (self.bound - self.now) - self.load[side][idle]
                    step = min(step, int(slack.min()))
            self.now += step
            self.rem[matched] -= step
            np.subtract.at(self.load[0], self.end[0][matched], step)
            np.subtract.at(self.load[1], self.end[1][matched], step)
            done = matched[self.rem[matched] == 0]
            self.live -= done.size
            self._emit(done)
            self.match[0][self.end[0][done]] = -1
            self.match[1][self.end[1][done]] = -1
            if self.now >= self.bound:
                break
            for side in (0, 1):
                tight = np.flatnonzero(
                    (self.match[side] < 0)
                    & (self.load[side] > 0)
                    & (self.load[side] == self.bound - self.now)
                )
                for root in tight.tolist():
                    if self.match[side][root] < 0:
                        self._repair(side, root)
            self._fill((self.end[0][done], self.end[1][done]))
            if 4 * self.live_at_rebuild > 5 * self.live + 4096:
                self._rebuild()
        if np.any(self.rem != 0):
            raise AssertionError("scheduler ended with unsent words")


def schedule_unicast(t: Transfers, bound: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Chunks ``(transfer, start, words)`` finishing exactly at ``bound`` (the endpoint lower
    bound), plus the number of repair paths used.

    The dense pair-matrix scheduler (``dense.py``) is used whenever its matrix is small
    (always at 1472 tiles); this sparse one only for phases over very many distinct tiles."""
    empty = np.zeros(0, dtype=np.int64)
    if t.count == 0:
        return empty, empty, empty, 0
    if dense_size(t) <= DENSE_LIMIT:
        return schedule_dense(t, bound)
    peeler = _Peeler(t, bound)
    peeler.run()
    edge = np.concatenate(peeler.out_edge)
    start = np.concatenate(peeler.out_start)
    end = np.concatenate(peeler.out_end)
    return edge, start, end - start, peeler.repairs
