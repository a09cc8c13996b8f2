"""The overlap walk of a layout conversion, compiled: every (destination block, source block)
pair that overlaps becomes transfers, in one loop over blocks.

A tower's compile converts layouts hundreds of times, each over thousands of block pairs;
as a Python loop this was the compile's largest cost.  :func:`walk` runs the same loop in
numba twice: once to count what it will emit (and to find the first problem, in loop
order), once to fill the arrays.  ``transfers.add_layout_transfers`` turns the result into
the builder's transfers and on-tile copies, or the problem into its ``CompileError``.
"""

from __future__ import annotations

import numba
import numpy as np

# problem codes, first found in loop order
NOWHERE, UNALIGNED, SPLIT_WORD, OVERRUN = 1, 2, 3, 4


@numba.njit(cache=True, nogil=True)
def _walk(dst_tiles, src_tiles, dst_shape, d_block, src_shape, s_block, shift, item, s_pitch,
          d_pitch, fill, t_src, t_off, t_words, t_fan, d_tile, d_off, local):
    """One pass of the walk; with ``fill`` the output arrays are written, else only
    counted.  Returns ``(transfers, destinations, local copies, problem, a, b)``."""
    dst_rows, dst_cols = dst_shape
    src_rows, src_cols = src_shape
    d_rb, d_cb = d_block
    s_rb, s_cb = s_block
    row_shift_base, col_shift = shift  # dst origin - src origin, rows and columns
    n_t = 0
    n_d = 0
    n_l = 0
    for i in range(dst_tiles.shape[0]):
        for j in range(dst_tiles.shape[1]):
            r0 = max(i * d_rb + row_shift_base, 0)
            r1 = min(min(i * d_rb + d_rb, dst_rows) + row_shift_base, src_rows)
            c0 = max(j * d_cb + col_shift, 0)
            c1 = min(min(j * d_cb + d_cb, dst_cols) + col_shift, src_cols)
            if r0 >= r1 or c0 >= c1:
                continue
            block_col_end = min((j + 1) * d_cb, dst_cols) + col_shift
            for si in range(r0 // s_rb, (r1 - 1) // s_rb + 1):
                rr0 = max(r0, si * s_rb)
                rr1 = min(r1, (si + 1) * s_rb)
                first = rr0 - si * s_rb
                rows = rr1 - rr0
                row_shift = si * s_rb - row_shift_base - i * d_rb
                for sj in range(c0 // s_cb, (c1 - 1) // s_cb + 1):
                    cc0 = max(c0, sj * s_cb)
                    cc1 = min(c1, (sj + 1) * s_cb)
                    holders = 0
                    for r in range(src_tiles.shape[2]):
                        if src_tiles[si, sj, r] >= 0:
                            holders += 1
                    if holders == 0:
                        return n_t, n_d, n_l, NOWHERE, si, sj
                    pick = (i + j) % holders
                    source = -1
                    for r in range(src_tiles.shape[2]):
                        if src_tiles[si, sj, r] >= 0:
                            if pick == 0:
                                source = src_tiles[si, sj, r]
                                break
                            pick -= 1
                    s_col = (cc0 - sj * s_cb) * item
                    d_col = (cc0 - col_shift - j * d_cb) * item
                    if s_col % 4:
                        return n_t, n_d, n_l, UNALIGNED, s_col, 0
                    if d_col % 4:
                        return n_t, n_d, n_l, UNALIGNED, d_col, 0
                    length = (cc1 - cc0) * item
                    if length % 4:
                        if cc1 != src_cols or cc1 != block_col_end:
                            return n_t, n_d, n_l, SPLIT_WORD, 0, 0
                        length += 4 - length % 4
                    if length > s_pitch - s_col or length > d_pitch - d_col:
                        return n_t, n_d, n_l, OVERRUN, 0, 0
                    count = rows
                    if length == s_pitch and length == d_pitch:  # whole rows: one transfer
                        count = 1
                        length *= rows
                    replicas = 0
                    keep = 0
                    for r in range(dst_tiles.shape[2]):
                        tile = dst_tiles[i, j, r]
                        if tile >= 0:
                            replicas += 1
                            if tile != source:
                                keep += 1
                    if keep:
                        if fill:
                            for k in range(count):
                                s_off = (first + k) * s_pitch + s_col
                                at = (first + k + row_shift) * d_pitch + d_col
                                t_src[n_t + k] = source
                                t_off[n_t + k] = s_off
                                t_words[n_t + k] = length // 4
                                t_fan[n_t + k] = keep
                                for r in range(dst_tiles.shape[2]):
                                    tile = dst_tiles[i, j, r]
                                    if tile >= 0 and tile != source:
                                        d_tile[n_d] = tile
                                        d_off[n_d] = at
                                        n_d += 1
                        else:
                            n_d += count * keep
                        n_t += count
                    if keep != replicas:  # the source is a destination: an on-tile copy
                        if fill:
                            local[n_l, 0] = source
                            local[n_l, 1] = first * s_pitch + s_col
                            local[n_l, 2] = (first + row_shift) * d_pitch + d_col
                            local[n_l, 3] = count
                            local[n_l, 4] = length
                        n_l += 1
    return n_t, n_d, n_l, 0, 0, 0


def walk(dst_tiles: np.ndarray, src_tiles: np.ndarray, dst_shape: tuple[int, int],
         d_block: tuple[int, int], src_shape: tuple[int, int], s_block: tuple[int, int],
         shift: tuple[int, int], item: int, s_pitch: int, d_pitch: int
         ) -> tuple[tuple[np.ndarray, ...], np.ndarray, tuple[int, int, int]]:
    """Transfers ``(src tile, src offset, words, fanout, dst tiles, dst offsets)``, on-tile
    copies ``[n, 5]`` (tile, src offset, dst offset, rows, row bytes) and the first problem
    ``(code, a, b)`` (code 0: none; then the outputs hold everything before it)."""
    dst_tiles = np.ascontiguousarray(dst_tiles, dtype=np.int64)
    src_tiles = np.ascontiguousarray(src_tiles, dtype=np.int64)
    shape = (np.int64(dst_shape[0]), np.int64(dst_shape[1]))
    args = (dst_tiles, src_tiles, shape, (np.int64(d_block[0]), np.int64(d_block[1])),
            (np.int64(src_shape[0]), np.int64(src_shape[1])),
            (np.int64(s_block[0]), np.int64(s_block[1])),
            (np.int64(shift[0]), np.int64(shift[1])), np.int64(item), np.int64(s_pitch),
            np.int64(d_pitch))
    empty = np.zeros(0, dtype=np.int64)
    n_t, n_d, n_l, problem, a, b = _walk(*args, False, empty, empty, empty, empty, empty, empty,
                                         np.zeros((0, 5), dtype=np.int64))
    out = tuple(np.empty(n, dtype=np.int64) for n in (n_t, n_t, n_t, n_t, n_d, n_d))
    local = np.empty((n_l, 5), dtype=np.int64)
    _walk(*args, True, *out, local)
    return out, local, (int(problem), int(a), int(b))
