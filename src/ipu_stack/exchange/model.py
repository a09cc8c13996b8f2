"""The data model of one exchange phase: transfers in, a chunked schedule out.

Both are structures of arrays (not lists of objects) because real phases carry up to half a
million transfers and every consumer (scheduler, verifier, table sizing) works on whole
columns with numpy.  A transfer ``i`` sends ``words[i]`` words from tile ``src[i]`` to every
tile in ``dst[dst_offsets[i]:dst_offsets[i + 1]]`` (a multicast is sent once and received by
all its destinations in the same cycles).  A schedule is a list of chunks ``(transfer, start,
words)``; the chunks of one transfer, sorted by start, cover its words in order, so the word
offsets are implied and a chunk never needs to carry them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ipu_stack.util.errors import IpuStackError


class ExchangeError(IpuStackError):
    """A bad exchange instance (or file): the message names the first bad transfer/field."""


class ScheduleError(ExchangeError):
    """The verifier rejected a schedule: the message names port, tile, cycle and transfer."""


@dataclass(frozen=True)
class Transfers:
    """One phase's transfers, destinations in CSR form (``dst_offsets`` has ``n + 1`` entries)."""

    tiles: int
    src: np.ndarray
    dst_offsets: np.ndarray
    dst: np.ndarray
    words: np.ndarray

    @property
    def count(self) -> int:
        """Number of transfers."""
        return int(self.src.shape[0])

    @property
    def fanout(self) -> np.ndarray:
        """Destinations per transfer (int64 [n])."""
        return np.diff(self.dst_offsets)

    def is_unicast(self) -> bool:
        """True when every transfer has exactly one destination (the exact scheduler applies)."""
        return bool(self.count == 0 or np.all(self.fanout == 1))

    def dst_transfer(self) -> np.ndarray:
        """For every entry of ``dst``, the transfer it belongs to (int64 [m])."""
        return np.repeat(np.arange(self.count, dtype=np.int64), self.fanout)

    @staticmethod
    def from_arrays(
        tiles: int,
        src: np.ndarray,
        dst_offsets: np.ndarray,
        dst: np.ndarray,
        words: np.ndarray,
    ) -> Transfers:
        """Build from arrays, normalising dtypes (int32 tiles, int64 offsets and words)."""
        return Transfers(
            tiles=int(tiles),
            src=np.ascontiguousarray(src, dtype=np.int32),
            dst_offsets=np.ascontiguousarray(dst_offsets, dtype=np.int64),
            dst=np.ascontiguousarray(dst, dtype=np.int32),
            words=np.ascontiguousarray(words, dtype=np.int64),
        )

    @staticmethod
    def unicast(tiles: int, src: np.ndarray, dst: np.ndarray, words: np.ndarray) -> Transfers:
        """Build a unicast phase (one destination per transfer) without Python lists."""
        n = int(np.asarray(src).shape[0])
        return Transfers.from_arrays(tiles, src, np.arange(n + 1, dtype=np.int64), dst, words)

    @staticmethod
    def from_lists(tiles: int, src: list[int], dsts: list[list[int]], words: list[int]) -> Transfers:
        """Build from Python lists (convenient for tests and small phases)."""
        if not (len(src) == len(dsts) == len(words)):
            raise ExchangeError(
                f"transfer lists differ in length: src={len(src)} dst={len(dsts)} words={len(words)}"
            )
        offsets = np.zeros(len(dsts) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum([len(d) for d in dsts], dtype=np.int64)
        flat = [tile for d in dsts for tile in d]
        return Transfers.from_arrays(
            tiles,
            np.asarray(src, dtype=np.int64),
            offsets,
            np.asarray(flat, dtype=np.int64),
            np.asarray(words, dtype=np.int64),
        )

    def validate(self) -> None:
        """Raise :class:`ExchangeError` naming the first bad transfer.

        Checked: array shapes, tile ranges, ``words >= 1``, at least one destination, no
        duplicate destination within a transfer, and the source not among its destinations
        (a tile cannot receive its own send in the same phase; that copy is not exchange).
        """
        n = self.count
        if self.tiles < 1:
            raise ExchangeError(f"tiles must be >= 1, got {self.tiles}")
        if self.words.shape != (n,) or self.dst_offsets.shape != (n + 1,):
            raise ExchangeError(
                f"array shapes disagree: src={self.src.shape} words={self.words.shape} "
                f"dst_offsets={self.dst_offsets.shape}"
            )
        if n == 0:
            if self.dst.shape[0] != 0:
                raise ExchangeError("destinations given for an empty phase")
            return
        offsets = self.dst_offsets
        if offsets[0] != 0 or offsets[-1] != self.dst.shape[0] or np.any(np.diff(offsets) < 0):
            raise ExchangeError("dst_offsets is not a valid CSR offset array")
        checks: list[tuple[np.ndarray, str]] = []
        checks.append(((self.src < 0) | (self.src >= self.tiles), "source tile out of range"))
        checks.append((self.words < 1, "words must be >= 1"))
        checks.append((self.fanout < 1, "no destination"))
        owner = self.dst_transfer()
        bad_dst = (self.dst < 0) | (self.dst >= self.tiles)
        checks.append((_any_per_transfer(bad_dst, owner, n), "destination tile out of range"))
        self_send = self.dst == self.src[owner]
        checks.append((_any_per_transfer(self_send, owner, n), "source among its destinations"))
        key = owner * np.int64(self.tiles) + self.dst.astype(np.int64)
        order = np.argsort(key, kind="stable")
        dup = np.zeros(self.dst.shape[0], dtype=bool)
        dup[order[1:]] = key[order[1:]] == key[order[:-1]]
        checks.append((_any_per_transfer(dup, owner, n), "duplicate destination"))
        first = n
        reason = ""
        for bad, text in checks:
            hits = np.flatnonzero(bad)
            if hits.size and hits[0] < first:
                first, reason = int(hits[0]), text
        if first < n:
            dsts = self.dst[offsets[first] : offsets[first + 1]].tolist()
            raise ExchangeError(
                f"invalid transfer {first}: {reason} (src={int(self.src[first])} dst={dsts} "
                f"words={int(self.words[first])} tiles={self.tiles})"
            )


def _any_per_transfer(flags: np.ndarray, owner: np.ndarray, n: int) -> np.ndarray:
    """OR the per-destination ``flags`` into one flag per transfer."""
    out = np.zeros(n, dtype=bool)
    out[owner[flags]] = True
    return out


@dataclass(frozen=True)
class Schedule:
    """A chunked schedule: chunk ``k`` runs transfer ``chunk_transfer[k]`` for
    ``chunk_words[k]`` cycles from ``chunk_start[k]``."""

    horizon: int
    lower_bound: int
    kind: str
    chunk_transfer: np.ndarray
    chunk_start: np.ndarray
    chunk_words: np.ndarray

    @property
    def chunks(self) -> int:
        """Number of chunks."""
        return int(self.chunk_transfer.shape[0])

    @property
    def ratio(self) -> float:
        """Horizon over the endpoint lower bound (1.0 for an empty phase)."""
        return self.horizon / self.lower_bound if self.lower_bound else 1.0

    @staticmethod
    def from_chunks(
        lower_bound: int,
        kind: str,
        transfer: np.ndarray,
        start: np.ndarray,
        words: np.ndarray,
    ) -> Schedule:
        """Build a schedule with chunks in (start, transfer) order and the horizon computed."""
        transfer = np.asarray(transfer, dtype=np.int64)
        start = np.asarray(start, dtype=np.int64)
        words = np.asarray(words, dtype=np.int64)
        order = np.lexsort((transfer, start))
        horizon = int((start + words).max()) if start.size else 0
        return Schedule(
            horizon=horizon,
            lower_bound=int(lower_bound),
            kind=kind,
            chunk_transfer=transfer[order],
            chunk_start=start[order],
            chunk_words=words[order],
        )

    def with_kind(self, kind: str) -> Schedule:
        """The same chunks under another strategy name (used for reuse)."""
        return Schedule(
            self.horizon,
            self.lower_bound,
            kind,
            self.chunk_transfer,
            self.chunk_start,
            self.chunk_words,
        )


def port_loads(t: Transfers) -> tuple[np.ndarray, np.ndarray]:
    """Words each tile sends and receives (a multicast counts once per destination)."""
    send = np.bincount(t.src, weights=t.words, minlength=t.tiles).astype(np.int64)
    recv_words = np.repeat(t.words, t.fanout)
    recv = np.bincount(t.dst, weights=recv_words, minlength=t.tiles).astype(np.int64)
    return send, recv


def endpoint_lower_bound(t: Transfers) -> int:
    """Max over tiles of words sent or received: no schedule can be shorter (one word per
    cycle per port), and for unicast phases the exact scheduler always meets it."""
    if t.count == 0:
        return 0
    send, recv = port_loads(t)
    return int(max(send.max(), recv.max()))


def table_bytes(s: Schedule, t: Transfers, bytes_per_chunk: int = 8) -> np.ndarray:
    """Exchange-table bytes per tile: each chunk costs ``bytes_per_chunk`` on its source and on
    every destination, which is why the schedulers keep the chunk count low."""
    if s.chunks == 0:
        return np.zeros(t.tiles, dtype=np.int64)
    per_transfer = np.bincount(s.chunk_transfer, minlength=t.count).astype(np.int64)
    send = np.bincount(t.src, weights=per_transfer, minlength=t.tiles)
    recv = np.bincount(t.dst, weights=np.repeat(per_transfer, t.fanout), minlength=t.tiles)
    return ((send + recv) * bytes_per_chunk).astype(np.int64)
