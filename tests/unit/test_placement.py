"""Storage placement: no live overlap, memory classes, alignment, support region, failures."""

from __future__ import annotations

import numpy as np
import pytest

from ipu_stack.lowering.program import Program
from ipu_stack.memory.placement import place_storage
from ipu_stack.target import IPU21, MemoryClass
from ipu_stack.util.errors import PlacementError

BASE = 0x4C000
END = 949168
INTERLEAVED = 0x80000
STD, ILV = MemoryClass.STANDARD, MemoryClass.INTERLEAVED


def program_with(buffers: list[tuple[list[int], int, MemoryClass, int, int]]) -> Program:
    program = Program()
    for n, (tiles, nbytes, cls, first, last) in enumerate(buffers):
        bid = program.add_buffer(f"buf{n}", np.array(tiles), nbytes, cls, f"test buffer {n}")
        program.buffers[bid].first, program.buffers[bid].last = first, last
    return program


def check_invariants(program: Program, placement, support: np.ndarray) -> None:
    addresses = placement.addresses
    for b in program.buffers:
        on = np.zeros(IPU21.tiles, dtype=bool)
        on[b.tiles] = True
        assert np.all(addresses[b.id, ~on] == -1), f"{b.name} placed on a tile it is not on"
        assert np.all(addresses[b.id, on] >= 0), f"{b.name} not placed"
    for tile in np.unique(np.concatenate([b.tiles for b in program.buffers])):
        here = [b for b in program.buffers if addresses[b.id, tile] >= 0]
        for b in here:
            lo = int(addresses[b.id, tile])
            hi = lo + b.nbytes
            assert lo >= BASE + support[tile], "overlaps the support region"
            assert hi <= END, "runs past the end of tile memory"
            if b.memory_class is ILV:
                assert lo >= INTERLEAVED and lo % 32 == 0
            else:
                assert lo % 8 == 0
        for x in here:
            for y in here:
                if x.id >= y.id or not (x.first <= y.last and y.first <= x.last):
                    continue
                xl, yl = int(addresses[x.id, tile]), int(addresses[y.id, tile])
                assert xl + x.nbytes <= yl or yl + y.nbytes <= xl, (
                    f"tile {tile}: live {x.name} and {y.name} overlap"
                )


def test_random_programs_place_without_live_overlap() -> None:
    rng = np.random.default_rng(12)
    for _ in range(4):
        specs = []
        for _ in range(int(rng.integers(5, 14))):
            tiles = sorted(rng.choice(24, size=int(rng.integers(1, 8)), replace=False).tolist())
            first = int(rng.integers(0, 10))
            last = first + int(rng.integers(0, 5))
            cls = ILV if rng.random() < 0.4 else STD
            specs.append((tiles, int(rng.integers(1, 30000)), cls, first, last))
        program = program_with(specs)
        support = np.zeros(IPU21.tiles, dtype=np.int64)
        support[:24] = rng.integers(1, 40, 24) * 32
        placement = place_storage(program, support, IPU21)
        check_invariants(program, placement, support)


def test_standard_below_interleaved_and_dead_bytes_are_reused() -> None:
    support = np.full(IPU21.tiles, 8192, dtype=np.int64)
    program = program_with(
        [
            ([7], 150_000, STD, 0, 1),
            ([7], 150_000, STD, 2, 3),  # dead while the first is live: may share its bytes
            ([7], 40_000, ILV, 0, 3),
            ([7, 8], 1000, STD, 0, 3),
        ]
    )
    placement = place_storage(program, support, IPU21)
    check_invariants(program, placement, support)
    a = placement.addresses[:, 7]
    assert a[0] == a[1] == BASE + 8192  # lowest free aligned address, reused
    assert a[2] == INTERLEAVED
    assert BASE + 8192 + 150_000 <= a[3] < INTERLEAVED
    assert placement.addresses[3, 8] == BASE + 8192  # tile 8 has a different signature
    # peak: support + the most bytes live at once (150000 + 40000 + 1000)
    assert placement.peak_bytes[7] == 8192 + 191_000
    assert placement.peak_bytes[8] == 8192 + 1000
    np.testing.assert_array_equal(placement.address(-1, np.array([7, 8])), [0, 0])


def test_standard_buffer_spills_above_interleaved_base_when_it_must() -> None:
    support = np.zeros(IPU21.tiles, dtype=np.int64)
    program = program_with([([0], 200_000, STD, 0, 0), ([0], 100_000, STD, 0, 0)])
    placement = place_storage(program, support, IPU21)
    check_invariants(program, placement, support)
    assert placement.addresses[0, 0] == BASE
    # only 12992 bytes remain below 0x80000: the second goes to the first free place anywhere
    assert placement.addresses[1, 0] == BASE + 200_000
    assert placement.addresses[1, 0] + 100_000 > INTERLEAVED


def test_placement_failure_names_tile_class_and_size() -> None:
    support = np.zeros(IPU21.tiles, dtype=np.int64)
    program = program_with([([736, 737], 700_000, STD, 0, 0)])
    with pytest.raises(
        PlacementError,
        match="placement failed: tile 736 has insufficient Ipu21Standard SRAM for 700000 bytes",
    ) as info:
        place_storage(program, support, IPU21)
    assert "value='buf0'" in info.value.details
    assert "type=test buffer 0" in info.value.details
    assert "alignment=8" in info.value.details


def test_interleaved_failure_when_only_standard_memory_is_free() -> None:
    support = np.full(IPU21.tiles, 1024, dtype=np.int64)
    # 424880 bytes exist at or above 0x80000; 500000 would fit overall but not there
    program = program_with([([3], 500_000, ILV, 0, 0)])
    with pytest.raises(
        PlacementError,
        match="placement failed: tile 3 has insufficient Ipu21Interleaved SRAM for 500000 bytes",
    ):
        place_storage(program, support, IPU21)


def test_live_buffers_that_together_overflow_fail_but_fit_when_lifetimes_split() -> None:
    support = np.zeros(IPU21.tiles, dtype=np.int64)
    both_live = program_with([([9], 400_000, STD, 0, 2), ([9], 300_000, STD, 1, 3)])
    with pytest.raises(PlacementError, match="tile 9 has insufficient Ipu21Standard SRAM"):
        place_storage(both_live, support, IPU21)
    disjoint = program_with([([9], 400_000, STD, 0, 1), ([9], 300_000, STD, 2, 3)])
    placement = place_storage(disjoint, support, IPU21)
    check_invariants(disjoint, placement, support)


def test_longest_lived_first_places_what_largest_first_fragments(monkeypatch) -> None:
    """Largest first puts the 370 000-byte late transient at the bottom, the long-lived
    190 000 above it, and leaves the 130 000 of step 0 two holes of 110 000 and 77 872
    though 580 000 of 637 872 bytes are live; packing the long-lived buffer low first
    places all four."""
    import ipu_stack.memory.placement as placement_module

    support = np.zeros(IPU21.tiles, dtype=np.int64)
    specs = [([5], 190_000, STD, 0, 2), ([5], 260_000, STD, 0, 0), ([5], 130_000, STD, 0, 1),
             ([5], 370_000, STD, 2, 3)]
    largest_first = placement_module.PLACEMENT_ORDERS[:1]
    monkeypatch.setattr(placement_module, "PLACEMENT_ORDERS", largest_first)
    with pytest.raises(PlacementError, match="tile 5 has insufficient Ipu21Standard SRAM for "
                                             "130000 bytes"):
        place_storage(program_with(specs), support, IPU21)
    monkeypatch.undo()
    program = program_with(specs)
    placement = place_storage(program, support, IPU21)
    check_invariants(program, placement, support)
    assert placement.addresses[:, 5].tolist() == [BASE, BASE + 320_000, BASE + 190_000,
                                                  BASE + 190_000]


def test_program_order_places_what_both_other_orders_fragment(monkeypatch) -> None:
    """Four buffers of 270 000 (step 0), 150 000 (0-1), 230 000 (1-3) and 310 000 (2-3)
    bytes in 637 872.  Largest first leaves the 150 000 holes of 40 000 and 97 872; longest
    lived first leaves the 270 000 holes of 230 000 and 257 872; in program order each
    transient goes low beside the ones that died before it, and all four place."""
    import ipu_stack.memory.placement as placement_module

    support = np.zeros(IPU21.tiles, dtype=np.int64)
    specs = [([5], 270_000, STD, 0, 0), ([5], 150_000, STD, 0, 1), ([5], 230_000, STD, 1, 3),
             ([5], 310_000, STD, 2, 3)]
    orders = placement_module.PLACEMENT_ORDERS
    for alone, size in ((orders[:1], 150_000), (orders[1:2], 270_000)):
        monkeypatch.setattr(placement_module, "PLACEMENT_ORDERS", alone)
        with pytest.raises(PlacementError, match=f"tile 5 has insufficient Ipu21Standard SRAM "
                                                 f"for {size} bytes"):
            place_storage(program_with(specs), support, IPU21)
    monkeypatch.undo()
    program = program_with(specs)
    placement = place_storage(program, support, IPU21)
    check_invariants(program, placement, support)
    assert placement.addresses[:, 5].tolist() == [BASE, BASE + 270_000, BASE,
                                                  BASE + 230_000]


def test_shortfall_is_the_most_unplaced_bytes_live_at_one_step() -> None:
    """The figure is the largest over the tiles, and counts unplaced buffers only where their
    lifetimes overlap: tile 4 of the second program misses a 300 KB and a 310 KB buffer that
    are never live together, so it is short 310 KB, not 610 KB."""
    support = np.zeros(IPU21.tiles, dtype=np.int64)
    program = program_with([([4], 300_000, STD, 0, 3), ([4], 300_000, STD, 0, 1),
                            ([4], 310_000, STD, 2, 3),
                            ([5], 800_000, STD, 0, 0), ([5], 200_000, STD, 0, 0)])
    with pytest.raises(PlacementError) as info:
        place_storage(program, support, IPU21)
    # tile 4 places all three by lifetime; tile 5's 800 KB buffer fits nowhere
    assert info.value.tile == 5 and info.value.shortfall == 800_000
    program = program_with([([4], 600_000, STD, 0, 3), ([4], 300_000, STD, 0, 1),
                            ([4], 310_000, STD, 2, 3)])
    with pytest.raises(PlacementError) as info:
        place_storage(program, support, IPU21)
    assert info.value.tile == 4 and info.value.shortfall == 310_000


def test_retry_gives_up_what_placement_missed_and_more_each_try() -> None:
    from ipu_stack.pipeline import (
        MIN_RETRY_STEP,
        NEAR_MISS,
        NEAR_MISS_TRIES,
        RETRY_MARGIN,
        retry_proportion,
    )

    usable = 500_000
    failure = PlacementError("test")
    failure.planned_bytes, failure.shortfall = 490_000, 128
    # a few bytes short: just under what the failed plans were estimated at
    assert retry_proportion(failure, 1.0, usable) == pytest.approx(
        (490_000 - 128) / usable - RETRY_MARGIN, abs=1e-3)
    failure.shortfall = 100_000  # far short: one jump, not twenty small steps
    assert retry_proportion(failure, 1.0, usable) == pytest.approx(0.775, abs=1e-3)
    failure.planned_bytes, failure.shortfall = 300_000, 0  # the plans were far under budget
    assert retry_proportion(failure, 1.0, usable) == pytest.approx(0.595, abs=1e-3)
    unknown = PlacementError("test")  # no estimate: the minimum step, doubled per try
    assert retry_proportion(unknown, 0.9, usable, tries=1) == 0.9 - MIN_RETRY_STEP
    assert retry_proportion(unknown, 0.9, usable, tries=3) == pytest.approx(
        0.9 - 4 * MIN_RETRY_STEP)
    # a near miss on an early try keeps the smallest step; later ones double again
    near = PlacementError("test")
    near.planned_bytes, near.shortfall = 480_000, NEAR_MISS
    assert retry_proportion(near, 0.9, usable, tries=2) == pytest.approx(0.9 - MIN_RETRY_STEP)
    assert retry_proportion(near, 0.9, usable, tries=NEAR_MISS_TRIES + 1) == pytest.approx(
        0.9 - 2 ** NEAR_MISS_TRIES * MIN_RETRY_STEP)
    near.shortfall = NEAR_MISS + 1
    assert retry_proportion(near, 0.9, usable, tries=2) == pytest.approx(
        0.9 - 2 * MIN_RETRY_STEP)


def test_a_compile_whose_plans_did_not_place_keeps_the_faster_of_two_chains(monkeypatch) -> None:
    """``Tries.leaner``: the tries again with wide column blocks are kept only where they
    place and schedule faster than the first chain (or where it placed nothing); a graph
    without a GEMM the wide blocks would change is not tried again."""
    from pathlib import Path
    from types import SimpleNamespace

    from ipu_stack.phases.state import CompileOptions
    from ipu_stack.pipeline import LEAN_TABLE_ROWS, Tries
    from ipu_stack.workloads import get_workload

    workload = get_workload("siglip-mlp")
    params = workload.resolve({"tokens": 2048, "dim": 64, "hidden": 96})
    tall, _ = workload.build(params)  # 2,048 rows a GEMM
    short, _ = workload.build(workload.resolve({"tokens": 64, "dim": 64, "hidden": 96}))

    def chain(cycles):
        placed = None if cycles is None else SimpleNamespace(estimate={"cycles": cycles})
        return (None if cycles is None else "build", None, placed,
                SimpleNamespace(failure=PlacementError("no room")))

    asked = []
    for first, lean, kept in [(100, 90, 90), (100, 110, 100), (None, 120, 120),
                              (100, None, 100)]:
        tries = Tries(workload, params, Path("."), None, {"graph": tall}, (), 0.45)
        monkeypatch.setattr(tries, "place", lambda options, dump, leanest, reports, lean=lean:
                            asked.append((options.lean_table_rows, leanest, reports))
                            or chain(lean))
        assert tries.leaner(CompileOptions(), chain(first), None)[2].estimate["cycles"] == kept
    # the leanest plans (the slowest) are tried only where the first chain placed nothing;
    # the second chain never writes failure reports (the first chain's program or failure
    # is the one the compile reports)
    assert asked == [(LEAN_TABLE_ROWS, False, False), (LEAN_TABLE_ROWS, False, False),
                     (LEAN_TABLE_ROWS, True, False), (LEAN_TABLE_ROWS, False, False)]
    tries = Tries(workload, params, Path("."), None, {"graph": short}, (), 0.45)
    monkeypatch.setattr(tries, "place", lambda options, dump, leanest, reports:
                        pytest.fail("again"))
    first = chain(100)
    assert tries.leaner(CompileOptions(), first, None) is first


def test_attempts_remember_a_placement_failure_and_plan_for_less_memory() -> None:
    """A placement failure plans for less memory and is remembered (the compile then tries
    the wide column blocks too); a failure that is not placement's is raised."""
    from types import SimpleNamespace

    from ipu_stack.phases.state import CompileOptions
    from ipu_stack.pipeline import Attempts
    from ipu_stack.util.errors import CompileError

    build = SimpleNamespace(plans=[])  # no plans of a decode step run side by side
    attempt = Attempts(CompileOptions(), 1.0, 0.45, 500_000)
    failure = PlacementError("test")
    failure.planned_bytes, failure.shortfall = 490_000, 1_664
    attempt.after(failure, build)
    assert attempt.placement_failed and attempt.proportion < 1.0 and attempt.tries == 1
    assert attempt.options.lean_table_rows == 0
    with pytest.raises(CompileError):
        attempt.after(CompileError("no tiling"), build)


def test_attempts_try_the_leanest_plans_when_less_memory_leaves_none() -> None:
    """After a placement failure, a retry whose budget is below the leanest plans plans for
    the leanest plans' bytes, once; where those do not place, the error says how many tiles
    are over and by how much (the support memory the planner does not count)."""
    from types import SimpleNamespace

    import numpy as np

    from ipu_stack.memory.placement import Placement
    from ipu_stack.phases.state import CompileOptions
    from ipu_stack.pipeline import Attempts
    from ipu_stack.planning.fit import DoesNotFit
    from ipu_stack.target import get_target
    from ipu_stack.util.errors import CompileError

    target = get_target("ipu21")
    capacity = target.memory_end - target.memory_base
    build = SimpleNamespace(plans=[], target=target)
    usable = 500_000
    attempt = Attempts(CompileOptions(fuse_window=0), 1.0, 0.45, usable)
    failure = PlacementError("first plans")
    failure.planned_bytes, failure.shortfall = 490_000, 250_000
    attempt.after(failure, build)
    assert attempt.proportion < 0.5 and not attempt.leanest
    attempt.after(DoesNotFit("no plan", 400_000), build)
    assert attempt.leanest and attempt.proportion == pytest.approx(0.8)
    assert attempt.proportion * usable >= 400_000
    peaks = np.array([capacity + 5_000, capacity + 120, capacity - 64, 1_000])
    last = PlacementError("placement failed: tile 0 has insufficient SRAM for 832 bytes")
    last.planned_bytes = 400_000
    last.placement = Placement(np.zeros((0, 4), np.int64), np.zeros(4, np.int64), peaks,
                               np.zeros(4, np.int64))
    with pytest.raises(CompileError, match=r"^does not fit: the leanest plans \(about 400000 "
                       r"bytes a tile.*do not place: 2 tiles need up to 5000 bytes more"):
        attempt.after(last, build)
    # leaner than the plans that did not place or nothing: the planning failure is the answer
    again = Attempts(CompileOptions(), 1.0, 0.45, usable)
    again.after(failure, build)
    with pytest.raises(DoesNotFit):
        again.after(DoesNotFit("no plan", 495_000), build)
    never = Attempts(CompileOptions(), 1.0, 0.45, usable)
    with pytest.raises(DoesNotFit):
        never.after(DoesNotFit("no plan", 400_000), build)
    placed_elsewhere = Attempts(CompileOptions(), 1.0, 0.45, usable, leanest_wanted=False)
    placed_elsewhere.after(failure, build)
    with pytest.raises(DoesNotFit):
        placed_elsewhere.after(DoesNotFit("no plan", 400_000), build)


def first_fit(buffers: list, support_end: int) -> dict[int, int]:
    """A plain first fit, largest first: each buffer at the lowest aligned address of its
    class (standard below the interleaved base where it can) clear of the support range
    and of every placed buffer live at the same time."""
    placed: dict[int, int] = {}
    for b in sorted(buffers, key=lambda b: (-b.nbytes, b.first, b.id)):
        taken = sorted([(BASE, support_end)] + [
            (placed[o.id], placed[o.id] + o.nbytes) for o in buffers
            if o.id in placed and o.first <= b.last and b.first <= o.last])
        align = IPU21.alignment(b.memory_class)
        start, end = IPU21.class_range(b.memory_class)
        windows = [(start, INTERLEAVED), (start, end)] if b.memory_class is STD else [(start, end)]
        for low, high in windows:
            cursor, at = low, None
            for lo, hi in [*taken, (high, high)]:
                candidate = -(-cursor // align) * align
                if lo > cursor and candidate + b.nbytes <= min(lo, high):
                    at = candidate
                    break
                cursor = max(cursor, hi)
            if at is not None:
                placed[b.id] = at
                break
    return placed


def test_addresses_are_a_plain_first_fit_of_a_crowded_tile() -> None:
    rng = np.random.default_rng(7)
    specs = []
    for _ in range(300):  # lifetimes that overlap in many ways: holes of every size
        first = int(rng.integers(0, 200))
        size = int(rng.integers(1, 4000)) if rng.random() < 0.9 else int(rng.integers(1, 40000))
        specs.append(([3], size, ILV if rng.random() < 0.3 else STD, first,
                      first + int(rng.integers(0, 40))))
    program = program_with(specs)
    support = np.zeros(IPU21.tiles, dtype=np.int64)
    support[3] = 12345 * 8
    placement = place_storage(program, support, IPU21)
    expected = first_fit(program.buffers, BASE + int(support[3]))
    assert len(expected) == len(program.buffers)  # the largest-first order places them all
    assert {b.id: int(placement.addresses[b.id, 3]) for b in program.buffers} == expected
    check_invariants(program, placement, support)


def test_a_compile_that_never_places_writes_its_failure_reports_once(tmp_path, monkeypatch
                                                                      ) -> None:
    """Every try places on tiles with 1 KB free beside their support, so the compile fails; the
    memory reports of what did not place are written once, when no try is left, and the
    page names the failure (a tower's page takes seconds: the tries before are not)."""
    from tests.helpers import cli, one_error_line, small

    import ipu_stack.phases.stages as stages_module

    real_place, real_page = stages_module.place_storage, stages_module.write_placement_html
    pages: list[str] = []

    def crowded(program, support, target):  # support memory takes all but 1 KB a tile
        return real_place(program, np.maximum(support, target.memory_end - target.memory_base
                                              - 1024), target)

    def page(path, *args, title: str, **kwargs) -> None:
        pages.append(title)
        real_page(path, *args, title=title, **kwargs)

    monkeypatch.setattr(stages_module, "place_storage", crowded)
    monkeypatch.setattr(stages_module, "write_placement_html", page)
    code, _, err = cli(["-v", "compile", "siglip-layer", *small("siglip-layer"), "-o",
                        str(tmp_path / "pkg"), "--cache-dir", str(tmp_path / "cache")])
    line = one_error_line(code, err)
    assert "placement failed: tile" in line
    assert err.count("planning again with less memory") >= 2
    assert len(pages) == 1 and "(failed: placement failed: tile" in pages[0]
    # the page is of the failure the compile raises
    assert line.split("placement failed: ")[1].split(" (")[0] in pages[0]
    assert "scope=failed" in err and (tmp_path / "pkg" / "memory" / "placement.html").is_file()
