"""The host's values of the norms the device runs on ``NormCE``'s loops
(``kernels/norm.py``): the vendor's one-pass layer norm, and an RMS norm on the same loops.

They round where the device's kernel rounds (FP32 lane sums combined in pairs, the inverse
root rounded to F16, F16 products), so the verdict's host reference at device precision
follows the kernel; ``ir.interpret`` uses them when :func:`runs_normce` says the device
does.
"""

from __future__ import annotations

import numpy as np

from ipu_stack.ir.graph import Graph, Operation


def runs_normce(graph: Graph, op: Operation) -> bool:
    """A layer norm the device runs as the vendor's fused ``NormCE``, or an RMS norm on its
    loops (F16 rows, F16 scale and shift, a width that is a multiple of 4 below 8192, and
    an epsilon whose ``1 / sqrt(eps)`` an F16 holds; ``kernels/norm.py``)."""
    if op.kind not in ("layer_norm", "rms_norm"):
        return False
    width = graph.value(op.inputs[0]).type.shape[-1]
    return all(graph.value(i).type.precision.kind == "F16" for i in op.inputs) and \
        width % 4 == 0 and width < 8192 and float(op.attrs["eps"]) * 65504.0**2 >= 1.0


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
    of squares in FP32 lanes, over the width, plus eps; ``1 / sqrt`` in FP32 rounded to F16;
    then ``(x * r) * gamma`` with each product rounded to F16."""
    width = x.shape[-1]
    lanes = 8 if width % 8 == 0 and width >= 576 else 4
    xf = np.asarray(x, np.float32)
    power = _lane_sums(xf * xf, lanes) * (np.float32(1) / np.float32(width)) + np.float32(eps)
    inverse = (np.float32(1) / np.sqrt(power)).astype(np.float16)
    out = xf.astype(np.float16) * inverse[..., None]
    return (out * np.asarray(gamma).astype(np.float16)).astype(np.float32)
