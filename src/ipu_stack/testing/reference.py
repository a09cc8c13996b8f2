"""Independent float64 references: written from their definitions with numpy and ml_dtypes
only (nothing from the stack), so that a test or a fuzz case judges the stack's numerics
with code that does not share them."""

from __future__ import annotations

import math

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
