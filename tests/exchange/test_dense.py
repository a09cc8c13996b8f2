"""The dense unicast scheduler, the sparse fallback and the layered replica-group path."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ipu_stack.exchange import Transfers, endpoint_lower_bound, schedule_exchange, verify_schedule
from ipu_stack.exchange import unicast as unicast_module
from ipu_stack.exchange.families import FAMILIES, gemm_operands, random_multicast, random_unicast
from ipu_stack.exchange.groups import layers

UNICAST_FAMILIES = ["random-unicast", "transpose", "gather", "reduction"]


@pytest.mark.parametrize("name", UNICAST_FAMILIES)
@pytest.mark.parametrize("n", [2_000, 30_000])
def test_unicast_families_exactly_at_bound(name: str, n: int) -> None:
    t = FAMILIES[name](n, seed=2)
    s = schedule_exchange(t)
    verify_schedule(t, s)
    assert s.horizon == s.lower_bound == endpoint_lower_bound(t)
    assert s.chunks <= 2 * t.count
    assert s.kind == "full-duplex"


@pytest.mark.parametrize("seed", range(4))
def test_sparse_fallback_still_exact(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    """Phases over very many tiles use the sparse scheduler; it must stay exact too."""
    monkeypatch.setattr(unicast_module, "DENSE_LIMIT", 0)
    t = random_unicast(3000, tiles=64, seed=seed)
    s = schedule_exchange(t)
    verify_schedule(t, s)
    assert s.horizon == s.lower_bound


@st.composite
def parallel_heavy(draw) -> Transfers:
    """Few tiles, many parallel transfers per pair: exercises pair merging and repairs."""
    tiles = draw(st.integers(2, 6))
    n = draw(st.integers(1, 60))
    src = draw(st.lists(st.integers(0, tiles - 1), min_size=n, max_size=n))
    shift = draw(st.lists(st.integers(1, tiles - 1), min_size=n, max_size=n))
    words = draw(st.lists(st.integers(1, 9), min_size=n, max_size=n))
    dst = [(s + k) % tiles for s, k in zip(src, shift, strict=True)]
    return Transfers.unicast(tiles, np.array(src), np.array(dst), np.array(words))


@settings(max_examples=200, deadline=None)
@given(parallel_heavy())
def test_property_pairs_exact(t: Transfers) -> None:
    s = schedule_exchange(t)
    verify_schedule(t, s)
    assert s.horizon == s.lower_bound
    assert s.chunks <= 2 * t.count


@pytest.mark.parametrize("n", [1_000, 8_000])
def test_gemm_operands_layered_at_bound(n: int) -> None:
    """A and B operand broadcasts in one phase: two overlapping replica-group layers."""
    t = gemm_operands(n, seed=4)
    split = layers(t)
    assert split is not None and len(split) == 2
    s = schedule_exchange(t)
    verify_schedule(t, s)
    assert s.horizon == s.lower_bound
    assert s.chunks == t.count


def test_layers_reject_random_multicast() -> None:
    assert layers(random_multicast(6000, seed=1)) is None


@pytest.mark.slow
def test_full_size_random_unicast_at_bound() -> None:
    """The 454 896-transfer target instance (timing is measured by the benchmark, not here)."""
    t = random_unicast(454_896)
    s = schedule_exchange(t)
    verify_schedule(t, s)
    assert s.horizon == s.lower_bound
    assert s.chunks <= 2 * t.count
