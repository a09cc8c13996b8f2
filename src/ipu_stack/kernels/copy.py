"""On-tile copies: ``rows`` rows of ``row_bytes`` from one buffer to another on the same tile.

Used where a layout conversion keeps data on its tile (a tile cannot send to itself).
Work: the bytes moved; priced as the reference's measured six-worker copy (288 + bytes/8).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ipu_stack.kernels.base import KernelFamily, Region, read_rows, register, write_rows
from ipu_stack.target.timing import Work


def _name(p: dict[str, Any]) -> str:
    return f"copy_r{p['rows']}_b{p['row_bytes']}"


def _run(p: dict[str, Any], mem: np.ndarray, tiles: np.ndarray, addresses: list[int]) -> list[Work]:
    src, dst = addresses
    rows, row_bytes = p["rows"], p["row_bytes"]
    write_rows(mem, tiles, dst, p["dst_pitch"],
               read_rows(mem, tiles, src, rows, row_bytes, p["src_pitch"]))
    return [Work("copy", {"bytes": rows * row_bytes})]


def _accesses(p: dict[str, Any]) -> list[tuple[int, int, bool]]:
    return [
        (0, (p["rows"] - 1) * p["src_pitch"] + p["row_bytes"], False),
        (1, (p["rows"] - 1) * p["dst_pitch"] + p["row_bytes"], True),
    ]


def _regions(p: dict[str, Any]) -> list[Region]:
    return [
        Region(0, 0, p["rows"], p["row_bytes"], p["src_pitch"], False),
        Region(1, 0, p["rows"], p["row_bytes"], p["dst_pitch"], True),
    ]


COPY = register(
    KernelFamily(
        name="copy",
        source="kernels/copy.py (ld64/st64 loop)",
        code_bytes=96,
        make_name=_name,
        run=_run,
        accesses=_accesses,
        regions=_regions,
    )
)


def copy_params(rows: int, row_bytes: int, src_pitch: int, dst_pitch: int) -> dict[str, Any]:
    return {
        "rows": int(rows),
        "row_bytes": int(row_bytes),
        "src_pitch": int(src_pitch),
        "dst_pitch": int(dst_pitch),
    }
