"""Reduce-and-finish kernels: sum depth partials, then bias, activation and casts.

One instance finishes a slice of a GEMM's output: it adds the tile's own partial and the
``parts - 1`` partials received from the other depth tiles (in that order, summed in F32),
then applies the fused operation chain of the graph (matmul rounding, bias add, GELU, cast),
rounding to each operation's output precision exactly where the graph says, and stores the
result.  Partials are FP16 (FP8-mode GEMMs) or F32 (F16 mode): ``partials``.

Operands: ``[own_partial, received, bias, out]`` (``bias`` address is 0 when there is none).
Work: one reduce pass and the chain's passes (``elementwise.chain_passes``), priced in
``target.timing``: the reduce as poplin's convolution reduction runs it where the tile's
region is dense (``contiguous``: a single-input ReduceAdd, or a Cast1D for one F32 partial),
else at the reference's measured price, 282 + 6 ceil(n/48) (11 + 2 (P - 1)).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ipu_stack.ir.precision import F32, Precision
from ipu_stack.kernels.base import (
    KernelFamily,
    Region,
    add_values,
    read_rows,
    read_values,
    register,
    tile_chunks,
    write_rows,
)
from ipu_stack.kernels.elementwise import apply_chain, bias_gelu_merge, chain_passes, chain_work
from ipu_stack.target.timing import Work, split_over_workers


def partials_are_result(depth_splits: int, mode: str, chain: Any, has_bias: bool) -> bool:
    """Whether a GEMM stage's partials already are its result, so no reduce kernel runs:
    one depth block (nothing to sum) in the FP8 mode, whose partials the AMP stores as FP16,
    and a chain that only rounds to F16 (no bias, activation or cast).  Rounding an FP16
    partial to F16 changes no bit, and the next kernel reads the AMP's output where the AMP
    stored it, as any kernel reads tile memory; a copy would add cycles and no work."""
    steps = [list(step) for step in chain]
    return (depth_splits == 1 and mode == "fp8" and not has_bias and len(steps) == 1
            and steps[0][0] == "round" and Precision.from_json(steps[0][1]).kind == "F16")


def bias_room(p: dict[str, Any]) -> tuple[int, int]:
    """Spare bias elements for a merged bias + GELU (``elementwise.bias_gelu_merge``), and
    the bias's item size: the received partial slots, which the sum has consumed, when the
    tile's block is contiguous (its columns fill the partials' pitch, so the sum, kept in
    place in the tile's own partial slice, is one run of ``rows * cols`` values); none
    without a bias, a depth split or a contiguous block."""
    if p["bias"] is None or p["parts"] < 2 or p["rows"] * p["cols"] == 0:
        return 0, 2
    itemsize = Precision.from_json(p["bias"]).itemsize
    if p["partial_pitch"] != p["cols"] * _partial(p).itemsize:
        return 0, itemsize
    return (p["parts"] - 1) * p["slot_rows"] * p["partial_pitch"] // itemsize, itemsize


def _bias_copies(p: dict[str, Any]) -> int:
    """How many times the kernel lays its bias out in the received slots (1: not at all)."""
    room, itemsize = bias_room(p)
    if room == 0 or "bias_gelu" not in chain_passes(p["chain"], p["rows"], p["cols"], room,
                                                    itemsize):
        return 1
    return bias_gelu_merge(p["rows"], p["cols"], room, itemsize)


def contiguous(p: dict[str, Any]) -> bool:
    """Whether the tile's partials and result are each one dense region at the received
    partials' stride: whole slots, no padding in a row.  Then poplin's ReduceAdd (or, for one
    partial, a Cast1D) takes them as one vector each; else the reduce is the measured one."""
    out = Precision.from_json(p["out"])
    return ((p["parts"] == 1 or p["rows"] == p["slot_rows"])
            and p["partial_pitch"] == p["cols"] * _partial(p).itemsize
            and p["out_pitch"] == p["cols"] * out.itemsize)


def _name(p: dict[str, Any]) -> str:
    ops = "_".join(step[0] for step in p["chain"]) or "store"
    out = Precision.from_json(p["out"])
    out_kind = "f16" if out.kind == "F16" else ("f32" if out.kind == "F32" else "f8")
    return f"reduce{p['parts']}_{ops}_{out_kind}_r{p['rows']}_c{p['cols']}"


def _partial(p: dict[str, Any]) -> Precision:
    return Precision.from_json(p.get("partials", {"kind": "F32"}))


CHUNK_BYTES = 1 << 20  # float32 bytes of the sum per chunk of tiles: it stays in L2


def _run(p: dict[str, Any], mem: np.ndarray, tiles: np.ndarray, addresses: list[int]) -> list[Work]:
    """A chunk of tiles at a time (``tile_chunks``); each tile's sum is its own."""
    rows, cols, parts = p["rows"], p["cols"], p["parts"]
    for chunk, at in tile_chunks(tiles, addresses, 4 * rows * cols, CHUNK_BYTES):
        _run_chunk(p, mem, chunk, at)
    reduce = Work("reduce", {"per_worker": split_over_workers(rows * cols), "parts": parts,
                             "f32_partials": _partial(p).kind == "F32",
                             "contiguous": contiguous(p)})
    return [reduce, *chain_work(p["chain"], rows, cols, *bias_room(p))]


def _run_chunk(p: dict[str, Any], mem: np.ndarray, tiles: np.ndarray,
               addresses: list[np.ndarray]) -> None:
    own_addr, recv_addr, bias_addr, out_addr = addresses
    rows, cols, parts = p["rows"], p["cols"], p["parts"]
    partial = _partial(p)
    total = read_values(mem, tiles, own_addr, rows, cols, p["partial_pitch"], partial)
    slot = p["slot_rows"] * p["partial_pitch"]  # received slices are full sub-blocks
    for k in range(parts - 1):
        add_values(total, mem, tiles, recv_addr + k * slot, rows, cols, p["partial_pitch"],
                   partial)
    bias = None
    if p["bias"] is not None:
        bp = Precision.from_json(p["bias"])
        bias = read_values(mem, tiles, bias_addr, 1, cols, cols * bp.itemsize, bp)
        copies = _bias_copies(p)
        if copies > 1:  # the merged vertex's bias row: the bias side by side, summed slots
            row = read_rows(mem, tiles, bias_addr, 1, cols * bp.itemsize, cols * bp.itemsize)
            write_rows(mem, tiles, recv_addr, copies * cols * bp.itemsize,
                       np.tile(row, (1, 1, copies)))
    result = apply_chain(total, p["chain"], bias)
    out = Precision.from_json(p["out"])
    stored = out.quantize(result)
    write_rows(mem, tiles, out_addr, p["out_pitch"], stored.view(np.uint8))


def _accesses(p: dict[str, Any]) -> list[tuple[int, int, bool]]:
    out = Precision.from_json(p["out"])
    item = _partial(p).itemsize
    result = [
        (0, (p["rows"] - 1) * p["partial_pitch"] + p["cols"] * item, False),
        (1, (p["parts"] - 1) * p["slot_rows"] * p["partial_pitch"], False),
        (3, (p["rows"] - 1) * p["out_pitch"] + p["cols"] * out.itemsize, True),
    ]
    if p["bias"] is not None:
        item = Precision.from_json(p["bias"]).itemsize
        result.append((2, p["cols"] * item, False))
        copies = _bias_copies(p)
        if copies > 1:
            result.append((1, copies * p["cols"] * item, True))
    return result


def _regions(p: dict[str, Any]) -> list[Region]:
    out = Precision.from_json(p["out"])
    rows, cols, pitch = p["rows"], p["cols"], p["partial_pitch"]
    slot = p["slot_rows"] * pitch
    item = _partial(p).itemsize
    result = [Region(0, 0, rows, cols * item, pitch, False)]
    result += [Region(1, k * slot, rows, cols * item, pitch, False)
               for k in range(p["parts"] - 1)]
    if p["bias"] is not None:
        bias_bytes = cols * Precision.from_json(p["bias"]).itemsize
        result.append(Region(2, 0, 1, bias_bytes, 0, False))
        copies = _bias_copies(p)
        if copies > 1:  # written after the slots were read
            result.append(Region(1, 0, 1, copies * bias_bytes, 0, True))
    result.append(Region(3, 0, rows, cols * out.itemsize, p["out_pitch"], True))
    return result


EPILOGUE = register(
    KernelFamily(
        name="reduce",
        source="kernels/epilogue.py (reduce of FP16/F32 partials + fused elementwise chain)",
        code_bytes=896,
        make_name=_name,
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
    partials: Precision = F32,
) -> dict[str, Any]:
    return {
        "partials": partials.to_json(),
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
