"""Reuse of exchange schedules within one compile, and optionally across compiles on disk.

A schedule depends only on each transfer's (source tile, destination tiles, words), never on
addresses, so a phase that recurs (finalists sharing a stage's plan, repeated blocks, the
re-lowering after a placement failure) need not be scheduled again.  ``ScheduleMemo`` keys
phases by a sha256 content digest and, on a hit, lets ``reuse_schedule`` validate the match
(and log the reference system's reuse line) before handing the stored schedule back.

The digest covers the destinations in the order they are listed, not sorted: the schedulers
break ties by transfer and destination order, so only an exact match is guaranteed to give
the very chunks that scheduling from scratch would.  That keeps the memo invisible in the
output: the package is byte-identical with and without it (the returned schedule keeps the
kind of the algorithm that made its chunks; "reused" appears only in the log).

``ScheduleStore`` is the optional disk cache, ``<cache>/exchange/<key>.json``, kept by the
shared :class:`~ipu_stack.util.cache.EntryCache` under its rules (a sha256 of the payload
checked on every load, atomic writes, a damaged entry dropped with a warning and rebuilt);
the payload is JSON with the chunk columns as base64 of zlib-compressed little-endian int64.
The key also covers a fingerprint of this package's source, so a change to any scheduler
retires every old entry.  A loaded schedule must pass ``verify_schedule`` against the phase
before it is used; one that does not is damage like any other.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
import logging
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ipu_stack.exchange.model import Schedule, ScheduleError, Transfers
from ipu_stack.exchange.scheduler import reuse_schedule, schedule_exchange
from ipu_stack.exchange.verify import verify_schedule
from ipu_stack.util.cache import EntryCache, content_key
from ipu_stack.util.log import event

LOG = logging.getLogger("ipu_stack.exchange")

FORMAT = "ipu-stack exchange schedule"
VERSION = 1
_COLUMNS = ("chunk_transfer", "chunk_start", "chunk_words")


def _column_bytes(array: np.ndarray) -> bytes:
    """Little-endian int64 bytes, so the digest does not depend on dtype or platform."""
    return np.ascontiguousarray(array, dtype="<i8").tobytes()


def phase_digest(t: Transfers) -> str:
    """sha256 of everything a schedule depends on: tiles, sources, destinations per
    transfer (CSR offsets and tiles, in listed order) and words."""
    h = hashlib.sha256(f"exchange phase v1 tiles={t.tiles} count={t.count};".encode())
    for name, array in (("src", t.src), ("dst_offsets", t.dst_offsets), ("dst", t.dst),
                        ("words", t.words)):
        data = _column_bytes(array)
        h.update(f"{name}:{len(data)};".encode())
        h.update(data)
    return h.hexdigest()


def _frozen(array: np.ndarray, dtype: Any) -> np.ndarray:
    """A private read-only copy: the memo hands the same arrays to several programs, so a
    stray in-place write must fail loudly instead of changing another finalist's phase."""
    out = np.array(array, dtype=dtype, copy=True)
    out.setflags(write=False)
    return out


def _freeze_transfers(t: Transfers) -> Transfers:
    return Transfers(t.tiles, _frozen(t.src, np.int32), _frozen(t.dst_offsets, np.int64),
                     _frozen(t.dst, np.int32), _frozen(t.words, np.int64))


def _freeze_schedule(s: Schedule) -> Schedule:
    lanes = None if s.chunk_lanes is None else _frozen(s.chunk_lanes, np.int64)
    return dataclasses.replace(
        s, chunk_transfer=_frozen(s.chunk_transfer, np.int64),
        chunk_start=_frozen(s.chunk_start, np.int64),
        chunk_words=_frozen(s.chunk_words, np.int64), chunk_lanes=lanes,
    )


def _decode_column(text: str, chunks: int) -> np.ndarray:
    """One stored column, refusing to inflate past the ``chunks`` it claims (no zip bomb)."""
    inflate = zlib.decompressobj()
    raw = inflate.decompress(base64.b64decode(text, validate=True), 8 * chunks + 1)
    if len(raw) != 8 * chunks or not inflate.eof:
        raise ValueError("chunk column length mismatch")
    return np.frombuffer(raw, dtype="<i8").astype(np.int64)


@functools.cache
def algorithm_fingerprint() -> str:
    """sha256 of this package's source files: any scheduler change retires disk entries."""
    h = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


class ScheduleStore:
    """The on-disk schedule cache under ``cache_dir/exchange``: an
    :class:`~ipu_stack.util.cache.EntryCache` whose decode also runs ``verify_schedule``
    against the phase being compiled (see the module docstring)."""

    def __init__(self, cache_dir: Path) -> None:
        self.root = Path(cache_dir) / "exchange"

    @staticmethod
    def key(digest: str, paired: bool = False) -> str:
        """The entry's content address: the phase, the mode and the schedulers' source."""
        return content_key("exchange schedule", algorithm_fingerprint(),
                           "paired" if paired else "plain", digest)

    def _cache(self) -> EntryCache:
        return EntryCache(self.root, "exchange")

    def path(self, digest: str, paired: bool = False) -> Path:
        return self.root / f"{self.key(digest, paired)}.json"

    def save(self, digest: str, s: Schedule, paired: bool = False) -> None:
        """Write ``s`` for the phase ``digest`` atomically (parallel writers both succeed; a
        failed write is a warning)."""
        payload: dict[str, Any] = {
            "format": FORMAT, "version": VERSION, "phase": digest, "paired": paired,
            "algorithm": algorithm_fingerprint(), "kind": s.kind, "horizon": int(s.horizon),
            "lower_bound": int(s.lower_bound), "chunks": s.chunks,
        }
        for name in _COLUMNS + ("chunk_lanes",):
            if getattr(s, name) is not None:
                raw = zlib.compress(_column_bytes(getattr(s, name)), 6)
                payload[name] = base64.b64encode(raw).decode("ascii")
        self._cache().save(self.key(digest, paired), payload)

    def load(
        self, digest: str, t: Transfers, paired: bool = False, phase: int | None = None
    ) -> tuple[Schedule | None, str]:
        """The verified schedule stored for ``t`` (and ``""``), or None and why it was
        unusable (``""`` when there is simply no entry; an unusable one is removed)."""

        def decode(payload: dict[str, Any]) -> Schedule:
            stored = (payload["format"], payload["version"], payload["phase"],
                      payload["paired"], payload["algorithm"])
            if stored != (FORMAT, VERSION, digest, paired, algorithm_fingerprint()):
                raise ValueError("entry belongs to another phase, mode, format or scheduler")
            chunks = int(payload["chunks"])
            columns = [_decode_column(payload[name], chunks) for name in _COLUMNS]
            lanes = payload.get("chunk_lanes")
            schedule = Schedule(int(payload["horizon"]), int(payload["lower_bound"]),
                                str(payload["kind"]), *columns,
                                None if lanes is None else _decode_column(lanes, chunks))
            try:
                verify_schedule(t, schedule)
            except ScheduleError as failure:
                raise ValueError(f"schedule does not verify: {failure}") from None
            return schedule

        return self._cache().load(self.key(digest, paired), decode,
                                  phase=-1 if phase is None else phase)


@dataclass
class _Entry:
    transfers: Transfers
    schedule: Schedule


class ScheduleMemo:
    """Schedules by phase digest for one compile (all finalists and placement retries).

    Counters: ``scheduled`` (from scratch), ``reused`` (memo hits, validated by
    ``reuse_schedule``), ``loaded`` (verified disk entries), ``rejected`` (disk entries that
    failed their checksum or the verifier and were rebuilt).
    """

    def __init__(self, store: ScheduleStore | None = None) -> None:
        self.store = store
        self.entries: dict[tuple[str, bool], _Entry] = {}
        self.scheduled = 0
        self.reused = 0
        self.loaded = 0
        self.rejected = 0

    def counts(self) -> dict[str, int]:
        """The counters as a dict (for log fields and deltas)."""
        return {"scheduled": self.scheduled, "reused": self.reused, "loaded": self.loaded,
                "rejected": self.rejected}

    def schedule(
        self, t: Transfers, *, phase: int | None = None, paired: bool = False
    ) -> Schedule:
        """``schedule_exchange(t, phase=phase, paired=paired)``, reusing an identical earlier
        phase scheduled in the same mode."""
        digest = phase_digest(t)
        entry = self.entries.get((digest, paired))
        if entry is not None:
            reused = reuse_schedule(entry.transfers, entry.schedule, t, phase=phase)
            # a digest match whose arrays differ would be a sha256 collision: never trust it
            if reused is not None and np.array_equal(entry.transfers.dst, t.dst):
                self.reused += 1
                # keep the producing algorithm's kind: the package records it
                return reused.with_kind(entry.schedule.kind)
        schedule = self._from_store(digest, t, phase, paired)
        if schedule is None:
            schedule = _freeze_schedule(schedule_exchange(t, phase=phase, paired=paired))
            self.scheduled += 1
            if self.store is not None:
                self.store.save(digest, schedule, paired)  # a failed write is a warning
        self.entries[(digest, paired)] = _Entry(_freeze_transfers(t), schedule)
        return schedule

    def _from_store(
        self, digest: str, t: Transfers, phase: int | None, paired: bool
    ) -> Schedule | None:
        if self.store is None:
            return None
        t.validate()  # the verifier assumes a valid instance, as schedule_exchange does
        schedule, reason = self.store.load(digest, t, paired, phase)
        if schedule is not None:
            self.loaded += 1
            event(LOG, "loaded verified exchange schedule from cache", logging.DEBUG,
                  phase=-1 if phase is None else phase, selected_kind=schedule.kind)
            return _freeze_schedule(schedule)
        if reason:  # the store dropped it with a warning; the caller schedules afresh
            self.rejected += 1
        return None
