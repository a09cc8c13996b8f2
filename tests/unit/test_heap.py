"""The heap settings the simulator relies on take effect where glibc is the C library."""

from __future__ import annotations

import platform

import pytest

from ipu_stack.util import heap


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                    reason="glibc's mallopt and malloc_trim")
def test_glibc_takes_the_thresholds_and_trims() -> None:
    assert heap.keep_freed_memory() is True
    assert heap.keep_freed_memory() is True  # once per process, idempotent
    assert isinstance(heap.release_freed_memory(), bool)


def test_without_a_c_library_nothing_happens(monkeypatch: pytest.MonkeyPatch) -> None:
    heap.keep_freed_memory.cache_clear()
    monkeypatch.setattr(heap, "_libc", lambda: None)
    try:
        assert heap.keep_freed_memory() is False
        assert heap.release_freed_memory() is False
    finally:
        heap.keep_freed_memory.cache_clear()
