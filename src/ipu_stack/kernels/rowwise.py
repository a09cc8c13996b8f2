"""Row kernels: operations that need whole rows (layer norm, RMS norm, softmax) or pair rows
of two tensors (residual add, product, SwiGLU, RoPE), plus unfused elementwise chains, on a
tile's block of rows.

Operands: ``[x, aux0, aux1, out]``; what the aux operands are depends on ``op``:
``layer_norm``: scale and shift rows (``[cols]``, replicated on every tile); ``rms_norm``:
the scale row (with ``group``, each run of that many columns is normalised on its own: a
row of heads, Qwen3's QK-norm); ``add``, ``mul``: the second operand, ``swiglu``: the up projection ``b`` of
``silu(x) * b``, ``biased_softmax``: the additive bias or mask table (same block shape as
``x``); ``rope``: cos and sin tables
(``[rows, head_dim / 2]``, in the same row blocks); ``softmax`` / ``chain``: none (a bias
chain takes its bias in ``aux0``).  An RMS norm split by columns over tiles (a decode
step's few wide rows) is two calls: ``rms_sums`` writes the sums of squares of the tile's
blocks (``ir.one_pass.rms_blocks``) into ``out``, FP32 a block's rows at a time;
``rms_scale`` reads every block's sums (``aux1``, gathered there by an exchange) with its
columns' scale (``aux0``).  Everything is computed in F32 and rounded to the output
precision once (the chain rounds after each of its steps).
Work and prices: the reference's measured layer norm and softmax kernels, the vendor's
``NormCE`` for layer norms (and, assumed, for RMS norms on its loops), assumed prices for
the residual add, other RMS norms and RoPE, the vendor's popops vertices for products and SwiGLU,
the chain's passes, and a cast pass for an FP8 output
(``target.timing``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ipu_stack.ir.one_pass import by_groups, rms_blocks
from ipu_stack.ir.precision import F32, Precision
from ipu_stack.kernels.base import (
    KernelFamily,
    Region,
    read_values,
    register,
    tile_chunks,
    write_rows,
)
from ipu_stack.kernels.elementwise import activation, apply_chain, chain_work
from ipu_stack.kernels.norm import (
    normce_applies,
    normce_calls,
    normce_layer_norm,
    normce_rms_norm,
    rms_partials,
    rms_scale,
)
from ipu_stack.target.timing import Work, split_over_workers


def _name(p: dict[str, Any]) -> str:
    op = p["op"] if p["op"] != "chain" else "_".join(s[0] for s in p["chain"])
    return f"row_{op}_r{p['rows']}_c{p['cols']}"


def _normce(p: dict[str, Any]) -> bool:
    """A layer norm that runs as the vendor's ``NormCE``, or an RMS norm on its loops
    (``kernels.norm``)."""
    if p["op"] not in ("layer_norm", "rms_norm"):
        return False
    aux = None if p.get("aux") is None else Precision.from_json(p["aux"])
    return normce_applies(Precision.from_json(p["x"]), aux, norm_group(p), float(p["eps"]))


def norm_group(p: dict[str, Any]) -> int:
    """The width an RMS norm normalises: the row's, or one head's when the row holds several
    heads side by side (``group``; Qwen3's QK-norm), checked to divide the block's columns
    before anything runs (a package's parameters are hostile)."""
    cols = int(p["cols"])
    group = p.get("group", cols)
    if p["op"] != "rms_norm" and group != cols:
        raise ValueError(f"{p['op']} takes no group")
    if not isinstance(group, int) or group <= 0 or cols % group:
        raise ValueError(f"rms_norm group {group!r} does not divide its {cols} columns")
    return group


def _out_cast(p: dict[str, Any]) -> bool:
    """Row kernels compute in F16/F32 and store F16; an FP8 output costs a cast pass."""
    return p["op"] != "chain" and Precision.from_json(p["out"]).is_fp8


def _work(p: dict[str, Any], block: tuple[int, ...]) -> list[Work]:
    """What the row loops did over one tile's ``rows x cols`` block (``block`` is the shape
    the kernel read, ``[tiles, rows, cols]``): rows in turn for a layer norm, rows over
    16-key panels for a softmax, elements dealt to six workers otherwise."""
    rows, cols = int(block[1]), int(block[2])
    op = p["op"]
    per_worker = split_over_workers(rows * cols)
    if op == "chain":
        return chain_work(p["chain"], rows, cols)
    if _normce(p):
        width = norm_group(p)  # a row of heads normalised a head at a time: rows of its width
        calls = normce_calls(rows * (cols // width))
        kind = "normce" if op == "layer_norm" else "normce_rms"
        work = [Work(kind, {"row_calls": [n for k, n in calls if k == "rows"],
                            "split_calls": [n for k, n in calls if k == "split"],
                            "width": width, "blocks": rms_blocks(width)})]
    elif op in ("layer_norm", "rms_norm"):
        width = norm_group(p)
        work = [Work(op, {"row_widths": [width] * (rows * (cols // width))})]
    elif op in ("rms_sums", "rms_scale"):
        blocks, here = _rms_blocks(p)
        work = [Work(op, {"rows": rows, "cols": cols, "width": int(p["width"]), "blocks": blocks,
                          "blocks_here": here})]
    elif op in ("softmax", "biased_softmax"):
        work = [Work("softmax", {"rows": rows, "keys": cols, "panels": -(-cols // 16)})]
        if op == "biased_softmax":  # each table an add (two: summed, then added)
            work.extend(Work("add_bias", {"per_worker": per_worker})
                        for _ in range(int(p.get("tables", 1))))
    else:
        work = [Work(op, {"per_worker": per_worker})]
    if _out_cast(p):
        work.append(Work("cast_f8", {"per_worker": per_worker}))
    return work


def _matrix(mem, tiles, address, rows, cols, pitch, precision_json) -> np.ndarray:
    return read_values(mem, tiles, address, rows, cols, pitch, Precision.from_json(precision_json))


def rope_rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, head_dim: int,
                halves: bool = False, rotary: int | None = None) -> np.ndarray:
    """Rotate pairs ``(2i, 2i+1)`` of every head by the row's angles (``[..., rows, d/2]``);
    with ``halves``, pairs ``(i, i + d/2)`` (Llama-style ``rotate_half``); with ``rotary``
    below ``head_dim``, only each head's first ``rotary`` channels, the rest copied."""
    shape = x.shape
    if rotary is not None and rotary < head_dim:
        heads = x.reshape(*shape[:-1], shape[-1] // head_dim, head_dim).astype(np.float32)
        turned = heads[..., :rotary].reshape(*shape[:-1], -1)
        heads[..., :rotary] = rope_rotate(turned, cos, sin, rotary, halves).reshape(
            heads[..., :rotary].shape)
        return heads.reshape(shape)
    if halves:
        heads = x.reshape(*shape[:-1], shape[-1] // head_dim, 2, head_dim // 2)
        c, s = cos[..., None, :], sin[..., None, :]
        first, second = heads[..., 0, :], heads[..., 1, :]
        out = np.stack([first * c - second * s, first * s + second * c], axis=-2)
        return out.reshape(shape).astype(np.float32)
    pairs = x.reshape(*shape[:-1], shape[-1] // head_dim, head_dim // 2, 2)
    c = cos[..., None, :]
    s = sin[..., None, :]
    even, odd = pairs[..., 0], pairs[..., 1]
    out = np.stack([even * c - odd * s, even * s + odd * c], axis=-1)
    return out.reshape(shape).astype(np.float32)


def _plain_rms_norm(x: np.ndarray, gamma: np.ndarray, eps: float) -> np.ndarray:
    """An RMS norm off NormCE's loops: the row's inverse root in FP32, then two products."""
    inverse = 1.0 / np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True) + np.float32(eps))
    return x * inverse.astype(np.float32) * gamma


CHUNK_BYTES = 1 << 20  # float32 bytes of x per chunk of tiles: its temporaries stay in L2


def _run(p: dict[str, Any], mem: np.ndarray, tiles: np.ndarray, addresses: list[int]) -> list[Work]:
    """A chunk of tiles at a time (``tile_chunks``): every operation works along rows, so
    a row's result does not depend on the chunk it is in."""
    rows, cols = p["rows"], p["cols"]
    for chunk, at in tile_chunks(tiles, addresses, 4 * rows * cols, CHUNK_BYTES):
        _run_chunk(p, mem, chunk, at)
    return _work(p, (len(tiles), rows, cols))


def _run_chunk(p: dict[str, Any], mem: np.ndarray, tiles: np.ndarray,
               addresses: list[np.ndarray]) -> None:
    x_addr, aux0, aux1, out_addr = addresses
    rows, cols, op = p["rows"], p["cols"], p["op"]
    x = _matrix(mem, tiles, x_addr, rows, cols, p["x_pitch"], p["x"])
    if op == "layer_norm" and _normce(p):
        gamma = _matrix(mem, tiles, aux0, 1, cols, p["aux_pitch"], p["aux"])
        beta = _matrix(mem, tiles, aux1, 1, cols, p["aux_pitch"], p["aux"])
        result = normce_layer_norm(x, gamma, beta, p["eps"])  # [T, 1, cols] scale, shift
    elif op == "layer_norm":
        gamma = _matrix(mem, tiles, aux0, 1, cols, p["aux_pitch"], p["aux"])
        beta = _matrix(mem, tiles, aux1, 1, cols, p["aux_pitch"], p["aux"])
        mean = x.mean(axis=-1, keepdims=True)
        var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
        result = (x - mean) / np.sqrt(var + np.float32(p["eps"])) * gamma + beta
    elif op == "rms_norm":
        gamma = _matrix(mem, tiles, aux0, 1, cols, p["aux_pitch"], p["aux"])
        result = by_groups(normce_rms_norm if _normce(p) else _plain_rms_norm, x, gamma,
                           norm_group(p), p["eps"])
    elif op == "rms_sums":  # the blocks' sums a row, written block-major in FP32
        sums = rms_partials(x, int(p["width"])).transpose(0, 2, 1)
        write_rows(mem, tiles, out_addr, p["out_pitch"],
                   np.ascontiguousarray(sums, dtype=np.float32).view(np.uint8))
        return
    elif op == "rms_scale":
        gamma = _matrix(mem, tiles, aux0, 1, cols, p["aux_pitch"], p["aux"])
        sums = read_values(mem, tiles, aux1, rms_blocks(int(p["width"])), rows, 4 * rows, F32)
        result = rms_scale(x, gamma, sums.transpose(0, 2, 1), int(p["width"]), p["eps"])
    elif op in ("mul", "swiglu"):
        y = _matrix(mem, tiles, aux0, rows, cols, p["aux_pitch"], p["aux"])
        result = (activation(x, "silu") if op == "swiglu" else x) * y
    elif op in ("softmax", "biased_softmax"):
        shifted = x * np.float32(p["scale"])
        if op == "biased_softmax":
            table = _matrix(mem, tiles, aux0, rows, cols, p["aux_pitch"], p["aux"])
            if int(p.get("tables", 1)) == 2:  # the bias and the mask, summed first
                table = table + _matrix(mem, tiles, aux1, rows, cols, p["aux_pitch"], p["aux"])
            shifted = shifted + table
        shifted = shifted - shifted.max(axis=-1, keepdims=True)
        e = np.exp(shifted)
        result = e / e.sum(axis=-1, keepdims=True)
    elif op == "add":
        y = _matrix(mem, tiles, aux0, rows, cols, p["aux_pitch"], p["aux"])
        result = x + y
    elif op == "rope":
        half = _rotary(p) // 2
        cos = _matrix(mem, tiles, aux0, rows, half, p["aux_pitch"], p["aux"])
        sin = _matrix(mem, tiles, aux1, rows, half, p["aux_pitch"], p["aux"])
        result = rope_rotate(x, cos, sin, p["head_dim"], p.get("pairs") == "halves",
                             _rotary(p))
    elif op == "chain":
        bias = None
        if p.get("aux") is not None:
            bias = _matrix(mem, tiles, aux0, 1, cols, p["aux_pitch"], p["aux"])
        result = apply_chain(x, p["chain"], bias)
    else:
        raise ValueError(f"unknown row operation {op!r}")
    out = Precision.from_json(p["out"])
    write_rows(mem, tiles, out_addr, p["out_pitch"], out.quantize(result).view(np.uint8))


def _rotary(p: dict[str, Any]) -> int:
    """The channels of each head a rope turns (all of them unless ``rotary`` says fewer),
    checked against the head before anything runs."""
    head = p.get("head_dim")
    rotary = p.get("rotary", head)
    if not isinstance(head, int) or head <= 0 or int(p["cols"]) % head or \
            not isinstance(rotary, int) or rotary <= 0 or rotary % 2 or rotary > head:
        raise ValueError(f"rope of {p['cols']} columns cannot turn {rotary!r} channels of "
                         f"heads of {head!r}")
    return rotary


def _rms_blocks(p: dict[str, Any]) -> tuple[int, int]:
    """A split RMS norm's blocks in the row and on this tile; its columns must be whole
    blocks of its row's (a package's parameters are checked here before anything runs)."""
    width, cols = int(p["width"]), int(p["cols"])
    blocks = rms_blocks(width)
    if cols > width or (cols * blocks) % width:
        raise ValueError(f"{p['op']} of {cols} columns is not whole blocks of a {width}-wide "
                         f"row's {blocks}")
    return blocks, cols * blocks // width


# the operations that read an ``aux`` operand (a chain reads one only with a bias step)
WITH_AUX = ("layer_norm", "rms_norm", "rms_scale", "add", "mul", "swiglu", "biased_softmax",
            "rope")


def _accesses(p: dict[str, Any]) -> list[tuple[int, int, bool]]:
    if p["op"] in WITH_AUX and p.get("aux") is None:
        raise ValueError(f"{p['op']} has no aux operand's precision")
    norm_group(p)
    x = Precision.from_json(p["x"])
    out = Precision.from_json(p["out"])
    rows, cols = p["rows"], p["cols"]
    result = [(0, (rows - 1) * p["x_pitch"] + cols * x.itemsize, False)]
    if p["op"] == "rms_sums":  # a block's sums of every row, a block after another
        here = _rms_blocks(p)[1]
        return [*result, (3, (here - 1) * p["out_pitch"] + 4 * rows, True)]
    result.append((3, (rows - 1) * p["out_pitch"] + cols * out.itemsize, True))
    if p["op"] == "rms_scale":
        result.append((2, 4 * rows * _rms_blocks(p)[0], False))
    if p.get("aux") is not None:
        item = Precision.from_json(p["aux"]).itemsize
        if p["op"] in ("layer_norm", "rms_norm", "rms_scale", "chain"):
            extent = cols * item
        elif p["op"] == "rope":
            extent = (rows - 1) * p["aux_pitch"] + _rotary(p) // 2 * item
        else:
            extent = (rows - 1) * p["aux_pitch"] + cols * item
        result.append((1, extent, False))
        if p["op"] in ("layer_norm", "rope") or int(p.get("tables", 1)) == 2:
            result.append((2, extent, False))
    return result


def _regions(p: dict[str, Any]) -> list[Region]:
    x = Precision.from_json(p["x"]).itemsize
    out = Precision.from_json(p["out"]).itemsize
    rows, cols = p["rows"], p["cols"]
    result = [Region(0, 0, rows, cols * x, p["x_pitch"], False)]
    if p["op"] == "rms_sums":
        here = _rms_blocks(p)[1]
        return [*result, Region(3, 0, here, 4 * rows, p["out_pitch"], True)]
    if p["op"] == "rms_scale":
        blocks = _rms_blocks(p)[0]
        result.append(Region(2, 0, blocks, 4 * rows, 4 * rows, False))
    if p.get("aux") is not None:
        item = Precision.from_json(p["aux"]).itemsize
        if p["op"] in ("layer_norm", "rms_norm", "rms_scale", "chain"):
            shape = (1, cols * item)
        elif p["op"] == "rope":
            shape = (rows, _rotary(p) // 2 * item)
        else:
            shape = (rows, cols * item)
        result.append(Region(1, 0, shape[0], shape[1], p["aux_pitch"], False))
        if p["op"] in ("layer_norm", "rope") or int(p.get("tables", 1)) == 2:
            result.append(Region(2, 0, shape[0], shape[1], p["aux_pitch"], False))
    result.append(Region(3, 0, rows, cols * out, p["out_pitch"], True))
    return result


ROWWISE = register(
    KernelFamily(
        name="row",
        source="kernels/rowwise.py (f32v2 row loops)",
        code_bytes=640,
        make_name=_name,
        run=_run,
        accesses=_accesses,
        regions=_regions,
    )
)


def row_params(
    op: str,
    rows: int,
    cols: int,
    x: Precision,
    x_pitch: int,
    out: Precision,
    out_pitch: int,
    aux: Precision | None = None,
    aux_pitch: int = 0,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "op": op,
        "rows": int(rows),
        "cols": int(cols),
        "x": x.to_json(),
        "x_pitch": int(x_pitch),
        "out": out.to_json(),
        "out_pitch": int(out_pitch),
        "aux": None if aux is None else aux.to_json(),
        "aux_pitch": int(aux_pitch),
        **extra,
    }
