"""A lookup and a cache write: popops ``MultiSlice`` and ``MultiUpdate`` on one tile (a token
embedding, a data-dependent gather; a KV cache row written at a runtime position).

Each tile holds every row of a column block of the table (the vendor's unplanned
``createSliceableTensor`` split: the embedding dimension over tiles, so every id is in range
on every tile and the exchange stays static). The call copies, for each of ``offsets`` ids,
``region_bytes`` of the table's row ``id`` to the output's row. An id outside the table's
rows is skipped and its output row left unwritten, as the vertex does
(``MultiSlice.cpp:68-71``). A table too large for one tile a column block is also split by
rows: each tile holds ``rows`` rows from ``first_row``, and with ``fill`` zeroes its output
first (popops Fill), so that summing the row groups' outputs gives each id's row.

``MultiUpdate`` is the reverse copy: each of ``offsets`` rows of the source is written to the
table's row ``slot`` where the tile holds that row (``MultiUpdate.cpp:74-77``: rows it does not
hold are skipped), so a cache split by positions over tiles takes each row where it belongs
while every exchange stays static.

Work: offsets, the ones in range, and the region's elements and their size, which
``device.pricing`` prices at the vendor's model of the vertex.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ipu_stack.kernels.base import KernelFamily, Region, per_tile, register
from ipu_stack.target.timing import Work


def _name(p: dict[str, Any]) -> str:
    first = f"_r{p['first_row']}" if p.get("first_row") else ""
    zero = "_zeroed" if p.get("fill") else ""
    return f"multislice_n{p['offsets']}_v{p['rows']}{first}_b{p['region_bytes']}{zero}"


def _offsets_held(mem: np.ndarray, tiles: np.ndarray, at: np.ndarray, count: int,
                  first: int, rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Every tile's ``count`` offsets (u32 at ``at``) less ``first``, read at once: the
    calls' tile indices and offset numbers of those in ``[0, rows)`` (the vertex's unsigned
    compare after the subtract), their values, and the most any tile holds."""
    window = mem[tiles[:, None], at[:, None] + np.arange(4 * count, dtype=np.int64)]
    values = np.ascontiguousarray(window).view("<u4").astype(np.int64) - first
    held = (values >= 0) & (values < rows)
    tile_index, number = np.nonzero(held)
    most = int(held.sum(axis=1).max()) if len(tiles) else 0
    return tile_index, number, values[tile_index, number], most


def _copy_rows(mem: np.ndarray, tiles: np.ndarray, source: np.ndarray,
               target: np.ndarray) -> None:
    """Each row ``i`` of byte addresses ``source[i]`` copied to ``target[i]`` on tile
    ``tiles[i]`` (all the calls' tiles in one gather and one scatter: a tile's rows never
    overlap another tile's)."""
    on = np.broadcast_to(tiles[:, None], source.shape)
    mem[on, target] = mem[on, source]


def _run(p: dict[str, Any], mem: np.ndarray, tiles: np.ndarray, addresses: list[int]) -> list[Work]:
    tiles = np.asarray(tiles, dtype=np.int64)
    ids_at, table_at, out_at = (per_tile(a, tiles) for a in addresses)
    n, rows, region = p["offsets"], p["rows"], p["region_bytes"]
    span = np.arange(region, dtype=np.int64)
    which, number, ids, in_range = _offsets_held(mem, tiles, ids_at, n, p.get("first_row", 0),
                                                 rows)
    if p.get("fill"):  # after the ids are read, as the vertex reads them
        every = np.arange(n, dtype=np.int64)[:, None] * p["out_pitch"] + span
        mem[tiles[:, None], (out_at[:, None] + every.ravel())] = 0
    _copy_rows(mem, tiles[which], table_at[which, None] + ids[:, None] * p["table_pitch"] + span,
               out_at[which, None] + number[:, None] * p["out_pitch"] + span)
    elements = -(-region // p["itemsize"])  # what was copied, whatever the item size says
    work = [Work("multislice", {"offsets": n, "in_range": in_range, "elements": elements,
                                "itemsize": p["itemsize"]})]
    if p.get("fill"):
        work.insert(0, Work("fill", {"elements": n * elements, "itemsize": p["itemsize"]}))
    return work


def _row_operands(p: dict[str, Any], update: bool) -> list[tuple[int, int]]:
    """``(rows, pitch)`` of operands 1 (read) and 2 (written): the table, then a row an
    offset (a slice); the reverse for an update."""
    table = (p["rows"], p["table_pitch"])
    per_offset = (p["offsets"], p["src_pitch"] if update else p["out_pitch"])
    return [per_offset, table] if update else [table, per_offset]


def _extents(p: dict[str, Any], update: bool) -> list[tuple[int, int, bool]]:
    """Each operand's extent: the offsets (4 bytes each), the read rows, the written rows."""
    return [(0, 4 * p["offsets"], False)] + [
        (k + 1, (rows - 1) * pitch + p["region_bytes"], k == 1)
        for k, (rows, pitch) in enumerate(_row_operands(p, update))]


def _exact(p: dict[str, Any], update: bool) -> list[Region]:
    """Each operand's exact bytes (the rows' padding left out)."""
    return [Region(0, 0, 1, 4 * p["offsets"], 4 * p["offsets"], False)] + [
        Region(k + 1, 0, rows, p["region_bytes"], pitch, k == 1)
        for k, (rows, pitch) in enumerate(_row_operands(p, update))]


def _register(name: str, source: str, make_name: Any, run: Any, update: bool) -> KernelFamily:
    """A slice family: its operands' extents and exact regions from :func:`_row_operands`."""
    return register(KernelFamily(
        name=name, source=source,
        code_bytes=512,  # assumed: the vertex's assembly and its C++ wrapper
        make_name=make_name, run=run,
        accesses=functools.partial(_extents, update=update),
        regions=functools.partial(_exact, update=update)))


MULTISLICE = _register("multislice", "poplibs lib/popops/codelets/MultiSlice.cpp, "
                       "asm/MultiSlice.S", _name, _run, update=False)


def multislice_params(offsets: int, rows: int, region_bytes: int, itemsize: int,
                      table_pitch: int, out_pitch: int, first_row: int = 0,
                      fill: bool = False) -> dict[str, Any]:
    """A call's parameters: the tile holds table rows ``[first_row, first_row + rows)``;
    ``fill`` zeroes every output row first (popops Fill), so the rows of ids it does not
    hold are zero for the reduce that combines the row groups (``lowering.lookup``)."""
    params = {"offsets": int(offsets), "rows": int(rows), "region_bytes": int(region_bytes),
              "itemsize": int(itemsize), "table_pitch": int(table_pitch),
              "out_pitch": int(out_pitch)}
    if first_row or fill:
        params.update(first_row=int(first_row), fill=bool(fill))
    return params


def _update_name(p: dict[str, Any]) -> str:
    first = f"_r{p['first_row']}" if p.get("first_row") else ""
    return f"multiupdate_n{p['offsets']}_v{p['rows']}{first}_b{p['region_bytes']}"


# a call on at most this many tiles runs a tile at a time: a cache split by positions makes
# one call a holder group (a few tiles) for every block of positions, and the batched
# gathers' fixed costs dwarf a few tiles' work
FEW_TILES = 8


def _update_few(p: dict[str, Any], mem: np.ndarray, tiles: np.ndarray,
                addresses: list[int]) -> int:
    """:func:`_update_run` a tile at a time (``FEW_TILES``); the most offsets a tile held."""
    n, region, first = p["offsets"], p["region_bytes"], p.get("first_row", 0)
    most = 0
    starts = [per_tile(a, tiles).tolist() for a in addresses]
    for tile, slots_at, rows_at, table_at in zip(tiles.tolist(), *starts, strict=True):
        slots = mem[tile, slots_at:slots_at + 4 * n].view("<u4").astype(np.int64) - first
        held = 0
        for number, slot in enumerate(slots.tolist()):
            if 0 <= slot < p["rows"]:  # the vertex's unsigned compare after the subtract
                source = rows_at + number * p["src_pitch"]
                target = table_at + slot * p["table_pitch"]
                mem[tile, target:target + region] = mem[tile, source:source + region]
                held += 1
        most = max(most, held)
    return most


def _update_run(p: dict[str, Any], mem: np.ndarray, tiles: np.ndarray,
                addresses: list[int]) -> list[Work]:
    tiles = np.asarray(tiles, dtype=np.int64)
    elements = -(-p["region_bytes"] // p["itemsize"])
    if len(tiles) <= FEW_TILES:
        in_range = _update_few(p, mem, tiles, addresses)
        return [Work("multiupdate", {"offsets": p["offsets"], "in_range": in_range,
                                     "elements": elements, "itemsize": p["itemsize"]})]
    slots_at, rows_at, table_at = (per_tile(a, tiles) for a in addresses)
    n, region = p["offsets"], p["region_bytes"]
    span = np.arange(region, dtype=np.int64)
    which, number, slots, in_range = _offsets_held(mem, tiles, slots_at, n,
                                                   p.get("first_row", 0), p["rows"])
    _copy_rows(mem, tiles[which], rows_at[which, None] + number[:, None] * p["src_pitch"] + span,
               table_at[which, None] + slots[:, None] * p["table_pitch"] + span)
    return [Work("multiupdate", {"offsets": n, "in_range": in_range, "elements": elements,
                                 "itemsize": p["itemsize"]})]


MULTIUPDATE = _register("multiupdate", "poplibs lib/popops/codelets/MultiUpdate.cpp, "
                        "asm/MultiSlice.S (MU entry)", _update_name, _update_run, update=True)


def multiupdate_params(offsets: int, rows: int, region_bytes: int, itemsize: int,
                       src_pitch: int, table_pitch: int, first_row: int = 0) -> dict[str, Any]:
    """A call's parameters: ``offsets`` source rows (``src_pitch`` apart) written into the
    tile's table rows ``[first_row, first_row + rows)`` (``table_pitch`` apart) at their
    slots; a slot outside them is skipped."""
    params = {"offsets": int(offsets), "rows": int(rows), "region_bytes": int(region_bytes),
              "itemsize": int(itemsize), "src_pitch": int(src_pitch),
              "table_pitch": int(table_pitch)}
    if first_row:
        params["first_row"] = int(first_row)
    return params
