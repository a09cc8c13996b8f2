"""Independent float64 references: written from their definitions with numpy and ml_dtypes
only (nothing from the stack), so that a test or a fuzz case judges the stack's numerics
with code that does not share them."""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import numpy as np

DTYPES = {
    "F16": np.float16,
    "F8F143": ml_dtypes.float8_e4m3fnuz,
    "F8F152": ml_dtypes.float8_e5m2fnuz,
}


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """The tanh GELU in float64, written from its formula."""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def gelu_tanh_half_loop(x: np.ndarray) -> np.ndarray:
    """The tanh GELU the way an F16 vector loop evaluates it, written from the loop's
    instruction list (popnn ``NonLinearityLoop_gelu.S``): every instruction's exact value
    rounded to the nearest F16, overflow saturating at 65504; float64 out."""

    def rn(v):
        return np.clip(v, -65504.0, 65504.0).astype(np.float16).astype(np.float64)

    x = rn(np.asarray(x, dtype=np.float64))
    c1 = rn(np.float64(math.sqrt(2.0 / math.pi)))
    c3 = rn(np.float64(math.sqrt(2.0 / math.pi) * 0.044715))
    steps = [rn(x * x)]
    steps.append(rn(x * steps[-1]))                  # x^3
    steps.append(rn(c1 * x + c3 * steps[-1]))        # the mix
    steps.append(rn(np.vectorize(math.tanh, otypes=[np.float64])(steps[-1])))  # scalar libm
    steps.append(rn(steps[-1] + 1.0))
    steps.append(rn(steps[-1] * 0.5))
    return rn(steps[-1] * x)


def _lane_layout(width: int) -> tuple[int, tuple[int, ...]]:
    """NormCE's FP32 accumulator lanes for a row of ``width`` (eight, or four below 576 or
    off a multiple of 8) and the order its pairwise combination reads them in."""
    lanes = 8 if width % 8 == 0 and width >= 576 else 4
    return lanes, [(0, 2, 4, 6, 1, 3, 5, 7), (0, 2, 1, 3)][lanes == 4]


def _lane_sums(row: np.ndarray) -> tuple[list, list, tuple[int, ...]]:
    """A row's sums and sums of squares in NormCE's FP32 lanes (scalar float32), and the
    order the lanes combine in."""
    f32 = np.float32
    lanes, order = _lane_layout(len(row))
    sums, squares = [f32(0)] * lanes, [f32(0)] * lanes
    for i, value in enumerate(row):
        v = f32(value)
        sums[i % lanes] = f32(sums[i % lanes] + v)
        squares[i % lanes] = f32(squares[i % lanes] + f32(v * v))
    return sums, squares, order


def _combined(acc: list, order: tuple[int, ...]) -> np.float32:
    """The lanes summed in pairs, as the kernel combines them (scalar float32)."""
    f32 = np.float32
    a = [acc[k] for k in order]
    if len(a) == 8:
        return f32(f32(f32(a[0] + a[1]) + f32(a[2] + a[3])) + f32(f32(a[4] + a[5])
                                                                + f32(a[6] + a[7])))
    return f32(f32(a[0] + a[1]) + f32(a[2] + a[3]))


def layer_norm_normce(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float
                      ) -> np.ndarray:
    """A layer norm the way PopTransformer's ``NormCE`` assembly computes it, written from
    its instruction list row by row with scalar float32 and float16 arithmetic: eight (or,
    below 576 or off a multiple of 8, four) FP32 lanes of sums and sums of squares, combined
    in pairs; the mean rounded to F16; ``E[x^2] - mean^2`` in FP32, not below 0, plus eps;
    ``1 / sqrt`` in FP32 rounded to F16; ``(x - mean) * r * gamma + beta`` rounding to F16
    after each operation.  float64 out."""
    f32, f16 = np.float32, np.float16

    def normalise(row: np.ndarray, sums: list, squares: list, order: tuple) -> list:
        reciprocal = f32(f32(1) / f32(len(row)))
        mean = f16(f32(_combined(sums, order) * reciprocal))
        var = f32(f32(_combined(squares, order) * reciprocal) - f32(f32(mean) * f32(mean)))
        inverse = f16(f32(1) / f32(np.sqrt(f32(max(var, f32(0)) + f32(eps)))))
        return [float(f16(f16(f16(f16(f16(v) - mean) * inverse) * f16(gamma[i]))
                          + f16(beta[i]))) for i, v in enumerate(row)]
    return _by_rows(x, normalise)


def rms_norm_normce(x: np.ndarray, gamma: np.ndarray, eps: float) -> np.ndarray:
    """An RMS norm on ``NormCE``'s loops, row by row with scalar float32 and float16
    arithmetic: the sums of squares in eight (or four) FP32 lanes, combined in pairs, times
    the FP32 reciprocal of the width, plus eps; ``1 / sqrt`` in FP32 rounded to F16;
    ``x * r * gamma`` rounding to F16 after each product.  float64 out."""
    f32, f16 = np.float32, np.float16

    def normalise(row: np.ndarray, sums: list, squares: list, order: tuple) -> list:
        power = f32(f32(_combined(squares, order) * f32(f32(1) / f32(len(row)))) + f32(eps))
        inverse = f16(f32(1) / f32(np.sqrt(power)))
        return [float(f16(f16(f16(v) * inverse) * f16(gamma[i]))) for i, v in enumerate(row)]
    return _by_rows(x, normalise)


def _by_rows(x: np.ndarray, normalise: Any) -> np.ndarray:
    """``normalise(row, sums, squares, order)`` of each row of ``x``, float64 out."""
    rows = np.atleast_2d(np.asarray(x, dtype=np.float64))
    out = np.array([normalise(row, *_lane_sums(row)) for row in rows], dtype=np.float64)
    return out.reshape(np.shape(x))


def round_to(values: np.ndarray, precision: dict) -> np.ndarray:
    """``values`` rounded to a stored precision given as its JSON form (``{"kind": "F8F143",
    "scale_exponent": -3}``), back in float64; FP8 saturates at its largest finite value."""
    kind, scale = precision["kind"], precision.get("scale_exponent", 0)
    if kind == "F32":
        return values.astype(np.float32).astype(np.float64)
    dtype = DTYPES[kind]
    scaled = values * 2.0**-scale
    if kind.startswith("F8"):
        limit = float(ml_dtypes.finfo(dtype).max)
        scaled = np.clip(scaled, -limit, limit)
    return scaled.astype(dtype).astype(np.float64) * 2.0**scale
