"""Reduce-and-finish kernels: sum depth partials, then bias, activation and casts.

One instance finishes a slice of a GEMM's output: it adds the tile's own F32 partial and the
``parts - 1`` partials received from the other depth tiles (in that order), then applies the
fused operation chain of the graph (matmul rounding, bias add, GELU, cast), rounding to each
operation's output precision exactly where the graph says, and stores the result.

Operands: ``[own_partial, received, bias, out]`` (``bias`` address is 0 when there is none).
Cost: worker cycles per element from ``target.VECTOR_COSTS`` (assumed, see there).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ipu_stack.ir.precision import Precision
from ipu_stack.kernels.base import KernelFamily, Region, read_matrix, register, write_rows
from ipu_stack.kernels.elementwise import apply_chain, chain_cost_per_element
from ipu_stack.target import Target
from ipu_stack.target.machine import VECTOR_COSTS


def _name(p: dict[str, Any]) -> str:
    ops = "_".join(step[0] for step in p["chain"]) or "store"
    out = Precision.from_json(p["out"])
    out_kind = "f16" if out.kind == "F16" else ("f32" if out.kind == "F32" else "f8")
    return f"reduce{p['parts']}_{ops}_{out_kind}_r{p['rows']}_c{p['cols']}"


def _cost(p: dict[str, Any], target: Target) -> int:
    elements = p["rows"] * p["cols"]
    if elements == 0:
        return 0
    per_element = (
        VECTOR_COSTS["load_store"].value
        + (p["parts"] - 1) * VECTOR_COSTS["add_f32"].value
        + chain_cost_per_element(p["chain"])
    )
    workers = target.workers
    worker_elements = -(-elements // workers)
    worker_rows = -(-p["rows"] // workers)
    worker = (
        int(target.worker_entry_cycles)
        + int(np.ceil(worker_elements * per_element))
        + int(worker_rows * VECTOR_COSTS["row_overhead"].value)
    )
    return int(target.amp_supervisor_cycles) + workers * worker


def _run(p: dict[str, Any], mem: np.ndarray, tiles: np.ndarray, addresses: list[int]) -> None:
    own_addr, recv_addr, bias_addr, out_addr = addresses
    rows, cols, parts = p["rows"], p["cols"], p["parts"]
    total = read_matrix(mem, tiles, own_addr, rows, cols, p["partial_pitch"], np.float32).copy()
    slot = p["slot_rows"] * p["partial_pitch"]  # received slices are full sub-blocks
    for k in range(parts - 1):
        total += read_matrix(
            mem, tiles, recv_addr + k * slot, rows, cols, p["partial_pitch"], np.float32
        )
    bias = None
    if p["bias"] is not None:
        bp = Precision.from_json(p["bias"])
        raw = mem[tiles, bias_addr : bias_addr + cols * bp.itemsize]
        bias = bp.dequantize(np.ascontiguousarray(raw).view(bp.dtype))[:, None, :]
    result = apply_chain(total, p["chain"], bias)
    out = Precision.from_json(p["out"])
    stored = out.quantize(result)
    write_rows(mem, tiles, out_addr, p["out_pitch"], stored.view(np.uint8))


def _accesses(p: dict[str, Any]) -> list[tuple[int, int, bool]]:
    out = Precision.from_json(p["out"])
    result = [
        (0, p["rows"] * p["partial_pitch"], False),
        (1, (p["parts"] - 1) * p["slot_rows"] * p["partial_pitch"], False),
        (3, (p["rows"] - 1) * p["out_pitch"] + p["cols"] * out.itemsize, True),
    ]
    if p["bias"] is not None:
        result.append((2, p["cols"] * Precision.from_json(p["bias"]).itemsize, False))
    return result


def _regions(p: dict[str, Any]) -> list[Region]:
    out = Precision.from_json(p["out"])
    rows, cols, pitch = p["rows"], p["cols"], p["partial_pitch"]
    slot = p["slot_rows"] * pitch
    result = [Region(0, 0, rows, cols * 4, pitch, False)]
    result += [Region(1, k * slot, rows, cols * 4, pitch, False) for k in range(p["parts"] - 1)]
    if p["bias"] is not None:
        result.append(Region(2, 0, 1, cols * Precision.from_json(p["bias"]).itemsize, 0, False))
    result.append(Region(3, 0, rows, cols * out.itemsize, p["out_pitch"], True))
    return result


EPILOGUE = register(
    KernelFamily(
        name="reduce",
        source="kernels/epilogue.py (f32v2 reduce + fused elementwise chain)",
        code_bytes=896,
        make_name=_name,
        cost=_cost,
        run=_run,
        accesses=_accesses,
        regions=_regions,
    )
)


def epilogue_params(
    parts: int,
    rows: int,
    cols: int,
    partial_pitch: int,
    slot_rows: int,
    chain: list[list[Any]],
    bias: Precision | None,
    out: Precision,
    out_pitch: int,
) -> dict[str, Any]:
    return {
        "parts": int(parts),
        "rows": int(rows),
        "cols": int(cols),
        "partial_pitch": int(partial_pitch),
        "slot_rows": int(slot_rows),
        "chain": chain,
        "bias": None if bias is None else bias.to_json(),
        "out": out.to_json(),
        "out_pitch": int(out_pitch),
    }
