"""The instruction-level view of a schedule: 64-word sends, aligned starts, table bytes."""

from __future__ import annotations

import numpy as np

from ipu_stack.exchange import Schedule, Transfers, table_bytes
from ipu_stack.exchange.instructions import instruction_horizon, send_instructions


def _schedule(transfer, start, words, bound=0) -> Schedule:
    return Schedule.from_chunks(bound, "test", np.array(transfer), np.array(start),
                                np.array(words))


def test_even_starts_keep_the_scheduled_horizon() -> None:
    t = Transfers.from_lists(4, [0, 1], [[2], [3]], [10, 6])
    s = _schedule([0, 1], [0, 0], [10, 6])
    assert instruction_horizon(s, t) == (10, 0)


def test_an_odd_start_shifts_that_send_and_everything_after_it_on_the_tile() -> None:
    # tile 0 sends 3 words from event 0, then 4 words from event 3 (odd: shifted to 4, ends
    # at 8), then 2 words from event 7 (now busy until 8: starts at 8, ends at 10)
    t = Transfers.from_lists(4, [0, 0, 0], [[1], [2], [3]], [3, 4, 2])
    s = _schedule([0, 1, 2], [0, 3, 7], [3, 4, 2])
    assert s.horizon == 9
    assert instruction_horizon(s, t) == (10, 1)


def test_each_tile_is_timed_on_its_own() -> None:
    # tile 0's shift does not delay tile 1, which sends from an even event
    t = Transfers.from_lists(4, [0, 0, 1], [[2], [3], [2]], [1, 5, 4])
    s = _schedule([0, 1, 2], [0, 1, 6], [1, 5, 4])
    assert instruction_horizon(s, t) == (10, 1)


def test_long_chunks_are_cut_into_64_word_sends() -> None:
    s = _schedule([0, 0, 1], [0, 200, 0], [64, 65, 129])  # kept in (start, transfer) order
    np.testing.assert_array_equal(s.chunk_words, [64, 129, 65])
    np.testing.assert_array_equal(send_instructions(s), [1, 3, 2])


def test_table_bytes_count_sends_on_the_source_and_one_entry_per_destination() -> None:
    # transfer 0: 130 words from tile 0 to tiles 1 and 2 in one chunk (3 sends);
    # transfer 1: 10 words from tile 3 to tile 1 in two chunks (2 sends, 2 mux entries)
    t = Transfers.from_lists(4, [0, 3], [[1, 2], [1]], [130, 10])
    s = _schedule([0, 1, 1], [0, 130, 136], [130, 6, 4])
    np.testing.assert_array_equal(table_bytes(s, t), np.array([3, 1 + 2, 1, 2]) * 8)
