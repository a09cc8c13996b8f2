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

from ipu_stack.ir.layout import WORD, BlockLayout
from ipu_stack.lowering import overlap
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

    def add_flat(self, src_tile: np.ndarray, src_buf: int, src_off: np.ndarray,
                 words: np.ndarray, fanout: np.ndarray, dst_tile: np.ndarray, dst_buf: int,
                 dst_off: np.ndarray) -> None:
        """Transfers given flat: transfer ``t`` goes to the next ``fanout[t]`` entries of
        ``dst_tile`` / ``dst_off`` (what a layout conversion's overlap walk produces)."""
        n, m = len(src_tile), len(dst_tile)
        self.src.append(np.stack([src_tile, np.full(n, src_buf, dtype=np.int64), src_off],
                                 axis=1))
        self.words.append(words)
        self.dst_count.append(fanout)
        self.dst.append(np.stack([dst_tile, np.full(m, dst_buf, dtype=np.int64), dst_off],
                                 axis=1))

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
        if not self.dst:
            return 0
        return int(np.bincount(np.concatenate(self.dst)[:, 0]).max())

    def split_multicasts(self) -> None:
        """Make every transfer to ``k`` tiles ``k`` transfers to one tile each.

        For an all-gather (each of R tiles holds one slice of a block all R need: a streamed
        plan's weights) the multicasts cannot meet their own bound: while a slice's holder
        sends to its R - 1 peers, they all listen to it, so R - 1 other slices wait.  As
        unicasts every tile sends (R - 1) slices and receives (R - 1) slices, so the phase's
        bound is unchanged and the full-duplex scheduler meets it exactly (R = 3: 2/3 of
        the block's words, where the multicast schedule took the whole block's)."""
        if not self.src:
            return
        src = np.concatenate(self.src)
        fanout = np.concatenate(self.dst_count)
        self.src = [np.repeat(src, fanout, axis=0)]
        self.words = [np.repeat(np.concatenate(self.words), fanout)]
        self.dst_count = [np.ones(int(fanout.sum()), dtype=np.int64)]
        self.dst = [np.concatenate(self.dst)]

    def most_peers(self) -> int:
        """The most destinations of any transfer (0 when there are none)."""
        if not self.dst_count:
            return 0
        return int(np.concatenate(self.dst_count).max())

    def all_gather(self) -> bool:
        """Whether the phase is an all-gather: multicasts among tiles that each send to
        every tile that sends to them (each holds a slice the others need). While one of
        them multicasts, the others only listen, so the slices go one after the other;
        ``split_multicasts`` turns them into unicasts that meet the phase's bound."""
        if not self.src:
            return False
        fanout = np.concatenate(self.dst_count)
        if fanout.max() < 2:
            return False
        senders = np.repeat(np.concatenate(self.src)[:, 0], fanout)
        receivers = np.concatenate(self.dst)[:, 0]
        pairs = set(zip(senders.tolist(), receivers.tolist(), strict=True))
        return all((receiver, sender) in pairs for sender, receiver in pairs)

    def absorb(self, other: TransferBuilder) -> None:
        """Take over ``other``'s transfers and local copies (a trial built separately)."""
        self.src += other.src
        self.words += other.words
        self.dst_count += other.dst_count
        self.dst += other.dst
        self.local += other.local

    def build(self) -> Exchange:
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
    (sr, sc), (dr, dc) = src_origin, dst_origin
    (t_src, t_off, t_words, t_fan, d_tile, d_off), local, (problem, a, b) = overlap.walk(
        dst.tiles, src.tiles, (dst.rows, dst.cols), (dst.row_block, dst.col_block),
        (src.rows, src.cols), (src.row_block, src.col_block), (dr - sr, dc - sc),
        src.precision.itemsize, src.pitch, dst.pitch)
    if problem == overlap.NOWHERE:
        raise CompileError(f"layout conversion of {what}: block {a},{b} is stored nowhere")
    if problem == overlap.UNALIGNED:
        _check_aligned(a, what)
    if problem == overlap.SPLIT_WORD:
        raise CompileError(f"layout conversion of {what} splits a word")
    if problem == overlap.OVERRUN:
        raise CompileError(f"layout conversion of {what} overruns a row")
    if len(t_src):
        builder.add_flat(t_src, src_buf, t_off, t_words, t_fan, d_tile, dst_buf, d_off)
    for tile, s_off, d_at, rows, length in local.tolist():
        builder.local.append(LocalCopy(tile, src_buf, s_off, src.pitch, dst_buf, d_at,
                                       dst.pitch, rows, length))


def row_moves(index: np.ndarray, group: int, source: BlockLayout, out: BlockLayout,
              row_bytes: int) -> tuple[np.ndarray, ...]:
    """The runs that move picked rows ``index`` from ``source`` into ``out`` (both whole
    rows): ``(source tile, source offset, target tile, target offset, bytes)`` per run,
    a run being rows consecutive on both sides between the same two tiles."""
    picks = len(index)
    result_row, part = np.divmod(np.arange(picks, dtype=np.int64), group)
    src_tile = source.tiles[index // source.row_block, 0, 0].astype(np.int64)
    src_off = (index % source.row_block) * source.pitch
    dst_tile = out.tiles[result_row // out.row_block, 0, 0].astype(np.int64)
    dst_off = (result_row % out.row_block) * out.pitch + part * row_bytes
    starts = np.ones(picks, dtype=bool)
    starts[1:] = ~((src_tile[1:] == src_tile[:-1]) & (dst_tile[1:] == dst_tile[:-1])
                   & (src_off[1:] == src_off[:-1] + row_bytes)
                   & (dst_off[1:] == dst_off[:-1] + row_bytes))
    first = np.flatnonzero(starts)
    lengths = np.diff(np.append(first, picks))
    return (src_tile[first], src_off[first], dst_tile[first], dst_off[first],
            lengths * row_bytes)


def add_row_moves(builder: TransferBuilder, index: np.ndarray, group: int,
                  source: tuple[BlockLayout, int], out: tuple[BlockLayout, int],
                  row_bytes: int) -> None:
    """Transfers that put rows ``index`` of ``source`` (a whole-row layout and its buffer)
    into ``out``'s rows in turn, ``group`` a result row (:func:`row_moves`); a run that
    stays on its tile is an on-tile copy (a tile cannot send to itself).  Runs move whole
    words: a row of an odd number of halves moves as its stored row (its pitch)."""
    if row_bytes % WORD:
        raise CompileError(f"row moves carry whole words; a row of {row_bytes} bytes is not "
                           "(move the stored row, its pitch)")
    (src_layout, src_buf), (out_layout, out_buf) = source, out
    src_tile, src_off, dst_tile, dst_off, nbytes = row_moves(index, group, src_layout,
                                                             out_layout, row_bytes)
    remote = src_tile != dst_tile
    if remote.any():
        count = int(remote.sum())
        builder.add_flat(src_tile[remote], src_buf, src_off[remote], nbytes[remote] // WORD,
                         np.ones(count, dtype=np.int64), dst_tile[remote], out_buf,
                         dst_off[remote])
    for tile, s_off, d_off, size in zip(src_tile[~remote].tolist(), src_off[~remote].tolist(),
                                        dst_off[~remote].tolist(), nbytes[~remote].tolist(),
                                        strict=True):
        builder.local.append(LocalCopy(tile, src_buf, s_off, size, out_buf, d_off, size, 1,
                                       size))
