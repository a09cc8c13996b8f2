"""The kernel contract: a specialised instance with a name and tile-byte semantics.

A :class:`KernelInstance` is a family plus frozen parameters; its canonical JSON is its
identity (equal parameters are the same kernel, and the package names it by its sha256).
Semantics run on the simulated tile memory (``uint8 [tiles, bytes]``) for a batch of tiles
at once: every tile of the batch runs the same instance; each operand's address is one for
all tiles or one per tile (an int array), so one kernel call of a package runs as one batch
whatever the placement gave each tile.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numba
import numpy as np

from ipu_stack.ir import rounding
from ipu_stack.ir.precision import Precision

RunFn = Callable[[dict[str, Any], np.ndarray, np.ndarray, list[int]], None]
NameFn = Callable[[dict[str, Any]], str]
AccessFn = Callable[[dict[str, Any]], list[tuple[int, int, bool]]]


@dataclass(frozen=True)
class Region:
    """Bytes a kernel touches in one operand: ``rows`` rows of ``row_bytes`` every ``pitch``
    bytes from ``offset``.  Exact, unlike an extent: row padding is not part of it, which is
    what poison mode needs to tell a read of never-written memory from padding."""

    operand: int
    offset: int
    rows: int
    row_bytes: int
    pitch: int
    writes: bool

    def byte_offsets(self) -> np.ndarray:
        rows = np.arange(self.rows, dtype=np.int64)[:, None] * self.pitch
        return (self.offset + rows + np.arange(self.row_bytes, dtype=np.int64)[None, :]).ravel()


RegionFn = Callable[[dict[str, Any]], list[Region]]


@dataclass(frozen=True)
class KernelFamily:
    """One kernel family: how to name, run and bound the accesses of its instances (what an
    instance should cost is the planner's business, ``planning.costs``; what it did cost is
    the device's, ``device.pricing``, from the work its run reports)."""

    name: str
    source: str
    code_bytes: int
    make_name: NameFn
    run: RunFn
    accesses: AccessFn  # per operand: (operand index, byte length, writes)
    regions: RegionFn  # the exact bytes read and written
    # operands the hardware only accepts in interleaved memory (the device refuses others)
    interleaved: tuple[int, ...] = ()


FAMILIES: dict[str, KernelFamily] = {}


def register(family: KernelFamily) -> KernelFamily:
    FAMILIES[family.name] = family
    return family


@dataclass(frozen=True)
class KernelInstance:
    """A family with frozen parameters; ``key`` is the sha256 of its canonical JSON."""

    family: str
    params: dict[str, Any] = field(hash=False, compare=False)
    canonical: str = field(default="", init=False)

    def __post_init__(self) -> None:
        text = json.dumps({"family": self.family, "params": self.params}, sort_keys=True)
        object.__setattr__(self, "canonical", text)

    def __hash__(self) -> int:
        return hash(self.canonical)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KernelInstance) and other.canonical == self.canonical

    @property
    def key(self) -> str:
        return hashlib.sha256(self.canonical.encode()).hexdigest()

    @property
    def impl(self) -> KernelFamily:
        return FAMILIES[self.family]

    @property
    def name(self) -> str:
        return self.impl.make_name(self.params)

    def to_json(self) -> dict[str, Any]:
        return {"family": self.family, "params": self.params}


@numba.njit(cache=True, nogil=True, inline="always")
def copy_elements(source: np.ndarray, target: np.ndarray) -> None:
    """``target[:] = source`` for two 1-D views (a row of tile memory, a transfer's words):
    a loop over the views, which the compiler vectorises, and faster than indexing both
    whole arrays inside the loop or a slice assignment (the figures: docs/benchmarks.md,
    "The simulator and the verdict at BLAS speed")."""
    for i in range(target.size):
        target[i] = source[i]


@numba.njit(cache=True, nogil=True)
def _gather(mem: np.ndarray, tiles: np.ndarray, addresses: np.ndarray, rows: int,
            row_bytes: int, pitch: int, out: np.ndarray) -> None:
    for t in range(tiles.size):
        source, base = mem[tiles[t]], addresses[t]
        block = out[t]
        for r in range(rows):
            start = base + r * pitch
            copy_elements(source[start : start + row_bytes], block[r])


@numba.njit(cache=True, nogil=True)
def _scatter(mem: np.ndarray, tiles: np.ndarray, addresses: np.ndarray, pitch: int,
             data: np.ndarray) -> None:
    row_bytes = data.shape[2]
    for t in range(tiles.size):
        target, base = mem[tiles[t]], addresses[t]
        block = data[t]
        for r in range(data.shape[1]):
            start = base + r * pitch
            copy_elements(block[r], target[start : start + row_bytes])


@numba.njit(cache=True, nogil=True, inline="always")
def _decode_row(codes: np.ndarray, item: int, table: np.ndarray, out: np.ndarray,
                add: bool) -> None:
    """One row of 1- or 2-byte little-endian codes looked up in ``table``, stored into or
    added (one float32 add each) to ``out``; loops over row views, as :func:`copy_elements`."""
    if item == 1:
        if add:
            for c in range(out.size):
                out[c] += table[codes[c]]
        else:
            for c in range(out.size):
                out[c] = table[codes[c]]
    else:
        for c in range(out.size):
            value = table[np.int64(codes[2 * c]) | (np.int64(codes[2 * c + 1]) << 8)]
            if add:
                out[c] += value
            else:
                out[c] = value


@numba.njit(cache=True, nogil=True)
def _gather_decoded(mem: np.ndarray, tiles: np.ndarray, addresses: np.ndarray, rows: int,
                    cols: int, pitch: int, item: int, table: np.ndarray,
                    out: np.ndarray, add: bool) -> None:
    """Elements of 1 or 2 bytes, each looked up in ``table``: ``out`` ``[tiles, rows,
    cols]`` gets them (``add``: ``out +=`` them, as numpy's ``+=`` of the gathered array)."""
    for t in range(tiles.size):
        source, base = mem[tiles[t]], addresses[t]
        block = out[t]
        for r in range(rows):
            start = base + r * pitch
            _decode_row(source[start : start + cols * item], item, table, block[r], add)


def per_tile(address: int | np.ndarray, tiles: np.ndarray) -> np.ndarray:
    """An operand's address on each tile of a call (int64 ``[len(tiles)]``, contiguous).
    A shared address is filled in, not broadcast: ``np.broadcast_to`` has a fixed cost a
    call far above the fill's, and a tower's run makes millions of these."""
    if isinstance(address, np.ndarray) and address.ndim == 1 and len(address) == len(tiles):
        return np.ascontiguousarray(address, dtype=np.int64)
    if isinstance(address, (int, np.integer)) or np.ndim(address) == 0:
        return np.full(len(tiles), int(address), dtype=np.int64)
    return np.ascontiguousarray(np.broadcast_to(np.asarray(address, dtype=np.int64),
                                                (len(tiles),)))


def tile_chunks(tiles: np.ndarray, addresses: list[int | np.ndarray], tile_bytes: int,
                chunk_bytes: int) -> Iterator[tuple[np.ndarray, list[np.ndarray]]]:
    """The call's tiles in chunks of about ``chunk_bytes`` (``tile_bytes`` a tile, at least
    one tile a chunk), each with its operands' per-tile addresses.

    A kernel runs a chunk at a time so that its float32 temporaries stay in cache: a whole
    call's (an attention's scores over 1458 tiles are 34 MB, above glibc's largest mmap
    threshold, ``util.heap``) would be fresh pages at every step.  Tiles are independent,
    so the chunking changes no result."""
    step = max(1, chunk_bytes // max(1, tile_bytes))
    at = [per_tile(address, tiles) for address in addresses]
    for start in range(0, len(tiles), step):
        yield tiles[start : start + step], [a[start : start + step] for a in at]


def read_rows(mem: np.ndarray, tiles: np.ndarray, address: int | np.ndarray, rows: int,
              row_bytes: int, pitch: int) -> np.ndarray:
    """``rows`` rows of ``row_bytes`` bytes every ``pitch`` bytes from ``address`` on each
    tile: ``uint8 [len(tiles), rows, row_bytes]``.  One compiled loop gathers every tile of a
    call, whatever its address (tiles of one call share parameters, not addresses)."""
    out = np.empty((len(tiles), rows, row_bytes), dtype=np.uint8)
    _gather(mem, np.asarray(tiles, dtype=np.int64), per_tile(address, tiles),
            rows, row_bytes, pitch, out)
    return out


def write_rows(
    mem: np.ndarray, tiles: np.ndarray, address: int | np.ndarray, pitch: int, data: np.ndarray
) -> None:
    """Write ``data`` (``[T, rows, row_bytes]`` uint8) as rows of ``pitch`` bytes at ``address``.

    Only the first ``row_bytes`` of each row are touched (the last row ends exactly there),
    so row padding and whatever follows the operand keep their contents.
    """
    if data.shape[1] == 0:
        return
    _scatter(mem, np.asarray(tiles, dtype=np.int64),
             per_tile(address, tiles), pitch,
             np.ascontiguousarray(data.reshape(data.shape[0], data.shape[1], -1)))


def read_matrix(
    mem: np.ndarray,
    tiles: np.ndarray,
    address: int | np.ndarray,
    rows: int,
    cols: int,
    pitch: int,
    dtype: np.dtype,
) -> np.ndarray:
    """A ``[T, rows, cols]`` matrix of ``dtype`` stored with row ``pitch`` at ``address``.

    Reads exactly ``(rows - 1) * pitch + cols * itemsize`` bytes: the operand's extent.
    """
    item = np.dtype(dtype).itemsize
    return read_rows(mem, tiles, address, rows, cols * item, pitch).view(dtype)


def _table(precision: Precision) -> np.ndarray:
    return (rounding.f16_table() if precision.kind == "F16"
            else rounding.fp8_table(precision.kind, precision.scale_exponent))


def add_values(total: np.ndarray, mem: np.ndarray, tiles: np.ndarray,
               address: int | np.ndarray, rows: int, cols: int, pitch: int,
               precision: Precision) -> None:
    """``total += read_values(...)`` in one pass: a reduce adds up to 27 partials of a
    tile, and ``read_values`` makes each a fresh ``[tiles, rows, cols]`` float32 temporary."""
    if precision.kind == "F32" or rows == 0:
        total += read_values(mem, tiles, address, rows, cols, pitch, precision)
        return
    _gather_decoded(mem, np.asarray(tiles, dtype=np.int64),
                    per_tile(address, tiles), rows, cols, pitch,
                    precision.itemsize, _table(precision), total, True)


def read_values(mem: np.ndarray, tiles: np.ndarray, address: int | np.ndarray, rows: int,
                cols: int, pitch: int, precision: Precision) -> np.ndarray:
    """The float32 values of a ``[T, rows, cols]`` operand of ``precision``: FP8 and F16
    codes are decoded by table as they are gathered (one pass, no code array)."""
    if precision.kind == "F32" or rows == 0:
        return precision.dequantize(read_matrix(mem, tiles, address, rows, cols, pitch,
                                                precision.dtype))
    out = np.empty((len(tiles), rows, cols), dtype=np.float32)
    _gather_decoded(mem, np.asarray(tiles, dtype=np.int64),
                    per_tile(address, tiles), rows, cols, pitch,
                    precision.itemsize, _table(precision), out, False)
    return out


@numba.njit(cache=True, nogil=True, inline="always")
def _bytes_differ(x: np.ndarray, y: np.ndarray) -> bool:
    """Whether two equal-length byte views differ: OR-ed over the whole row in bytes (a
    loop the compiler vectorises; an early exit per byte would not be)."""
    differ = np.uint8(0)
    for c in range(x.size):
        differ |= x[c] ^ y[c]
    return differ != 0


@numba.njit(cache=True, nogil=True)
def _repeats_previous(mem: np.ndarray, tiles: np.ndarray, addresses: np.ndarray, rows: int,
                      row_bytes: int, pitch: int, out: np.ndarray) -> None:
    """``out[t]``: tile ``t``'s operand bytes equal tile ``t - 1``'s (compared row by row,
    so a differing operand stops at its first differing row)."""
    out[0] = False
    for t in range(1, tiles.size):
        mine, theirs = mem[tiles[t]], mem[tiles[t - 1]]
        same = True
        for r in range(rows):
            i, j = addresses[t] + r * pitch, addresses[t - 1] + r * pitch
            if _bytes_differ(mine[i : i + row_bytes], theirs[j : j + row_bytes]):
                same = False
                break
        out[t] = same


def read_shared_values(mem: np.ndarray, tiles: np.ndarray, address: int | np.ndarray,
                       rows: int, cols: int, pitch: int, precision: Precision
                       ) -> tuple[np.ndarray, np.ndarray | None]:
    """:func:`read_values` of an operand that runs of consecutive tiles may hold as the same
    bytes, decoding each run once: ``(values [runs, rows, cols], run of each tile [T])``,
    or ``(values [T, rows, cols], None)`` where no tile repeats its neighbour.

    Why: a GEMM's A block is multicast to the C column tiles of its row block, which are
    consecutive in a call's tile order, so decoding it on every tile decoded the same bytes
    C times (siglip-vision: 9 of every 10 A elements decoded).  The bytes are compared, never
    assumed: a tile whose operand differs from its neighbour's starts a run of its own, so
    the values are each tile's own whatever the layout."""
    tiles = np.asarray(tiles, dtype=np.int64)
    count = len(tiles)
    if precision.kind == "F32" or rows == 0 or count < 2:
        return read_values(mem, tiles, address, rows, cols, pitch, precision), None
    addresses = per_tile(address, tiles)
    repeats = np.empty(count, dtype=np.bool_)
    _repeats_previous(mem, tiles, addresses, rows, cols * precision.itemsize, pitch, repeats)
    if not repeats.any():
        return read_values(mem, tiles, addresses, rows, cols, pitch, precision), None
    heads = np.flatnonzero(~repeats)
    values = np.empty((len(heads), rows, cols), dtype=np.float32)
    _gather_decoded(mem, tiles[heads], addresses[heads], rows, cols, pitch,
                    precision.itemsize, _table(precision), values, False)
    return values, np.cumsum(~repeats) - 1
