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

from collections.abc import Callable
from dataclasses import dataclass

import numba
import numpy as np

from ipu_stack.util.errors import IpuStackError

# the most tiles an instance may name: arrays a tile long are sized from it before any
# transfer is read (an IPU has 1,472; this leaves room for any machine of linked chips)
MAX_TILES = 1 << 20
# the most words one transfer may move: a tile's whole memory (624 KiB, 159,744 words) with
# room to spare; a schedule's event arrays grow with the words sent
MAX_WORDS = 1 << 20


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
        if not 1 <= self.tiles <= MAX_TILES:
            raise ExchangeError(f"tiles must be between 1 and {MAX_TILES}, got {self.tiles}")
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
        # Checks in priority order; each sees only the transfers before the first violation
        # found so far (a later one cannot be first, one at the same transfer loses the
        # tie), which also keeps out-of-range tiles away from the later entry checks.
        first, reason = n, ""
        for check, text in _VALIDITY_CHECKS:
            hit = check(self, first)
            if hit < first:
                first, reason = hit, text
        if first < n:
            dsts = self.dst[offsets[first] : offsets[first + 1]].tolist()
            raise ExchangeError(
                f"invalid transfer {first}: {reason} (src={int(self.src[first])} dst={dsts} "
                f"words={int(self.words[first])} tiles={self.tiles})"
            )


def _first_flag(flags: np.ndarray, limit: int) -> int:
    """Index of the first True in ``flags``, or ``limit`` when there is none."""
    if flags.size == 0:
        return limit
    hit = int(np.argmax(flags))
    return hit if flags[hit] else limit


def _entry_owner(t: Transfers, position: int) -> int:
    """The transfer whose destination list holds entry ``position``."""
    return int(np.searchsorted(t.dst_offsets, position, side="right")) - 1


def _first_flagged_entry(t: Transfers, flags: np.ndarray, limit: int) -> int:
    """The first transfer with a flagged destination entry, or ``limit``.  Entries are
    stored transfer after transfer, so that is the owner of the first flagged entry."""
    hit = _first_flag(flags, -1)
    return limit if hit < 0 else _entry_owner(t, hit)


def _bad_source(t: Transfers, limit: int) -> int:
    """Source tile outside ``0..tiles-1``."""
    src = t.src[:limit]
    return _first_flag((src < 0) | (src >= t.tiles), limit)


def _bad_words(t: Transfers, limit: int) -> int:
    """``words < 1``: an empty transfer occupies no cycle, so no schedule can place it;
    above ``MAX_WORDS``: more than a tile holds."""
    words = t.words[:limit]
    return _first_flag((words < 1) | (words > MAX_WORDS), limit)


def _no_destination(t: Transfers, limit: int) -> int:
    """An empty destination list."""
    return _first_flag(t.fanout[:limit] < 1, limit)


def _bad_destination(t: Transfers, limit: int) -> int:
    """Range check with a fast path: two reductions clear an all-valid prefix."""
    dst = t.dst[: t.dst_offsets[limit]]
    if dst.size == 0 or (int(dst.min()) >= 0 and int(dst.max()) < t.tiles):
        return limit
    return _first_flagged_entry(t, (dst < 0) | (dst >= t.tiles), limit)


def _self_send(t: Transfers, limit: int) -> int:
    """Source among its own destinations (compared against the source repeated per entry)."""
    dst = t.dst[: t.dst_offsets[limit]]
    return _first_flagged_entry(t, dst == np.repeat(t.src[:limit], t.fanout[:limit]), limit)


def _duplicate(t: Transfers, limit: int) -> int:
    """First transfer below ``limit`` listing a destination twice, or ``limit``.

    Fast path: a strictly increasing destination list has no duplicate, and most phases
    list destinations in order, so one comparison of neighbours clears them; only the lists
    that are not increasing are gathered and checked by a sort (exact either way).  Callers
    guarantee that the lists below ``limit`` are non-empty and in range.
    """
    end = int(t.dst_offsets[limit])
    dst = t.dst[:end]
    unsorted = np.zeros(end, dtype=bool)  # [p]: p, p + 1 in one list and not increasing
    np.less_equal(dst[1:], dst[:-1], out=unsorted[:-1])
    unsorted[t.dst_offsets[1:limit] - 1] = False
    if not unsorted.any():
        return limit
    flags = np.logical_or.reduceat(unsorted, t.dst_offsets[:limit])
    rows = np.flatnonzero(flags)
    picked = np.repeat(flags, t.fanout[:limit])
    hit = _first_duplicate_list(dst[picked], t.fanout[rows], t.tiles)
    return limit if hit < 0 else int(rows[hit])


def _first_duplicate_list(dst: np.ndarray, fan: np.ndarray, tiles: int) -> int:
    """Index of the first list (CSR: ``dst`` split by ``fan``) with a repeated tile, or -1.

    Linear: a stable sort by tile (a radix sort for 16-bit tiles) groups equal tiles with
    their entries in storage order, so two entries of one list with the same tile are
    neighbours (anything stored between them belongs to the same list).  Neighbours are in
    one list iff the second lies before the end of the first's list; pairs straddling two
    tiles are dropped by comparing tiles for those candidates only.
    """
    ends = np.cumsum(fan)
    tile = dst.astype(np.uint16 if tiles <= 1 << 16 else np.int64)
    perm = np.argsort(tile, kind="stable")
    candidates = np.flatnonzero(perm[1:] < np.repeat(ends, fan)[perm[:-1]])
    pairs = candidates[tile[perm[candidates]] == tile[perm[candidates + 1]]]
    if pairs.size == 0:
        return -1
    return int(np.searchsorted(ends, int(perm[pairs].min()), side="right"))


_VALIDITY_CHECKS: tuple[tuple[Callable[[Transfers, int], int], str], ...] = (
    (_bad_source, "source tile out of range"),
    (_bad_words, f"words must be between 1 and {MAX_WORDS}"),
    (_no_destination, "no destination"),
    (_bad_destination, "destination tile out of range"),
    (_self_send, "source among its destinations"),
    (_duplicate, "duplicate destination"),
)
"""``validate``'s checks in priority order: ``check(t, limit)`` returns the first bad
transfer below ``limit``, or ``limit``."""


def chunk_cycles(words: np.ndarray, lanes: np.ndarray | None) -> np.ndarray:
    """Cycles a chunk occupies its ports: ``ceil(words / lanes)`` (``words`` with no lanes,
    the plain model's one word per cycle)."""
    words = np.asarray(words, dtype=np.int64)
    return words if lanes is None else -(-words // np.asarray(lanes, dtype=np.int64))


@dataclass(frozen=True)
class Schedule:
    """A chunked schedule: chunk ``k`` sends ``chunk_words[k]`` words of transfer
    ``chunk_transfer[k]`` from cycle ``chunk_start[k]``, in ``chunk_lanes[k]`` lanes
    (``ceil(words / lanes)`` cycles).  ``chunk_lanes`` is None in the plain model (one lane,
    one word per cycle); a schedule made with the paired-tiles option carries it."""

    horizon: int
    lower_bound: int
    kind: str
    chunk_transfer: np.ndarray
    chunk_start: np.ndarray
    chunk_words: np.ndarray
    chunk_lanes: np.ndarray | None = None

    @property
    def chunks(self) -> int:
        """Number of chunks."""
        return int(self.chunk_transfer.shape[0])

    @property
    def paired(self) -> bool:
        """Made under the paired-tiles option (its lower bound is the paired bound)."""
        return self.chunk_lanes is not None

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
        lanes: np.ndarray | None = None,
    ) -> Schedule:
        """Build a schedule with chunks in (start, transfer) order and the horizon computed."""
        transfer = np.asarray(transfer, dtype=np.int64)
        start = np.asarray(start, dtype=np.int64)
        words = np.asarray(words, dtype=np.int64)
        if (transfer.size and int(transfer.min()) >= 0 and int(start.min()) >= 0
                and int(start.max()) < 2**62 // (int(transfer.max()) + 1)):
            # one int64 key (start, then transfer) sorts faster than a two-key lexsort
            order = np.argsort(start * (int(transfer.max()) + 1) + transfer, kind="stable")
        else:
            order = np.lexsort((transfer, start))
        horizon = int((start + chunk_cycles(words, lanes)).max()) if start.size else 0
        return Schedule(
            horizon=horizon,
            lower_bound=int(lower_bound),
            kind=kind,
            chunk_transfer=transfer[order],
            chunk_start=start[order],
            chunk_words=words[order],
            chunk_lanes=None if lanes is None else np.asarray(lanes, dtype=np.int64)[order],
        )

    def with_kind(self, kind: str) -> Schedule:
        """The same chunks under another strategy name (used for reuse)."""
        return Schedule(self.horizon, self.lower_bound, kind, self.chunk_transfer,
                        self.chunk_start, self.chunk_words, self.chunk_lanes)

    def as_paired(self, lower_bound: int) -> Schedule:
        """This (one-lane) schedule stated under the paired option: same chunks, one lane
        each, against the paired lower bound."""
        lanes = np.ones(self.chunks, dtype=np.int64) if self.chunk_lanes is None else self.chunk_lanes
        return Schedule(self.horizon, lower_bound, self.kind, self.chunk_transfer,
                        self.chunk_start, self.chunk_words, lanes)


def port_loads(t: Transfers) -> tuple[np.ndarray, np.ndarray]:
    """Words each tile sends and receives (a multicast counts once per destination)."""
    send = np.bincount(t.src, weights=t.words, minlength=t.tiles).astype(np.int64)
    recv_words = np.repeat(t.words, t.fanout)
    recv = np.bincount(t.dst, weights=recv_words, minlength=t.tiles).astype(np.int64)
    return send, recv


PAIR_LANES = 2  # tiles per shared exchange bus (target fact tiles_per_shared_exchange_bus)


def endpoint_lower_bound(t: Transfers, paired: bool = False) -> int:
    """Max over tiles of words sent or received: no schedule can be shorter (one word per
    cycle per port), and for unicast phases the exact scheduler always meets it.  With
    ``paired``, the bound of the paired-tiles model (``paired_lower_bound``)."""
    if t.count == 0:
        return 0
    if paired:
        return paired_lower_bound(t)
    send, recv = port_loads(t)
    return int(max(send.max(), recv.max()))


@numba.njit(cache=True, nogil=True)
def _pairs_whole(src, offsets, dst):  # pragma: no cover - compiled
    """Per transfer: every destination's partner is a destination too, or (multicasts
    only) is the source.  One pass over each list; a list that is not increasing is
    sorted first (a copy), so the partner is always a neighbour."""
    n = src.shape[0]
    out = np.ones(n, np.bool_)
    for i in range(n):
        row = dst[offsets[i] : offsets[i + 1]]
        for j in range(1, row.shape[0]):
            if row[j] <= row[j - 1]:
                row = np.sort(row)
                break
        multicast = row.shape[0] > 1
        for j in range(row.shape[0]):
            d = row[j]
            partner = d ^ 1
            if d & 1:
                ok = j > 0 and row[j - 1] == partner
            else:
                ok = j + 1 < row.shape[0] and row[j + 1] == partner
            if not ok and not (multicast and partner == src[i]):
                out[i] = False
                break
    return out


def pair_eligible(t: Transfers) -> np.ndarray:
    """Per transfer: True when its destinations are whole tile pairs ``{2k, 2k + 1}`` (data
    both tiles of every receiving pair take), so it may be sent in two lanes.  The source's
    own partner may be a destination without the source when the transfer is a multicast (a
    replica group that holds the data already: the source pair's bus carries it to the
    partner); a unicast is never eligible, as only one tile takes its data.  Compiled with
    numba: one pass over the destination lists."""
    if t.count == 0 or t.tiles % PAIR_LANES:
        return np.zeros(t.count, dtype=bool)
    # int32 tiles as stored (a copy to int64 would cost more than the pass itself)
    return _pairs_whole(np.ascontiguousarray(t.src, dtype=np.int32),
                        np.ascontiguousarray(t.dst_offsets, dtype=np.int64),
                        np.ascontiguousarray(t.dst, dtype=np.int32))


@numba.njit(cache=True, nogil=True)
def _lane_loads(tiles, src, offsets, dst, words, eligible):  # pragma: no cover - compiled
    """Words each tile sends and receives, one-lane and two-lane apart (one pass)."""
    send_one = np.zeros(tiles, np.int64)
    send_two = np.zeros(tiles, np.int64)
    recv_one = np.zeros(tiles, np.int64)
    recv_two = np.zeros(tiles, np.int64)
    for i in range(src.shape[0]):
        w = words[i]
        send = send_two if eligible[i] else send_one
        recv = recv_two if eligible[i] else recv_one
        send[src[i]] += w
        for j in range(offsets[i], offsets[i + 1]):
            recv[dst[j]] += w
    return send_one, send_two, recv_one, recv_two


def paired_lower_bound(t: Transfers, eligible: np.ndarray | None = None) -> int:
    """A lower bound on any schedule that may send eligible transfers in two lanes.

    Per receive and per send port: the one-lane words plus half (rounded up) of the
    eligible words; per source pair: half the pair's sent words (a pair sends at most two
    words per cycle).  Each is necessary, so their maximum is a lower bound.  ``eligible``
    (``pair_eligible(t)``) may be passed by a caller that has it already."""
    if t.count == 0:
        return 0
    send_one, send_two, recv_one, recv_two = _lane_loads(
        t.tiles, np.ascontiguousarray(t.src, dtype=np.int32),
        np.ascontiguousarray(t.dst_offsets, dtype=np.int64),
        np.ascontiguousarray(t.dst, dtype=np.int32),
        np.ascontiguousarray(t.words, dtype=np.int64),
        pair_eligible(t) if eligible is None else eligible)

    def half(x: np.ndarray) -> np.ndarray:
        return -(-x // PAIR_LANES)

    bounds = [(send_one + half(send_two)).max(), (recv_one + half(recv_two)).max()]
    if t.tiles % PAIR_LANES == 0:
        bounds.append(half((send_one + send_two).reshape(-1, PAIR_LANES).sum(axis=1)).max())
    return int(max(bounds))


def table_bytes(s: Schedule, t: Transfers, bytes_per_send: int = 8, send_words: int = 64
                ) -> np.ndarray:
    """Exchange-table bytes per tile: a chunk is ``ceil(words / send_words)`` send
    instructions of ``bytes_per_send`` on its source, and one mux switch entry of
    ``bytes_per_send`` on every destination; why the schedulers keep the chunk count low."""
    if s.chunks == 0:
        return np.zeros(t.tiles, dtype=np.int64)
    sends = -(-s.chunk_words.astype(np.int64) // send_words)
    per_transfer_sends = np.bincount(s.chunk_transfer, weights=sends, minlength=t.count)
    per_transfer = np.bincount(s.chunk_transfer, minlength=t.count).astype(np.int64)
    send = np.bincount(t.src, weights=per_transfer_sends, minlength=t.tiles)
    recv = np.bincount(t.dst, weights=np.repeat(per_transfer, t.fanout), minlength=t.tiles)
    return ((send + recv) * bytes_per_send).astype(np.int64)
