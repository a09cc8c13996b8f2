"""The graph interpreter: the host reference at device precision, or ideal float64.

Written independently of the device kernels.  ``evaluate`` computes every operation in
float32 from the exactly dequantised inputs and rounds to its output precision, as the graph
says; the only freedom the device has is the order of float32 additions inside a matmul,
which the tolerance policy (``docs/tolerance.md``) accounts for.  ``evaluate_float64`` runs
the same graph in float64 with no intermediate rounding (the ideal answer, for reports).
"""

from __future__ import annotations

from collections.abc import Callable
from math import erf

import numpy as np

from ipu_stack.ir.graph import Graph, Operation


def _gelu(x: np.ndarray, approximate: str, dtype: type) -> np.ndarray:
    x = x.astype(dtype)
    if approximate == "tanh":
        c = dtype(np.sqrt(2.0 / np.pi))
        return dtype(0.5) * x * (dtype(1) + np.tanh(c * (x + dtype(0.044715) * x**3)))
    return (0.5 * x * (1.0 + np.vectorize(erf)(x / np.sqrt(2.0)))).astype(dtype)


def _head_matmul(op: Operation, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    heads, tokens = int(op.attrs["heads"]), int(op.attrs["tokens"])
    batch = b.shape[0] // tokens
    head_dim = b.shape[1] // heads
    bh = b.reshape(batch, tokens, heads, head_dim).transpose(0, 2, 1, 3)  # [B, H, T, d]
    if op.attrs["mode"] == "qk":
        ah = a.reshape(batch, tokens, heads, head_dim).transpose(0, 2, 1, 3)
        return np.matmul(ah, bh.transpose(0, 1, 3, 2)).reshape(batch * heads * tokens, tokens)
    p = a.reshape(batch, heads, tokens, tokens)
    o = np.matmul(p, bh)  # [B, H, T, d]
    return o.transpose(0, 2, 1, 3).reshape(batch * tokens, heads * head_dim)


def _rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, head_dim: int) -> np.ndarray:
    rows, cols = x.shape
    pairs = x.reshape(rows, cols // head_dim, head_dim // 2, 2)
    c, s = cos[:, None, :], sin[:, None, :]
    even, odd = pairs[..., 0], pairs[..., 1]
    return np.stack([even * c - odd * s, even * s + odd * c], axis=-1).reshape(rows, cols)


def _apply(op: Operation, ins: list[np.ndarray], dtype: type) -> np.ndarray:
    if op.kind == "matmul":
        a = ins[0].reshape(-1, ins[0].shape[-1]).astype(dtype)
        return a @ ins[1].astype(dtype)
    if op.kind == "head_matmul":
        return _head_matmul(op, ins[0].astype(dtype), ins[1].astype(dtype))
    if op.kind in ("bias_add", "add"):
        return ins[0].astype(dtype) + ins[1].astype(dtype)
    if op.kind == "gelu":
        return _gelu(ins[0], op.attrs.get("approximate", "tanh"), dtype)
    if op.kind == "scale":
        return ins[0].astype(dtype) * dtype(op.attrs["factor"])
    if op.kind == "cast":
        return ins[0].astype(dtype)
    if op.kind == "softmax":
        x = ins[0].astype(dtype) * dtype(op.attrs.get("scale", 1.0))
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)
    if op.kind == "layer_norm":
        x = ins[0].astype(dtype)
        mean = x.mean(axis=-1, keepdims=True)
        var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
        return (x - mean) / np.sqrt(var + dtype(op.attrs["eps"])) * ins[1] + ins[2]
    if op.kind == "rope":
        return _rope(ins[0].astype(dtype), ins[1].astype(dtype), ins[2].astype(dtype),
                     int(op.attrs["head_dim"]))
    raise ValueError(f"reference has no rule for {op.kind}")


def _run(graph: Graph, tensors: dict[str, np.ndarray], dtype: type,
         store: Callable[[np.ndarray, object], np.ndarray]) -> dict[str, np.ndarray]:
    values: dict[int, np.ndarray] = {}
    for value in graph.values:
        if value.role in ("input", "weight"):
            data = np.asarray(tensors[value.name])
            values[value.id] = store(data, value.type.precision).reshape(value.type.rows, -1) \
                if len(value.type.shape) > 1 else store(data, value.type.precision)
    for op in graph.operations:
        out = graph.value(op.outputs[0])
        result = _apply(op, [values[i] for i in op.inputs], dtype)
        values[out.id] = store(result.reshape(out.type.rows, -1), out.type.precision)
    return {
        graph.value(i).name: v.reshape(graph.value(i).type.shape) for i, v in values.items()
    }


def evaluate(graph: Graph, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """All values of ``graph`` at device precision (float32 arrays), keyed by value name."""
    return _run(graph, tensors, np.float32, lambda data, precision: precision.round_trip(data))


def evaluate_float64(graph: Graph, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The same graph in float64 with no intermediate rounding (the ideal answer)."""
    return _run(graph, tensors, np.float64,
                lambda data, precision: np.asarray(data, dtype=np.float64))
