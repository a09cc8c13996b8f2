"""Elementwise operation semantics shared by the device kernels.

A *chain* is a list of ``[kind, precision_json]`` steps applied to an F32 tensor; after each
step the value is rounded to that step's output precision, exactly as the graph stores it.
Kinds: ``round`` (the matmul's own output rounding), ``bias`` (add the bias row), ``gelu_tanh``,
``gelu_erf``, ``cast``.  GELU is evaluated in F32.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ipu_stack.ir.precision import Precision
from ipu_stack.target.machine import VECTOR_COSTS

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation, in float32."""
    x = x.astype(np.float32, copy=False)
    inner = np.float32(SQRT_2_OVER_PI) * (x + np.float32(0.044715) * x * x * x)
    return (np.float32(0.5) * x * (np.float32(1.0) + np.tanh(inner))).astype(np.float32)


def gelu_erf(x: np.ndarray) -> np.ndarray:
    """GELU, exact (erf) form, in float32 (erf via math.erf vectorised on float64)."""
    x64 = x.astype(np.float64)
    erf = np.vectorize(math.erf, otypes=[np.float64])(x64 / math.sqrt(2.0))
    return (0.5 * x64 * (1.0 + erf)).astype(np.float32)


def apply_chain(
    values: np.ndarray, chain: list[list[Any]], bias: np.ndarray | None
) -> np.ndarray:
    """Apply the chain to F32 ``values`` (bias broadcast over rows), rounding after each step."""
    out = values.astype(np.float32, copy=False)
    for step in chain:
        kind, precision = step[0], Precision.from_json(step[1])
        if kind == "scale":
            out = out * np.float32(step[2])
        elif kind == "bias":
            if bias is None:
                raise ValueError("bias step without a bias operand")
            out = out + bias.astype(np.float32)
        elif kind == "gelu_tanh":
            out = gelu_tanh(out)
        elif kind == "gelu_erf":
            out = gelu_erf(out)
        elif kind not in ("round", "cast"):
            raise ValueError(f"unknown elementwise step {kind!r}")
        out = precision.round_trip(out)
    return out


def chain_cost_per_element(chain: list[list[Any]]) -> float:
    """Worker cycles per element of a chain (each step ends with a conversion)."""
    cost = 0.0
    for step in chain:
        kind = step[0]
        if kind in ("bias", "scale"):
            cost += VECTOR_COSTS["add_f32"].value
        elif kind in ("gelu_tanh", "gelu_erf"):
            cost += VECTOR_COSTS[kind].value
        cost += VECTOR_COSTS["convert"].value
    return cost
