"""Keep freed arrays in the process heap for reuse, instead of returning them to the OS.

A simulated run allocates and frees tens of thousands of arrays of a few kilobytes to tens of
megabytes (a tile group's operands, a pass's products).  glibc serves those above its mmap
threshold with fresh mappings and unmaps them on free, so every one is paid for again in page
faults: on a virtual machine a first touch runs at under 1 GB/s, against 7-8 GB/s for memory
the process already holds (``benchmarks/bench_speed.py``; docs/benchmarks.md).  Raising the
mmap threshold to glibc's maximum (32 MiB) and the trim threshold to 1 GiB lets freed blocks
be reused; the peak RSS of a run is unchanged (it is set by what is live at once).

Elsewhere (another C library, or no ``mallopt``) this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import lru_cache

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's largest (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD = 1 << 30


@lru_cache(maxsize=1)
def keep_freed_memory() -> bool:
    """Set the thresholds once per process; whether the C library took them."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
