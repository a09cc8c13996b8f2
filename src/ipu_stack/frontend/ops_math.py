"""ATen rules, arithmetic and row operations: add/sub/mul/div/neg (lazy factors and
addends, layer-scale folding, RoPE products, products of activations), layer_norm, gelu,
softmax."""

from __future__ import annotations

from typing import Any

import numpy as np

from ipu_stack.frontend import forms, order, patterns, rope
from ipu_stack.frontend.attention import softmax_op
from ipu_stack.frontend.convert import Converter, unsupported
from ipu_stack.frontend.forms import Act, UserInput
from ipu_stack.frontend.ops_gemm import cache_mask
from ipu_stack.frontend.ops_lookup import host_arithmetic
from ipu_stack.frontend.rules import (
    activation,
    constant_array,
    is_tensor,
    out_precision,
    row_activation,
    rule,
    to_numpy,
)
from ipu_stack.ir.precision import F16


# ---------------------------------------------------------------- arithmetic
@rule("aten.add", "aten.sub", "aten.rsub")
def _add(conv: Converter, node: Any, x: Any, y: Any, alpha: float = 1.0) -> Any:
    if (gelu := patterns.gelu_pending(x, y)) is not None:  # GELU's tanh form written out
        return patterns.gelu_step(conv, node, gelu)
    if _on_ids(node) and alpha == 1.0:  # RoBERTa's position ids; rsub(x, y) is y - x
        target = str(node.target)
        x, y = (y, x) if "rsub" in target else (x, y)
        return host_arithmetic(node, "sub" if "sub" in target else "add", x, y)
    if any(a in conv.host_nodes for a in node.all_input_nodes):
        return _add_cache_mask(conv, node, x, y, alpha)
    if isinstance(y, patterns.Centring) and "aten.sub" in str(node.target) and alpha == 1.0:
        return patterns.Pending("centred", y.act, node)  # x - mean(x) (checked ahead)
    sign = -1.0 if "sub" in str(node.target) else 1.0
    if "rsub" in str(node.target):
        x, y = y, x
    if isinstance(x, patterns.Pending) and sign > 0 and not isinstance(y, (Act, UserInput)):
        return patterns.advance(node, x, "mean_square_eps", float(constant_array(y)) * alpha)
    symbolic = (rope.Pairs, rope.PairPart)
    if isinstance(x, symbolic) or isinstance(y, symbolic):
        summed = rope.add(x, y, sign * alpha)
        if summed is None:
            raise unsupported(node, "a sum of channel-pair values of different inputs")
        return summed
    if isinstance(x, UserInput):
        x = conv.user_act(x, node)
    if isinstance(y, UserInput):
        y = conv.user_act(y, node)
    if isinstance(x, Act) and isinstance(y, Act):
        return _add_acts(conv, node, x, y, sign * alpha)
    if isinstance(y, Act):  # constant + activation (or constant - activation)
        return _add_constant(conv, node, _scale(y, sign * alpha), constant_array(x))
    return _add_constant(conv, node, x, sign * alpha * constant_array(y))


def _add_cache_mask(conv: Converter, node: Any, x: Any, y: Any, alpha: float) -> Act:
    """Scores over a KV cache plus the mask the host computes from the positions (Gemma 2's
    eager attention): the mask a per-call input the softmax adds (``biased_softmax``)."""
    scores, mask_node, values = (x, node.args[1], y) if isinstance(x, Act) else \
        (y, node.args[0], x)
    if "aten.add" not in str(node.target) or alpha != 1.0 or not isinstance(scores, Act) or \
            not scores.over_cache or scores.attention is None or scores.mask is not None or \
            scores.addend is not None or mask_node not in conv.host_nodes:
        raise unsupported(node, "a value computed from the position input added other than "
                          "as the mask of scores over a KV cache")
    b, h, t = scores.attention
    mask = cache_mask(conv, node, mask_node, values, (b, h, t, scores.shape[-1]),
                      f"{conv.name(node)}.mask")
    return scores.with_(mask=mask, linear=None)


def _scale(act: Act, factor: float) -> Act:
    addend = None if act.addend is None else act.addend * factor
    return act.with_(factor=act.factor * factor, addend=addend, linear=None)


def _add_constant(conv: Converter, node: Any, act: Act, constant: np.ndarray) -> Act:
    act = conv.in_order(act, node)  # the constant's rows are in logical order
    if act.prefix or act.suffix or act.form not in ("rows", "replicated"):
        raise unsupported(node, f"adding a constant to a {act.form}-form value")
    if np.broadcast_shapes(constant.shape, act.shape) != act.shape:
        raise unsupported(node, "a constant that broadcasts the activation to a larger shape")
    rows = forms.broadcast_rows(constant, act)
    addend = rows if act.addend is None else act.addend + rows
    return act.with_(addend=addend, linear=None, origin=conv.name(node))


def _add_acts(conv: Converter, node: Any, x: Act, y: Act, alpha: float) -> Act:
    # two values in the same form and dims are the same IR matrix layout: add them row by row
    if x.shape != y.shape or x.form != y.form or x.dims != y.dims or x.attention != y.attention:
        raise unsupported(node, f"add of {x.form} {list(x.shape)} and {y.form} {list(y.shape)}")
    # lazy addends are applied here, not carried on: a residual stream would otherwise
    # re-add a position table at every layer (``plain`` memoises the first application)
    xs = conv.plain(x, node)
    ys = conv.plain(y.with_(factor=y.factor * alpha,
                            addend=None if y.addend is None else y.addend * alpha), node) \
        if alpha != 1.0 else conv.plain(y, node)
    if xs.order is not None or ys.order is not None:  # rows out of order (Swin's windows)
        if order.keeps_rows(xs, True) and order.keeps_rows(ys, True):
            ys, xs = order.in_same_order(conv, node, ys, xs)
        else:
            xs, ys = conv.in_order(xs, node), conv.in_order(ys, node)
    value = conv.b.op("add", [xs.value, ys.value], F16, conv.name(node))
    return Act(value, x.shape, x.form, x.dims, order=xs.order)


def _on_ids(node: Any) -> bool:
    """Whether the operation is integer arithmetic (on a program input's ids)."""
    value = node.meta.get("val")
    return value is not None and hasattr(value, "dtype") and not value.dtype.is_floating_point


@rule("aten.mul")
def _mul(conv: Converter, node: Any, x: Any, y: Any) -> Any:
    if (gelu := patterns.gelu_pending(x, y)) is not None:  # GELU's tanh form written out
        return patterns.gelu_step(conv, node, gelu)
    if _on_ids(node):
        return host_arithmetic(node, "mul", x, y)
    symbolic = (Act, UserInput, rope.Pairs, rope.PairPart, patterns.Pending)
    if not isinstance(x, symbolic):
        x, y = y, x
    if isinstance(x, Act) and is_tensor(y) and (folded := _norm_scale(conv, node, x, y)):
        return folded  # a per-head norm's scale (Qwen3's q_norm) before any RoPE
    if isinstance(x, (rope.Pairs, rope.PairPart)) or (
            isinstance(x, Act) and is_tensor(y) and y.numel() > 1 and rope.start(x) is not None):
        return _mul_pairs(conv, node, x, y)
    if isinstance(x, patterns.Pending) and x.stage == "gate" and not isinstance(
            y, (Act, UserInput, patterns.Pending)):  # silu(a) times a constant after all
        x = patterns.emit_activation(conv, node, x.act, x.function)
    if isinstance(x, patterns.Pending) or isinstance(y, (Act, UserInput, patterns.Pending)):
        return patterns.multiply(conv, node, activation(conv, node, x) if isinstance(
            x, UserInput) else x, activation(conv, node, y) if isinstance(y, UserInput) else y)
    act = activation(conv, node, x)
    constant = constant_array(y)
    if constant.size == 1:
        return _scale(act, float(constant.reshape(())))
    if act.linear is not None and _per_channel(conv, node, act, constant):
        return _fold_column_scale(conv, node, act, constant.reshape(-1))
    raise unsupported(node, "a product with a tensor that is not a per-channel scale of a "
                      "linear layer's output")


def _norm_scale(conv: Converter, node: Any, act: Act, y: Any) -> Act | None:
    """``rms_norm(x) * gamma`` with ``gamma`` per channel (and the product the scale's only
    use): folded into the norm's scale; None when the product is not so."""
    if act.norm_scale is None:
        return None
    constant = constant_array(y)
    if constant.size > 1 and _per_channel(conv, node, act, constant):
        return patterns.fold_norm_scale(conv, node, act, constant.reshape(-1))
    return None


def _per_channel(conv: Converter, node: Any, act: Act, constant: np.ndarray) -> bool:
    """Whether ``constant`` holds one value a channel of ``act`` (broadcast over the rest)
    and the product is its only use, so folding it into a weight changes nothing else."""
    arg = node.args[0] if node.args[0] in conv.dynamic else node.args[1]
    return constant.reshape(-1).size == act.shape[-1] and np.broadcast_shapes(
        constant.shape, act.shape) == act.shape and len(arg.users) == 1


def _mul_pairs(conv: Converter, node: Any, x: Any, y: Any) -> Any:
    """A product on a query/key in heads form: part of a RoPE (``frontend/rope.py``)."""
    if isinstance(y, (Act, UserInput, rope.Pairs, rope.PairPart)):
        raise unsupported(node, "product of two activations")
    value = rope.start(x) if isinstance(x, Act) else x
    constant = constant_array(y)
    if constant.size == 1:
        return rope.scale(value, float(constant.reshape(())))
    product = rope.multiply(value, constant)
    if product is None:
        raise unsupported(node, "a product with a table that differs between images or heads")
    return product


def _fold_column_scale(conv: Converter, node: Any, act: Act, scale: np.ndarray) -> Act:
    """``linear(x) * gamma`` (layer scale) is ``x @ (W * gamma) + b * gamma``: folded into
    the weights at compile time."""
    weight_key, bias_key = act.linear  # type: ignore[misc]
    value_id, raw, kind = conv.weights[weight_key]
    conv.weights[weight_key] = (value_id, raw * scale[None, :].astype(np.float32), kind)
    if bias_key is not None:
        bias_id, bias, bias_kind = conv.weights[bias_key]
        conv.weights[bias_key] = (bias_id, bias * scale.astype(np.float32), bias_kind)
    conv.rewrites.append(f"{node.name}: per-channel scale folded into {weight_key}")
    return act.with_(linear=None)


@rule("aten.div")
def _div(conv: Converter, node: Any, x: Any, y: Any, rounding_mode: Any = None) -> Act:
    if isinstance(y, patterns.Pending) and y.stage == "inverse_rms":  # x / sqrt(var + eps)
        return patterns.multiply(conv, node, x, y)
    act = activation(conv, node, x)
    if isinstance(y, (Act, UserInput)) or rounding_mode is not None:
        raise unsupported(node, "division by an activation, or rounding division")
    constant = constant_array(y)
    if constant.size != 1:
        raise unsupported(node, "division by a tensor")
    return _scale(act, 1.0 / float(constant.reshape(())))


@rule("aten.neg")
def _neg(conv: Converter, node: Any, x: Any) -> Any:
    if isinstance(x, (rope.Pairs, rope.PairPart)):
        return rope.scale(x, -1.0)
    return _scale(activation(conv, node, x), -1.0)


# ---------------------------------------------------------------- row operations
@rule("aten.layer_norm")
def _layer_norm(conv: Converter, node: Any, x: Any, shape: Any, weight: Any = None,
                bias: Any = None, eps: float = 1e-5, cudnn: bool = True) -> Act:
    act = row_activation(conv, node, x)
    cols = act.shape[-1]
    if list(shape) != [cols]:
        raise unsupported(node, "layer norm over more than the last dimension")
    name = conv.name(node)
    gamma = to_numpy(weight) if weight is not None else np.ones(cols, np.float32)
    beta = to_numpy(bias) if bias is not None else np.zeros(cols, np.float32)
    g = conv.weight(conv.const_key(weight, f"{name}.weight"), gamma, False)
    bt = conv.weight(conv.const_key(bias, f"{name}.bias"), beta, False)
    value = conv.b.op("layer_norm", [act.value, g, bt], out_precision(conv, node, name), name,
                      eps=float(eps))
    return act.with_(value=value)


@rule("aten.gelu")
def _gelu(conv: Converter, node: Any, x: Any, approximate: str = "none") -> Act:
    act = row_activation(conv, node, x)
    name = conv.name(node)
    value = conv.b.op("gelu", [act.value], out_precision(conv, node, name), name,
                      approximate="tanh" if approximate == "tanh" else "none")
    return act.with_(value=value)


@rule("aten.softmax", "aten._softmax", "aten._safe_softmax")
def _softmax(conv: Converter, node: Any, x: Any, dim: int = -1, *rest: Any, **kwargs: Any) -> Act:
    act = activation(conv, node, x)
    if dim % len(act.shape) != len(act.shape) - 1:
        raise unsupported(node, "softmax over a dimension other than the last")
    if act.form != "rows" or act.prefix or act.suffix:
        raise unsupported(node, f"softmax of a {act.form}-form value")
    if act.addend is not None and act.attention is None:
        raise unsupported(node, "softmax with an additive constant outside attention")
    if act.mask is not None:  # scores over a KV cache plus the host's mask
        if act.addend is not None:
            raise unsupported(node, "a softmax of scores with both a mask and a constant")
        value = conv.b.op("biased_softmax", [act.value, act.mask], F16, conv.name(node),
                          scale=float(act.factor))
        return act.with_(value=value, factor=1.0, mask=None)
    bias = None if act.addend is None else act.addend.reshape(act.shape)  # factor x + addend
    value = softmax_op(conv, act, float(act.factor), bias, conv.name(node))
    return act.with_(value=value, factor=1.0, addend=None)
