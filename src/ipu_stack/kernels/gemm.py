"""AMP GEMM worker kernels: ``partial[rows, cols] = A[rows, depth] @ B[depth, cols]`` in F32.

Names follow the reference: ``gemm_{f8|f16}_interleaved_k{K}_c{C}_r{lo}_r{hi}`` when rows are
split over the 6 workers (each worker takes ``lo`` or ``hi`` rows) and ``..._g{lo}_g{hi}`` when
the 16-column AMP groups are split instead (better when a tile holds few rows).

Cost (tile cycles), from PopLibs' convPartial1x1 / quarter estimators (``target``):
a work item is one AMP pass over 16 output columns and 16 (F16) or 32 (FP8) depth elements for
all of a worker's rows, costing ``item_cycles + 4 x rows``; a worker adds its entry cost;
workers are interleaved round robin so the tile takes ``6 x`` the slowest worker, plus the
supervisor's call overhead.  At large row counts this tends to 64 (F16) or 128 (FP8)
MACs per cycle, the AMP peak.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ipu_stack.ir.precision import Precision
from ipu_stack.kernels.base import KernelFamily, Region, read_matrix, register, write_rows
from ipu_stack.target import Target


def _split(total: int, parts: int) -> tuple[int, int]:
    """Sizes when ``total`` items are dealt to ``parts`` workers: (smallest, largest)."""
    return total // parts, -(-total // parts)


def gemm_worker_cycles(
    rows: int, depth: int, cols: int, fp8: bool, split: str, target: Target
) -> int:
    """Cycles of the slowest worker (in worker cycles) for one call."""
    depth_step = int(target.amp_f8_depth if fp8 else target.amp_f16_depth)
    col_groups = -(-cols // int(target.amp_out_columns))
    depth_groups = -(-depth // depth_step)
    item = int(target.amp_item_cycles)
    per_row = int(target.amp_cycles_per_row)
    workers = target.workers
    if split == "rows":
        worker_rows = -(-rows // workers)
        items = col_groups * depth_groups
    else:
        worker_rows = rows
        items = -(-col_groups // workers) * depth_groups
    return int(target.worker_entry_cycles) + items * (item + per_row * worker_rows)


def gemm_cycles(rows: int, depth: int, cols: int, fp8: bool, split: str, target: Target) -> int:
    """Tile cycles for one GEMM call: supervisor plus 6 x the slowest worker."""
    if rows == 0 or depth == 0 or cols == 0:
        return 0
    worker = gemm_worker_cycles(rows, depth, cols, fp8, split, target)
    return int(target.amp_supervisor_cycles) + target.workers * worker


def best_split(rows: int, depth: int, cols: int, fp8: bool, target: Target) -> str:
    """The worker split with fewer cycles (rows on ties)."""
    by_rows = gemm_cycles(rows, depth, cols, fp8, "rows", target)
    by_cols = gemm_cycles(rows, depth, cols, fp8, "cols", target)
    return "rows" if by_rows <= by_cols else "cols"


def _name(p: dict[str, Any]) -> str:
    kind = "f16" if p["a"]["kind"] == "F16" else "f8"
    workers = 6
    if p["split"] == "rows":
        lo, hi = _split(p["rows"], workers)
        tail = f"r{lo}_r{hi}"
    else:
        lo, hi = _split(-(-p["cols"] // 16), workers)
        tail = f"r{p['rows']}_g{lo}_g{hi}"
    order = "_bt" if p.get("b_transposed") else ""
    return f"gemm_{kind}_interleaved{order}_k{p['depth']}_c{p['cols']}_{tail}"


def _cost(p: dict[str, Any], target: Target) -> int:
    fp8 = p["a"]["kind"] != "F16"
    return gemm_cycles(p["rows"], p["depth"], p["cols"], fp8, p["split"], target)


CHUNK_BYTES = 32 << 20  # decoded operand bytes per batch: keeps the working set in cache


def _run(p: dict[str, Any], mem: np.ndarray, tiles: np.ndarray, addresses: list[int]) -> None:
    a_addr, b_addr, out_addr = addresses
    pa, pb = Precision.from_json(p["a"]), Precision.from_json(p["b"])
    rows, depth, cols = p["rows"], p["depth"], p["cols"]
    per_tile = 4 * (rows * depth + depth * cols + rows * cols)
    step = max(1, CHUNK_BYTES // per_tile)
    for start in range(0, len(tiles), step):
        chunk = tiles[start : start + step]
        a = read_matrix(mem, chunk, a_addr, rows, depth, p["a_pitch"], pa.dtype)
        if p.get("b_transposed"):
            b = read_matrix(mem, chunk, b_addr, cols, depth, p["b_pitch"], pb.dtype)
            b_values = pb.dequantize(b).transpose(0, 2, 1)
        else:
            b = read_matrix(mem, chunk, b_addr, depth, cols, p["b_pitch"], pb.dtype)
            b_values = pb.dequantize(b)
        partial = np.matmul(pa.dequantize(a), b_values)
        write_rows(mem, chunk, out_addr, p["out_pitch"], partial.astype(np.float32).view(np.uint8))


def _accesses(p: dict[str, Any]) -> list[tuple[int, int, bool]]:
    return [
        (0, p["rows"] * p["a_pitch"], False),
        (1, (p["cols"] if p.get("b_transposed") else p["depth"]) * p["b_pitch"], False),
        (2, p["rows"] * p["out_pitch"], True),
    ]


def _regions(p: dict[str, Any]) -> list[Region]:
    a = Precision.from_json(p["a"]).itemsize
    b = Precision.from_json(p["b"]).itemsize
    b_rows, b_cols = (p["cols"], p["depth"]) if p.get("b_transposed") else (p["depth"], p["cols"])
    return [
        Region(0, 0, p["rows"], p["depth"] * a, p["a_pitch"], False),
        Region(1, 0, b_rows, b_cols * b, p["b_pitch"], False),
        Region(2, 0, p["rows"], p["cols"] * 4, p["out_pitch"], True),
    ]


GEMM = register(
    KernelFamily(
        name="gemm",
        source="kernels/gemm.py (AMP f16v4hihoamp / f8 quarter AMP worker)",
        code_bytes=1168,
        make_name=_name,
        cost=_cost,
        run=_run,
        accesses=_accesses,
        regions=_regions,
    )
)


def gemm_params(
    a: Precision,
    b: Precision,
    rows: int,
    depth: int,
    cols: int,
    a_pitch: int,
    b_pitch: int,
    out_pitch: int,
    split: str,
    b_transposed: bool = False,
) -> dict[str, Any]:
    """Parameters of one GEMM instance (valid extents and the pitches of the stored blocks).

    ``b_transposed``: B is stored as ``[cols, depth]`` (the keys of ``Q.K^T``).
    """
    return {
        "b_transposed": bool(b_transposed),
        "a": a.to_json(),
        "b": b.to_json(),
        "rows": int(rows),
        "depth": int(depth),
        "cols": int(cols),
        "a_pitch": int(a_pitch),
        "b_pitch": int(b_pitch),
        "out_pitch": int(out_pitch),
        "split": split,
    }
