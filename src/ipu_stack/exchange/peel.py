"""The covering-matching event loop of the exact unicast scheduler, compiled with numba.

Rows are senders, columns receivers, ``rem[s, r]`` the words left on the pair edge.  The loop
keeps a matching that covers every *tight* port (slack ``bound - now - load == 0``) and runs
it until an edge is spent or an idle port turns tight; a tight idle port is covered by an
alternating path (breadth-first search) that ends at a free port or at a port with slack,
whose edge is dropped.  ``unicast.py`` explains why such a path always exists, so the
horizon is exactly ``bound``.

Loads are updated lazily: a matched port's slack is constant while its edge runs and an idle
port's load does not change, so only edges leaving the matching touch ``load``.  Between
events, the ports freed at this event propose to their free partners: most loaded proposer
first, each taking its most loaded free partner, ties by the cyclic distance
``(receiver - sender) mod m`` (Latin-square rounds on all-to-all blocks, so repairs are rare).
Each event costs O(freed ports x partners) machine operations instead of a dozen numpy calls,
which is what made half-million-transfer phases slow.
"""

from __future__ import annotations

import numba
import numpy as np

INF = np.iinfo(np.int64).max // 4


@numba.njit(cache=True, nogil=True)
def _record(out: np.ndarray, chunks: int, s: int, r: int, start: int, words: int) -> np.ndarray:
    """Append a pair chunk, doubling the buffer when full; returns the (new) buffer."""
    if chunks == out.shape[0]:
        bigger = np.empty((2 * out.shape[0], 4), np.int64)
        bigger[:chunks] = out
        out = bigger
    out[chunks, 0] = s
    out[chunks, 1] = r
    out[chunks, 2] = start
    out[chunks, 3] = words
    return out


@numba.njit(cache=True, nogil=True)
def _leave(s, r, now, enter, rem, rem_t, load_s, load_r, match_s, match_r, fin, dirty_s,
           dirty_r, out, chunks):
    """Take edge (s, r) out of the matching at ``now``, recording the chunk it ran (if any);
    returns the (possibly grown) chunk buffer and the chunk count."""
    ran = now - enter[s]
    if ran > 0:
        out = _record(out, chunks, s, r, enter[s], ran)
        chunks += 1
    rem[s, r] -= ran
    rem_t[r, s] -= ran
    load_s[s] -= ran
    load_r[r] -= ran
    match_s[s] = -1
    match_r[r] = -1
    fin[s] = INF
    dirty_s[s] = True
    dirty_r[r] = True
    return out, chunks


@numba.njit(cache=True, nogil=True)
def _join(s, r, now, rem, match_s, match_r, enter, fin) -> None:
    """Put edge (s, r) into the matching from ``now`` until its words run out."""
    match_s[s] = r
    match_r[r] = s
    enter[s] = now
    fin[s] = now + rem[s, r]


@numba.njit(cache=True, nogil=True)
def _better(load: int, tie: int, best_load: int, best_tie: int) -> bool:
    return load > best_load or (load == best_load and tie < best_tie)


@numba.njit(cache=True, nogil=True)
def peel(rem, s_tile, r_tile, modulus, bound):
    """Return pair chunks (rows ``sender, receiver, start, words``) and the repair count."""
    ns, nr = rem.shape
    rem_t = np.ascontiguousarray(rem.T)
    load_s = rem.sum(axis=1)
    load_r = rem.sum(axis=0)
    match_s = np.full(ns, -1, np.int64)
    match_r = np.full(nr, -1, np.int64)
    enter = np.zeros(ns, np.int64)
    fin = np.full(ns, INF, np.int64)
    dirty_s = np.ones(ns, np.bool_)
    dirty_r = np.ones(nr, np.bool_)
    out = np.empty((ns + nr + 1024, 4), np.int64)  # pair chunks: sender, receiver, start, words
    chunks = 0
    repairs = 0
    now = 0
    # breadth-first search scratch
    seen_mine = np.zeros(max(ns, nr), np.bool_)
    seen_other = np.zeros(max(ns, nr), np.bool_)
    parent = np.full(max(ns, nr), -1, np.int64)
    queue = np.empty(max(ns, nr), np.int64)
    while True:
        # greedy fill: freed senders, then freed receivers, propose to free partners
        for side in range(2):
            dirty = dirty_s if side == 0 else dirty_r
            load_me = load_s if side == 0 else load_r
            load_other = load_r if side == 0 else load_s
            match_me = match_s if side == 0 else match_r
            match_other = match_r if side == 0 else match_s
            props = np.flatnonzero(dirty & (match_me < 0) & (load_me > 0))
            dirty[:] = False
            if props.size == 0:
                continue
            props = props[np.argsort(-load_me[props], kind="mergesort")]
            matrix = rem if side == 0 else rem_t
            for p in props:
                best = -1
                best_load = -1
                best_tie = 0
                row = matrix[p]
                for q in range(row.shape[0]):
                    if row[q] <= 0 or match_other[q] >= 0:
                        continue
                    if side == 0:
                        tie = (r_tile[q] - s_tile[p]) % modulus
                    else:
                        tie = (r_tile[p] - s_tile[q]) % modulus
                    if _better(load_other[q], tie, best_load, best_tie):
                        best, best_load, best_tie = q, load_other[q], tie
                if best >= 0:
                    s, r = (p, best) if side == 0 else (best, p)
                    _join(s, r, now, rem, match_s, match_r, enter, fin)
        # cover tight idle ports by alternating paths
        for side in range(2):
            load_me = load_s if side == 0 else load_r
            match_me = match_s if side == 0 else match_r
            match_other = match_r if side == 0 else match_s
            matrix = rem if side == 0 else rem_t
            n_me = ns if side == 0 else nr
            n_other = nr if side == 0 else ns
            for root in range(n_me):
                if match_me[root] >= 0 or load_me[root] == 0 or load_me[root] != bound - now:
                    continue
                seen_mine[:n_me] = False
                seen_other[:n_other] = False
                seen_mine[root] = True
                queue[0] = root
                head, tail = 0, 1
                stop = -1
                while head < tail and stop < 0:
                    mine = queue[head]
                    head += 1
                    row = matrix[mine]
                    for q in range(n_other):
                        if row[q] <= 0 or seen_other[q]:
                            continue
                        seen_other[q] = True
                        parent[q] = mine
                        partner = match_other[q]
                        if partner < 0:
                            stop = q
                            break
                        sender = partner if side == 0 else q
                        slack = bound - enter[sender] - load_me[partner]
                        if slack > 0:  # drop the partner's edge: q becomes free
                            s, r = (partner, q) if side == 0 else (q, partner)
                            out, chunks = _leave(s, r, now, enter, rem, rem_t, load_s, load_r,
                                                 match_s, match_r, fin, dirty_s, dirty_r, out,
                                                 chunks)
                            stop = q
                            break
                        if not seen_mine[partner]:
                            seen_mine[partner] = True
                            queue[tail] = partner
                            tail += 1
                if stop < 0:
                    raise AssertionError("no covering matching: the endpoint bound was violated")
                repairs += 1
                port = stop
                while True:  # flip the path: each port on it takes its parent
                    mine = parent[port]
                    old = match_me[mine]
                    if old >= 0:
                        s, r = (mine, old) if side == 0 else (old, mine)
                        out, chunks = _leave(s, r, now, enter, rem, rem_t, load_s, load_r,
                                             match_s, match_r, fin, dirty_s, dirty_r, out, chunks)
                    s, r = (mine, port) if side == 0 else (port, mine)
                    _join(s, r, now, rem, match_s, match_r, enter, fin)
                    if old < 0:
                        break
                    port = old
        # next event: an edge ends or an idle port turns tight
        nxt = INF
        for s in range(ns):
            if fin[s] < nxt:
                nxt = fin[s]
        for s in range(ns):
            if match_s[s] < 0 and load_s[s] > 0 and bound - load_s[s] < nxt:
                nxt = bound - load_s[s]
        for r in range(nr):
            if match_r[r] < 0 and load_r[r] > 0 and bound - load_r[r] < nxt:
                nxt = bound - load_r[r]
        if nxt >= INF:
            break
        if nxt > bound:
            raise AssertionError("scheduler passed the endpoint bound")
        now = nxt
        for s in range(ns):
            if fin[s] > now:
                continue
            out, chunks = _leave(s, match_s[s], now, enter, rem, rem_t, load_s, load_r, match_s,
                                 match_r, fin, dirty_s, dirty_r, out, chunks)
    for s in range(ns):
        for r in range(nr):
            if rem[s, r] != 0:
                raise AssertionError("scheduler ended with unsent words")
    return out[:chunks], repairs
