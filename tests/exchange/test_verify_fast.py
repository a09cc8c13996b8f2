"""The linear-time verifier and validator: every path still names the first violation.

The verifier lays destination entries out in one of two ways (padded rows when fan-outs
are similar, a segmented gather otherwise) and the validator clears increasing destination
lists without sorting; each path is forced here and compared with a pure-Python reference
that spells out the documented order (ports by tile, then start, then chunk index).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ipu_stack.exchange import (
    ExchangeError,
    Schedule,
    ScheduleError,
    Transfers,
    endpoint_lower_bound,
    verify_schedule,
)
from ipu_stack.exchange import model as model_module
from ipu_stack.exchange.families import gemm_operands, random_multicast
from ipu_stack.exchange.model import MAX_WORDS

Chunk = tuple[int, int, int]


def _reference_validate(t: Transfers) -> str | None:
    """The first bad transfer by the documented rules, one transfer at a time."""
    offsets, dst = t.dst_offsets.tolist(), t.dst.tolist()
    for i in range(t.count):
        d, s, w = dst[offsets[i] : offsets[i + 1]], int(t.src[i]), int(t.words[i])
        for bad, text in (
            (not 0 <= s < t.tiles, "source tile out of range"),
            (not 1 <= w <= MAX_WORDS, f"words must be between 1 and {MAX_WORDS}"),
            (not d, "no destination"),
            (any(not 0 <= x < t.tiles for x in d), "destination tile out of range"),
            (s in d, "source among its destinations"),
            (len(set(d)) != len(d), "duplicate destination"),
        ):
            if bad:
                return f"invalid transfer {i}: {text} (src={s} dst={d} words={w} tiles={t.tiles})"
    return None


def _reference_ports(t: Transfers, chunks: list[Chunk]) -> str | None:
    """First port overlap: entries sorted by (tile, start, chunk index, destination slot)."""
    offsets = t.dst_offsets.tolist()
    for name in ("send", "receive"):
        entries = []
        for k, (tr, start, words) in enumerate(chunks):
            ports = [int(t.src[tr])] if name == "send" else t.dst[offsets[tr] : offsets[tr + 1]].tolist()
            entries += [(tile, start, k, j, tr, start + words) for j, tile in enumerate(ports)]
        entries.sort()
        for a, b in zip(entries, entries[1:], strict=False):
            if a[0] == b[0] and b[1] < a[5]:
                return (
                    f"{name} port overlap: tile {a[0]} cycle {b[1]} used by transfer {a[4]} "
                    f"(cycles {a[1]}..{a[5]}) and transfer {b[4]} (from cycle {b[1]})"
                )
    return None


def _overlap(port: str, tile: int, cycle: int, a: int, a_cycles: tuple[int, int], b: int) -> str:
    return (
        f"{port} port overlap: tile {tile} cycle {cycle} used by transfer {a} "
        f"(cycles {a_cycles[0]}..{a_cycles[1]}) and transfer {b} (from cycle {cycle})"
    )


def _schedule(t: Transfers, chunks: list[Chunk]) -> Schedule:
    arr = np.array(chunks, dtype=np.int64).reshape(-1, 3)
    horizon = int((arr[:, 1] + arr[:, 2]).max()) if len(chunks) else 0
    return Schedule(horizon, endpoint_lower_bound(t), "test", arr[:, 0], arr[:, 1], arr[:, 2])


def _verify_message(t: Transfers, chunks: list[Chunk]) -> str | None:
    try:
        verify_schedule(t, _schedule(t, chunks))
    except ScheduleError as error:
        return str(error)
    return None


def _padded(t: Transfers, chunks: list[Chunk]) -> bool:
    """Whether the verifier takes the padded-rows layout for this schedule, by its documented
    rule (``exchange/verify.py``): padding every chunk to the largest fan-out at most doubles
    the destination entries (the 8 tiles here always fit a narrow tile type)."""
    fan = t.fanout[_schedule(t, chunks).chunk_transfer]
    return 0 < len(fan) * int(fan.max(initial=0)) <= 2 * int(fan.sum())


def _case(
    dsts: list[list[int]], src: list[int], words: list[int], chunks: list[Chunk], fillers: int
) -> tuple[Transfers, list[Chunk]]:
    """A case on tiles 0..5 plus ``fillers`` unicasts 6 -> 7 after it: many fan-out-1
    transfers make the padded layout too wasteful, so fillers force the segmented one."""
    base = max(s + w for _, s, w in chunks) + 1
    src = src + [6] * fillers
    dsts = dsts + [[7]] * fillers
    words = words + [1] * fillers
    chunks = chunks + [(len(dsts) - fillers + i, base + i, 1) for i in range(fillers)]
    return Transfers.from_lists(8, src, dsts, words), chunks


LAYOUTS = pytest.mark.parametrize(("fillers", "padded"), [(0, True), (12, False)])


@LAYOUTS
def test_multicast_overlapping_on_one_destination_only(fillers: int, padded: bool) -> None:
    t, chunks = _case(
        [[2, 3, 4], [4], [1], [5]],
        [0, 1, 5, 0],
        [3, 2, 1, 2],
        [(0, 0, 3), (1, 2, 2), (2, 0, 1), (3, 3, 2)],
        fillers,
    )
    assert _padded(t, chunks) is padded
    expected = _overlap("receive", 4, 2, 0, (0, 3), 1)
    assert _verify_message(t, chunks) == expected == _reference_ports(t, chunks)


@LAYOUTS
@pytest.mark.parametrize("swap", [False, True])
def test_ties_in_start_name_chunks_in_chunk_order(fillers: int, padded: bool, swap: bool) -> None:
    raw = [(0, 0, 2), (1, 0, 2), (2, 0, 1)]
    t, chunks = _case(
        [[3], [3], [4, 5, 1]], [0, 1, 2], [2, 2, 1], raw[1::-1] + raw[2:] if swap else raw, fillers
    )
    assert _padded(t, chunks) is padded
    first, second = (1, 0) if swap else (0, 1)
    expected = _overlap("receive", 3, 0, first, (0, 2), second)
    assert _verify_message(t, chunks) == expected == _reference_ports(t, chunks)


@LAYOUTS
def test_send_port_tie(fillers: int, padded: bool) -> None:
    t, chunks = _case([[1, 2, 3], [4, 5]], [0, 0], [2, 1], [(1, 0, 1), (0, 0, 2)], fillers)
    assert _padded(t, chunks) is padded
    expected = _overlap("send", 0, 0, 1, (0, 1), 0)
    assert _verify_message(t, chunks) == expected == _reference_ports(t, chunks)


@LAYOUTS
def test_lowest_tile_wins_over_earliest_cycle(fillers: int, padded: bool) -> None:
    # tile 5 clashes at cycle 1, tile 2 only at cycle 10; chunks on other ports start in between
    t, chunks = _case(
        [[5], [5], [2], [2, 3, 0], [1, 4], [4]],
        [0, 1, 4, 1, 3, 3],
        [3, 1, 12, 4, 2, 2],
        [(0, 0, 3), (1, 1, 1), (2, 0, 12), (3, 10, 4), (4, 4, 2), (5, 6, 2)],
        fillers,
    )
    assert _padded(t, chunks) is padded
    expected = _overlap("receive", 2, 10, 2, (0, 12), 3)
    assert _verify_message(t, chunks) == expected == _reference_ports(t, chunks)


@LAYOUTS
def test_long_interval_covering_later_ones(fillers: int, padded: bool) -> None:
    t, chunks = _case(
        [[3], [3], [3], [1, 2, 4]],
        [0, 1, 2, 0],
        [10, 1, 1, 1],
        [(2, 5, 1), (0, 0, 10), (1, 2, 1), (3, 10, 1)],
        fillers,
    )
    assert _padded(t, chunks) is padded
    expected = _overlap("receive", 3, 2, 0, (0, 10), 1)
    assert _verify_message(t, chunks) == expected == _reference_ports(t, chunks)


@LAYOUTS
def test_port_boundaries_are_not_overlaps(fillers: int, padded: bool) -> None:
    # tile 2 busy 5..9 and tile 3 busy 0..2 are neighbours in the tile-sorted order
    t, chunks = _case([[2], [3], [2, 3, 5]], [0, 1, 4], [4, 2, 3], [(0, 5, 4), (1, 0, 2), (2, 9, 3)], fillers)
    assert _padded(t, chunks) is padded
    assert _verify_message(t, chunks) is None


@LAYOUTS
def test_split_transfer_chunk_overlaps(fillers: int, padded: bool) -> None:
    # transfer 0 runs as two chunks; its second chunk hits transfer 1 on tile 4 only
    t, chunks = _case([[3, 4, 5], [4]], [0, 1], [4, 2], [(0, 0, 1), (0, 5, 3), (1, 6, 2)], fillers)
    assert _padded(t, chunks) is padded
    expected = _overlap("receive", 4, 6, 0, (5, 8), 1)
    assert _verify_message(t, chunks) == expected == _reference_ports(t, chunks)


def test_wide_tile_numbers_take_the_exact_wide_path() -> None:
    t = Transfers.from_lists(70_000, [0, 1], [[69_999, 5], [69_999]], [3, 2])
    expected = _overlap("receive", 69999, 1, 0, (0, 3), 1)
    assert _verify_message(t, [(0, 0, 3), (1, 1, 2)]) == expected


def test_unvalidated_duplicate_destination_overlaps_itself() -> None:
    t = Transfers.from_lists(4, [0], [[3, 3]], [2])
    expected = _overlap("receive", 3, 0, 0, (0, 2), 0)
    assert _verify_message(t, [(0, 0, 2)]) == expected


@st.composite
def _scheduled(draw) -> tuple[Transfers, list[Chunk]]:
    """Valid instances with chunks that pass the field and coverage checks (split transfers
    in order) but whose starts are random, so port overlaps and ties are common."""
    tiles = draw(st.integers(2, 9))
    n = draw(st.integers(1, 14))
    src, dsts, words, chunks = [], [], [], []
    for i in range(n):
        s = draw(st.integers(0, tiles - 1))
        others = [x for x in range(tiles) if x != s]
        dsts.append(draw(st.lists(st.sampled_from(others), min_size=1, max_size=4, unique=True)))
        src.append(s)
        words.append(draw(st.integers(1, 5)))
        cut = draw(st.integers(0, words[-1] - 1))
        at = draw(st.integers(0, 12))
        for size in (cut, words[-1] - cut):
            if size:
                chunks.append((i, at, size))
                at += size + draw(st.integers(0, 3))
    order = draw(st.permutations(range(len(chunks))))
    return Transfers.from_lists(tiles, src, dsts, words), [chunks[k] for k in order]


@settings(max_examples=300, deadline=None)
@given(_scheduled())
def test_property_port_check_matches_reference(case: tuple[Transfers, list[Chunk]]) -> None:
    t, chunks = case
    assert _verify_message(t, chunks) == _reference_ports(t, chunks)


@pytest.mark.parametrize("seed", range(3))
def test_larger_perturbed_schedules_match_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    t = random_multicast(400, tiles=64, seed=seed)
    start = np.cumsum(t.words) - t.words
    chunks = [(i, int(s), int(w)) for i, (s, w) in enumerate(zip(start, t.words, strict=True))]
    assert _verify_message(t, chunks) is None
    for _ in range(20):
        k = int(rng.integers(1, t.count))
        moved = chunks.copy()
        moved[k] = (k, max(0, moved[k][1] - int(rng.integers(1, 60))), moved[k][2])
        assert _verify_message(t, moved) == _reference_ports(t, moved)


def _validate_message(t: Transfers) -> str | None:
    try:
        t.validate()
    except ExchangeError as error:
        return str(error)
    return None


@pytest.mark.parametrize(
    ("dsts", "src", "words", "expected"),
    [
        # sorted lists: the neighbour comparison alone settles them
        ([[1, 2, 3], [1, 3, 3], [1, 2]], [0, 0, 0], [1, 1, 1], "invalid transfer 1: duplicate destination"),
        # unsorted, duplicate not adjacent: found by the sort fallback
        ([[1, 2, 3], [3, 1, 2, 3], [1]], [0, 0, 0], [1, 1, 1], "invalid transfer 1: duplicate destination"),
        # an unsorted but valid list before a sorted duplicate
        ([[3, 1], [1, 2, 2]], [0, 0], [1, 1], "invalid transfer 1: duplicate destination"),
        # unsorted, no duplicate anywhere
        ([[3, 1, 2], [2, 1], [3]], [0, 0, 0], [1, 1, 1], None),
        # a duplicate before an out-of-range tile
        ([[1, 1], [9]], [0, 0], [1, 1], "invalid transfer 0: duplicate destination"),
        # range beats duplicate in the same transfer
        ([[2, 9, 2]], [0], [1], "invalid transfer 0: destination tile out of range"),
        # source among its destinations beats duplicate in the same transfer
        ([[1, 0, 1]], [0], [1], "invalid transfer 0: source among its destinations"),
        # tile 4 of transfer 0 and tile 0 of transfer 1 share the old key owner*tiles+dst
        ([[4], [0, 1]], [1, 2], [1, 1], "invalid transfer 0: destination tile out of range"),
        # a later duplicate loses to an earlier bad word count, an earlier one wins
        ([[1], [2, 2], [3]], [0, 0, 0], [1, 1, 0], "invalid transfer 1: duplicate destination"),
        ([[1], [2, 2], [3]], [0, 0, 0], [0, 1, 1],
         f"invalid transfer 0: words must be between 1 and {MAX_WORDS}"),
        ([[1], [2]], [0, 0], [1, MAX_WORDS + 1],  # more than a tile holds
         f"invalid transfer 1: words must be between 1 and {MAX_WORDS}"),
        ([[], [2, 2]], [0, 0], [1, 1], "invalid transfer 0: no destination"),
        # both in the sort: the first transfer wins, not the first tile
        ([[1, 1], [2, 2]], [0, 0], [1, 1], "invalid transfer 0: duplicate destination"),
        ([[3, 1, 3], [2, 1, 2]], [0, 0], [1, 1], "invalid transfer 0: duplicate destination"),
        ([[1], [-1, 2], [3, 3]], [0, 0, 0], [1, 1, 1], "invalid transfer 1: destination tile out of range"),
    ],
)
def test_validate_names_first_violation(dsts, src, words, expected: str | None) -> None:
    t = Transfers.from_lists(4, src, dsts, words)
    message = _validate_message(t)
    assert message == _reference_validate(t)
    assert (message is None) if expected is None else message.startswith(expected + " (")


def test_validate_wide_tiles_duplicate() -> None:
    t = Transfers.from_lists(70_000, [0, 0], [[69_999, 5], [69_999, 7, 69_999]], [1, 1])
    assert _validate_message(t) == _reference_validate(t)
    assert _validate_message(t).startswith("invalid transfer 1: duplicate destination")


@st.composite
def _raw_instances(draw) -> Transfers:
    """Instances that are often invalid in one or several ways at once."""
    tiles = draw(st.integers(1, 8))
    n = draw(st.integers(0, 10))
    tile = st.integers(-1, tiles)
    dsts = [draw(st.lists(tile, min_size=0, max_size=5)) for _ in range(n)]
    if draw(st.booleans()):
        dsts = [sorted(d) for d in dsts]
    src = [draw(tile) for _ in range(n)]
    words = [draw(st.integers(0, 3)) for _ in range(n)]
    return Transfers.from_lists(tiles, src, dsts, words)


@settings(max_examples=400, deadline=None)
@given(_raw_instances())
def test_property_validate_matches_reference(t: Transfers) -> None:
    assert _validate_message(t) == _reference_validate(t)


@pytest.mark.parametrize("family", [gemm_operands, random_multicast])
def test_family_instances_validate(family) -> None:
    t = family(3000, seed=4)
    t.validate()
    bad = Transfers.from_arrays(t.tiles, t.src, t.dst_offsets, t.dst.copy(), t.words)
    k = int(np.flatnonzero(t.fanout[2500:] >= 2)[0]) + 2500
    row = slice(int(t.dst_offsets[k]), int(t.dst_offsets[k + 1]))
    bad.dst[row] = bad.dst[row][::-1]
    bad.dst[int(t.dst_offsets[k + 1]) - 1] = bad.dst[row][0]
    assert _validate_message(bad) == _reference_validate(bad)
    assert _validate_message(bad).startswith(f"invalid transfer {k}: duplicate destination")


def test_increasing_lists_skip_the_sort(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_sort(*args: object) -> int:
        raise AssertionError("strictly increasing destination lists must not be sorted")

    monkeypatch.setattr(model_module, "_first_duplicate_list", no_sort)
    gemm_operands(3000, seed=1).validate()
    Transfers.from_lists(4, [0, 1], [[1, 2], [0, 3]], [1, 1]).validate()  # 2 -> 0 spans two lists
