"""Checks of a :class:`~ipu_stack.memory.placement.Placement` against its program and target.

Why: the first fit places tiles by signature and hands its addresses to code generation,
the memory reports and the device's allocation map; a wrong address there is silent until
two values share bytes in a run.  The pipeline runs this between stages when
``CompileOptions.verify_stages`` is set (or ``IPU_STACK_VERIFY_STAGES`` is).  What it checks:

* the address table has a row per buffer and a column per tile, and the support sizes a
  column per tile;
* every buffer has an address on exactly the tiles that hold it;
* every buffer lies inside its memory class's address range, above its tile's support
  memory, at its class's alignment;
* no two buffers live at the same step overlap in bytes on a tile (lifetimes are inclusive
  step ranges, as placement reads them).

Tiles with the same column of addresses and the same support size are checked once, as
placement places them once.  A failure is one :class:`~ipu_stack.util.errors.CompileError`
line naming the stage, the tile and the buffers.
"""

from __future__ import annotations

import numpy as np

from ipu_stack.lowering.program import Program
from ipu_stack.memory.placement import Placement
from ipu_stack.target import MemoryClass, Target
from ipu_stack.util.errors import CompileError


def _fail(stage: str, problem: str) -> None:
    raise CompileError(f"{stage}: {problem}")


def _shapes(program: Program, placement: Placement, target: Target, stage: str) -> None:
    expected = (len(program.buffers), target.tiles)
    if placement.addresses.shape != expected:
        _fail(stage, f"the address table is {placement.addresses.shape}, not {expected} "
                     "(buffers, tiles)")
    if placement.support_bytes.shape != (target.tiles,):
        _fail(stage, f"support sizes for {placement.support_bytes.shape} tiles, not "
                     f"{target.tiles}")


def _held(program: Program, placement: Placement, stage: str) -> None:
    """Addresses exactly where the buffers are."""
    member = np.zeros(placement.addresses.shape, dtype=bool)
    for buffer in program.buffers:
        member[buffer.id, buffer.tiles] = True
    wrong = member != (placement.addresses >= 0)
    if wrong.any():
        buffer_id, tile = (int(i) for i in np.argwhere(wrong)[0])
        buffer = program.buffers[buffer_id]
        _fail(stage, f"buffer {buffer_id} ({buffer.name!r}) "
                     f"{'has no address' if member[buffer_id, tile] else 'has an address'} on "
                     f"tile {tile}, which {'holds' if member[buffer_id, tile] else 'does not hold'}"
                     " it")


def _bounds(program: Program, placement: Placement, target: Target, stage: str) -> None:
    """Class range, support memory and alignment, for every placed (buffer, tile)."""
    buffer_ids, tiles = np.nonzero(placement.addresses >= 0)
    address = placement.addresses[buffer_ids, tiles]
    nbytes = np.array([b.nbytes for b in program.buffers], dtype=np.int64)[buffer_ids]
    interleaved = np.array([b.memory_class is MemoryClass.INTERLEAVED
                            for b in program.buffers], dtype=bool)[buffer_ids]
    lo = np.where(interleaved, target.class_range(MemoryClass.INTERLEAVED)[0],
                  target.class_range(MemoryClass.STANDARD)[0])
    hi = np.where(interleaved, target.class_range(MemoryClass.INTERLEAVED)[1],
                  target.class_range(MemoryClass.STANDARD)[1])
    align = np.where(interleaved, target.alignment(MemoryClass.INTERLEAVED),
                     target.alignment(MemoryClass.STANDARD))
    support_end = target.memory_base + placement.support_bytes[tiles]
    checks = (
        (address < lo, "starts below its memory class's range"),
        (address + nbytes > hi, "ends beyond its memory class's range"),
        (address < support_end, "overlaps the tile's support memory"),
        (address % align != 0, "is not aligned for its memory class"),
    )
    for bad, why in checks:
        if bad.any():
            k = int(np.argmax(bad))
            buffer = program.buffers[int(buffer_ids[k])]
            _fail(stage, f"buffer {buffer.id} ({buffer.name!r}, {buffer.memory_class.value}, "
                         f"{buffer.nbytes} bytes) at {int(address[k])} on tile {int(tiles[k])} "
                         f"{why} (support ends at {int(support_end[k])})")


def _overlaps(program: Program, placement: Placement, stage: str) -> None:
    """No two buffers live at one step share a byte on a tile."""
    nbytes = np.array([b.nbytes for b in program.buffers], dtype=np.int64)
    first = np.array([b.first for b in program.buffers], dtype=np.int64)
    last = np.array([b.last for b in program.buffers], dtype=np.int64)
    _, columns = np.unique(placement.addresses.T, axis=0, return_index=True)
    for tile in sorted(columns.tolist()):  # the lowest tile of each distinct column
        column = placement.addresses[:, tile]
        present = np.flatnonzero((column >= 0) & (nbytes > 0))
        order = present[np.argsort(column[present], kind="stable")]
        start, end = column[order], column[order] + nbytes[order]
        # each buffer against the later-starting ones that begin before it ends
        stop = np.searchsorted(start, end, side="left")
        counts = np.maximum(stop - np.arange(len(order)) - 1, 0)
        if not counts.any():
            continue
        left = np.repeat(np.arange(len(order)), counts)
        right = left + 1 + (np.arange(len(left)) - np.repeat(np.cumsum(counts) - counts, counts))
        a, b = order[left], order[right]
        clash = (first[a] <= last[b]) & (first[b] <= last[a])
        if clash.any():
            k = int(np.argmax(clash))
            x, y = program.buffers[int(a[k])], program.buffers[int(b[k])]
            _fail(stage, f"buffers {x.id} ({x.name!r}, steps {x.first}-{x.last}) and {y.id} "
                         f"({y.name!r}, steps {y.first}-{y.last}) share bytes on tile {tile}: "
                         f"[{int(column[x.id])}, {int(column[x.id]) + x.nbytes}) and "
                         f"[{int(column[y.id])}, {int(column[y.id]) + y.nbytes})")


def verify_placement(program: Program, placement: Placement, target: Target,
                     stage: str = "placement") -> None:
    """Raise a one-line :class:`CompileError` (``stage: problem``) at the first thing wrong
    with ``placement`` of ``program`` on ``target``; return nothing when all is well."""
    _shapes(program, placement, target, stage)
    _held(program, placement, stage)
    _bounds(program, placement, target, stage)
    _overlaps(program, placement, stage)
