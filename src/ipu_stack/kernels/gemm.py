"""AMP GEMM worker kernels: ``partial[rows, cols] = A[rows, depth] @ B[depth, cols]``.

Names follow the reference: ``gemm_{f8|f16}_interleaved_k{K}_c{C}_r{lo}_r{hi}``: the 6 workers
split the rows (``lo`` or ``hi`` each).  They cannot split columns: the AMP weight registers
(CWEI) are one set per tile, shared by all workers, so every pass over a 16-column x depth
group loads its weights once, syncs the workers and launches them again (poplibs
``ConvPartial1x1Out``).

Two modes, as the hardware has them:

* ``fp8``: native FP8 operands, **FP16 partials** (``f8v8hihov4amp``).  Each pass adds a
  32-deep dot product to the stored FP16 partial, so the partial is rounded to FP16 after
  every pass, exactly as here.
* ``f16``: F16 operands with F32 partials (summed exactly and rounded to F32 once,
  ``ir.rounding.f32_matmul``).  FP8 operands are first cast to F16 into a scratch operand
  (a real cast, priced), then the F16 AMP runs at 64 MACs per cycle.

A call reports the work it did (passes looped, rows, cast elements); ``device.pricing``
prices it.  The planner prices the same shapes with its own closed form.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ipu_stack.ir.precision import F16, Precision
from ipu_stack.ir.rounding import f32_matmul, fp16_pass_codes
from ipu_stack.kernels.base import (
    KernelFamily,
    Region,
    read_matrix,
    read_shared_values,
    read_values,
    register,
    tile_chunks,
    write_rows,
)
from ipu_stack.target.timing import Work, p, split_over_workers

MODES = ("fp8", "f16")


def partial_itemsize(mode: str) -> int:
    """Bytes of one stored partial: FP16 in FP8 mode, F32 in F16 mode."""
    return 2 if mode == "fp8" else 4


def _fp8_operands(params: dict[str, Any]) -> bool:
    return Precision.from_json(params["a"]).is_fp8


def b_shape(params: dict[str, Any]) -> tuple[int, int]:
    return (params["cols"], params["depth"]) if params.get("b_transposed") else (
        params["depth"], params["cols"])


def scratch_bytes(params: dict[str, Any]) -> int:
    """F16 copies of FP8 operands an F16-mode call needs (0 otherwise)."""
    if params["mode"] != "f16" or not _fp8_operands(params):
        return 0
    b_rows, b_cols = b_shape(params)
    return 2 * (params["rows"] * params["depth"] + b_rows * b_cols)


def _name(params: dict[str, Any]) -> str:
    lo, hi = min(split_over_workers(params["rows"])), max(split_over_workers(params["rows"]))
    kind = "f8" if params["mode"] == "fp8" else ("f16cast" if _fp8_operands(params) else "f16")
    order = "_bt" if params.get("b_transposed") else ""
    return f"gemm_{kind}_interleaved{order}_k{params['depth']}_c{params['cols']}_r{lo}_r{hi}"


CHUNK_BYTES = 32 << 20  # decoded operand bytes per batch: keeps the working set in cache


def _run(params: dict[str, Any], mem: np.ndarray, tiles: np.ndarray,
         addresses: list[int]) -> list[Work]:
    pa, pb = Precision.from_json(params["a"]), Precision.from_json(params["b"])
    rows, depth, cols = params["rows"], params["depth"], params["cols"]
    b_rows, b_cols = b_shape(params)
    mode = params["mode"]
    cast = scratch_bytes(params) > 0
    depth_passes = 0
    tile_bytes = 4 * (rows * depth + depth * cols + rows * cols)
    for chunk, (a_addr, b_addr, out_addr, scratch_addr) in tile_chunks(
            tiles, addresses, tile_bytes, CHUNK_BYTES):
        # the A block is the same bytes on a row block's column tiles: decoded once a run
        a, a_of = read_shared_values(mem, chunk, a_addr, rows, depth, params["a_pitch"], pa)
        b = read_values(mem, chunk, b_addr, b_rows, b_cols, params["b_pitch"], pb)
        if cast:  # FP8 -> F16 into the scratch operand, then the F16 AMP reads it back
            a, a_of = (a if a_of is None else a[a_of]), None  # each tile casts its own
            a16, b16 = F16.quantize(a), F16.quantize(b)
            write_rows(mem, chunk, scratch_addr, depth * 2, a16.view(np.uint8))
            b_scratch = scratch_addr + rows * depth * 2
            write_rows(mem, chunk, b_scratch, b_cols * 2, b16.view(np.uint8))
            a = read_matrix(mem, chunk, scratch_addr, rows, depth, depth * 2, np.float16)
            b = read_matrix(mem, chunk, b_scratch, b_rows, b_cols, b_cols * 2, np.float16)
            a, b = a.astype(np.float32), b.astype(np.float32)
        if params.get("b_transposed"):
            b = b.transpose(0, 2, 1)
        if mode == "fp8":
            pass_depth = p("amp_f8_depth")
            partial = fp16_pass_codes(a, b, pass_depth, a_of)
            depth_passes = -(-depth // pass_depth)
        else:
            partial = f32_matmul(a if a_of is None else a[a_of], b)
            depth_passes = -(-depth // p("amp_f16_depth"))
        write_rows(mem, chunk, out_addr, params["out_pitch"], partial.view(np.uint8))
    col_groups = -(-cols // p("amp_out_columns"))
    work = [Work("amp", {"passes": depth_passes * col_groups, "rows": rows}, weights=1)]
    if cast:
        work.append(Work("cast_from_f8", {"per_worker": split_over_workers(
            rows * depth + b_rows * b_cols)}))
    return work


def _regions(params: dict[str, Any]) -> list[Region]:
    a = Precision.from_json(params["a"]).itemsize
    b = Precision.from_json(params["b"]).itemsize
    b_rows, b_cols = b_shape(params)
    out = Region(2, 0, params["rows"], params["cols"] * partial_itemsize(params["mode"]),
                 params["out_pitch"], True)
    regions = [
        Region(0, 0, params["rows"], params["depth"] * a, params["a_pitch"], False),
        Region(1, 0, b_rows, b_cols * b, params["b_pitch"], False),
        out,
    ]
    if scratch_bytes(params):
        regions.append(Region(3, 0, 1, scratch_bytes(params), 0, True))
    return regions


def _accesses(params: dict[str, Any]) -> list[tuple[int, int, bool]]:
    return [(r.operand, (r.rows - 1) * r.pitch + r.row_bytes if r.rows else 0, r.writes)
            for r in _regions(params)]


GEMM = register(
    KernelFamily(
        name="gemm",
        source="kernels/gemm.py (AMP f8v8hihov4amp FP16 partials / f16 AMP F32 partials)",
        code_bytes=1168,
        make_name=_name,
        run=_run,
        accesses=_accesses,
        regions=_regions,
        # poplibs ConvPartial1x1Out: the partials (`out`) are always interleaved
        interleaved=(2,),
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
    mode: str,
    b_transposed: bool = False,
) -> dict[str, Any]:
    """Parameters of one GEMM instance (valid extents and the pitches of the stored blocks).

    ``b_transposed``: B is stored as ``[cols, depth]`` (the keys of ``Q.K^T``).
    ``mode``: ``fp8`` (FP8 operands, FP16 partials) or ``f16`` (F32 partials).
    """
    if mode not in MODES:
        raise ValueError(f"unknown GEMM mode {mode!r}")
    if mode == "fp8" and not (a.is_fp8 and b.is_fp8):
        raise ValueError("FP8 GEMM mode needs FP8 operands")
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
        "mode": mode,
    }
