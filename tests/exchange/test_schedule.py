"""Scheduler quality and correctness: exact unicast, families within targets, properties."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ipu_stack.exchange import (
    ExchangeError,
    Transfers,
    endpoint_lower_bound,
    reuse_schedule,
    schedule_exchange,
    table_bytes,
    verify_schedule,
)
from ipu_stack.exchange.families import FAMILIES, random_unicast


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize(("tiles", "n"), [(4, 12), (16, 200), (64, 3000), (1472, 20000)])
def test_random_unicast_meets_bound(seed: int, tiles: int, n: int) -> None:
    t = random_unicast(n, tiles=tiles, seed=seed)
    s = schedule_exchange(t)
    verify_schedule(t, s)
    assert s.horizon == s.lower_bound == endpoint_lower_bound(t)
    assert s.chunks <= 2 * t.count
    assert s.kind == "full-duplex"


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_families_within_targets(name: str) -> None:
    t = FAMILIES[name](3000, seed=1)
    s = schedule_exchange(t)
    verify_schedule(t, s)
    limit = 1.0 if t.is_unicast() else 1.3
    assert s.horizon <= limit * s.lower_bound
    assert s.chunks <= 2 * t.count


def test_empty_phase() -> None:
    t = Transfers.from_lists(8, [], [], [])
    s = schedule_exchange(t)
    verify_schedule(t, s)
    assert (s.horizon, s.lower_bound, s.chunks) == (0, 0, 0)


@pytest.mark.parametrize(
    ("src", "dsts", "words", "message"),
    [
        ([0], [[0]], [1], "source among its destinations"),
        ([0], [[1, 1]], [1], "duplicate destination"),
        ([0], [[1]], [0], "words must be between 1 and"),
        ([0, 9], [[1], [2]], [1, 1], "invalid transfer 1: source tile out of range"),
        ([0], [[]], [1], "no destination"),
    ],
)
def test_invalid_instances(src, dsts, words, message: str) -> None:
    with pytest.raises(ExchangeError, match=message):
        Transfers.from_lists(4, src, dsts, words).validate()


@st.composite
def instances(draw) -> Transfers:
    tiles = draw(st.integers(2, 12))
    n = draw(st.integers(0, 40))
    src, dsts, words = [], [], []
    for _ in range(n):
        s = draw(st.integers(0, tiles - 1))
        others = [x for x in range(tiles) if x != s]
        d = draw(st.lists(st.sampled_from(others), min_size=1, max_size=3, unique=True))
        src.append(s)
        dsts.append(d)
        words.append(draw(st.integers(1, 20)))
    return Transfers.from_lists(tiles, src, dsts, words)


@settings(max_examples=150, deadline=None)
@given(instances())
def test_property_schedules_verify(t: Transfers) -> None:
    s = schedule_exchange(t, paired=True)
    verify_schedule(t, s)
    assert s.horizon >= s.lower_bound
    if t.is_unicast():
        assert s.horizon == s.lower_bound


def test_logs_and_paired(caplog: pytest.LogCaptureFixture) -> None:
    t = FAMILIES["random-multicast"](1200, seed=3)
    with caplog.at_level(logging.DEBUG, logger="ipu_stack.exchange"):
        s = schedule_exchange(t, phase=7, paired=True)
    verify_schedule(t, s)
    text = caplog.text
    assert "prepared large physical exchange phase phase=7 transfers=1200" in text
    assert "maximum_identical_destinations=8" in text
    assert "compared ordinary and paired exchange schedules phase=7" in text
    from ipu_stack.exchange.model import pair_eligible

    assert f"eligible_transfers={int(pair_eligible(t).sum())}" in text and "use_paired=" in text
    assert "optimized physical exchange schedule phase=7" in text
    assert f"endpoint_lower_bound={s.lower_bound}" in text


def test_paired_wins_on_pair_aligned_broadcasts(caplog: pytest.LogCaptureFixture) -> None:
    t = FAMILIES["gemm-broadcast"](3000)
    with caplog.at_level(logging.DEBUG, logger="ipu_stack.exchange"):
        s = schedule_exchange(t, phase=3, paired=True)
    verify_schedule(t, s)
    assert s.kind == "paired" and "use_paired=true" in caplog.text
    assert f"eligible_transfers={t.count}" in caplog.text
    plain = schedule_exchange(t)
    assert s.horizon < 0.55 * plain.horizon  # two lanes: about half the cycles


def test_reuse_and_table_bytes(caplog: pytest.LogCaptureFixture) -> None:
    t = Transfers.from_lists(4, [0, 1], [[2, 3], [0]], [3, 2])
    s = schedule_exchange(t)
    moved = Transfers.from_lists(4, [0, 1], [[3, 2], [0]], [3, 2])
    with caplog.at_level(logging.DEBUG, logger="ipu_stack.exchange"):
        again = reuse_schedule(t, s, moved, phase=2)
    assert again is not None and again.kind == "reused"
    assert "reused exchange optimization after validating relocated rows phase=2" in caplog.text
    changed = Transfers.from_lists(4, [0, 1], [[2, 3], [0]], [4, 2])
    assert reuse_schedule(t, s, changed) is None
    tb = table_bytes(s, t)
    assert tb.tolist() == [16, 8, 8, 8]
    assert np.all(tb >= 0)
