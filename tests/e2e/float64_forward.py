"""An independent float64 forward pass of the SigLIP MLP from saved tensors.

Written against the saved ``.npz`` files only, with numpy and the references of
``ipu_stack.testing.reference`` (``round_to``, the tanh GELU: numpy and ml_dtypes, nothing
from the stack), so it checks the device result the way a user with plain numpy would.
``round_to`` applies the stored precisions (from the saved metadata) at the same points the
graph stores values.
"""

from __future__ import annotations

import json

import numpy as np

from ipu_stack.testing.reference import gelu_tanh, gelu_tanh_half_loop, round_to

__all__ = ["gemm", "gemm_modes", "mlp_forward", "round_to"]


def gemm(x: np.ndarray, w: np.ndarray, mode: dict | None, rounded: bool) -> np.ndarray:
    """``x @ w`` as the package ran it: in the native FP8 mode the AMP adds each 32-deep pass
    to an FP16 partial (rounded there), per depth block, and the blocks' partials are then
    summed; otherwise (F16 mode, or the ideal answer) an exact product."""
    if not rounded or mode is None or mode["mode"] != "fp8":
        return x @ w
    total = np.zeros((x.shape[0], w.shape[1]))
    block = int(mode["depth_block"])
    for start in range(0, x.shape[1], block):
        partial = np.zeros_like(total)
        for k in range(start, min(start + block, x.shape[1]), 32):
            end = min(k + 32, start + block, x.shape[1])
            partial = (partial + x[:, k:end] @ w[k:end]).astype(np.float16).astype(np.float64)
        total += partial
    return total


def gemm_modes(saved: dict[str, np.ndarray]) -> dict[str, dict]:
    """The saved GEMM modes by matmul result name (empty for files without them)."""
    return json.loads(str(saved["__gemm_modes__"])) if "__gemm_modes__" in saved else {}


def mlp_forward(saved: dict[str, np.ndarray], rounded: bool) -> np.ndarray:
    """``fc2(gelu(fc1(x)))`` per block in float64; ``rounded`` applies stored precisions."""
    meta = json.loads(str(saved["__precisions__"]))
    modes = gemm_modes(saved)

    def store(values: np.ndarray, name: str) -> np.ndarray:
        return round_to(values, meta[name]) if rounded else values

    def linear(x: np.ndarray, weight: str, bias: str, mm: str, added: str) -> np.ndarray:
        y = store(gemm(x, saved[weight].astype(np.float64), modes.get(mm), rounded), mm)
        return store(y + saved[bias], added) if bias in saved else y

    x = saved["x"].astype(np.float64).reshape(-1, saved["x"].shape[-1])
    block = 0
    while f"w1.{block}" in saved:
        h = linear(x, f"w1.{block}", f"b1.{block}", f"fc1.{block}", f"fc1_bias.{block}")
        g = store(gelu_tanh_half_loop(h) if rounded else gelu_tanh(h), f"gelu.{block}")
        y = linear(g, f"w2.{block}", f"b2.{block}", f"fc2.{block}", f"fc2_bias.{block}")
        if f"cast.{block}" in meta and rounded:
            y = round_to(y, meta[f"cast.{block}"])
        x = y
        block += 1
    return x
