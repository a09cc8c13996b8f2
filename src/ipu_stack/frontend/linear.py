"""One linear layer as IR operations: the GEMM every rule family and the fused-projection
split emit (``x @ W (+ b)``, FP8 A operand in fp8 mode, F16 result)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ipu_stack.frontend.convert import Converter
from ipu_stack.frontend.forms import Act
from ipu_stack.frontend.rules import row_activation
from ipu_stack.ir.precision import F16


def emit_linear(conv: Converter, node: Any, x: Any, weight: np.ndarray, key: str,
                bias: np.ndarray | None, bias_key: str | None, suffix: str = "") -> Act:
    """``x @ weight (+ bias)`` as IR operations: weight ``[in, out]``, FP8 A operand, F16."""
    act = row_activation(conv, node, x)  # rows in any order: the result keeps it
    if act.order is not None and len(act.order) < conv.b.graph.value(act.value).type.rows:
        act = conv.in_order(act, node)  # a few of the rows (a prompt's last): only those
    name = conv.name(node, suffix)
    a = conv.a_operand(act, node)
    w = conv.weight(key, weight, True)
    bias_name = None
    if bias is None:
        value = conv.b.op("matmul", [a, w], F16, name)
    else:
        mm = conv.b.op("matmul", [a, w], F16, f"{name}.mm")
        bv = conv.weight(bias_key or f"{name}.bias", bias.reshape(-1), False)
        bias_name = conv.b.graph.value(bv).name
        value = conv.b.op("bias_add", [mm, bv], F16, name)
    return Act(value, (*act.shape[:-1], weight.shape[1]), act.form, act.dims,
               linear=(conv.b.graph.value(w).name, bias_name), order=act.order)
