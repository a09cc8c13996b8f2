"""The activation hand-off between two pipeline groups, as one exchange phase.

At the end of a pipeline step each group's output (the activation its last layer carries
out) moves into the next group's input buffer.  Both are known from the groups' typed
programs: the output as the host reads it (``HostRead`` pieces: blocks on the sending
group's tiles) and the input as the host would write it (``HostWrite``: blocks, with
replicas, on the receiving group's tiles).  Every overlap of a sent block with a received
block is one transfer, on the chip's tile numbers (each group's tiles offset by its base);
the exchange scheduler then gives the phase its chunk schedule, which the package carries and
the device side verifies and prices like any other phase.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ipu_stack.contract import DeviceProgram
from ipu_stack.contract.program import HostRead, HostWrite, StreamLayout
from ipu_stack.exchange import Schedule, Transfers
from ipu_stack.ir.layout import WORD, round_up
from ipu_stack.planning.groups import PipelineError


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
        raise PipelineError(f"hand-off of {tensor}: the groups' programs do not read it out "
                            "and write it in")
    write = writes[0]
    if (reads[0].layout.precision != write.layout.precision):
        raise PipelineError(f"hand-off of {tensor}: sent as {reads[0].layout.precision}, "
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


def handoff_record(transfers: Transfers, schedule: Schedule, sender: int, receiver: int,
                   tensor: str, nbytes: int) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The package's record of a hand-off and its arrays (transfers and chunk schedule)."""
    prefix = f"handoff.{sender}."
    arrays = {
        prefix + "src_tile": transfers.src.astype(np.int32),
        prefix + "dst_offsets": transfers.dst_offsets.astype(np.int64),
        prefix + "dst_tile": transfers.dst.astype(np.int32),
        prefix + "words": transfers.words.astype(np.int64),
        prefix + "chunk_transfer": schedule.chunk_transfer.astype(np.int64),
        prefix + "chunk_start": schedule.chunk_start.astype(np.int64),
        prefix + "chunk_words": schedule.chunk_words.astype(np.int64),
    }
    record = {"from": sender, "to": receiver, "tensor": tensor, "bytes": nbytes,
              "transfers": int(len(transfers.words)), "lower_bound": int(schedule.lower_bound),
              "kind": schedule.kind}
    return record, arrays


__all__ = ["handoff_record", "handoff_transfers"]
