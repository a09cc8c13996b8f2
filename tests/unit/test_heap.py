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


@pytest.mark.skipif(platform.system() != "Linux", reason="/proc/self/smaps")
def test_tile_memory_is_zeroed_in_small_pages_and_mapped_on_touch() -> None:
    """Zeroed, writable, its own pages (two arrays do not share), not marked for huge
    pages, and only the pages written are resident."""
    import numpy as np

    first, second = heap.zeroed_pages(64, 1 << 16), heap.zeroed_pages(64, 1 << 16)
    assert first.shape == (64, 1 << 16) and first.dtype == np.uint8 and not first.any()
    first[3, 5] = 7
    assert int(first.sum()) == 7 and not second.any()
    start = first.ctypes.data
    with open("/proc/self/smaps") as smaps:
        lines = smaps.read().splitlines()
    def span(line: str) -> tuple[int, int] | None:
        word = line.split()[0]
        if ":" in word or "-" not in word:
            return None
        low, high = word.split("-")
        return int(low, 16), int(high, 16)

    header = next(i for i, line in enumerate(lines)
                  if (bounds := span(line)) and bounds[0] <= start < bounds[1])
    fields = {}
    for line in lines[header + 1:]:
        if span(line):
            break
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    # kB: the one page written (the kernel may have joined both arrays' mappings), not 8 MiB
    assert int(fields["Rss"].split()[0]) <= 64
    assert "nh" in fields["VmFlags"].split()  # MADV_NOHUGEPAGE


def test_an_empty_tile_memory_is_an_empty_array() -> None:
    assert heap.zeroed_pages(0, 5).shape == (0, 5)
