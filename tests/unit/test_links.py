"""The IPU-Link between cards: its facts, the device's pricing of a hand-off from the
transfers it moved and the planner's closed form, each against figures worked out here from
the sources (31.25 GB/s each way over a cable, 1.5 GHz, the assumed hop and sync)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ipu_stack.device.pricing import link_cycles
from ipu_stack.planning.costs import estimate_link_phase
from ipu_stack.planning.groups import PipelineError, group_counts
from ipu_stack.target.links import get_system
from ipu_stack.util.errors import UsageError

CLOCK = 1.5e9
BYTES_A_CYCLE = 31.25e9 / CLOCK  # 20.83: 2 links of a 1 Tbps-bidirectional 4, each way
HOP_AND_SYNC = 1500 + 3000


def _moved(src, words, destinations):
    offsets = np.concatenate([[0], np.cumsum([len(d) for d in destinations])])
    return (np.array(src, np.int64), offsets.astype(np.int64),
            np.array([t for d in destinations for t in d], np.int64),
            np.array(words, np.int64))


def test_a_busy_sending_tile_bounds_a_small_handoff():
    # 1,010 words = 4,040 bytes: 194 cycles on the cable, but tile 0 sends 1,000 words
    cycles, moved = link_cycles(*_moved([0, 1], [1000, 10], [[5], [6, 7]]), CLOCK)
    assert moved == 4040
    assert cycles == 1000 + HOP_AND_SYNC


def test_the_cable_bounds_a_handoff_spread_over_many_tiles():
    src = list(range(1000))
    cycles, moved = link_cycles(*_moved(src, [100] * 1000, [[t] for t in src]), CLOCK)
    assert moved == 400_000
    assert cycles == math.ceil(400_000 / BYTES_A_CYCLE) + HOP_AND_SYNC  # 19,200 + 4,500


def test_a_copy_on_the_receiving_card_crosses_the_cable_once():
    one, _ = link_cycles(*_moved(list(range(500)), [200] * 500, [[t] for t in range(500)]),
                         CLOCK)
    fanned, moved = link_cycles(*_moved(list(range(500)), [200] * 500,
                                        [[t, t + 500] for t in range(500)]), CLOCK)
    assert moved == 500 * 200 * 4 and fanned == one


def test_the_planner_prices_the_cable_hop_and_sync():
    assert estimate_link_phase(400_000, CLOCK) == 19_200 + HOP_AND_SYNC
    assert estimate_link_phase(1, CLOCK) == 1 + HOP_AND_SYNC


def test_the_system_is_a_line_of_up_to_eight_cards():
    system = get_system("ipu21", 4)
    assert system.chips == 4 and system.to_json()["topology"] == "line"
    assert system.to_json()["links_per_cable"] == 2
    for chips in (0, 9):
        with pytest.raises(UsageError, match=f"--chips {chips}: a C600 cluster holds 1 to 8"):
            get_system("ipu21", chips)


def test_groups_a_chip_the_planner_tries():
    assert group_counts(40, 2) == (1, 2, 3, 4, 5, 6, 8, 9, 12)
    assert group_counts(27, 1) == (2, 3, 4, 5, 6, 8, 9, 12)  # one group on one chip is layers
    assert group_counts(50, 4) == (1, 2, 3, 4, 5, 6, 8, 9, 12)
    assert group_counts(4, 4) == (1,)
    assert group_counts(40, 4, groups=2) == (2,)
    # a run of N images fills at most N groups a chip
    assert group_counts(27, 1, most=4) == (2, 3, 4)
    assert group_counts(40, 2, most=1) == (1,)
    with pytest.raises(PipelineError, match="1 image cannot fill a pipeline of 2 or more "
                                            "groups"):
        group_counts(27, 1, most=1)
    with pytest.raises(PipelineError, match="cannot fill 4 chips"):
        group_counts(3, 4)
    with pytest.raises(PipelineError, match=r"into 12 groups \(3 on each of 4 chips\)"):
        group_counts(8, 4, groups=3)
    with pytest.raises(PipelineError, match="a pipeline of one group on one chip is the "
                                            "layers strategy"):
        group_counts(27, 1, groups=1)
    assert group_counts(27, 2, groups=1) == (1,)  # one group a chip over two chips pipelines
