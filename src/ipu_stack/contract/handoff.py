"""What a hand-off between two programs moves, derived from the programs alone.

A pipeline group's output (the activation its last layer carries out) moves into the next
group's input buffer.  Both are known from the groups' typed programs: the output as the
host reads it (``HostRead`` pieces: blocks on the sending group's tiles) and the input as
the host would write it (``HostWrite``: blocks, with replicas, on the receiving group's
tiles).  Every overlap of a sent block with a received block is one transfer.  The compile
derives the transfers from the programs it made; the device side derives them again from
the programs it loaded and checks they are the package's, so two programs that disagree on
a hand-off (its shape, bytes or order) never run together.
"""

from __future__ import annotations

import numpy as np

from ipu_stack.contract.program import DeviceProgram, HostRead, HostWrite, StreamLayout
from ipu_stack.exchange import Transfers
from ipu_stack.ir.layout import WORD, round_up
from ipu_stack.util.errors import PackageError


def _blocks(layout: StreamLayout, tiles: np.ndarray, origin: tuple[int, int]) -> list[tuple]:
    """``(row0, row1, col0, col1, tiles)`` of every block, in tensor coordinates."""
    placed = layout.on(tiles)
    out = []
    for i in range(tiles.shape[0]):
        for j in range(tiles.shape[1]):
            r0, r1, c0, c1 = placed.block_extent(i, j)
            holders = tiles[i, j][tiles[i, j] >= 0]
            if r1 > r0 and c1 > c0 and holders.size:
                out.append((r0 + origin[0], r1 + origin[0], c0 + origin[1], c1 + origin[1],
                            holders))
    return out


def handoff_transfers(sender: DeviceProgram, tensor: str, receiver: DeviceProgram,
                      input_name: str, send_base: int, receive_base: int,
                      chip_tiles: int) -> tuple[Transfers, int]:
    """The transfers that move ``tensor`` from ``sender``'s output pieces into
    ``receiver``'s input ``input_name`` (tiles offset by each group's base); also the
    bytes one copy of the tensor holds."""
    reads = [s for s in sender.program("run") if isinstance(s, HostRead)
             and s.tensor == tensor and s.checkpoint is None]
    writes = [s for s in receiver.program("run") if isinstance(s, HostWrite)
              and s.tensor == input_name]
    if not reads or len(writes) != 1:
        raise PackageError(f"hand-off of {tensor}: the groups' programs do not read it out "
                            "and write it in")
    write = writes[0]
    if (reads[0].layout.precision != write.layout.precision):
        raise PackageError(f"hand-off of {tensor}: sent as {reads[0].layout.precision}, "
                            f"received as {write.layout.precision}")
    item = write.layout.precision.itemsize
    received = _blocks(write.layout, write.tiles, (0, 0))
    src, dsts, words = [], [], []
    for read in reads:
        for r0, r1, c0, c1, holders in _blocks(read.layout, read.tiles, read.origin):
            for q0, q1, p0, p1, takers in received:
                rows = min(r1, q1) - max(r0, q0)
                cols = min(c1, p1) - max(c0, p0)
                if rows <= 0 or cols <= 0:
                    continue
                src.append(int(holders[0]) + send_base)
                dsts.append([int(t) + receive_base for t in takers])
                words.append(rows * round_up(cols * item, WORD) // WORD)
    nbytes = write.layout.rows * write.layout.cols * item
    return Transfers.from_lists(chip_tiles, src, dsts, words), nbytes


def same_transfers(a: Transfers, b: Transfers) -> bool:
    """The same transfers in the same order: sources, destinations and words."""
    return all(np.array_equal(x, y) for x, y in (
        (a.src, b.src), (a.dst_offsets, b.dst_offsets), (a.dst, b.dst), (a.words, b.words)))


__all__ = ["handoff_transfers", "same_transfers"]
