"""The host's values of the norms the device runs on ``NormCE``'s loops
(``kernels/norm.py``): the vendor's one-pass layer norm, and an RMS norm on the same loops.

They round where the device's kernel rounds (FP32 lane sums combined in pairs, the inverse
root rounded to F16, F16 products), so the verdict's host reference at device precision
follows the kernel; ``ir.interpret`` uses them when :func:`runs_normce` says the device
does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ipu_stack.ir.graph import Graph, Operation


def runs_normce(graph: Graph, op: Operation) -> bool:
    """A layer norm the device runs as the vendor's fused ``NormCE``, or an RMS norm on its
    loops (F16 rows, F16 scale and shift, a width that is a multiple of 4 below 8192, and
    an epsilon whose ``1 / sqrt(eps)`` an F16 holds; ``kernels/norm.py``)."""
    if op.kind not in ("layer_norm", "rms_norm"):
        return False
    width = int(op.attrs.get("group", graph.value(op.inputs[0]).type.shape[-1]))
    return all(graph.value(i).type.precision.kind == "F16" for i in op.inputs) and \
        width % 4 == 0 and width < 8192 and float(op.attrs["eps"]) * 65504.0**2 >= 1.0


def by_groups(norm: Callable[..., np.ndarray], x: np.ndarray, gamma: np.ndarray, group: int,
              *args: Any) -> np.ndarray:
    """``norm`` of each run of ``group`` columns of ``x``'s rows on its own, ``gamma`` (the
    scale of every column) split alike: a per-head RMS norm (Qwen3's QK-norm) of heads that
    lie side by side in a row, run as rows of one head's width."""
    cols = x.shape[-1]
    if group == cols:
        return norm(x, gamma, *args)
    heads = x.reshape(*x.shape[:-1], cols // group, group)
    scale = np.asarray(gamma).reshape(*np.shape(gamma)[:-1], cols // group, group)
    return norm(heads, scale, *args).reshape(x.shape)


# the narrowest RMS norm row summed in blocks, and so split by columns at a decode step
SPLIT_WIDTH = 512


def rms_blocks(width: int) -> int:
    """Blocks an RMS norm's sum of squares is gathered in: the row's columns in ``blocks``
    equal runs (whole accumulator vectors, at least 64 wide, at most 16 of them), each summed
    in its own lanes, the blocks' sums then added in order.  A decode step's few rows are
    then normalised a block a tile (``lowering.row_stage``: a tile's partial sums, an
    exchange, the sum and the scaling), and a whole row on one tile sums the same blocks in
    the same order, so the values do not depend on where the row ran.  One block (the
    one-pass order) for rows narrower than ``SPLIT_WIDTH``: a split row pays a second call's
    fixed costs and an exchange, which only wide loops repay (a 576-wide row's norm takes
    1,632 cycles in two calls against 1,650 in one, before the exchange; its layer gains
    from the adds and casts split with it, 25,416 cycles against 26,364)."""
    if width % 8 or width < SPLIT_WIDTH:
        return 1
    return max(b for b in range(1, 17) if (width // 8) % b == 0 and width // b >= 64)


def _lane_sums(values: np.ndarray, lanes: int) -> np.ndarray:
    """FP32 accumulators, one a lane, each adding its elements in order, then combined in
    pairs as the vendor's kernel combines them."""
    columns = values.shape[-1] // lanes
    acc = np.zeros((*values.shape[:-1], lanes), np.float32)
    for step in range(columns):
        acc = acc + values[..., step * lanes:(step + 1) * lanes]
    pairs = [acc[..., k] + acc[..., k + 2] for k in ((0, 4, 1, 5) if lanes == 8 else (0, 1))]
    if lanes == 8:
        return (pairs[0] + pairs[1]) + (pairs[2] + pairs[3])
    return pairs[0] + pairs[1]


def one_pass_layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float
                   ) -> np.ndarray:
    """The layer norm at the device's precision when it runs as ``NormCE``: sum and sum of
    squares in FP32 lanes, the mean rounded to F16, ``E[x^2] - mean^2`` in FP32 (not below
    0) plus eps, ``1 / sqrt`` in FP32 rounded to F16, then ``(x - mean) * r * gamma + beta``
    with every operation rounded to F16."""
    width = x.shape[-1]
    lanes = 8 if width % 8 == 0 and width >= 576 else 4
    xf = np.asarray(x, np.float32)
    inv_width = np.float32(1) / np.float32(width)
    # a row past F16's range overflows on the device too: its infinities are the answer
    with np.errstate(over="ignore", invalid="ignore"):
        mean_h = (_lane_sums(xf, lanes) * inv_width).astype(np.float16)
        mean_f = mean_h.astype(np.float32)
        power = _lane_sums(xf * xf, lanes) * inv_width
        var = np.maximum(power - mean_f * mean_f, np.float32(0)) + np.float32(eps)
        inverse = (np.float32(1) / np.sqrt(var)).astype(np.float16)
        out = (xf.astype(np.float16) - mean_h[..., None]) * inverse[..., None]
        out = out * np.asarray(gamma).astype(np.float16)
        return (out + np.asarray(beta).astype(np.float16)).astype(np.float32)


def one_pass_rms_norm(x: np.ndarray, gamma: np.ndarray, eps: float) -> np.ndarray:
    """The RMS norm at the device's precision when it runs on ``NormCE``'s loops: the sum
    of squares in FP32 lanes over each of the row's blocks (:func:`rms_blocks`), the blocks'
    sums added in order, over the width, plus eps; ``1 / sqrt`` in FP32 rounded to F16;
    then ``(x * r) * gamma`` with each product rounded to F16."""
    width = x.shape[-1]
    lanes = 8 if width % 8 == 0 and width >= 576 else 4
    block = width // rms_blocks(width)
    xf = np.asarray(x, np.float32)
    squares = _lane_sums(xf[..., :block] * xf[..., :block], lanes)
    for start in range(block, width, block):
        piece = xf[..., start:start + block]
        squares = squares + _lane_sums(piece * piece, lanes)
    power = squares * (np.float32(1) / np.float32(width)) + np.float32(eps)
    inverse = (np.float32(1) / np.sqrt(power)).astype(np.float16)
    out = xf.astype(np.float16) * inverse[..., None]
    return (out * np.asarray(gamma).astype(np.float16)).astype(np.float32)
