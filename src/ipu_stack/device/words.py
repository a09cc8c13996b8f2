"""Exchange data movement on the simulated tile memories, compiled with numba.

An exchange phase moves whole 32-bit words: transfer ``t`` reads ``words[t]`` words from its
source and writes them to each of its destinations (``dst_offsets[t]:dst_offsets[t + 1]``).
All reads happen before any write, as on the chip, where a phase's sends leave their tiles
before the receives land: :func:`move_words` first gathers every source into one staging
buffer, then scatters.  Two plain loops over the words, instead of building gather and
scatter index arrays (several int64 arrays the size of the phase) and indexing with them.
"""

from __future__ import annotations

import numba
import numpy as np

from ipu_stack.kernels.base import copy_elements


@numba.njit(cache=True, nogil=True)
def _move(memory: np.ndarray, src_word: np.ndarray, words: np.ndarray,
          dst_offsets: np.ndarray, dst_word: np.ndarray) -> None:
    staged = np.empty(int(words.sum()), dtype=memory.dtype)
    at = 0
    for t in range(src_word.size):
        start, count = src_word[t], words[t]
        copy_elements(memory[start : start + count], staged[at : at + count])
        at += count
    at = 0
    for t in range(src_word.size):
        count = words[t]
        for d in range(dst_offsets[t], dst_offsets[t + 1]):
            start = dst_word[d]
            copy_elements(staged[at : at + count], memory[start : start + count])
        at += count


def move_words(memory: np.ndarray, src_word: np.ndarray, words: np.ndarray,
               dst_offsets: np.ndarray, dst_word: np.ndarray) -> None:
    """Copy every transfer's words from ``src_word`` (flat word index into ``memory``, a
    ``uint32`` view of all tiles) to each of its destinations' ``dst_word``."""
    _move(memory, np.asarray(src_word, dtype=np.int64), np.asarray(words, dtype=np.int64),
          np.asarray(dst_offsets, dtype=np.int64), np.asarray(dst_word, dtype=np.int64))
