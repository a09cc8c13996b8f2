"""ATen rules, activations and normalisation: sigmoid, tanh, SiLU (alone, or gating a product
as SwiGLU), quick GELU (``x * sigmoid(1.702 x)``), RMS norm (``aten.rms_norm`` or written
out as ``x * rsqrt(mean(x^2) + eps)``); the multi-node forms are matched in
``frontend/patterns.py``."""

from __future__ import annotations

from typing import Any

import numpy as np

from ipu_stack.frontend import patterns
from ipu_stack.frontend.convert import Converter, unsupported
from ipu_stack.frontend.forms import Act
from ipu_stack.frontend.patterns import Pending
from ipu_stack.frontend.rules import (
    activation,
    is_tensor,
    norm_activation,
    out_precision,
    rule,
    to_numpy,
)


@rule("aten.sigmoid")
def _sigmoid(conv: Converter, node: Any, x: Any) -> Act | Pending:
    source = patterns.gate_of(node, "quick_gelu")
    if source is not None:  # x * sigmoid(1.702 x): one quick_gelu at the product
        return Pending("gate", activation(conv, node, conv.env[source]), source,
                       function="quick_gelu")
    return patterns.emit_activation(conv, node, activation(conv, node, x), "sigmoid")


@rule("aten.tanh")
def _tanh(conv: Converter, node: Any, x: Any) -> Act | Pending:
    if patterns.gelu_pending(x) is not None:
        return patterns.gelu_step(conv, node, x)
    return patterns.emit_activation(conv, node, activation(conv, node, x), "tanh")


@rule("aten.silu")
def _silu(conv: Converter, node: Any, x: Any, inplace: bool = False) -> Act | Pending:
    act = activation(conv, node, x)
    if patterns.gate_of(node, "silu") is not None:  # silu(a) * b: one swiglu at the product
        return Pending("gate", act, node, function="silu")
    return patterns.emit_activation(conv, node, act, "silu")


@rule("aten.pow")
def _pow(conv: Converter, node: Any, x: Any, exponent: Any) -> Act | Pending:
    if isinstance(x, Pending) and x.stage == "centred":  # a layer norm's (checked ahead)
        return Pending("square", x.act, node.args[0], centred=True)
    act = activation(conv, node, x)
    if exponent == 3 and (last := patterns.gelu_tanh_chain(node)) is not None:
        return Pending("gelu", act, node.args[0], last=last)
    if exponent != 2:
        raise unsupported(node, f"a power other than 2 ({exponent})")
    if patterns.rms_chain(node) is not None:
        return Pending("square", act, node.args[0])
    return patterns.multiply(conv, node, act, act)


@rule("aten.rsqrt", "aten.sqrt")
def _rsqrt(conv: Converter, node: Any, x: Any) -> Pending:
    """A norm's root of its statistics: ``rsqrt`` for a product, ``sqrt`` for a division
    (``rms_chain`` checked which ahead)."""
    if not isinstance(x, Pending):
        raise unsupported(node, "a root of an activation (only a norm's statistics)")
    return patterns.advance(node, x, "inverse_rms")


@rule("aten.rms_norm")
def _rms_norm(conv: Converter, node: Any, x: Any, shape: Any, weight: Any = None,
              eps: float | None = None) -> Act:
    act, group = norm_activation(conv, node, x)
    cols = act.shape[-1]
    if list(shape) != [cols]:
        raise unsupported(node, "RMS norm over more than the last dimension")
    if weight is not None and not is_tensor(weight):
        raise unsupported(node, "RMS norm with a computed scale")
    name = conv.name(node)
    gamma = to_numpy(weight) if weight is not None else np.ones(cols, np.float32)
    # a heads-form value's scale is one head's, held for every head side by side
    gamma = np.tile(gamma, conv.b.graph.value(act.value).type.cols // cols)
    g = conv.weight(f"{name}.weight" if group else conv.const_key(weight, f"{name}.weight"),
                    gamma, False)
    # torch's default eps is float32's machine epsilon
    eps = float(np.finfo(np.float32).eps) if eps is None else float(eps)
    value = conv.b.op("rms_norm", [act.value, g], out_precision(conv, node, name), name, eps=eps,
                      **({} if group is None else {"group": group}))
    return act.with_(value=value, linear=None)
