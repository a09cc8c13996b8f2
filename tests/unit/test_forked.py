"""``util.forked``: work in a forked child; its JSON result, its failure, its peak memory."""

from __future__ import annotations

import os

import numpy as np

from ipu_stack.util.forked import call_forked


def test_the_result_comes_back_and_the_memory_stays_with_the_child():
    parent = os.getpid()

    def work():
        big = np.ones(64 << 20, np.uint8)  # 64 MiB, touched
        return {"pid": os.getpid(), "sum": int(big.sum())}

    done = call_forked(work)
    assert done.ok and done.result["sum"] == 64 << 20
    assert done.result["pid"] != parent
    assert done.peak_bytes >= 64 << 20


def test_an_exception_in_the_child_is_named():
    def work():
        raise ValueError("bad scale")

    done = call_forked(work)
    assert not done.ok and done.failure == "ValueError: bad scale" and done.result is None


def test_a_child_that_dies_is_reported_not_waited_on():
    done = call_forked(lambda: os._exit(3))
    assert not done.ok and done.failure == "the child ended with status 3 and no result"


def test_a_result_json_cannot_carry_is_a_failure():
    done = call_forked(lambda: {1, 2})
    assert not done.ok and done.failure.startswith("TypeError: ")
