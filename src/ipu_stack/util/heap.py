"""Keep freed arrays in the process heap for reuse, instead of returning them to the OS.

A simulated run allocates and frees tens of thousands of arrays of a few kilobytes to tens of
megabytes (a tile group's operands, a pass's products).  glibc serves those above its mmap
threshold with fresh mappings and unmaps them on free, so every one is paid for again in page
faults, and on a virtual machine a first touch of fresh memory is several times slower than
a touch of memory the process already holds (``benchmarks/bench_speed.py`` prints both; the
figures: docs/benchmarks.md, "The simulator and the verdict at BLAS speed").  Raising the
mmap threshold to glibc's maximum (32 MiB) and the trim threshold to 1 GiB lets freed blocks
be reused; the peak RSS of a run is unchanged (it is set by what is live at once).

The price is that memory freed stays with the process: :func:`release_freed_memory`
hands it back (``malloc_trim``) where a phase ends and a larger one begins, as a run does
after its compile.  Elsewhere (another C library, or no ``mallopt``) both do nothing.

:func:`zeroed_pages` gives the simulator its tile memory in small pages (see there why).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import mmap
from functools import lru_cache

import numpy as np

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's largest (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD = 1 << 30


@lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


@lru_cache(maxsize=1)
def keep_freed_memory() -> bool:
    """Set the thresholds once per process; whether the C library took them."""
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def release_freed_memory() -> bool:
    """Collect garbage cycles and give the heap's free pages back to the OS; whether the
    C library could."""
    gc.collect()
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is None:
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return bool(trim(0))


def zeroed_pages(rows: int, cols: int) -> np.ndarray:
    """A zeroed ``uint8 [rows, cols]`` array in its own anonymous mapping of small pages.

    numpy asks the kernel for transparent huge pages on every large array.  Faulted in as
    huge pages, the 918 MB of a chip's tile memory stall a tower run's first write while the
    kernel compacts memory, which the run's other arrays have fragmented, to find each 2 MiB
    page; in 4 KiB pages the whole run simulates faster (the figures: docs/benchmarks.md,
    "The simulator and the verdict at BLAS speed").  Pages are still mapped on first touch,
    so a small program's memory stays small.  Where there is no anonymous ``mmap`` it is
    ``np.zeros``."""
    nbytes = rows * cols
    try:
        mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (AttributeError, OSError, ValueError):  # no POSIX mmap, or an empty array
        return np.zeros((rows, cols), dtype=np.uint8)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        mapping.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(mapping, dtype=np.uint8).reshape(rows, cols)
