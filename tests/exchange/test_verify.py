"""Verifier rejections, each asserted by its message."""

from __future__ import annotations

import numpy as np
import pytest

from ipu_stack.exchange import Schedule, ScheduleError, Transfers, verify_schedule


def _inst() -> Transfers:
    return Transfers.from_lists(4, [0, 1, 2], [[1], [2, 3], [0]], [3, 2, 2])


def _sched(t: Transfers, chunks: list[tuple[int, int, int]], horizon: int | None = None):
    arr = np.array(chunks, dtype=np.int64).reshape(-1, 3)
    end = int((arr[:, 1] + arr[:, 2]).max()) if len(chunks) else 0
    return Schedule(horizon if horizon is not None else end, 3, "test", arr[:, 0], arr[:, 1], arr[:, 2])


def test_valid_schedule_passes() -> None:
    t = _inst()
    verify_schedule(t, _sched(t, [(0, 0, 3), (1, 0, 1), (1, 3, 1), (2, 0, 2)]))


@pytest.mark.parametrize(
    ("chunks", "message"),
    [
        ([(0, 0, 3), (1, 0, 2), (2, 0, 2), (2, 2, 1)], "doubly covered word: transfer 2"),
        ([(0, 0, 3), (1, 0, 2), (2, 0, 1)], "uncovered word: transfer 2"),
        ([(0, 0, 3), (1, 0, 2)], "uncovered word: transfer 2"),
        ([(0, 0, 3), (1, 0, 2), (2, 0, 1), (2, 0, 1)], "chunk out of order: transfer 2"),
        ([(0, 0, 3), (1, -1, 2), (2, 0, 2)], "chunk 1: negative start"),
        ([(0, 0, 3), (1, 0, 0), (1, 0, 2), (2, 0, 2)], "chunk 1: words must be >= 1"),
        ([(0, 0, 3), (1, 0, 2), (5, 0, 2)], "chunk 2: transfer index out of range"),
    ],
)
def test_rejections(chunks: list[tuple[int, int, int]], message: str) -> None:
    t = _inst()
    with pytest.raises(ScheduleError, match=message):
        verify_schedule(t, _sched(t, chunks))


def test_send_port_overlap() -> None:
    t = Transfers.from_lists(4, [0, 0], [[1], [2]], [2, 2])
    with pytest.raises(ScheduleError, match="send port overlap: tile 0 cycle 1"):
        verify_schedule(t, _sched(t, [(0, 0, 2), (1, 1, 2)]))


def test_receive_port_overlap_multicast() -> None:
    t = Transfers.from_lists(4, [0, 1], [[2, 3], [3]], [2, 2])
    with pytest.raises(ScheduleError, match="receive port overlap: tile 3 cycle 1"):
        verify_schedule(t, _sched(t, [(0, 0, 2), (1, 1, 2)]))


def test_horizon_mismatch() -> None:
    t = _inst()
    with pytest.raises(ScheduleError, match="horizon mismatch"):
        verify_schedule(t, _sched(t, [(0, 0, 3), (1, 0, 2), (2, 0, 2)], horizon=9))
