"""The ATen operations the importer maps, one rule each (``HANDLERS``).

A rule gets the converter, the FX node and its arguments with nodes replaced by what the
converter made of them (constants, :class:`Act`, :class:`UserInput`); it returns the node's
value.  Operations whose inputs are all constants never reach a rule: the converter runs
them in torch (constant folding: ``embedding(weight, arange)``, ``cls.expand(...)``, masks).
"""

from __future__ import annotations

from collections.abc import Callable
from math import prod, sqrt
from typing import Any

import numpy as np

from ipu_stack.frontend import forms, rope
from ipu_stack.frontend.convert import Converter, unsupported
from ipu_stack.frontend.forms import Act, UserInput
from ipu_stack.ir.precision import F16

Handler = Callable[..., Any]
HANDLERS: dict[str, Handler] = {}


def rule(*names: str) -> Callable[[Handler], Handler]:
    def register(function: Handler) -> Handler:
        for name in names:
            HANDLERS[name] = function
        return function
    return register


def _np(tensor: Any) -> np.ndarray:
    return tensor.detach().to(dtype=__import__("torch").float32).numpy().astype(np.float32)


def _is_tensor(value: Any) -> bool:
    return hasattr(value, "detach") and hasattr(value, "shape")


def _act(conv: Converter, node: Any, value: Any) -> Act:
    """An activation argument (a user input used as-is becomes one here)."""
    if isinstance(value, UserInput):
        return conv.user_act(value, node)
    if not isinstance(value, Act):
        raise unsupported(node, "expected an activation")
    return value


# ---------------------------------------------------------------- pass-through and views
@rule("aten._assert_tensor_metadata", "aten._assert_scalar", "aten.sym_constrain_range_for_size")
def _assert(conv: Converter, node: Any, *args: Any, **kwargs: Any) -> None:
    return None


@rule("aten.contiguous", "aten.clone", "aten.alias", "aten.detach", "aten.lift_fresh_copy")
def _identity(conv: Converter, node: Any, x: Any, *args: Any, **kwargs: Any) -> Any:
    return x


@rule("aten.to", "aten._to_copy", "aten.type_as")
def _to(conv: Converter, node: Any, x: Any, *args: Any, **kwargs: Any) -> Any:
    """Float dtype changes are the device's precision policy's business; others are not."""
    torch = conv.torch
    dtypes = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.dtype)]
    if any(not d.is_floating_point for d in dtypes):
        raise unsupported(node, "conversion of an activation to a non-float dtype")
    return x


@rule("aten.dropout", "aten.feature_dropout")
def _dropout(conv: Converter, node: Any, x: Any, p: float = 0.0, train: bool = False) -> Any:
    if train and p > 0:
        raise unsupported(node, "dropout in training mode (export the model in eval())")
    return x


def _view(conv: Converter, node: Any, x: Any, shape: tuple[int, ...]) -> Any:
    if isinstance(x, (rope.Pairs, rope.PairPart)):
        pairs = rope.view(x, forms.resolve_shape(shape, prod(x.shape)))
        if pairs is None:
            raise unsupported(node, f"view of a channel-pair value as {list(shape)}")
        return pairs
    act = _act(conv, node, x)
    total = prod(act.shape)
    resolved = forms.resolve_shape(shape, total)
    if resolved == (*act.shape[:-1], act.shape[-1] // 2, 2) and rope.start(act) is not None:
        return rope.view(rope.start(act), resolved)  # type: ignore[arg-type]
    out = forms.reshape(act, resolved)
    if out is None:
        raise unsupported(node, f"view of a {act.form}-form value {list(act.shape)} as "
                          f"{list(shape)} moves data")
    return out


@rule("aten.view", "aten.reshape", "aten._unsafe_view")
def _reshape(conv: Converter, node: Any, x: Any, shape: Any) -> Act:
    return _view(conv, node, x, tuple(int(s) for s in shape))


def _shaped(conv: Converter, node: Any, x: Any) -> Any:
    return x if isinstance(x, (rope.Pairs, rope.PairPart)) else _act(conv, node, x)


@rule("aten.flatten")
def _flatten(conv: Converter, node: Any, x: Any, start: int = 0, end: int = -1) -> Any:
    act = _shaped(conv, node, x)
    n = len(act.shape)
    start, end = start % n, end % n
    shape = (*act.shape[:start], prod(act.shape[start:end + 1]), *act.shape[end + 1:])
    return _view(conv, node, act, shape)


@rule("aten.unflatten")
def _unflatten(conv: Converter, node: Any, x: Any, dim: int, sizes: Any) -> Any:
    act = _shaped(conv, node, x)
    dim %= len(act.shape)
    sizes = forms.resolve_shape(sizes, act.shape[dim])
    return _view(conv, node, act, (*act.shape[:dim], *sizes, *act.shape[dim + 1:]))


@rule("aten.unbind")
def _unbind(conv: Converter, node: Any, x: Any, dim: int = 0) -> list[Any]:
    if isinstance(x, rope.Pairs) and x.split and dim % len(x.shape) == len(x.shape) - 1:
        return [rope.component(x, 0), rope.component(x, 1)]
    raise unsupported(node, "unbinding an activation (only the pair axis of a RoPE view)")


@rule("<built-in function getitem>")
def _getitem(conv: Converter, node: Any, items: Any, index: int) -> Any:
    if isinstance(items, (list, tuple)):
        return items[index]
    raise unsupported(node, "indexing an activation")


@rule("aten.stack")
def _stack(conv: Converter, node: Any, parts: Any, dim: int = 0) -> Any:
    pairs = rope.stack(list(parts))
    if pairs is None or dim % len(pairs.shape) != len(pairs.shape) - 1:
        raise unsupported(node, "stacking activations (only the two halves of a RoPE pair)")
    return pairs


@rule("aten.unsqueeze")
def _unsqueeze(conv: Converter, node: Any, x: Any, dim: int) -> Act:
    act = _act(conv, node, x)
    dim %= len(act.shape) + 1
    return _view(conv, node, act, (*act.shape[:dim], 1, *act.shape[dim:]))


@rule("aten.squeeze")
def _squeeze(conv: Converter, node: Any, x: Any, dim: Any = None) -> Act:
    act = _act(conv, node, x)
    n = len(act.shape)
    dims = range(n) if dim is None else ([dim] if isinstance(dim, int) else list(dim))
    drop = {d % n for d in dims if act.shape[d % n] == 1}
    return _view(conv, node, act, tuple(s for i, s in enumerate(act.shape) if i not in drop))


@rule("aten.transpose")
def _transpose(conv: Converter, node: Any, x: Any, a: int, b: int) -> Act:
    act = _act(conv, node, x)
    return _permute(conv, node, act, forms.transpose_perm(len(act.shape), a, b))


@rule("aten.permute")
def _permute(conv: Converter, node: Any, x: Any, perm: Any) -> Act:
    act = _act(conv, node, x)
    out = forms.permute(act, tuple(int(p) for p in perm))
    if out is None:
        raise unsupported(node, f"permute {list(perm)} of a {act.form}-form value "
                          f"{list(act.shape)} moves data")
    return out


@rule("aten.expand")
def _expand(conv: Converter, node: Any, x: Any, shape: Any, implicit: bool = False) -> Act:
    act = _act(conv, node, x)
    size = tuple(s if s != -1 else act.shape[i - len(shape) + len(act.shape)]
                 for i, s in enumerate(shape))
    if size != act.shape:
        raise unsupported(node, "expanding an activation replicates data")
    return act


@rule("aten.slice")
def _slice(conv: Converter, node: Any, x: Any, dim: int = 0, start: Any = None, end: Any = None,
           step: int = 1) -> Act:
    act = _act(conv, node, x)
    dim %= len(act.shape)
    size = act.shape[dim]
    start = 0 if start is None else (start + size if start < 0 else start)
    end = size if end is None else min(end + size if end < 0 else end, size)
    if (start, end, step) == (0, size, 1):
        return act
    if act.form == "rows" and len(act.shape) == 3 and dim == 1 and end - start == 1:
        return _mix_tokens(conv, node, act, _one_hot(size, start), keepdim=True)
    raise unsupported(node, "a slice that keeps part of an activation")


@rule("aten.select")
def _select(conv: Converter, node: Any, x: Any, dim: int, index: int) -> Any:
    if isinstance(x, rope.Pairs) and dim % len(x.shape) == len(x.shape) - 1 and x.split:
        return rope.component(x, index)
    act = _act(conv, node, x)
    dim %= len(act.shape)
    if act.form == "rows" and len(act.shape) == 3 and dim == 1:
        return _mix_tokens(conv, node, act, _one_hot(act.shape[1], index % act.shape[1]),
                           keepdim=False)
    raise unsupported(node, "selecting part of an activation other than one token")


@rule("aten.mean")
def _mean(conv: Converter, node: Any, x: Any, dims: Any = None, keepdim: bool = False,
          dtype: Any = None) -> Act:
    act = _act(conv, node, x)
    dims = [d % len(act.shape) for d in (dims if dims is not None else [])]
    if act.form == "rows" and len(act.shape) == 3 and dims == [1]:
        tokens = act.shape[1]
        return _mix_tokens(conv, node, act, np.full(tokens, 1.0 / tokens), keepdim=keepdim)
    raise unsupported(node, "mean over anything but the token dimension of [B, T, D]")


def _one_hot(size: int, index: int) -> np.ndarray:
    row = np.zeros(size)
    row[index] = 1.0
    return row


def _mix_tokens(conv: Converter, node: Any, act: Act, weights: np.ndarray, keepdim: bool) -> Act:
    """Every token row of each image replaced by ``sum_t weights[t] * x[t]`` (a mean or one
    token): ``head_matmul pv`` with one head and a constant mixing matrix streamed as an
    input, so the result is ``replicated`` (every row of an image equal)."""
    act = conv.plain(act, node)
    b, t, d = act.shape
    name = conv.name(node)
    mix = np.tile(weights.astype(np.float32), (b * t, 1))
    mix_id = conv.constant_input(f"{name}.mix", mix, (b * t, t))
    value = conv.b.op("head_matmul", [mix_id, act.value], F16, name, mode="pv", heads=1,
                      tokens=t)
    conv.rewrites.append(f"{node.name}: token mixing as head_matmul pv with input {name}.mix")
    shape = (b, 1, d) if keepdim else (b, d)
    return Act(value, shape, "replicated", (b, t))


@rule("aten.cat")
def _cat(conv: Converter, node: Any, parts: Any, dim: int = 0) -> Act:
    """``cat([constant tokens, patches], dim=1)``: the patches' GEMM already ran on an input
    with zero patch rows at the front of each image (``conv2d`` looked ahead), so those rows
    hold the conv bias; adding ``constant - bias`` there is the concatenation."""
    acts = [p for p in parts if isinstance(p, Act)]
    if len(acts) != 1 or not isinstance(parts[-1], Act) or acts[0].prefix == 0:
        raise unsupported(node, "concatenation of activations (only constant tokens ahead of "
                          "the patch embedding are supported)")
    act = acts[0]
    b, n, d = act.shape
    if dim % 3 != 1:
        raise unsupported(node, "concatenation along a dimension other than tokens")
    head = np.concatenate([np.broadcast_to(_np(p), (b, p.shape[1], d)) for p in parts[:-1]],
                          axis=1)
    if head.shape[1] != act.prefix:
        raise unsupported(node, "constant tokens do not match the reserved patch rows")
    addend = np.zeros((b, act.prefix + n, d))
    addend[:, :act.prefix] = head - (act.bias if act.bias is not None else 0.0)
    conv.rewrites.append(f"{node.name}: {act.prefix} constant token(s) as zero patch rows plus "
                         "a corrected addend")
    return Act(act.value, (b, act.prefix + n, d), addend=addend.reshape(-1, d),
               origin=conv.name(node))


# ---------------------------------------------------------------- arithmetic
def _const_array(value: Any) -> np.ndarray:
    return _np(value) if _is_tensor(value) else np.asarray(float(value))


@rule("aten.add", "aten.sub", "aten.rsub")
def _add(conv: Converter, node: Any, x: Any, y: Any, alpha: float = 1.0) -> Act:
    sign = -1.0 if "sub" in str(node.target) else 1.0
    if "rsub" in str(node.target):
        x, y = y, x
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
        return _add_constant(conv, node, _scale(y, sign * alpha), _const_array(x))
    return _add_constant(conv, node, x, sign * alpha * _const_array(y))


def _scale(act: Act, factor: float) -> Act:
    addend = None if act.addend is None else act.addend * factor
    return act.with_(factor=act.factor * factor, addend=addend, linear=None)


def _add_constant(conv: Converter, node: Any, act: Act, constant: np.ndarray) -> Act:
    if act.prefix or act.form not in ("rows", "replicated") or act.attention is not None:
        raise unsupported(node, f"adding a constant to a {act.form}-form value")
    if np.broadcast_shapes(constant.shape, act.shape) != act.shape:
        raise unsupported(node, "a constant that broadcasts the activation to a larger shape")
    rows = forms.broadcast_rows(constant, act)
    addend = rows if act.addend is None else act.addend + rows
    return act.with_(addend=addend, linear=None, origin=conv.name(node))


def _add_acts(conv: Converter, node: Any, x: Act, y: Act, alpha: float) -> Act:
    if x.shape != y.shape or x.form != y.form or x.form not in ("rows", "replicated") or (
            x.dims != y.dims):
        raise unsupported(node, f"add of {x.form} {list(x.shape)} and {y.form} {list(y.shape)}")
    # lazy addends are applied here, not carried on: a residual stream would otherwise
    # re-add a position table at every layer (``plain`` memoises the first application)
    xs = conv.plain(x, node)
    ys = conv.plain(y.with_(factor=y.factor * alpha,
                            addend=None if y.addend is None else y.addend * alpha), node) \
        if alpha != 1.0 else conv.plain(y, node)
    value = conv.b.op("add", [xs.value, ys.value], F16, conv.name(node))
    return Act(value, x.shape, x.form, x.dims)


@rule("aten.mul")
def _mul(conv: Converter, node: Any, x: Any, y: Any) -> Any:
    symbolic = (Act, UserInput, rope.Pairs, rope.PairPart)
    if not isinstance(x, symbolic):
        x, y = y, x
    if isinstance(x, (rope.Pairs, rope.PairPart)) or (
            isinstance(x, Act) and _is_tensor(y) and y.numel() > 1 and rope.start(x) is not None):
        return _mul_pairs(conv, node, x, y)
    act = _act(conv, node, x)
    if isinstance(y, (Act, UserInput)):
        raise unsupported(node, "product of two activations")
    constant = _const_array(y)
    if constant.size == 1:
        return _scale(act, float(constant.reshape(())))
    arg = node.args[0] if node.args[0] in conv.dynamic else node.args[1]
    if act.linear is not None and constant.reshape(-1).size == act.shape[-1] and (
            np.broadcast_shapes(constant.shape, act.shape) == act.shape) and len(arg.users) == 1:
        return _fold_column_scale(conv, node, act, constant.reshape(-1))
    raise unsupported(node, "a product with a tensor that is not a per-channel scale of a "
                      "linear layer's output")


def _mul_pairs(conv: Converter, node: Any, x: Any, y: Any) -> Any:
    """A product on a query/key in heads form: part of a RoPE (``frontend/rope.py``)."""
    if isinstance(y, (Act, UserInput, rope.Pairs, rope.PairPart)):
        raise unsupported(node, "product of two activations")
    value = rope.start(x) if isinstance(x, Act) else x
    constant = _const_array(y)
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
    act = _act(conv, node, x)
    if isinstance(y, (Act, UserInput)) or rounding_mode is not None:
        raise unsupported(node, "division by an activation, or rounding division")
    constant = _const_array(y)
    if constant.size != 1:
        raise unsupported(node, "division by a tensor")
    return _scale(act, 1.0 / float(constant.reshape(())))


@rule("aten.neg")
def _neg(conv: Converter, node: Any, x: Any) -> Any:
    if isinstance(x, (rope.Pairs, rope.PairPart)):
        return rope.scale(x, -1.0)
    return _scale(_act(conv, node, x), -1.0)


# ---------------------------------------------------------------- row operations
def _rows(conv: Converter, node: Any, x: Any) -> Act:
    act = conv.plain(_act(conv, node, x), node)
    if act.form not in ("rows", "replicated"):
        raise unsupported(node, f"a row operation on a {act.form}-form value")
    return act


def _out_precision(conv: Converter, node: Any, name: str):
    """FP8 when every use is a GEMM's A operand (the builtins' policy), else F16."""
    return conv.act_precision(name) if conv.fp8 and conv.gemm_only(node) else F16


@rule("aten.layer_norm")
def _layer_norm(conv: Converter, node: Any, x: Any, shape: Any, weight: Any = None,
                bias: Any = None, eps: float = 1e-5, cudnn: bool = True) -> Act:
    act = _rows(conv, node, x)
    cols = act.shape[-1]
    if list(shape) != [cols]:
        raise unsupported(node, "layer norm over more than the last dimension")
    name = conv.name(node)
    gamma = _np(weight) if weight is not None else np.ones(cols, np.float32)
    beta = _np(bias) if bias is not None else np.zeros(cols, np.float32)
    g = conv.weight(conv.const_key(weight, f"{name}.weight"), gamma, False)
    bt = conv.weight(conv.const_key(bias, f"{name}.bias"), beta, False)
    value = conv.b.op("layer_norm", [act.value, g, bt], _out_precision(conv, node, name), name,
                      eps=float(eps))
    return act.with_(value=value)


@rule("aten.gelu")
def _gelu(conv: Converter, node: Any, x: Any, approximate: str = "none") -> Act:
    act = _rows(conv, node, x)
    name = conv.name(node)
    value = conv.b.op("gelu", [act.value], _out_precision(conv, node, name), name,
                      approximate="tanh" if approximate == "tanh" else "none")
    return act.with_(value=value)


@rule("aten.softmax", "aten._softmax", "aten._safe_softmax")
def _softmax(conv: Converter, node: Any, x: Any, dim: int = -1, *rest: Any, **kwargs: Any) -> Act:
    act = _act(conv, node, x)
    if dim % len(act.shape) != len(act.shape) - 1:
        raise unsupported(node, "softmax over a dimension other than the last")
    if act.addend is not None:
        raise unsupported(node, "softmax of scores with an additive mask or bias")
    if act.form != "rows" or act.prefix:
        raise unsupported(node, f"softmax of a {act.form}-form value")
    value = conv.b.op("softmax", [act.value], F16, conv.name(node), scale=float(act.factor))
    return act.with_(value=value, factor=1.0)


# ---------------------------------------------------------------- GEMMs
def _linear_weight(conv: Converter, node: Any, x: Any, weight: np.ndarray, key: str,
                   bias: Any) -> Act:
    """``x @ weight (+ bias)``: weight ``[in, out]``, FP8 A operand, F16 result."""
    act = _rows(conv, node, x)
    if weight.ndim != 2 or weight.shape[0] != act.shape[-1]:
        raise unsupported(node, f"weight {list(weight.shape)} for input {list(act.shape)}")
    name = conv.name(node)
    a = conv.a_operand(act, node)
    w = conv.weight(key, weight, True)
    bias_key = None
    if bias is None:
        value = conv.b.op("matmul", [a, w], F16, name)
    else:
        mm = conv.b.op("matmul", [a, w], F16, f"{name}.mm")
        bias_key = conv.const_key(bias, f"{name}.bias")
        bv = conv.weight(bias_key, _np(bias).reshape(-1), False)
        bias_key = conv.b.graph.value(bv).name
        value = conv.b.op("bias_add", [mm, bv], F16, name)
    weight_key = conv.b.graph.value(w).name
    return Act(value, (*act.shape[:-1], weight.shape[1]), act.form, act.dims,
               linear=(weight_key, bias_key))


@rule("aten.linear")
def _linear(conv: Converter, node: Any, x: Any, weight: Any, bias: Any = None) -> Act:
    if not _is_tensor(weight) or (bias is not None and not _is_tensor(bias)):
        raise unsupported(node, "a linear layer whose weight is computed from the input")
    return _linear_weight(conv, node, x, _np(weight).T,
                          conv.const_key(weight, f"{conv.name(node)}.weight"), bias)


@rule("aten.addmm")
def _addmm(conv: Converter, node: Any, bias: Any, x: Any, weight: Any, beta: float = 1,
           alpha: float = 1) -> Act:
    if not _is_tensor(weight) or not _is_tensor(bias) or (beta, alpha) != (1, 1):
        raise unsupported(node, "addmm with a computed weight or scaled terms")
    return _linear_weight(conv, node, x, _np(weight), f"{conv.name(node)}.weight", bias)


@rule("aten.mm", "aten.matmul", "aten.bmm")
def _matmul(conv: Converter, node: Any, x: Any, y: Any) -> Act:
    if isinstance(x, (Act, UserInput)) and _is_tensor(y) and y.ndim == 2:
        return _linear_weight(conv, node, x, _np(y), f"{conv.name(node)}.weight", None)
    if not (isinstance(x, Act) and isinstance(y, Act)):
        raise unsupported(node, "a matrix product with a constant on the left")
    if x.form == "heads_major" and y.form == "keys_t" and x.dims == y.dims:
        return _scores(conv, node, x, y)
    if x.form == "rows" and x.attention is not None and y.form == "heads_major":
        return _context(conv, node, x, y)
    raise unsupported(node, f"product of {x.form} {list(x.shape)} and {y.form} {list(y.shape)}")


def _scores(conv: Converter, node: Any, q: Act, k: Act, name: str | None = None) -> Act:
    b, t, h, d = q.dims
    value = conv.b.op("head_matmul", [q.value, k.value], F16, name or conv.name(node),
                      mode="qk", heads=h, tokens=t)
    shape = (b, h, t, t) if len(q.shape) == 4 else (b * h, t, t)
    return Act(value, shape, factor=q.factor * k.factor, attention=(b, h, t))


def _context(conv: Converter, node: Any, probs: Act, v: Act, name: str | None = None) -> Act:
    b, h, t = probs.attention  # type: ignore[misc]
    if v.dims[0] != b or v.dims[1] != t or v.dims[2] != h or probs.addend is not None:
        raise unsupported(node, "attention probabilities and values disagree in shape")
    value = conv.b.op("head_matmul", [probs.value, v.value], F16, name or conv.name(node),
                      mode="pv", heads=h, tokens=t)
    return Act(value, v.shape, "heads_major", v.dims, factor=probs.factor * v.factor)


@rule("aten.scaled_dot_product_attention")
def _sdpa(conv: Converter, node: Any, q: Any, k: Any, v: Any, attn_mask: Any = None,
          dropout_p: float = 0.0, is_causal: bool = False, scale: Any = None,
          enable_gqa: bool = False) -> Act:
    q, k, v = (_act(conv, node, a) for a in (q, k, v))
    if not all(a.form == "heads_major" for a in (q, k, v)) or not q.dims == k.dims == v.dims:
        raise unsupported(node, "attention inputs that are not [B, H, T, d] views of projections")
    if is_causal or dropout_p:
        raise unsupported(node, "causal or dropout attention")
    if attn_mask is not None:
        mask = attn_mask.detach() if _is_tensor(attn_mask) else None
        if mask is None or not (bool(mask.all()) if mask.dtype == conv.torch.bool
                                else bool((mask == 0).all())):
            raise unsupported(node, "attention with a mask that masks something")
    d = q.dims[3]
    name = conv.name(node)
    scores = _scores(conv, node, q, k, f"{name}.scores")
    factor = scores.factor * (1.0 / sqrt(d) if scale is None else float(scale))
    probs = conv.b.op("softmax", [scores.value], F16, f"{name}.probs", scale=float(factor))
    return _context(conv, node, scores.with_(value=probs, factor=1.0), v, name)


@rule("aten.conv2d", "aten.convolution")
def _conv2d(conv: Converter, node: Any, x: Any, weight: Any, bias: Any = None,
            stride: Any = 1, padding: Any = 0, dilation: Any = 1, *rest: Any) -> Act:
    """A patch embedding (stride == kernel, no padding): a GEMM on patches that the host
    lays out (im2col), one row per patch; see ``docs/frontend.md``."""
    if not isinstance(x, UserInput) or len(x.shape) != 4:
        raise unsupported(node, "convolution of anything but a model input [B, C, H, W]")
    if not _is_tensor(weight):
        raise unsupported(node, "convolution with a computed weight")
    out_ch, in_ch, p, q = (int(s) for s in weight.shape)
    transposed = rest[0] if op_is(node, "aten.convolution") and rest else False
    groups = rest[-1] if op_is(node, "aten.convolution") and rest else (rest[0] if rest else 1)
    pads = (0, 0) if padding == "valid" else pair(padding)
    if pair(stride) != (p, q) or pads != (0, 0) or pair(dilation) != (1, 1) or groups != 1 or (
            transposed):
        raise unsupported(node, "convolution other than a patch embedding (stride == kernel, "
                          "no padding, dilation 1, one group)")
    b, c, hh, ww = x.shape
    gh, gw = hh // p, ww // q
    n = gh * gw
    prefix = conv_prefix(conv, node)
    index, name = x.index, f"{x.name}.patches"

    def im2col(arrays: list[np.ndarray], index: int = index) -> np.ndarray:
        img = np.asarray(arrays[index], np.float32)[:, :, :gh * p, :gw * q]
        patches = img.reshape(b, c, gh, p, gw, q).transpose(0, 2, 4, 1, 3, 5).reshape(b, n, -1)
        return np.concatenate([np.zeros((b, prefix, c * p * q), np.float32), patches], axis=1)

    data = im2col(conv.user)
    value = conv.add_input(name, (b, prefix + n, c * p * q), data, True, im2col)
    conv.rewrites.append(f"{node.name}: patch embedding as a GEMM on host-laid-out patches "
                         f"{name} [{b}, {prefix}+{n}, {c * p * q}]")
    wmat = _np(weight).reshape(out_ch, -1).T
    act = Act(value, (b, prefix + n, c * p * q))
    out = _linear_weight(conv, node, act, wmat, conv.const_key(weight, f"{name}.weight"), bias)
    return out.with_(shape=(b, out_ch, gh, gw), form="channels", dims=(b, out_ch, n),
                     prefix=prefix, bias=None if bias is None else _np(bias), linear=None)


def pair(value: Any) -> tuple[int, int]:
    """A conv hyper-parameter as (height, width): ``2``, ``[2]`` and ``[2, 2]`` alike."""
    if isinstance(value, (list, tuple)):
        return (int(value[0]), int(value[-1]))
    return (int(value), int(value))


def op_is(node: Any, name: str) -> bool:
    from ipu_stack.frontend.convert import op_name

    return op_name(node.target) == name


def conv_prefix(conv: Converter, node: Any) -> int:
    """Constant tokens a patch embedding's tokens are later concatenated behind (a CLS
    token): the number of zero patch rows to reserve ahead of each image's patches."""
    from ipu_stack.frontend.convert import op_name

    current = node
    while len(current.users) == 1:
        user = next(iter(current.users))
        kind = op_name(user.target)
        if kind == "aten.cat":
            parts = list(user.args[0])
            if parts[-1] is not current or any(p in conv.dynamic for p in parts[:-1]):
                return 0
            dim = user.args[1] if len(user.args) > 1 else user.kwargs.get("dim", 0)
            if dim % 3 != 1:
                return 0
            return sum(int(p.meta["val"].shape[1]) for p in parts[:-1])
        if kind not in ("aten.flatten", "aten.transpose", "aten.permute", "aten.view",
                        "aten.reshape", "aten.contiguous", "aten.clone", "aten.dropout",
                        "aten.to"):
            return 0
        current = user
    return 0


SUPPORTED = sorted(HANDLERS)
