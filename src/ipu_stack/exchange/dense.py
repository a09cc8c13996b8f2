"""Exact unicast scheduling on a dense sender x receiver matrix (the fast path).

Same algorithm and guarantee as ``unicast.py`` (keep a matching that covers every tight
port; a covering matching always exists, so the horizon is exactly the endpoint bound ``L``),
with a representation that makes every event cheap:

* transfers between the same (sender, receiver) pair are merged into one *pair edge* whose
  words run back to back (they use the same two ports, so any schedule of the pair is a
  schedule of its transfers); chunks are split back into transfers at the end;
* live pairs are a dense matrix of remaining words (rows senders, columns receivers), so a
  free port's free partners and an alternating-path level are one row scan;
* the event loop itself (greedy fill, repairs, lazy load updates) is compiled with numba in
  ``peel.py``: per event it does O(freed ports x partners) machine operations.

Events fall on integer cycles and each ends a pair or tightens a port: at most
``min(L, pairs + 2 * tiles)`` events.  Memory is ``senders x receivers`` (about 20 MB at
1472 tiles); ``schedule_unicast`` uses the sparse scheduler when the matrix would be larger.
"""

from __future__ import annotations

import numpy as np

from ipu_stack.exchange.model import Transfers
from ipu_stack.exchange.peel import peel


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
        self.modulus = int(max(self.s_tile.max(), self.r_tile.max())) + 1
        self.repairs = 0
        self.out = np.zeros((0, 4), dtype=np.int64)

    def run(self) -> None:
        """Run the compiled event loop (``peel.py``); it finishes exactly at ``bound``."""
        self.out, self.repairs = peel(
            self.rem, self.s_tile.astype(np.int64), self.r_tile.astype(np.int64),
            np.int64(self.modulus), np.int64(self.bound),
        )

    def chunks(self, t: Transfers) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Split the pair chunks back into transfer chunks ``(transfer, start, words)``.

        A pair's transfers are laid out back to back in one global word line; each pair
        chunk covers a contiguous stretch of it.  Cutting that line at every chunk start and
        every transfer start gives pieces that belong to one chunk and one transfer each."""
        pair = self.pid[self.out[:, 0], self.out[:, 1]].astype(np.int64)
        start, words = self.out[:, 2], self.out[:, 3]
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
