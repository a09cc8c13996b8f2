"""The compiled schedulers: multicast rounds (multicast.py), the exact unicast loop (peel.py)
and paired-tile eligibility and bounds (paired.py), checked against brute-force occupancy."""

from __future__ import annotations

import numpy as np
import pytest

from ipu_stack.exchange import Transfers, endpoint_lower_bound, schedule_exchange, verify_schedule
from ipu_stack.exchange.families import random_multicast, random_unicast
from ipu_stack.exchange.model import pair_eligible, paired_lower_bound
from ipu_stack.exchange.multicast import port_lists, schedule_multicast, schedule_tasks
from ipu_stack.exchange.paired import schedule_paired
from ipu_stack.exchange.scheduler import NO_ROUNDS


def occupancy_ok(ports: int, poff, pl, task, start, cycles) -> bool:
    """Independent check: paint every chunk's cycles on a ports x time grid."""
    horizon = int((start + cycles).max())
    grid = np.zeros((ports, horizon), dtype=np.int64)
    for k in range(task.size):
        for p in pl[poff[task[k]] : poff[task[k] + 1]]:
            grid[p, start[k] : start[k] + cycles[k]] += 1
    return bool(grid.max() <= 1)


@pytest.mark.parametrize("n", [300, 2000])
def test_tasks_never_share_a_port(n: int) -> None:
    t = random_multicast(n, tiles=64, seed=n)
    poff, pl = port_lists(t)
    task, start, cycles = schedule_tasks(128, poff, pl, t.words.astype(np.int64))
    assert occupancy_ok(128, poff, pl, task, start, cycles)
    assert np.array_equal(np.bincount(task, weights=cycles, minlength=n), t.words)


def test_port_lists_layout() -> None:
    t = Transfers.from_lists(8, [3, 4], [[5, 6], [1]], [7, 2])
    poff, pl = port_lists(t, np.array([True, False]))
    assert poff.tolist() == [0, 4, 6]
    assert pl.tolist() == [3, 2, 8 + 5, 8 + 6, 4, 8 + 1]


@pytest.mark.parametrize("n", [1000, 5000, 20000])
def test_random_multicast_within_target(n: int) -> None:
    t = random_multicast(n)
    s = schedule_exchange(t)
    verify_schedule(t, s)
    assert s.horizon <= 1.15 * s.lower_bound, (s.horizon, s.lower_bound)
    assert s.chunks <= 2 * n


def test_multicast_is_deterministic() -> None:
    t = random_multicast(3000, seed=5)
    a, b = schedule_multicast(t), schedule_multicast(t)
    for x, y in zip(a, b, strict=True):
        assert np.array_equal(x, y)


def test_no_rounds_gives_one_chunk_per_transfer() -> None:
    t = random_multicast(2000, seed=2)
    transfer, start, words = schedule_multicast(t, round_cycles=NO_ROUNDS)
    assert np.array_equal(np.sort(transfer), np.arange(t.count))
    assert np.array_equal(words, t.words[transfer])


@pytest.mark.parametrize("seed", range(6))
def test_unicast_loop_exact_on_small_random_phases(seed: int) -> None:
    rng = np.random.default_rng(seed)
    tiles = int(rng.integers(3, 40))
    t = random_unicast(int(rng.integers(1, 400)), tiles=tiles, seed=seed, max_words=9)
    s = schedule_exchange(t)
    verify_schedule(t, s)
    assert s.horizon == endpoint_lower_bound(t)


def test_pair_eligibility() -> None:
    # 0: whole pair {4,5}; 1: half a pair; 2: two whole pairs; 3: a pair listed out of order
    t = Transfers.from_lists(8, [0, 0, 1, 2], [[4, 5], [4], [2, 3, 6, 7], [7, 6]], [4, 4, 4, 4])
    assert pair_eligible(t).tolist() == [True, False, True, True]
    odd = Transfers.from_lists(7, [0], [[4, 5]], [4])
    assert pair_eligible(odd).tolist() == [False]
    # a replica group {4,5,6,7} fed by its member 4: the partner 5 receives without 4
    group = Transfers.from_lists(8, [4, 4], [[5, 6, 7], [6, 7, 1]], [4, 4])
    assert pair_eligible(group).tolist() == [True, False]


def test_paired_lower_bound_by_hand() -> None:
    # tile 0 sends 10 words to pair {2,3} (eligible: 5 cycles) and 3 words to tile 4 alone
    t = Transfers.from_lists(8, [0, 0], [[2, 3], [4]], [10, 3])
    assert endpoint_lower_bound(t) == 13
    # send port 0: 3 + ceil(10 / 2) = 8; source pair {0,1}: ceil(13 / 2) = 7
    assert paired_lower_bound(t) == 8


def test_paired_chunks_cover_words_and_respect_ports() -> None:
    t = random_multicast(1500, tiles=32, seed=3)
    # make every transfer pair-closed by adding each destination's partner
    dsts = [sorted(({int(d) ^ 1 for d in t.dst[a:b]} | set(t.dst[a:b].tolist())) - {int(s), int(s) ^ 1})
            for s, a, b in zip(t.src, t.dst_offsets[:-1], t.dst_offsets[1:], strict=True)]
    keep = [k for k, d in enumerate(dsts) if d]
    t = Transfers.from_lists(32, [int(t.src[k]) for k in keep], [dsts[k] for k in keep],
                             [int(t.words[k]) for k in keep])
    assert pair_eligible(t).all()
    task, start, words, lanes = schedule_paired(t)
    assert np.array_equal(np.bincount(task, weights=words, minlength=t.count), t.words)
    assert (lanes == 2).all()
    poff, pl = port_lists(t, pair_eligible(t))
    cycles = -(-words // lanes)
    assert occupancy_ok(64, poff, pl, task, start, cycles)
    horizon = int((start + cycles).max())
    assert paired_lower_bound(t) <= horizon <= 1.3 * paired_lower_bound(t)
    assert horizon < endpoint_lower_bound(t)


# -- paired schedules through the verifier and the JSON files -------------------------------

def _paired_phase(second_source: int = 5) -> Transfers:
    # 0: tile 0 -> pair {2,3}, 10 words (eligible); 1: -> tile 6, 6 words (not eligible)
    return Transfers.from_lists(8, [0, second_source], [[2, 3], [6]], [10, 6])


def test_paired_schedule_verifies_and_beats_plain_bound() -> None:
    t = _paired_phase()
    s = schedule_exchange(t, paired=True)
    verify_schedule(t, s)
    assert s.paired and s.lower_bound == paired_lower_bound(t) == 6
    assert s.horizon < endpoint_lower_bound(t) == 10


@pytest.mark.parametrize(
    ("source", "lanes", "starts", "message"),
    [
        (5, [2, 2], [0, 0], "two-lane chunk of transfer 1, whose destinations are not whole tile pairs"),
        (1, [2, 1], [0, 0], "send port overlap: tile 1 cycle 0"),  # tile 0's partner is busy
        (5, [3, 1], [0, 5], "lanes must be 1 or 2, got 3"),
    ],
)
def test_verifier_rejects_bad_lanes(source: int, lanes: list[int], starts: list[int], message: str) -> None:
    from ipu_stack.exchange import Schedule, ScheduleError

    t = _paired_phase(source)
    s = Schedule.from_chunks(paired_lower_bound(t), "paired", np.array([0, 1]), np.array(starts),
                             np.array([10, 6]), np.array(lanes))
    with pytest.raises(ScheduleError, match=message):
        verify_schedule(t, s)


def test_two_lane_chunks_need_the_paired_bound() -> None:
    from ipu_stack.exchange import Schedule, ScheduleError

    t = _paired_phase()
    s = Schedule.from_chunks(endpoint_lower_bound(t), "paired", np.array([0, 1]), np.array([0, 0]),
                             np.array([10, 6]), np.array([2, 1]))
    with pytest.raises(ScheduleError, match="lower bound mismatch: recorded 10, instance 6"):
        verify_schedule(t, s)


def test_paired_schedule_json_round_trip(tmp_path) -> None:
    from ipu_stack.exchange import ExchangeError, load_schedule, save_schedule

    t = _paired_phase()
    s = schedule_exchange(t, paired=True)
    save_schedule(tmp_path / "s.json", s)
    back = load_schedule(tmp_path / "s.json")
    assert back.paired and np.array_equal(back.chunk_lanes, s.chunk_lanes)
    verify_schedule(t, back)
    (tmp_path / "bad.json").write_text('{"horizon": 1, "lower_bound": 1, "kind": "x", '
                                       '"paired": 1, "chunks": []}')
    with pytest.raises(ExchangeError, match="'paired' must be true or false"):
        load_schedule(tmp_path / "bad.json")


def test_pair_eligibility_matches_a_set_reference() -> None:
    """The vectorised rule (sorted-list fast path, sorting fallback) against plain sets."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        tiles = int(rng.integers(2, 12))
        n = int(rng.integers(1, 30))
        src = rng.integers(0, tiles, n).tolist()
        dsts = []
        for s in src:
            others = [x for x in range(tiles) if x != s]
            d = rng.choice(others, int(rng.integers(1, len(others) + 1)), replace=False).tolist()
            dsts.append(sorted(d) if rng.random() < 0.5 else d)
        t = Transfers.from_lists(tiles, src, dsts, [1] * n)
        expect = [tiles % 2 == 0 and all((x ^ 1) in set(d) or ((x ^ 1) == s and len(d) > 1)
                                         for x in d) for s, d in zip(src, dsts, strict=True)]
        assert pair_eligible(t).tolist() == expect


def test_all_eligible_phases_are_exact_on_the_pair_machine() -> None:
    """Pair-aligned replica broadcasts (every transfer eligible) are scheduled on the pair
    machine by the exact strategies: the horizon is that instance's own bound, with one
    chunk per transfer, and it verifies as a two-lane schedule of the tile phase."""
    from ipu_stack.exchange.families import gemm_broadcast
    from ipu_stack.exchange.paired import pair_level

    t = gemm_broadcast(3000)
    assert pair_eligible(t).all()
    s = schedule_exchange(t, paired=True)
    verify_schedule(t, s)
    pairs = pair_level(t)
    assert pairs.tiles == t.tiles // 2 and np.array_equal(pairs.words, -(-t.words // 2))
    assert s.kind == "paired" and s.chunks == t.count and (s.chunk_lanes == 2).all()
    assert s.horizon == endpoint_lower_bound(pairs)
    assert paired_lower_bound(t) <= s.horizon <= 1.02 * paired_lower_bound(t)


def test_pair_level_merges_destination_pairs() -> None:
    from ipu_stack.exchange.paired import pair_level

    # sorted rows and an unsorted one; transfer 1 includes its source's partner (tile 3)
    t = Transfers.from_lists(8, [0, 2, 5], [[2, 3, 6, 7], [3, 4, 5], [1, 0, 3, 2]], [5, 4, 3])
    pairs = pair_level(t)
    rows = [pairs.dst[a:b].tolist() for a, b in zip(pairs.dst_offsets[:-1], pairs.dst_offsets[1:],
                                                     strict=True)]
    assert rows == [[1, 3], [1, 2], [0, 1]]
    assert pairs.src.tolist() == [0, 1, 2] and pairs.words.tolist() == [3, 2, 2]


def test_grid_phases_are_exact_layer_by_layer_when_paired() -> None:
    """GEMM operand phases (pair-aligned row groups, strided column groups) split into two
    replica layers: the row layer runs on the pair machine, the column layer in one lane,
    each exactly, so the horizon is the sum of the two layers' own bounds."""
    from ipu_stack.exchange.families import gemm_operands
    from ipu_stack.exchange.groups import layers, subset
    from ipu_stack.exchange.paired import pair_level

    t = gemm_operands(4000)
    s = schedule_exchange(t, paired=True)
    verify_schedule(t, s)
    expected = 0
    for rows in layers(t):
        part = subset(t, rows)
        expected += endpoint_lower_bound(pair_level(part) if pair_eligible(part).all() else part)
    assert s.horizon == expected and s.chunks == t.count
    assert set(np.unique(s.chunk_lanes).tolist()) == {1, 2}
    assert s.horizon < 0.8 * endpoint_lower_bound(t)


def test_parallel_priorities_match_sequential_runs() -> None:
    """The two priorities run on two threads; each result equals a run on its own (numba's
    generator is per thread and seeded inside the kernel), so phases stay deterministic."""
    t = random_multicast(4000, seed=9)
    s = schedule_exchange(t)
    alone = {k: schedule_multicast(t, b) for k, b in (("compact-streams", 0.3),
                                                        ("balanced-compact-streams", 1.0))}
    transfer, start, words = alone[s.kind]
    order = np.lexsort((transfer, start))
    assert np.array_equal(s.chunk_transfer, transfer[order])
    assert np.array_equal(s.chunk_start, start[order])
    assert np.array_equal(s.chunk_words, words[order])


def _brute_force_valid(t: Transfers, s) -> bool:
    """An independent judge of a (possibly paired) schedule: paint every chunk's cycles on
    per-port grids, check per-transfer order and coverage, and two-lane eligibility."""
    lanes = np.ones(s.chunks, dtype=np.int64) if s.chunk_lanes is None else s.chunk_lanes
    cycles = -(-s.chunk_words // lanes)
    if (s.chunk_start < 0).any() or (s.chunk_words < 1).any():
        return False
    horizon = int((s.chunk_start + cycles).max())
    send = np.zeros((t.tiles, horizon), dtype=np.int64)
    recv = np.zeros((t.tiles, horizon), dtype=np.int64)
    eligible = pair_eligible(t)
    for k in range(s.chunks):
        i, a, b = int(s.chunk_transfer[k]), int(s.chunk_start[k]), int(s.chunk_start[k] + cycles[k])
        if lanes[k] == 2 and not eligible[i]:
            return False
        send[t.src[i], a:b] += 1
        if lanes[k] == 2:
            send[t.src[i] ^ 1, a:b] += 1
        for d in t.dst[t.dst_offsets[i] : t.dst_offsets[i + 1]]:
            recv[d, a:b] += 1
    if send.max() > 1 or recv.max() > 1:
        return False
    for i in range(t.count):
        mine = np.flatnonzero(s.chunk_transfer == i)
        mine = mine[np.argsort(s.chunk_start[mine], kind="stable")]
        ends = s.chunk_start[mine] + cycles[mine]
        if (s.chunk_start[mine][1:] < ends[:-1]).any() or s.chunk_words[mine].sum() != t.words[i]:
            return False
    return True


@pytest.mark.parametrize("seed", range(12))
def test_verifier_agrees_with_brute_force_on_perturbed_paired_schedules(seed: int) -> None:
    from ipu_stack.exchange import Schedule, ScheduleError

    rng = np.random.default_rng(seed)
    tiles = 8
    src, dsts = [], []
    for _ in range(int(rng.integers(3, 12))):
        s0 = int(rng.integers(0, tiles))
        pairs = rng.choice([p for p in range(tiles // 2) if p != s0 // 2], int(rng.integers(1, 3)),
                           replace=False)
        d = sorted({2 * int(p) + h for p in pairs for h in (0, 1)})
        if rng.random() < 0.3:
            d = d[:-1]  # break a pair: one lane only
        src.append(s0)
        dsts.append(d)
    t = Transfers.from_lists(tiles, src, dsts, rng.integers(1, 9, len(src)).tolist())
    good = schedule_exchange(t, paired=True)
    verify_schedule(t, good)
    assert _brute_force_valid(t, good)
    for _ in range(20):
        start = good.chunk_start.copy()
        lanes = good.chunk_lanes.copy()
        k = int(rng.integers(0, good.chunks))
        if rng.random() < 0.5:
            start[k] = max(0, start[k] + int(rng.integers(-3, 4)))
        else:
            lanes[k] = 3 - lanes[k]
        cand = Schedule.from_chunks(good.lower_bound, "paired", good.chunk_transfer, start,
                                    good.chunk_words, lanes)
        expected = _brute_force_valid(t, cand)
        try:
            verify_schedule(t, cand)
            accepted = True
        except ScheduleError:
            accepted = False
        assert accepted == expected
