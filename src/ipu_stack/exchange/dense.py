"""Exact unicast scheduling on a dense sender x receiver matrix (the fast path).

Same algorithm and guarantee as ``unicast.py`` (keep a matching that covers every tight
port; a covering matching always exists, so the horizon is exactly the endpoint bound ``L``),
with a representation chosen so that every event costs a handful of whole-array numpy calls
instead of a rescan of each freed port's adjacency:

* transfers between the same (sender, receiver) pair are merged into one *pair edge* whose
  words run back to back (they use the same two ports, so any schedule of the pair is a
  schedule of its transfers); chunks are split back into transfers at the end;
* live pairs are a boolean matrix, so "which free partners does a free port have" is one
  ``np.ix_`` slice of free rows x free columns, and an alternating-path search level is one
  row-block ``any``;
* remaining words and loads are updated lazily, only when an edge leaves the matching: a
  matched port's slack does not change while it runs, an idle port's load does not change,
  so the next event is ``min(finish times, L - idle loads)`` over tile-sized arrays.

The greedy fill lets the ports freed since the last event propose to their most loaded free
partner, ties broken by the cyclic distance ``(receiver - sender) mod M``; partners accept
the most loaded proposer with the same tie-break (few proposers: a sequential greedy).  On
all-to-all and other regular patterns this yields Latin-square rounds (a perfect matching
every round) so repairs, the only Python-level loop, stay rare.  An edge's end may be
handled up to ``DEFER`` cycles late (never past a freed port turning tight) to batch events.

Events fall on integer cycles and each ends a pair or tightens a port: at most
``min(L, pairs + 2 * tiles)`` events.  Memory is ``senders x receivers`` (about 20 MB at
1472 tiles); ``schedule_unicast`` uses the sparse scheduler when the matrix would be larger.
"""

from __future__ import annotations

import numpy as np

from ipu_stack.exchange.model import Transfers

INF = np.iinfo(np.int64).max // 4
DEFER = 2  # cycles an edge's end may wait for the next event
ROUNDS = 16  # proposal rounds per fill
SEQUENTIAL = 32  # at most this many proposers left: finish with the sequential greedy


class _DensePeeler:
    """Covering-matching scheduler over merged pairs (rows = senders, columns = receivers)."""

    def __init__(self, t: Transfers, bound: int) -> None:
        self.bound = bound
        self.s_tile, s_idx = np.unique(t.src, return_inverse=True)
        self.r_tile, r_idx = np.unique(t.dst, return_inverse=True)
        ns, nr = self.s_tile.size, self.r_tile.size
        key = s_idx.astype(np.int64).ravel() * nr + r_idx.ravel()
        self.order = np.argsort(key, kind="stable")
        sorted_key = key[self.order]
        head = np.ones(sorted_key.size, dtype=bool)
        head[1:] = sorted_key[1:] != sorted_key[:-1]
        self.pair_key = sorted_key[head]
        self.pair_of = np.cumsum(head) - 1  # pair of each sorted transfer
        pair_words = np.bincount(self.pair_of, weights=t.words[self.order]).astype(np.int64)
        self.rem = np.zeros((ns, nr), dtype=np.int64)
        self.rem.flat[self.pair_key] = pair_words
        self.pid = np.full((ns, nr), -1, dtype=np.int32)
        self.pid.flat[self.pair_key] = np.arange(self.pair_key.size)
        self.live = self.rem > 0
        self.live_t = np.ascontiguousarray(self.live.T)  # receiver rows, for row slices
        self.load = (self.rem.sum(axis=1), self.rem.sum(axis=0))
        self.match = (np.full(ns, -1, dtype=np.int64), np.full(nr, -1, dtype=np.int64))
        self.enter = np.zeros(ns, dtype=np.int64)  # per sender: when its edge started
        self.fin = np.full(ns, INF, dtype=np.int64)
        self.due = np.full(ns, INF, dtype=np.int64)  # latest event time once the edge ends
        self.dirty = (np.ones(ns, dtype=bool), np.ones(nr, dtype=bool))  # freed since last fill
        self.modulus = m = int(max(self.s_tile.max(), self.r_tile.max())) + 1
        # tie-break matrix (cyclic distance receiver - sender), dead pairs set to ``dead`` so
        # that ``load * m - tie`` is a candidate score that is negative exactly for them
        big = (bound + 1) * m
        self.dtype = np.int32 if 2 * big < np.iinfo(np.int32).max else np.int64
        self.dead = 2 * big
        tie = ((self.r_tile[None, :] - self.s_tile[:, None]) % m).astype(self.dtype)
        tie[~self.live] = self.dead
        self.tie = (tie, np.ascontiguousarray(tie.T))
        self.out: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.repairs = 0
        self.now = 0
        self.defer = DEFER

    # -- matching updates -------------------------------------------------------------
    def _leave(self, senders: np.ndarray, end: np.ndarray | int | None = None) -> None:
        """Take the edges of ``senders`` out of the matching, recording their chunks: at
        ``end`` (their finish times, when an event was deferred past them) or now."""
        receivers = self.match[0][senders]
        ran = (self.now if end is None else end) - self.enter[senders]
        ran_any = ran > 0
        if ran_any.any():
            s, r = senders[ran_any], receivers[ran_any]
            self.out.append((self.pid[s, r], self.enter[s].copy(), ran[ran_any]))
        self.rem[senders, receivers] -= ran
        alive = self.rem[senders, receivers] > 0
        self.live[senders, receivers] = alive
        self.live_t[receivers, senders] = alive
        gone = ~alive
        if gone.any():
            self.tie[0][senders[gone], receivers[gone]] = self.dead
            self.tie[1][receivers[gone], senders[gone]] = self.dead
        self.load[0][senders] -= ran
        self.load[1][receivers] -= ran
        self.match[0][senders] = -1
        self.match[1][receivers] = -1
        self.fin[senders] = INF
        self.due[senders] = INF
        self.dirty[0][senders] = True
        self.dirty[1][receivers] = True

    def _set(self, senders: np.ndarray, receivers: np.ndarray) -> None:
        """Start edges now.  Their end may be handled up to ``DEFER`` cycles late (never past
        the moment a port they free would turn tight), which batches events: the freed
        ports idle meanwhile, but only ports with slack to spare."""
        self.match[0][senders] = receivers
        self.match[1][receivers] = senders
        self.enter[senders] = self.now
        self.fin[senders] = self.now + self.rem[senders, receivers]
        slack = self.bound - self.now - np.maximum(self.load[0][senders], self.load[1][receivers])
        self.due[senders] = self.fin[senders] + np.minimum(slack, self.defer)

    def _slack(self, side: int, ports: np.ndarray) -> np.ndarray:
        """Slack of matched ``ports``: constant while their edge runs."""
        senders = ports if side == 0 else self.match[1][ports]
        return self.bound - self.enter[senders] - self.load[side][ports]

    # -- greedy fill --------------------------------------------------------------------
    def _fill(self) -> None:
        """Greedily match free ports with load left, most loaded partners first.

        Only pairs with a port freed since the last fill can be new, so in two passes the
        freed free senders, then the freed free receivers, propose to free partners: one
        row slice of the live matrix (or its transpose) each, tens of rows per event."""
        free = [(self.match[k] < 0) & (self.load[k] > 0) for k in (0, 1)]
        dirty = [np.flatnonzero(self.dirty[k] & free[k]) for k in (0, 1)]
        self.dirty[0][:] = False
        self.dirty[1][:] = False
        m = self.modulus
        for side in (0, 1):
            props = dirty[side][free[side][dirty[side]]]
            targets = np.flatnonzero(free[1 - side])
            if props.size == 0 or targets.size == 0:
                continue
            loads = self.load[1 - side][targets].astype(self.dtype) * self.dtype(m)
            score = loads[None, :] - self.tie[side][props][:, targets]
            i, j = _greedy(score, self.load[side][props], loads, m)
            if i.size:
                ends = (props[i], targets[j]) if side == 0 else (targets[j], props[i])
                self._set(*ends)
                free[0][ends[0]] = False
                free[1][ends[1]] = False

    # -- repair -------------------------------------------------------------------------
    def _repair(self, side: int, root: int) -> None:
        """Cover tight idle port ``root`` by an alternating path (BFS, one slice per level)."""
        other = 1 - side
        adj = self.live if side == 0 else self.live_t
        visited_mine = np.zeros(adj.shape[0], dtype=bool)
        visited_other = np.zeros(adj.shape[1], dtype=bool)
        parent = np.full(adj.shape[1], -1, dtype=np.int64)
        visited_mine[root] = True
        frontier = np.array([root], dtype=np.int64)
        stop = -1
        while frontier.size:
            sub = adj[frontier] & ~visited_other[None, :]
            new = np.flatnonzero(sub.any(axis=0))
            if new.size == 0:
                break
            parent[new] = frontier[sub[:, new].argmax(axis=0)]
            visited_other[new] = True
            partner = self.match[other][new]
            free = np.flatnonzero(partner < 0)
            if free.size:
                stop = int(new[free[0]])
                break
            loose = np.flatnonzero(self._slack(side, partner) > 0)
            if loose.size:
                stop = int(new[loose[0]])
                victim = int(partner[loose[0]])
                self._leave(np.array([victim if side == 0 else stop]))
                break
            frontier = partner[~visited_mine[partner]]
            visited_mine[frontier] = True
        if stop < 0:
            raise AssertionError("no covering matching: the endpoint bound was violated")
        self.repairs += 1
        port = stop
        while True:
            mine = int(parent[port])
            old = int(self.match[side][mine])
            if old >= 0:
                self._leave(np.array([mine if side == 0 else old]))
            pair = (mine, port) if side == 0 else (port, mine)
            self._set(np.array([pair[0]]), np.array([pair[1]]))
            if old < 0:
                return
            port = old

    def run(self) -> None:
        """Advance event by event until every word is sent (at exactly ``bound``)."""
        bound = self.bound
        while True:
            self._fill()
            for side in (0, 1):
                tight = np.flatnonzero(
                    (self.match[side] < 0) & (self.load[side] > 0) & (self.load[side] == bound - self.now)
                )
                for root in tight.tolist():
                    if self.match[side][root] < 0:
                        self._repair(side, root)
            nxt = int(self.due.min())
            for side in (0, 1):
                idle = (self.match[side] < 0) & (self.load[side] > 0)
                if idle.any():
                    nxt = min(nxt, bound - int(self.load[side][idle].max()))
            if nxt >= INF:
                break
            if nxt > bound:
                raise AssertionError("scheduler passed the endpoint bound")
            self.now = nxt
            done = np.flatnonzero(self.fin <= nxt)
            if done.size:
                self._leave(done, self.fin[done])
        if np.any(self.rem != 0):
            raise AssertionError("scheduler ended with unsent words")

    def chunks(self, t: Transfers) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Split the pair chunks back into transfer chunks ``(transfer, start, words)``.

        A pair's transfers are laid out back to back in one global word line; each pair
        chunk covers a contiguous stretch of it.  Cutting that line at every chunk start and
        every transfer start gives pieces that belong to one chunk and one transfer each."""
        pair = np.concatenate([c[0] for c in self.out])
        start = np.concatenate([c[1] for c in self.out])
        words = np.concatenate([c[2] for c in self.out])
        order = np.lexsort((start, pair))
        pair, start, words = pair[order], start[order], words[order]
        tw = t.words[self.order].astype(np.int64)
        tpos = np.cumsum(tw) - tw  # global start of each sorted transfer
        head = np.ones(tpos.size, dtype=bool)
        head[1:] = self.pair_of[1:] != self.pair_of[:-1]
        base = tpos[head]  # global start of each pair
        cpos = np.cumsum(words) - words  # chunks are in pair order too, so this is global
        if not np.array_equal(cpos[np.r_[True, pair[1:] != pair[:-1]]], base):
            raise AssertionError("pair chunks do not cover their pairs")
        shift = start - cpos
        cuts = np.union1d(cpos, tpos)
        ends = np.append(cuts[1:], tw.sum())
        chunk = np.searchsorted(cpos, cuts, side="right") - 1
        transfer = np.searchsorted(tpos, cuts, side="right") - 1
        return self.order[transfer].astype(np.int64), cuts + shift[chunk], ends - cuts


def _greedy(
    score: np.ndarray, row_load: np.ndarray, col_base: np.ndarray, m: int
) -> tuple[np.ndarray, np.ndarray]:
    """Greedy matching on a candidate block by rounds of proposals.

    ``score[i, j]`` is column ``j``'s load times ``m`` minus the tie-break distance (negative
    for no edge); ``col_base`` is the load part alone.  Every row proposes to its best
    column, every column accepts its most loaded proposer (same tie-break); matched rows
    and columns leave and the next round runs on what is left.  Returns (rows, columns)."""
    if score.shape[0] <= SEQUENTIAL:
        return _sequential(score, row_load)
    cols = np.flatnonzero((score >= 0).any(axis=0))
    if cols.size <= SEQUENTIAL:  # few columns: they choose, most loaded first
        sub = score[:, cols]
        flipped = (row_load.astype(score.dtype) * score.dtype.type(m))[None, :] - (
            col_base[cols][:, None] - sub.T
        )
        c, r = _sequential(flipped, col_base[cols])
        return r, cols[c]
    active = np.arange(score.shape[0])
    out_r: list[np.ndarray] = []
    out_c: list[np.ndarray] = []
    for _ in range(ROUNDS):
        sub = score[active]
        pick = sub.argmax(axis=1)
        best = sub[np.arange(active.size), pick]
        ok = best >= 0
        i, j = active[ok], pick[ok]
        if i.size == 0:
            break
        key = row_load[i] * m - (col_base[j] - best[ok])
        order = np.lexsort((-key, j))
        first = np.ones(order.size, dtype=bool)
        first[1:] = j[order[1:]] != j[order[:-1]]
        i, j = i[order[first]], j[order[first]]
        out_r.append(i)
        out_c.append(j)
        score[:, j] = -1
        left = ok.copy()
        left[np.searchsorted(active, i)] = False
        active = active[left]
        if active.size == 0:
            break
    if not out_r:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty
    return np.concatenate(out_r), np.concatenate(out_c)


def _sequential(score: np.ndarray, row_load: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sequential greedy for a block with few rows: most loaded row first takes its best
    free column.  Priority proposals herd (every row wants the same most loaded column) and
    would need one round per row anyway."""
    out_r: list[int] = []
    out_c: list[int] = []
    for i in np.argsort(-row_load, kind="stable").tolist():
        j = int(score[i].argmax())
        if score[i, j] >= 0:
            score[:, j] = -1
            out_r.append(i)
            out_c.append(j)
    return np.asarray(out_r, dtype=np.int64), np.asarray(out_c, dtype=np.int64)


def dense_size(t: Transfers) -> int:
    """Cells of the pair matrix (distinct senders x distinct receivers)."""
    if t.count == 0:
        return 0
    return int(np.unique(t.src).size) * int(np.unique(t.dst).size)


def schedule_dense(t: Transfers, bound: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Chunks ``(transfer, start, words)`` finishing exactly at ``bound``, plus repairs used."""
    peeler = _DensePeeler(t, bound)
    peeler.run()
    transfer, start, words = peeler.chunks(t)
    return transfer, start, words, peeler.repairs
