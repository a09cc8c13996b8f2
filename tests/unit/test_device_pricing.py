"""The device's pricing of executed work and moved chunks, against hand-counted cases and
against the planner's independent closed forms on the same shapes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ipu_stack.device.pricing import exchange_cycles, price_work
from ipu_stack.exchange import Schedule, Transfers
from ipu_stack.exchange.instructions import instruction_horizon
from ipu_stack.planning.costs import estimate_activation, estimate_layer_norm, estimate_softmax
from ipu_stack.target.timing import Work, p, split_over_workers

PHASE = p("exchange_phase")


def _phase(src, starts, words, lanes=None):
    src = np.asarray(src, dtype=np.int32)
    transfer = np.arange(len(src), dtype=np.int64)
    return exchange_cycles(src, transfer, np.asarray(starts, dtype=np.int64),
                           np.asarray(words, dtype=np.int64),
                           None if lanes is None else np.asarray(lanes, dtype=np.int64))


def test_an_aligned_chunk_costs_its_words_plus_the_phase():
    assert _phase([3], [0], [100]) == (100 + PHASE, 100, 0)


def test_a_send_on_an_odd_event_moves_one_later_and_pushes_the_tile():
    # tile 3 sends 5 words from 0 (ends at 5), then a chunk scheduled at 5 (odd): it moves
    # to 6 and ends at 6 + 10
    cycles, horizon, moved = _phase([3, 3], [0, 5], [5, 10])
    assert (horizon, moved) == (16, 1) and cycles == 16 + PHASE


def test_long_chunks_are_cut_into_sends_of_64_words():
    # 130 words = sends of 64, 64 and 2; all aligned, so the chunk ends at 130
    assert _phase([0], [0], [130])[1] == 130
    # two lanes: 65 events for 130 words
    assert _phase([0], [0], [130], lanes=[2])[1] == 65


def test_empty_phase_costs_nothing():
    assert _phase([], [], []) == (0, 0, 0)


def test_agrees_with_the_planners_instruction_horizon_on_random_schedules():
    """Two implementations of the same hardware rule (the planner walks chunks, the device
    walks send instructions): they must agree on every schedule."""
    rng = np.random.default_rng(7)
    for _ in range(50):
        n = int(rng.integers(1, 60))
        src = rng.integers(0, 8, n)
        dst = (src + rng.integers(1, 8, n)) % 16
        words = rng.integers(1, 200, n)
        lanes = rng.integers(1, 3, n) if rng.random() < 0.5 else None
        cycles_each = words if lanes is None else -(-words // lanes)
        # a port sends one chunk at a time (what the verifier enforces): each tile's chunks
        # follow one another with random gaps
        starts = np.zeros(n, dtype=np.int64)
        free: dict[int, int] = {}
        for k in range(n):
            starts[k] = free.get(int(src[k]), 0) + int(rng.integers(0, 5))
            free[int(src[k])] = int(starts[k] + cycles_each[k])
        transfers = Transfers.unicast(16, src, dst, words)
        schedule = Schedule(int((starts + cycles_each).max()), 0, "test",
                            np.arange(n, dtype=np.int64), starts.astype(np.int64),
                            words.astype(np.int64), lanes)
        planner, _ = instruction_horizon(schedule, transfers)
        device = _phase(src, starts, words, lanes)
        assert device[1] == planner


@pytest.mark.parametrize("keys", [1, 15, 16, 17, 64, 127, 128, 200, 729, 1025])
@pytest.mark.parametrize("rows", [1, 5, 6, 8, 13])
def test_softmax_work_prices_as_the_planner_estimates(rows, keys):
    work = Work("softmax", {"rows": rows, "keys": keys, "panels": -(-keys // 16)})
    assert price_work(work) == estimate_softmax(rows, keys)


@pytest.mark.parametrize("width", [1, 7, 12, 64, 96, 100, 1152, 1536])
def test_layer_norm_work_prices_as_the_planner_estimates(width):
    work = Work("layer_norm", {"row_widths": [width] * 3})
    assert price_work(work) == estimate_layer_norm(3, width)


def test_layer_norm_is_within_a_few_cycles_of_the_measured_kernels():
    """The reference's measured kernels: (1, 1152) 6,732 and (3, 1152) 19,938 cycles; the
    fitted row model gives 6,735 and 19,941."""
    assert price_work(Work("layer_norm", {"row_widths": [1152]})) == pytest.approx(6732, abs=5)
    assert price_work(Work("layer_norm", {"row_widths": [1152] * 3})) == pytest.approx(
        19938, abs=5)


@pytest.mark.parametrize("elements", [1, 6, 24, 25, 1708, 6403])
def test_residual_add_and_rope_price_as_the_vendors_binary_vertices(elements):
    """A residual add is one popops ADD HALF supervisor vertex: launch 11 + 6 worker slots x
    (26 setup + 3 cycles per 4-half vector of the busiest worker); RoPE is three of them
    (two MULTIPLY, one ADD). Hand count for 1,708 halves: 285 per worker -> 72 vectors ->
    11 + 6 (26 + 216) = 1,463. The device prices the worker split it ran, the planner the
    even split: the same here."""
    busiest = math.ceil(elements / 6)
    vertex = 11 + 6 * (26 + 3 * math.ceil(busiest / 4))
    work = {"per_worker": split_over_workers(elements)}
    assert price_work(Work("add", work)) == vertex == estimate_activation(elements, "add")
    assert price_work(Work("rope", work)) == 3 * vertex == estimate_activation(elements, "rope")
    if elements == 1708:
        assert vertex == 1463
