"""Exchange transfers that move a tensor from one block layout to another.

For every destination block and every source block it overlaps, the overlap rectangle is
copied row by row; rows that are whole stored rows in both layouts merge into one transfer
(``merge_copies``).  All replicas of a destination block receive the same bytes at the same
offset, so they become the destinations of one multicast transfer.  Column offsets and
lengths must be whole words: layouts are built so they are, and a violation is a compile
error rather than a silent overwrite of a neighbouring element.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ipu_stack.ir.layout import WORD, BlockLayout, round_up
from ipu_stack.lowering.program import Exchange
from ipu_stack.util.errors import CompileError


@dataclass(frozen=True)
class LocalCopy:
    """Rows a tile copies from one of its buffers to another (it cannot send to itself)."""

    tile: int
    src_buf: int
    src_off: int
    src_pitch: int
    dst_buf: int
    dst_off: int
    dst_pitch: int
    rows: int
    row_bytes: int


class TransferBuilder:
    """Accumulates transfers for one exchange phase as arrays (and on-tile copies)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.local: list[LocalCopy] = []
        self.src: list[np.ndarray] = []
        self.words: list[np.ndarray] = []
        self.dst_count: list[np.ndarray] = []
        self.dst: list[np.ndarray] = []
        # row-by-row transfers to one replica set, kept as given and turned into arrays in
        # bulk (a layout conversion adds hundreds of thousands of them)
        self.rows: list[tuple[int, int, np.ndarray, int, np.ndarray, int, np.ndarray]] = []

    def add_rows(self, src_tile: int, src_buf: int, src_off: np.ndarray, words: int,
                 dst_tiles: np.ndarray, dst_buf: int, dst_off: np.ndarray) -> None:
        """:meth:`add` for one source tile, one word count and 1-D destinations."""
        self.rows.append((src_tile, src_buf, src_off, words, dst_tiles, dst_buf, dst_off))

    def _flush_rows(self) -> None:
        """Turn the pending :meth:`add_rows` calls into transfer arrays, all at once."""
        if not self.rows:
            return
        rows, self.rows = self.rows, []
        n = np.array([len(r[2]) for r in rows], dtype=np.int64)
        k = np.array([len(r[4]) for r in rows], dtype=np.int64)
        call = np.repeat(np.arange(len(rows)), n)
        column = np.array([[r[0], r[1], r[3], r[5]] for r in rows], dtype=np.int64)
        src = np.stack([column[call, 0], column[call, 1],
                        np.concatenate([np.asarray(r[2], dtype=np.int64) for r in rows])], axis=1)
        fanout = k[call]
        tiles = np.concatenate([np.asarray(r[4], dtype=np.int64) for r in rows])
        starts = (np.cumsum(k) - k)[call]
        ends = np.cumsum(fanout)
        within = np.arange(int(ends[-1]) if len(ends) else 0) - np.repeat(ends - fanout, fanout)
        dst_off = np.concatenate([np.asarray(r[6], dtype=np.int64) for r in rows])
        dst = np.stack([tiles[np.repeat(starts, fanout) + within],
                        np.repeat(column[call, 3], fanout), np.repeat(dst_off, fanout)], axis=1)
        self.src.append(src)
        self.words.append(column[call, 2])
        self.dst_count.append(fanout)
        self.dst.append(dst)

    def add(
        self,
        src_tile: np.ndarray,
        src_buf: int,
        src_off: np.ndarray,
        words: np.ndarray,
        dst_tiles: np.ndarray,
        dst_buf: int,
        dst_off: np.ndarray,
    ) -> None:
        """Add ``n`` transfers, each to the same ``len(dst_tiles)`` tiles.

        ``src_tile``, ``src_off``, ``words``, ``dst_off`` have length ``n`` (or broadcast);
        ``dst_tiles`` is ``[n, k]`` or ``[k]`` (the same destinations for every transfer).
        """
        self._flush_rows()  # keep the order transfers were added in
        words = np.atleast_1d(np.asarray(words, dtype=np.int64))
        n = max(len(words), len(np.atleast_1d(src_off)), len(np.atleast_1d(dst_off)))
        words = np.broadcast_to(words, (n,))
        dst_tiles = np.asarray(dst_tiles, dtype=np.int32)
        if dst_tiles.ndim == 1:
            dst_tiles = np.broadcast_to(dst_tiles, (n, len(dst_tiles)))
        k = dst_tiles.shape[1]
        src = np.stack(
            [
                np.broadcast_to(np.asarray(src_tile, dtype=np.int64), (n,)),
                np.full(n, src_buf, dtype=np.int64),
                np.broadcast_to(np.asarray(src_off, dtype=np.int64), (n,)),
            ],
            axis=1,
        )
        dst = np.stack(
            [
                dst_tiles.astype(np.int64).ravel(),
                np.full(n * k, dst_buf, dtype=np.int64),
                np.repeat(np.broadcast_to(np.asarray(dst_off, dtype=np.int64), (n,)), k),
            ],
            axis=1,
        )
        self.src.append(src)
        self.words.append(np.array(words))
        self.dst_count.append(np.full(n, k, dtype=np.int64))
        self.dst.append(dst)

    def most_received(self) -> int:
        """The most transfers any one tile receives (each costs it an exchange-table entry)."""
        self._flush_rows()
        if not self.dst:
            return 0
        return int(np.bincount(np.concatenate(self.dst)[:, 0]).max())

    def absorb(self, other: TransferBuilder) -> None:
        """Take over ``other``'s transfers and local copies (a trial built separately)."""
        self._flush_rows()
        other._flush_rows()
        self.src += other.src
        self.words += other.words
        self.dst_count += other.dst_count
        self.dst += other.dst
        self.local += other.local

    def build(self) -> Exchange:
        self._flush_rows()
        if not self.src:
            empty = np.zeros(0, dtype=np.int64)
            return Exchange(self.name, empty.astype(np.int32), empty, empty, empty,
                            np.zeros(1, dtype=np.int64), empty.astype(np.int32), empty, empty)
        src = np.concatenate(self.src)
        dst = np.concatenate(self.dst)
        counts = np.concatenate(self.dst_count)
        offsets = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        return Exchange(
            self.name,
            src_tile=src[:, 0].astype(np.int32),
            src_buf=src[:, 1],
            src_off=src[:, 2],
            words=np.concatenate(self.words),
            dst_offsets=offsets,
            dst_tile=dst[:, 0].astype(np.int32),
            dst_buf=dst[:, 1],
            dst_off=dst[:, 2],
        )


def _check_aligned(byte_offset: int, what: str) -> None:
    if byte_offset % WORD:
        raise CompileError(f"layout conversion of {what} is not word aligned (offset {byte_offset})")


def add_layout_transfers(
    builder: TransferBuilder,
    what: str,
    src: BlockLayout,
    src_buf: int,
    dst: BlockLayout,
    dst_buf: int,
    src_origin: tuple[int, int] = (0, 0),
    dst_origin: tuple[int, int] = (0, 0),
) -> None:
    """Transfers that fill ``dst`` (every replica) with what ``src`` holds of it.

    Both layouts cover windows of one tensor: ``src`` the rectangle at ``src_origin``,
    ``dst`` the one at ``dst_origin`` (tensor coordinates).  Only the overlap is moved, so a
    destination assembled from several source pieces takes one call per piece.
    """
    if src.precision != dst.precision:
        raise CompileError(f"layout conversion of {what} changes precision")
    item = src.precision.itemsize
    s_rb, s_cb = src.row_block, src.col_block
    s_pitch, d_pitch = src.pitch, dst.pitch  # properties: computed once, not per row block
    d_rb, d_cb = dst.row_block, dst.col_block
    (sr, sc), (dr, dc) = src_origin, dst_origin
    d_rows, d_cols = dst.grid
    # each source block's replicas (tiles holding it), found once
    holders: dict[tuple[int, int], np.ndarray] = {}
    whole_rows = np.arange(max(s_rb, 1), dtype=np.int64)
    src_cols, add_rows = src.cols, builder.add_rows
    for i in range(d_rows):
        for j in range(d_cols):
            r0, r1, c0, c1 = dst.block_extent(i, j)
            # the block in source-local coordinates, clipped to the source window
            r0, r1 = max(r0 + dr - sr, 0), min(r1 + dr - sr, src.rows)
            c0, c1 = max(c0 + dc - sc, 0), min(c1 + dc - sc, src.cols)
            if r0 >= r1 or c0 >= c1:
                continue
            replicas = dst.tiles[i, j]
            replicas = replicas[replicas >= 0]
            others: dict[int, np.ndarray] = {}
            block_col_end = min((j + 1) * d_cb, dst.cols) + dc - sc
            for si in range(r0 // s_rb, (r1 - 1) // s_rb + 1):
                rr0 = r0 if r0 > si * s_rb else si * s_rb
                rr1 = r1 if r1 < (si + 1) * s_rb else (si + 1) * s_rb
                first = rr0 - si * s_rb
                rows = whole_rows[first : first + rr1 - rr0]
                row_shift = si * s_rb + sr - dr - i * d_rb
                for sj in range(c0 // s_cb, (c1 - 1) // s_cb + 1):
                    cc0 = c0 if c0 > sj * s_cb else sj * s_cb
                    cc1 = c1 if c1 < (sj + 1) * s_cb else (sj + 1) * s_cb
                    source_replicas = holders.get((si, sj))
                    if source_replicas is None:
                        source_replicas = src.tiles[si, sj]
                        source_replicas = holders[si, sj] = source_replicas[source_replicas >= 0]
                    if len(source_replicas) == 0:
                        raise CompileError(f"layout conversion of {what}: block {si},{sj} "
                                           "is stored nowhere")
                    source = int(source_replicas[(i + j) % len(source_replicas)])
                    s_col = (cc0 - sj * s_cb) * item
                    d_col = (cc0 + sc - dc - j * d_cb) * item
                    if s_col % WORD or d_col % WORD:
                        _check_aligned(s_col, what)
                        _check_aligned(d_col, what)
                    length = (cc1 - cc0) * item
                    if length % WORD:
                        if cc1 != src_cols or cc1 != block_col_end:
                            raise CompileError(f"layout conversion of {what} splits a word")
                        length = round_up(length, WORD)
                    if length > s_pitch - s_col or length > d_pitch - d_col:
                        raise CompileError(f"layout conversion of {what} overruns a row")
                    if length == s_pitch == d_pitch:
                        # whole rows in both layouts: one contiguous transfer (merge_copies)
                        s_off = rows[:1] * s_pitch + s_col
                        d_off = (rows[:1] + row_shift) * d_pitch + d_col
                        length *= rr1 - rr0
                    else:
                        s_off = rows * s_pitch + s_col
                        d_off = (rows + row_shift) * d_pitch + d_col
                    keep = others.get(source)
                    if keep is None:
                        keep = others[source] = replicas[replicas != source]
                    if len(keep):
                        add_rows(source, src_buf, s_off, length // WORD, keep, dst_buf, d_off)
                    if len(keep) != len(replicas):
                        # the source tile is itself a destination: an on-tile copy kernel
                        builder.local.append(
                            LocalCopy(source, src_buf, int(s_off[0]), s_pitch, dst_buf,
                                      int(d_off[0]), d_pitch, len(s_off), length)
                        )
