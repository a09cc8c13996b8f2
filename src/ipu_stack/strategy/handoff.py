"""The activation hand-offs between pipeline groups: an exchange phase on a chip, or a
transfer over the IPU-Link to the next chip.

The transfers come from the groups' typed programs (``contract.handoff``).  Between two
groups of one chip they are on the chip's tile numbers (each group's tiles offset by its
base), and the exchange scheduler gives the phase its chunk schedule, which the package
carries and the device side verifies and prices like any other phase.  Between the last
group of one chip and the first of the next, the sending tiles' blocks go out over the
cable to the receiving card's tiles, in the package's order; the device side checks that
both chips' programs agree on that order and prices the bytes at the link's rate
(``device.pricing.link_cycles``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ipu_stack.exchange import Schedule, Transfers


def _transfer_arrays(prefix: str, transfers: Transfers) -> dict[str, np.ndarray]:
    return {
        prefix + "src_tile": transfers.src.astype(np.int32),
        prefix + "dst_offsets": transfers.dst_offsets.astype(np.int64),
        prefix + "dst_tile": transfers.dst.astype(np.int32),
        prefix + "words": transfers.words.astype(np.int64),
    }


def handoff_record(transfers: Transfers, schedule: Schedule, sender: int, receiver: int,
                   tensor: str, nbytes: int) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The package's record of an on-chip hand-off and its arrays (transfers and chunk
    schedule)."""
    prefix = f"handoff.{sender}."
    arrays = {
        **_transfer_arrays(prefix, transfers),
        prefix + "chunk_transfer": schedule.chunk_transfer.astype(np.int64),
        prefix + "chunk_start": schedule.chunk_start.astype(np.int64),
        prefix + "chunk_words": schedule.chunk_words.astype(np.int64),
    }
    record = {"from": sender, "to": receiver, "tensor": tensor, "bytes": nbytes,
              "transfers": int(len(transfers.words)), "lower_bound": int(schedule.lower_bound),
              "kind": schedule.kind}
    return record, arrays


def link_record(transfers: Transfers, sender: int, receiver: int, chips: tuple[int, int],
                tensor: str, nbytes: int) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The package's record of a hand-off over the IPU-Link from chip ``chips[0]`` to
    ``chips[1]`` and its arrays (the transfers in the order the link carries them; tile
    numbers are each chip's own)."""
    record = {"from": sender, "to": receiver, "tensor": tensor, "bytes": nbytes,
              "transfers": int(len(transfers.words)), "link": True,
              "from_chip": chips[0], "to_chip": chips[1],
              "link_bytes": int(transfers.words.sum()) * 4}
    return record, _transfer_arrays(f"handoff.{sender}.", transfers)


__all__ = ["handoff_record", "link_record"]
