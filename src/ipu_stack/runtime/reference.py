"""The host reference: the graph evaluated with numpy at device precision.

Written independently of the device kernels: every operation is computed in float32 from
the exactly dequantised inputs and rounded to its output precision, as the graph says.  The
only freedom the device has is the order of float32 additions inside a matmul, which the
tolerance policy (``docs/tolerance.md``) accounts for.
"""

from __future__ import annotations

import numpy as np

from ipu_stack.ir.graph import Graph


def _gelu(x: np.ndarray, approximate: str) -> np.ndarray:
    x = x.astype(np.float32)
    if approximate == "tanh":
        c = np.float32(np.sqrt(2.0 / np.pi))
        return np.float32(0.5) * x * (np.float32(1) + np.tanh(c * (x + np.float32(0.044715) * x**3)))
    from math import erf

    return (0.5 * x * (1.0 + np.vectorize(erf)(x / np.sqrt(2.0)))).astype(np.float32)


def evaluate(graph: Graph, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """All values of ``graph`` as float32 arrays, keyed by value name."""
    values: dict[int, np.ndarray] = {}
    for value in graph.values:
        if value.role in ("input", "weight"):
            values[value.id] = value.type.precision.round_trip(tensors[value.name]).reshape(
                value.type.shape
            )
    for op in graph.operations:
        out = graph.value(op.outputs[0])
        ins = [values[i] for i in op.inputs]
        if op.kind == "matmul":
            a = ins[0].reshape(-1, ins[0].shape[-1]).astype(np.float32)
            result = (a @ ins[1].astype(np.float32)).reshape(out.type.shape)
        elif op.kind == "bias_add":
            result = ins[0] + ins[1]
        elif op.kind == "gelu":
            result = _gelu(ins[0], op.attrs.get("approximate", "tanh"))
        elif op.kind == "cast":
            result = ins[0]
        else:
            raise ValueError(f"reference has no rule for {op.kind}")
        values[out.id] = out.type.precision.round_trip(result)
    return {graph.value(i).name: v for i, v in values.items()}


def evaluate_float64(graph: Graph, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The same graph in float64 with no intermediate rounding (the ideal answer)."""
    values: dict[int, np.ndarray] = {}
    for value in graph.values:
        if value.role in ("input", "weight"):
            values[value.id] = np.asarray(tensors[value.name], dtype=np.float64).reshape(
                value.type.shape
            )
    for op in graph.operations:
        out = graph.value(op.outputs[0])
        ins = [values[i] for i in op.inputs]
        if op.kind == "matmul":
            result = (ins[0].reshape(-1, ins[0].shape[-1]) @ ins[1]).reshape(out.type.shape)
        elif op.kind == "bias_add":
            result = ins[0] + ins[1]
        elif op.kind == "gelu":
            x = ins[0]
            result = 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))
        else:
            result = ins[0]
        values[out.id] = result
    return {graph.value(i).name: v for i, v in values.items()}
