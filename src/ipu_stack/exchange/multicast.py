"""Multicast scheduling by rounds of global rematching ("compact streams").

A multicast occupies its source's send port and all its destinations' receive ports for the
same cycles, so exact scheduling is hypergraph edge colouring (NP-hard).  Plain list
scheduling (start whatever fits when a port frees) loses 20-25 % on dense random phases: as
the phase runs, the free ports of the moment rarely line up with all the ports of one
pending transfer, and utilisation decays from 90 % to under 40 %.

This scheduler restores the alignment periodically.  Every ``round_cycles`` cycles it
re-chooses the running set from scratch: all unfinished transfers (running ones included)
in priority order, each taken when none of its ports is taken yet.  That is a greedy maximal
hypergraph matching over the whole phase, as at cycle 0, which is what keeps utilisation
high (the "nibble" of Pippenger-Spencer: random-like greedy matchings of a hypergraph with
small codegrees cover almost every vertex).  A running transfer that is not re-chosen is cut
at the round boundary: its sent words become a chunk and the rest returns to the pending
pool, so a transfer may be several chunks (1.6 per transfer on random phases; the budget is
2).  Between boundaries, a port that frees scans up to ``fill_scan`` of its pending transfers
(from a rotating offset) and starts the best whose ports are all free.

Priority (higher first): the largest remaining load among the transfer's ports plus
``balance`` times the sum of its ports' remaining loads, so wide multicasts to busy ports go
first.  The kernel is compiled with numba (an event loop with per-port pending lists; numpy
whole-array steps cost too much per event at half a million transfers).  It schedules
generic *tasks* (a list of ports held together for a number of cycles), so the paired-tiles
model (two send ports, half the cycles; ``paired.py``) uses it unchanged.  Deterministic:
the only randomness is numba's generator seeded with ``seed``.
"""

from __future__ import annotations

import numba
import numpy as np

from ipu_stack.exchange.model import Transfers

# Tuned on the random-multicast family (docs/exchange.md, "Tuning", has the sweep's figures).
ROUNDS_PER_MEAN_WORDS = 2  # a round lasts about two average transfers
FILL_SCAN = 128  # pending transfers a freed port examines (32: 1.23x the bound, 128: 1.13x)
FILL_RATIO = 0.0  # fill only ports whose load is at least this share of the time to the bound
RESORT_ROUNDS = 32  # priorities are recomputed every this many rounds (loads drift slowly),
RESORTS_PER_PHASE = 8  # or less often on long phases: at most about this many per phase
STOP_AFTER = 2  # a rematch stops after this many times `tiles` rejections in a row
SORT_HEAD = 64  # a resort orders only the best SORT_HEAD x tiles tasks (rematches scan ~20 x)
HINTS = 4  # other ports of a task kept inline in its list entries (the fill check unrolls 4)


@numba.njit(cache=True, nogil=True)
def _heap_push(heap: np.ndarray, size: int, key: np.int64) -> int:
    k = size
    heap[k] = key
    while k > 0:
        parent = (k - 1) >> 1
        if heap[parent] <= heap[k]:
            break
        heap[parent], heap[k] = heap[k], heap[parent]
        k = parent
    return size + 1


@numba.njit(cache=True, nogil=True)
def _heap_pop(heap: np.ndarray, size: int) -> int:
    size -= 1
    heap[0] = heap[size]
    k = 0
    while True:
        left = 2 * k + 1
        if left >= size:
            break
        child = left
        if left + 1 < size and heap[left + 1] < heap[left]:
            child = left + 1
        if heap[k] <= heap[child]:
            break
        heap[k], heap[child] = heap[child], heap[k]
        k = child
    return size


@numba.njit(cache=True, nogil=True)
def _priority(i: int, poff, pl, load, balance: float) -> float:
    top = 0
    total = 0
    for e in range(poff[i], poff[i + 1]):
        value = load[pl[e]]
        total += value
        if value > top:
            top = value
    return top + balance * total


@numba.njit(cache=True, nogil=True)
def _grow(array: np.ndarray) -> np.ndarray:
    bigger = np.empty(2 * array.shape[0], array.dtype)
    bigger[: array.shape[0]] = array
    return bigger


@numba.njit(cache=True, nogil=True)
def _set_ports(i: int, poff, pl, array, value) -> None:
    for e in range(poff[i], poff[i + 1]):
        array[pl[e]] = value


# Per-port lists of pending tasks with O(1) removal (swap with the last entry):
# ``item[ptr[p] : ptr[p] + count[p]]`` holds entry ids (entry ``poff[i] + q`` is task i's
# q-th port) and ``where[e]`` is an entry's slot; ``item_rec`` carries the task's packed
# record offset and ``item_hint`` HINTS other ports of the task (its last ones), checked
# inline from the list itself: they reject most busy candidates (all but 1 in 130 on random
# phases) without a cache miss on the record.  Starting a task and returning a cut one touch only its own
# ports, so no scan ever visits finished or running work.


@numba.njit(cache=True, nogil=True)
def _pending_remove(i, poff, pl, ptr, count, item, item_rec, item_hint, where) -> None:
    for entry in range(poff[i], poff[i + 1]):
        port = pl[entry]
        slot = where[entry]
        last = ptr[port] + count[port] - 1
        moved = item[last]
        item[slot] = moved
        item_rec[slot] = item_rec[last]
        item_hint[slot] = item_hint[last]
        where[moved] = slot
        count[port] -= 1
        where[entry] = -1


@numba.njit(cache=True, nogil=True)
def _pending_add(i, poff, pl, ptr, count, item, item_rec, item_hint, where) -> None:
    for entry in range(poff[i], poff[i + 1]):
        port = pl[entry]
        slot = ptr[port] + count[port]
        item[slot] = entry
        item_rec[slot] = poff[i] + 2 * i
        k = 0  # hints: the task's last ports other than this one (repeated if it has fewer)
        e = poff[i + 1] - 1
        while k < item_hint.shape[1]:
            if e < poff[i]:
                e = poff[i + 1] - 1
            if e != entry or poff[i + 1] - poff[i] == 1:
                item_hint[slot, k] = pl[e]
                k += 1
            e -= 1
        where[entry] = slot
        count[port] += 1


@numba.njit(cache=True, nogil=True)
def _start(i, now, state, began, ends, left, poff, pl, ptr, count, item, item_rec, item_hint,
           where, runner, heap, heap_size, stride):
    """Start pending task ``i`` at ``now``: off the pending lists, onto its ports, its end
    onto the event heap (grown when full); returns the heap and its size."""
    state[i] = 1
    began[i] = now
    ends[i] = now + left[i]
    _pending_remove(i, poff, pl, ptr, count, item, item_rec, item_hint, where)
    _set_ports(i, poff, pl, runner, i)
    if heap_size == heap.shape[0]:
        heap = _grow(heap)
    return heap, _heap_push(heap, heap_size, ends[i] * stride + i)


@numba.njit(cache=True, nogil=True)
def _resort(order, n_order, state, poff, pl, load, balance, seq_off, seq_ports, head, prio):
    """Drop finished tasks, sort the rest by priority and pack the ports of the first
    ``2 * head`` in that order, so that the rematch scan reads memory sequentially (it is
    memory-bound otherwise).  Returns ``(kept, packed)``: a rematch scans the packed head
    only, since it stops long before the end of a large order."""
    kept = 0
    for a in range(n_order):
        if state[order[a]] != 2:
            order[kept] = order[a]
            kept += 1
    for i in range(prio.shape[0]):  # in task order: the port lists are read sequentially
        if state[i] != 2:
            prio[i] = -_priority(i, poff, pl, load, balance)
    keys = prio[order[:kept]]
    if kept > 2 * head:
        # sort only the ``head`` best (found by an O(n) partition), keep the rest in their
        # previous order behind them
        threshold = np.partition(keys, head)[head]
        top = np.flatnonzero(keys < threshold)
        rest = np.flatnonzero(keys >= threshold)
        order[:kept] = np.concatenate((order[top[np.argsort(keys[top])]], order[rest]))
    else:
        order[:kept] = order[:kept][np.argsort(keys)]
    packed = min(kept, 2 * head)
    e = 0
    for a in range(packed):
        i = order[a]
        seq_off[a] = e
        for f in range(poff[i], poff[i + 1]):
            seq_ports[e] = pl[f]
            e += 1
    seq_off[packed] = e
    return kept, packed


@numba.njit(cache=True, nogil=True)
def _schedule(ports, poff, pl, cycles, round_cycles, balance, fill_scan, fill_ratio,
              resort_rounds, stop_after, sort_head, seed, hint_dtype):
    """Chunks ``(task, start, cycles)`` for tasks that each hold ports ``pl[poff[i]:poff[i+1]]``
    for ``cycles[i]`` cycles (in pieces; a port serves one task per cycle)."""
    np.random.seed(seed)
    n = poff.shape[0] - 1
    entries = poff[n]
    sizes = np.zeros(ports + 1, np.int64)
    load = np.zeros(ports, np.int64)
    for i in range(n):
        for e in range(poff[i], poff[i + 1]):
            sizes[pl[e] + 1] += 1
            load[pl[e]] += cycles[i]
    ptr = np.cumsum(sizes)
    count = np.zeros(ports, np.int64)
    item = np.empty(entries, np.int64)
    item_rec = np.empty(entries, np.int32)  # narrow: the fill scan is memory-bound
    item_hint = np.empty((entries, HINTS), hint_dtype)
    where = np.empty(entries, np.int64)
    # packed records [task, port count, ports...] at poff[i] + 2 * i: a fill candidate is
    # checked from one or two cache lines instead of three scattered arrays
    rec = np.empty(entries + 2 * n, np.int32)
    for i in range(n):
        r = poff[i] + 2 * i
        rec[r] = i
        rec[r + 1] = poff[i + 1] - poff[i]
        for e in range(poff[i], poff[i + 1]):
            rec[r + 2 + e - poff[i]] = pl[e]
    for i in range(n):
        _pending_add(i, poff, pl, ptr, count, item, item_rec, item_hint, where)

    left = cycles.copy()  # cycles not yet run
    state = np.zeros(n, np.int8)  # 0 pending, 1 running, 2 done, 3 re-chosen this round
    began = np.zeros(n, np.int64)
    ends = np.full(n, -1, np.int64)
    runner = np.full(ports, -1, np.int64)
    taken = np.zeros(ports, np.bool_)
    capacity = 2 * n + 16
    out_t = np.empty(capacity, np.int64)
    out_s = np.empty(capacity, np.int64)
    out_w = np.empty(capacity, np.int64)
    chunks = 0
    heap = np.empty(capacity, np.int64)  # live entries of running tasks and stale ones
    heap_size = 0
    stride = np.int64(n + 1)
    freed = np.empty(8 * ports + 8, np.int64)
    n_freed = 0
    chosen = np.empty(ports, np.int64)
    order = np.arange(n)
    n_order = n
    n_packed = 0
    prio = np.zeros(n, np.float64)
    seq_off = np.zeros(n + 1, np.int64)  # ports of order[a], packed in priority order
    seq_ports = np.empty(entries, np.int64)
    bound = load.max()
    rounds = 0
    done = 0
    now = 0
    next_round = 0
    while done < n:
        if now >= next_round:
            next_round = now + round_cycles
            if rounds % resort_rounds == 0:
                n_order, n_packed = _resort(order, n_order, state, poff, pl, load, balance,
                                            seq_off, seq_ports, sort_head, prio)
            rounds += 1
            taken[:] = False
            n_chosen = 0
            misses = 0
            for a in range(n_packed):
                i = order[a]
                if state[i] == 2:
                    continue
                free = True
                for e in range(seq_off[a], seq_off[a + 1]):
                    if taken[seq_ports[e]]:
                        free = False
                        break
                if not free:
                    misses += 1
                    if misses > stop_after:
                        break
                    continue
                misses = 0
                for e in range(seq_off[a], seq_off[a + 1]):
                    taken[seq_ports[e]] = True
                chosen[n_chosen] = i
                n_chosen += 1
                if state[i] == 1:
                    state[i] = 3
            for p in range(ports):  # cut running tasks that were not re-chosen
                y = runner[p]
                if y < 0 or state[y] != 1:
                    continue
                sent = now - began[y]
                if sent > 0:
                    if chunks == out_t.shape[0]:
                        out_t, out_s, out_w = _grow(out_t), _grow(out_s), _grow(out_w)
                    out_t[chunks] = y
                    out_s[chunks] = began[y]
                    out_w[chunks] = sent
                    chunks += 1
                    left[y] -= sent
                    for e in range(poff[y], poff[y + 1]):
                        load[pl[e]] -= sent
                state[y] = 0
                ends[y] = -1
                _set_ports(y, poff, pl, runner, -1)
                _pending_add(y, poff, pl, ptr, count, item, item_rec, item_hint, where)
            for k in range(n_chosen):
                i = chosen[k]
                if state[i] == 3:
                    state[i] = 1
                    continue
                heap, heap_size = _start(i, now, state, began, ends, left, poff, pl, ptr, count,
                                         item, item_rec, item_hint, where, runner, heap,
                                         heap_size, stride)
            n_freed = 0
            for p in range(ports):
                if runner[p] < 0 and count[p] > 0:
                    freed[n_freed] = p
                    n_freed += 1

        # fill freed ports from their pending lists
        for k in range(n_freed):
            p = freed[k]
            if runner[p] >= 0 or count[p] == 0 or load[p] < fill_ratio * (bound - now):
                continue
            c = count[p]
            scan = min(fill_scan, c)
            offset = 0 if scan == c else np.random.randint(0, c)
            best = -1
            best_key = -1.0
            slot = ptr[p] + offset
            wrap = ptr[p] + c
            for _ in range(scan):
                here = slot
                slot += 1
                if slot == wrap:  # rotate without a division per step
                    slot = ptr[p]
                if (runner[item_hint[here, 0]] >= 0 or runner[item_hint[here, 1]] >= 0
                        or runner[item_hint[here, 2]] >= 0 or runner[item_hint[here, 3]] >= 0):
                    # unrolled for HINTS == 4: a loop here measured slower
                    continue
                r = item_rec[here]  # read only for candidates the hints let through
                idle = True
                for e in range(r + 2, r + 2 + rec[r + 1]):
                    if runner[rec[e]] >= 0:
                        idle = False
                        break
                if idle:
                    i = rec[r]
                    key = _priority(i, poff, pl, load, balance)
                    if key > best_key:
                        best = i
                        best_key = key
            if best >= 0:
                heap, heap_size = _start(best, now, state, began, ends, left, poff, pl, ptr,
                                         count, item, item_rec, item_hint, where, runner, heap,
                                         heap_size, stride)
        n_freed = 0
        # advance to the next chunk end (or the next round boundary)
        while heap_size > 0:
            top = heap[0]
            i = top % stride
            if state[i] == 1 and ends[i] == top // stride:
                break
            heap_size = _heap_pop(heap, heap_size)
        if heap_size == 0:  # nothing runs: rematch at once rather than idle to the boundary
            next_round = now
            continue
        if heap[0] // stride > next_round:
            now = next_round
            continue
        now = heap[0] // stride
        while heap_size > 0 and heap[0] // stride == now:
            i = heap[0] % stride
            heap_size = _heap_pop(heap, heap_size)
            if state[i] != 1 or ends[i] != now:
                continue
            sent = now - began[i]
            if chunks == out_t.shape[0]:
                out_t, out_s, out_w = _grow(out_t), _grow(out_s), _grow(out_w)
            out_t[chunks] = i
            out_s[chunks] = began[i]
            out_w[chunks] = sent
            chunks += 1
            left[i] = 0
            state[i] = 2
            done += 1
            for e in range(poff[i], poff[i + 1]):
                port = pl[e]
                load[port] -= sent
                runner[port] = -1
                freed[n_freed] = port
                n_freed += 1
    return out_t[:chunks], out_s[:chunks], out_w[:chunks]


def port_lists(t: Transfers, paired: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Each transfer's ports in CSR form: its send port ``src``, then (for ``paired`` rows)
    the send port of the source's pair partner ``src ^ 1``, then receive ports
    ``tiles + dst``."""
    n = t.count
    extra = np.zeros(n, dtype=np.int64) if paired is None else paired.astype(np.int64)
    per = t.fanout + 1 + extra
    poff = np.zeros(n + 1, dtype=np.int64)
    poff[1:] = np.cumsum(per)
    pl = np.empty(int(poff[-1]), dtype=np.int64)
    src = t.src.astype(np.int64)
    pl[poff[:-1]] = src
    pl[(poff[:-1] + 1)[extra > 0]] = src[extra > 0] ^ 1
    owner = t.dst_transfer()
    rank = np.arange(t.dst.shape[0], dtype=np.int64) - t.dst_offsets[owner]
    pl[poff[owner] + 1 + extra[owner] + rank] = t.tiles + t.dst.astype(np.int64)
    return poff, pl


def schedule_tasks(
    ports: int, poff: np.ndarray, pl: np.ndarray, cycles: np.ndarray, balance: float = 1.0,
    *, round_cycles: int | None = None, seed: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Chunks ``(task, start, cycles)`` for tasks holding port lists ``pl[poff[i]:poff[i+1]]``
    for ``cycles[i]`` cycles; ports are numbered ``0 .. ports - 1``."""
    if cycles.shape[0] == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    if round_cycles is None:
        round_cycles = max(4, int(round(ROUNDS_PER_MEAN_WORDS * float(cycles.mean()))))
    if int(poff[-1]) + 2 * cycles.shape[0] >= 2**31 or ports >= 2**31:
        raise ValueError("phase too large for the multicast scheduler's 32-bit records")
    # a resort is O(n): a bounded number of them per phase keeps the whole O(n log n)
    busiest = int(np.bincount(pl, weights=np.repeat(cycles, np.diff(poff)), minlength=ports).max())
    resort_rounds = max(RESORT_ROUNDS, busiest // round_cycles // RESORTS_PER_PHASE)
    return _schedule(
        np.int64(ports), np.ascontiguousarray(poff, dtype=np.int64),
        np.ascontiguousarray(pl, dtype=np.int64), np.ascontiguousarray(cycles, dtype=np.int64),
        np.int64(round_cycles), float(balance), np.int64(FILL_SCAN), FILL_RATIO,
        np.int64(resort_rounds), np.int64(STOP_AFTER * ports // 2),
        np.int64(SORT_HEAD * ports // 2), np.int64(seed),
        np.uint16 if ports <= 2**16 else np.int32,  # narrow hints: the fill scan is memory-bound
    )


def schedule_multicast(
    t: Transfers, balance: float = 1.0, *, round_cycles: int | None = None, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Chunks ``(transfer, start, words)`` by rounds of global rematching."""
    poff, pl = port_lists(t)
    return schedule_tasks(2 * t.tiles, poff, pl, t.words.astype(np.int64), balance,
                          round_cycles=round_cycles, seed=seed)
