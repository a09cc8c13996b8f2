"""Exchange schedules are reused, never wrongly: within a compile (``ScheduleMemo``) and,
when enabled, across compiles (``ScheduleStore`` under ``cache_dir/exchange``).

Reuse must be invisible in the output: every reused schedule verifies against its own phase
and equals what scheduling from scratch gives, and the package is byte-identical with and
without it.  A phase that differs in one destination or one word count is scheduled afresh.
Small workload sizes (as in ``test_builtin_schedules``) keep each compile under a second or two.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import numpy as np
import pytest

from ipu_stack.exchange import (
    Schedule,
    ScheduleError,
    ScheduleMemo,
    ScheduleStore,
    Transfers,
    phase_digest,
    schedule_exchange,
    verify_schedule,
)
from ipu_stack.pipeline import MIN_PROPORTION, CompileOptions, compile_workload, to_transfers
from ipu_stack.target import IPU21
from ipu_stack.workloads import get_workload
from tests.e2e.test_builtin_schedules import lowered
from tests.helpers import cache_entries, placement_fails_on_call

ATTENTION = ("attention", {"tokens": 17, "dim": 64, "heads": 4})
LAYERS = ("siglip-layer", {"tokens": 17, "dim": 64, "heads": 4, "hidden": 96, "blocks": 2})
COLUMNS = ("chunk_transfer", "chunk_start", "chunk_words")


def _same(a: Schedule, b: Schedule) -> bool:
    return (a.kind, a.horizon, a.lower_bound) == (b.kind, b.horizon, b.lower_bound) and all(
        np.array_equal(getattr(a, c), getattr(b, c)) for c in COLUMNS
    )


def _fields(caplog: pytest.LogCaptureFixture, phase: str) -> list[dict[str, str]]:
    """The key=value fields of every ``package build phase finished phase=<phase>`` line."""
    out = []
    for record in caplog.records:
        message = record.getMessage()
        if message.startswith("package build phase finished") and f"phase={phase} " in message:
            out.append(dict(re.findall(r"(\w+)=(\S+)", message)))
    return out


def _compile(tmp_path: Path, cache_dir: Path, spec: tuple[str, dict], name: str,
             **options) -> bytes:
    workload = get_workload(spec[0])
    params = workload.resolve(spec[1])
    options.setdefault("cache_dir", str(cache_dir))
    result = compile_workload(workload, params, tmp_path / name, CompileOptions(**options))
    return result.package.read_bytes()


@pytest.fixture()
def info_logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="ipu_stack")
    return caplog


# --- in-compile memo ---------------------------------------------------------------------


@pytest.mark.parametrize("spec", [ATTENTION, LAYERS], ids=["attention", "siglip-layer-x2"])
def test_package_is_identical_with_and_without_reuse(tmp_path, cache_dir, info_logs, spec):
    plain = _compile(tmp_path, cache_dir, spec, "plain", reuse_schedules=False)
    (off,) = _fields(info_logs, "select_finalist")
    info_logs.clear()
    reused = _compile(tmp_path, cache_dir, spec, "reused", finalists=3)
    (on,) = _fields(info_logs, "select_finalist")
    assert plain == reused
    assert off["reused_phases"] == "0" and off["scheduled_phases"] == off["exchange_phases"]
    if spec is LAYERS:  # two identical layers: the second's phases are the first's
        # (attention's q, k and v now share one gather, so it has no phase twice)
        assert int(on["reused_phases"]) > 0
    assert int(on["scheduled_phases"]) + int(on["reused_phases"]) == int(on["exchange_phases"])
    assert on["exchange_phases"] == off["exchange_phases"]


def _programs(spec: tuple[str, dict], ranks: tuple[int, ...]):
    """The lowered programs of a few candidate plans, as ``select_finalist`` sees them."""
    for rank in ranks:
        yield lowered(spec[0], spec[1], rank)


def test_reused_schedules_verify_and_equal_fresh_ones():
    memo = ScheduleMemo()
    phases = 0
    for program in _programs(LAYERS, (0, 1, 0)):  # rank 0 twice: a whole program repeats
        for _, _, step in program.steps():
            if not hasattr(step, "dst_offsets"):
                continue
            transfers = to_transfers(step, IPU21)
            schedule = memo.schedule(transfers, phase=phases)
            verify_schedule(transfers, schedule)
            assert _same(schedule, schedule_exchange(transfers)), step.name
            phases += 1
    assert memo.reused > 0 and memo.scheduled + memo.reused == phases
    assert memo.reused >= phases // 3  # the repeated program alone is a third of the phases


def _multicast() -> Transfers:
    return Transfers.from_lists(
        16, [0, 1, 2, 3, 0, 5], [[4, 5], [4, 6, 7], [5, 7], [6], [8, 9, 10], [11]],
        [3, 2, 4, 1, 5, 2],
    )


def _changed(t: Transfers, *, dst: np.ndarray | None = None, words: np.ndarray | None = None):
    return Transfers.from_arrays(t.tiles, t.src, t.dst_offsets,
                                 t.dst if dst is None else dst, t.words if words is None else words)


def test_relocated_phase_is_reused(caplog):
    caplog.set_level(logging.DEBUG, logger="ipu_stack.exchange")
    t = _multicast()
    memo = ScheduleMemo()
    first = memo.schedule(t, phase=0)
    again = memo.schedule(_changed(t, dst=t.dst.copy()), phase=7)  # new arrays, same content
    assert memo.counts() == {"scheduled": 1, "reused": 1, "loaded": 0, "rejected": 0}
    assert _same(first, again) and again.kind != "reused"  # the package keeps the real kind
    assert any("reused exchange optimization after validating relocated rows phase=7"
               in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("change", ["destination", "words", "source", "split"])
def test_a_phase_that_differs_is_not_reused(change):
    t = _multicast()
    if change == "destination":
        dst = t.dst.copy()
        dst[3] = 15  # transfer 1 goes to 15 instead of 6
        other = _changed(t, dst=dst)
    elif change == "words":
        words = t.words.copy()
        words[2] += 1
        other = _changed(t, words=words)
    elif change == "source":
        src = t.src.copy()
        src[3] = 12
        other = Transfers.from_arrays(t.tiles, src, t.dst_offsets, t.dst, t.words)
    else:  # the same destination tiles, grouped differently
        offsets = t.dst_offsets.copy()
        offsets[3] -= 1  # transfer 2 sends to [5], transfer 3 to [7, 6]
        other = Transfers.from_arrays(t.tiles, t.src, offsets, t.dst, t.words)
    other.validate()
    assert phase_digest(other) != phase_digest(t)
    memo = ScheduleMemo()
    memo.schedule(t)
    schedule = memo.schedule(other)
    assert memo.reused == 0 and memo.scheduled == 2
    verify_schedule(other, schedule)
    assert _same(schedule, schedule_exchange(other))
    if change == "words":  # the old schedule would leave a word unsent
        with pytest.raises(ScheduleError, match="uncovered word"):
            verify_schedule(other, schedule_exchange(t))


def test_phase_digest_is_a_fixed_content_hash():
    """sha256 of the content, never Python's salted ``hash()``: stable across processes."""
    t = _multicast()
    same = Transfers(t.tiles, t.src.astype(np.int64), t.dst_offsets, t.dst.astype(np.int16),
                     t.words.astype(np.int32))
    assert phase_digest(same) == phase_digest(t)
    assert phase_digest(t) == "76a74473c5270b751a1f0d29590e1f65ecaff51ee828b6b527ab51ee202c5a5e"


def test_placement_retry_reuses_the_failed_attempts_schedules(tmp_path, cache_dir, info_logs,
                                                              monkeypatch):
    import ipu_stack.phases.stages as stages_module

    original = stages_module.place_storage
    placement_fails_on_call(monkeypatch, 1, "test: pretend the first placement does not fit")
    # unfused: a fused program's first retry is the same memory unfused (lowering.fuse)
    retried = _compile(tmp_path, cache_dir, ATTENTION, "retried", fuse_window=0)
    first, second = _fields(info_logs, "select_finalist")
    assert int(first["scheduled_phases"]) > 0
    # the retry plans the same finalists with a little less memory (they fit): nothing is
    # scheduled twice
    assert second["scheduled_phases"] == "0"
    assert second["reused_phases"] == second["exchange_phases"]
    (retry,) = [dict(re.findall(r"(\w+)=(\S+)", r.getMessage())) for r in info_logs.records
                if r.getMessage().startswith("planning again with less memory")]
    proportion = float(retry["memory_proportion"])
    # no byte was short, and the plans were estimated far under the budget: the retry
    # plans for what they were estimated at, here below the floor, so at the floor
    assert proportion == MIN_PROPORTION and retry["short_bytes"] == "0"
    monkeypatch.setattr(stages_module, "place_storage", original)
    direct = _compile(tmp_path, cache_dir, ATTENTION, "direct", memory_proportion=proportion,
                      reuse_schedules=False, fuse_window=0)
    assert retried == direct


# --- the disk cache -------------------------------------------------------------------------


def test_disk_cache_serves_a_second_compile(tmp_path, info_logs):
    cache = tmp_path / "cache"
    plain = _compile(tmp_path, cache, ATTENTION, "plain", reuse_schedules=False)
    assert not (cache / "exchange").exists()  # off unless asked for
    first = _compile(tmp_path, cache, ATTENTION, "first", exchange_cache=True)
    second = _compile(tmp_path, cache, ATTENTION, "second", exchange_cache=True)
    _, built, served = _fields(info_logs, "select_finalist")
    assert plain == first == second
    assert built["cached_phases"] == "0" and int(built["scheduled_phases"]) > 0
    assert served["scheduled_phases"] == "0"
    assert served["cached_phases"] == built["scheduled_phases"]
    assert len(cache_entries(cache, "exchange")) == int(built["scheduled_phases"])
    assert not list(cache.rglob("*.tmp"))


def test_damaged_disk_entries_are_rebuilt(tmp_path, info_logs):
    cache = tmp_path / "cache"
    plain = _compile(tmp_path, cache, ATTENTION, "plain", exchange_cache=True)
    entries = cache_entries(cache, "exchange")
    entries[0].write_bytes(b"not json")
    entries[1].write_bytes(entries[1].read_bytes()[:100])  # truncated
    entry = json.loads(entries[2].read_bytes())
    entry["payload"]["horizon"] += 1  # valid JSON, stale checksum
    entries[2].write_text(json.dumps(entry))
    entries[3].unlink()
    entries[3].mkdir()  # a directory where the file should be
    info_logs.clear()
    again = _compile(tmp_path, cache, ATTENTION, "again", exchange_cache=True)
    (fields,) = _fields(info_logs, "select_finalist")
    warnings = [r.getMessage() for r in info_logs.records if r.levelno == logging.WARNING]
    assert again == plain
    assert fields["rejected_cache_entries"] == "4" and fields["scheduled_phases"] == "4"
    assert sum("dropped a damaged cache entry, rebuilding cache=exchange" in w
               for w in warnings) == 4
    assert any("checksum mismatch" in w for w in warnings)
    # every entry is whole again
    info_logs.clear()
    _compile(tmp_path, cache, ATTENTION, "third", exchange_cache=True)
    (fields,) = _fields(info_logs, "select_finalist")
    assert fields["rejected_cache_entries"] == "0" and fields["scheduled_phases"] == "0"


def test_tampered_schedule_is_rejected_by_the_verifier(tmp_path, caplog):
    """An entry with a valid checksum but an invalid schedule never reaches the package."""
    t = _multicast()
    good = schedule_exchange(t)
    store = ScheduleStore(tmp_path)
    digest = phase_digest(t)
    tampered = Schedule(good.horizon, good.lower_bound, good.kind, good.chunk_transfer,
                        np.zeros_like(good.chunk_start), good.chunk_words)  # all at cycle 0
    with pytest.raises(ScheduleError):
        verify_schedule(t, tampered)
    store.save(digest, tampered)  # written through the store: the checksum matches
    memo = ScheduleMemo(store)
    schedule = memo.schedule(t, phase=3)
    assert memo.counts() == {"scheduled": 1, "reused": 0, "loaded": 0, "rejected": 1}
    assert _same(schedule, good)
    assert any("does not verify" in r.getMessage() and r.levelno == logging.WARNING
               for r in caplog.records)
    # the rebuilt entry is the fresh schedule, and a new memo loads it
    loaded, reason = store.load(digest, t)
    assert reason == "" and loaded is not None and _same(loaded, good)
    fresh = ScheduleMemo(store)
    assert _same(fresh.schedule(t), good) and fresh.loaded == 1


def test_disk_entry_for_another_phase_is_not_used(tmp_path):
    """Entries are named by their content address, and each entry names it again (and its
    payload the phase): one copied under another phase's name is dropped, not used."""
    t = _multicast()
    words = t.words.copy()
    words[0] += 2
    other = _changed(t, words=words)
    store = ScheduleStore(tmp_path)
    store.save(phase_digest(t), schedule_exchange(t))
    path = store.path(phase_digest(other))
    path.write_bytes(store.path(phase_digest(t)).read_bytes())  # copied under other's name
    loaded, reason = store.load(phase_digest(other), other)
    assert loaded is None and "stored under another key" in reason
    assert not path.exists() and store.path(phase_digest(t)).exists()


def test_paired_schedules_keep_their_lanes_and_their_own_entries(tmp_path):
    """A paired-tiles schedule (two-lane chunks) is memoised and cached apart from the plain
    one for the same phase, lanes included."""
    t = _multicast()
    paired, plain = schedule_exchange(t, paired=True), schedule_exchange(t)
    memo = ScheduleMemo(ScheduleStore(tmp_path))
    got = [memo.schedule(t, paired=True), memo.schedule(t), memo.schedule(t, paired=True)]
    assert memo.counts() == {"scheduled": 2, "reused": 1, "loaded": 0, "rejected": 0}
    fresh = ScheduleMemo(ScheduleStore(tmp_path))
    got.append(fresh.schedule(t, paired=True))
    assert fresh.loaded == 1
    for schedule, want in zip(got, [paired, plain, paired, paired], strict=True):
        verify_schedule(t, schedule)
        assert _same(schedule, want)
        assert (schedule.chunk_lanes is None) == (want.chunk_lanes is None)
        if want.chunk_lanes is not None:
            assert np.array_equal(schedule.chunk_lanes, want.chunk_lanes)
