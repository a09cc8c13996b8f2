"""ATen rules, GEMMs: linear/addmm/mm/matmul/bmm, attention (eager and SDPA) and the patch
embedding convolution (a GEMM on host-laid-out patches)."""

from __future__ import annotations

from math import sqrt
from typing import Any

import numpy as np

from ipu_stack.frontend import fused
from ipu_stack.frontend.attention import additive_mask, softmax_op
from ipu_stack.frontend.convert import Converter, op_name, unsupported
from ipu_stack.frontend.forms import Act, UserInput
from ipu_stack.frontend.linear import emit_linear
from ipu_stack.frontend.rules import activation, is_tensor, row_activation, rule, to_numpy
from ipu_stack.ir.precision import F16
from ipu_stack.ir.types import RowIndex
from ipu_stack.workloads.vision import image_patches


# ---------------------------------------------------------------- GEMMs
def _linear_weight(conv: Converter, node: Any, x: Any, weight: np.ndarray, key: str,
                   bias: Any) -> Any:
    """A linear layer: emitted now, or kept as :class:`~ipu_stack.frontend.fused.Fused`
    when every user splits its output into parts (``frontend/fused.py``)."""
    act = row_activation(conv, node, x)
    if act.order is not None and _splits_columns(node, act):
        act = conv.in_order(act, node)  # attention's q, k, v read the rows in order
    if act.form == "replicated" and node.users and all(u.op == "output" for u in node.users):
        act = _one_row_an_item(conv, node, act)  # a classifier: its logits leave as they are
    if weight.ndim != 2 or weight.shape[0] != act.shape[-1]:
        raise unsupported(node, f"weight {list(weight.shape)} for input {list(act.shape)}")
    bias_np = None if bias is None else to_numpy(bias).reshape(-1)
    bias_key = None if bias is None else conv.const_key(bias, f"{conv.name(node)}.bias")
    users = list(node.users)
    if users and all(fused.is_fused_user(u, len(act.shape)) for u in users):
        act = conv.in_order(act, node)  # its parts are views the orders do not follow
        return fused.Fused(act, weight, bias_np, key, bias_key,
                           (*act.shape[:-1], weight.shape[1]), node)
    return emit_linear(conv, node, act, weight, key, bias_np, bias_key)


def _one_row_an_item(conv: Converter, node: Any, act: Act) -> Act:
    """A replicated value (every token row of an item equal: a pooled mean or one token)
    as one row an item, by one ``gather_rows``: a program's last linear layer (a
    classifier's) then multiplies and sends one row an item, not one a token."""
    batch, tokens = act.dims
    precision = conv.b.graph.value(act.value).type.precision
    value = conv.b.op("gather_rows", [act.value], precision, f"{conv.name(node)}.rows",
                      index=RowIndex(np.arange(batch) * tokens))
    conv.rewrites.append(f"{node.name}: the replicated input's first row of each of "
                         f"{batch} items, by one gather")
    return Act(value, act.shape)


def _splits_columns(node: Any, act: Act) -> bool:
    """Whether every user views the linear layer's output with another last axis (an
    attention projection split into heads): those need the rows in order, and moving the
    input once serves q, k and v, where moving each output would take three gathers."""
    users = list(node.users)
    return bool(users) and all(
        op_name(u.target) in ("aten.view", "aten.reshape", "aten._unsafe_view")
        and hasattr(u.meta.get("val"), "shape") and u.meta["val"].shape[-1] != act.shape[-1]
        for u in users)


@rule("aten.linear")
def _linear(conv: Converter, node: Any, x: Any, weight: Any, bias: Any = None) -> Act:
    if not is_tensor(weight) or (bias is not None and not is_tensor(bias)):
        raise unsupported(node, "a linear layer whose weight is computed from the input")
    return _linear_weight(conv, node, x, to_numpy(weight).T,
                          conv.const_key(weight, f"{conv.name(node)}.weight"), bias)


@rule("aten.addmm")
def _addmm(conv: Converter, node: Any, bias: Any, x: Any, weight: Any, beta: float = 1,
           alpha: float = 1) -> Act:
    if not is_tensor(weight) or not is_tensor(bias) or (beta, alpha) != (1, 1):
        raise unsupported(node, "addmm with a computed weight or scaled terms")
    return _linear_weight(conv, node, x, to_numpy(weight), f"{conv.name(node)}.weight", bias)


def _cached_attention(conv: Converter, node: Any, q: Act, k: Act, v: Act, attn_mask: Any,
                      scale: Any, enable_gqa: bool) -> Act:
    """A step's queries against a whole KV cache (``frontend/ops_cache.py``): each query
    head reads its key/value head straight from the cache (``head_matmul``'s ``kv_heads``),
    the mask a per-call input when the host computes it from the positions."""
    q = conv.plain(q, node)
    b, t, h, d = q.dims
    if q.form != "heads_major" or not k.cached == v.cached or k.dims != v.dims or \
            k.dims[0] != b or k.dims[3] != d:
        raise unsupported(node, "attention over a KV cache with queries that are not "
                          "[B, H, T, d] views of a projection, or keys and values that differ")
    positions, heads = k.dims[1], k.dims[2]
    if heads != h and not (enable_gqa and h % heads == 0):
        raise unsupported(node, f"{h} query heads over a cache read as {heads} heads")
    name = conv.name(node)
    attrs = {"heads": h, "tokens": t, "kv_heads": k.cached, "kv_tokens": positions}
    scores = conv.b.op("head_matmul", [q.value, k.value], F16, f"{name}.scores", mode="qk",
                       **attrs)
    factor = q.factor * k.factor * (1.0 / sqrt(d) if scale is None else float(scale))
    mask_node = node.args[3] if len(node.args) > 3 else node.kwargs.get("attn_mask")
    if attn_mask is None:
        probs = conv.b.op("softmax", [scores], F16, f"{name}.probs", scale=float(factor))
    else:
        mask = cache_mask(conv, node, mask_node, attn_mask, (b, h, t, positions),
                          f"{name}.probs.bias")
        probs = conv.b.op("biased_softmax", [scores, mask], F16, f"{name}.probs",
                          scale=float(factor))
    context = conv.b.op("head_matmul", [probs, v.value], F16, name, mode="pv", **attrs)
    conv.rewrites.append(f"{node.name}: attention over the KV cache, {h} query heads reading "
                         f"{k.cached} key/value heads")
    return Act(context, q.shape, "heads_major", q.dims, factor=v.factor)


def cache_mask(conv: Converter, node: Any, mask_node: Any, values: Any,
               shape: tuple[int, int, int, int], name: str) -> int:
    """The additive mask of attention over a KV cache as ``[B H T, positions]`` rows: a
    per-call input where the host computes it from the positions (its arithmetic replayed
    before each call), else a constant table (a boolean mask: 0 kept, -inf masked)."""
    b, h, t, positions = shape

    def rows(mask: Any) -> np.ndarray:
        if mask.dtype == conv.torch.bool:
            mask = np.where(mask.numpy(), 0.0, -np.inf)
        full = np.broadcast_to(to_numpy(mask) if is_tensor(mask) else mask, shape)
        return np.ascontiguousarray(full, np.float32).reshape(b * h * t, positions)
    if mask_node in conv.host_nodes:
        return conv.per_call_input("mask", lambda arrays: rows(conv.replay(mask_node, arrays)),
                                   F16)
    if is_tensor(values):
        return conv.weight(name, rows(values.detach()), False)
    raise unsupported(node, "attention over a KV cache with a mask computed on the device")


def _cached_scores(conv: Converter, node: Any, q: Act, k: Act) -> Act:
    """``q @ k^T`` of a step's queries against the whole KV cache, written out (Gemma 2's
    eager attention, which caps the scores' logits before the softmax): each query head
    reads its key/value head from the cache, as ``scaled_dot_product_attention`` over the
    cache does; the scores carry the cache's heads to the mask, softmax and context."""
    q = conv.plain(q, node)
    b, t, h, d = q.dims
    positions, heads = k.dims[1], k.dims[2]
    if q.form != "heads_major" or k.dims[0] != b or k.dims[3] != d or heads != h:
        raise unsupported(node, "scores over a KV cache with queries that are not [B, H, T, "
                          "d] views of a projection, or keys not repeated for every head")
    value = conv.b.op("head_matmul", [q.value, k.value], F16, conv.name(node), mode="qk",
                      heads=h, tokens=t, kv_heads=k.cached, kv_tokens=positions)
    conv.rewrites.append(f"{node.name}: scores over the KV cache, {h} query heads reading "
                         f"{k.cached} key heads")
    return Act(value, (b, h, t, positions), factor=q.factor * k.factor, attention=(b, h, t),
               over_cache=k.cached)


def _cached_context(conv: Converter, node: Any, probs: Act, v: Act) -> Act:
    """The probabilities over a KV cache times its values (written out, as the scores)."""
    b, h, t = probs.attention  # type: ignore[misc]
    positions = probs.shape[-1]
    if v.cached != probs.over_cache or v.dims[0] != b or v.dims[1] != positions or \
            v.dims[2] != h or probs.addend is not None:
        raise unsupported(node, "attention probabilities and the cache's values disagree")
    d = v.dims[3]
    value = conv.b.op("head_matmul", [conv.plain(probs, node).value, v.value], F16,
                      conv.name(node), mode="pv", heads=h, tokens=t, kv_heads=v.cached,
                      kv_tokens=positions)
    return Act(value, (b, h, t, d), "heads_major", (b, t, h, d), factor=v.factor)


@rule("aten.mm", "aten.matmul", "aten.bmm")
def _matmul(conv: Converter, node: Any, x: Any, y: Any) -> Act:
    if isinstance(x, (Act, UserInput)) and is_tensor(y) and y.ndim == 2:
        return _linear_weight(conv, node, x, to_numpy(y), f"{conv.name(node)}.weight", None)
    if is_tensor(x) and isinstance(y, Act) and y.form == "keys_t":
        return _one_query_scores(conv, node, to_numpy(x), y)
    if not (isinstance(x, Act) and isinstance(y, Act)):
        raise unsupported(node, "a matrix product with a constant on the left")
    if x.form == "heads_major" and y.form == "keys_t" and y.cached:
        return _cached_scores(conv, node, x, y)
    if x.form == "heads_major" and y.form == "keys_t" and x.dims == y.dims:
        return _scores(conv, node, x, y)
    if x.form == "rows" and x.attention is not None and x.over_cache:
        return _cached_context(conv, node, x, y)
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
    if probs.one_query:  # every token row holds the one query's output
        return Act(value, (*probs.shape[:-1], v.dims[3]), "rep_heads", v.dims,
                   factor=probs.factor * v.factor)
    return Act(value, v.shape, "heads_major", v.dims, factor=probs.factor * v.factor)


def _one_query_scores(conv: Converter, node: Any, query: np.ndarray, k: Act,
                      name: str | None = None) -> Act:
    """``q @ k^T`` for one constant query per image and head (an attention-pooling probe,
    ``[B*H, 1, d]``): the query is replicated over the token rows as an input, so
    ``head_matmul qk`` gives every row the probe's scores and the result stays in rows."""
    b, t, h, d = k.dims
    if query.size != b * h * d:
        raise unsupported(node, "a constant query that is not one vector per image and head")
    rows = np.repeat(query.reshape(b, 1, h * d), t, axis=1).reshape(b * t, h * d)
    name = name or conv.name(node)
    q = conv.constant_input(f"{name}.query", rows, (b * t, h * d))
    value = conv.b.op("head_matmul", [q, k.value], F16, name, mode="qk", heads=h, tokens=t)
    conv.rewrites.append(f"{node.name}: constant query replicated over tokens ({name}.query)")
    return Act(value, (*query.shape[:-1], t), factor=k.factor, attention=(b, h, t),
               one_query=True)


@rule("aten.scaled_dot_product_attention")
def _sdpa(conv: Converter, node: Any, q: Any, k: Any, v: Any, attn_mask: Any = None,
          dropout_p: float = 0.0, is_causal: bool = False, scale: Any = None,
          enable_gqa: bool = False) -> Act:
    k, v = (activation(conv, node, a) for a in (k, v))
    if is_causal or dropout_p:
        raise unsupported(node, "causal or dropout attention")
    if k.cached or v.cached:
        return _cached_attention(conv, node, activation(conv, node, q), k, v, attn_mask,
                                 scale, enable_gqa)
    if is_tensor(q) and k.form == v.form == "heads_major" and k.dims == v.dims:
        # a learned query (an attention-pooling head): one query per image and head
        query = to_numpy(q)
        if attn_mask is not None or query.ndim != 4 or query.shape[2] != 1:
            raise unsupported(node, "a constant query that is not [B, H, 1, d], or with a mask")
        scale_q = 1.0 / sqrt(k.dims[3]) if scale is None else float(scale)
        name = conv.name(node)
        scores = _one_query_scores(conv, node, query, k, f"{name}.scores")
        probs = conv.b.op("softmax", [scores.value], F16, f"{name}.probs",
                          scale=float(scores.factor * scale_q))
        return _context(conv, node, scores.with_(value=probs, factor=1.0), v, name)
    q = activation(conv, node, q)
    if not all(a.form == "heads_major" for a in (q, k, v)) or not q.dims == k.dims == v.dims:
        raise unsupported(node, "attention inputs that are not [B, H, T, d] views of projections")
    bias = None
    if attn_mask is not None:
        if not is_tensor(attn_mask):
            raise unsupported(node, "attention with a mask computed from the input (only "
                              "constant masks and biases)")
        bias = additive_mask(conv, node, attn_mask, q.dims)
    d = q.dims[3]
    name = conv.name(node)
    scores = _scores(conv, node, q, k, f"{name}.scores")
    factor = scores.factor * (1.0 / sqrt(d) if scale is None else float(scale))
    probs = softmax_op(conv, scores, float(factor), bias, f"{name}.probs")
    return _context(conv, node, scores.with_(value=probs, factor=1.0), v, name)


@rule("aten.conv2d", "aten.convolution")
def _conv2d(conv: Converter, node: Any, x: Any, weight: Any, bias: Any = None,
            stride: Any = 1, padding: Any = 0, dilation: Any = 1, *rest: Any) -> Act:
    """A patch embedding (stride == kernel, no padding): a GEMM on patches that the host
    lays out (im2col), one row per patch; see ``docs/frontend.md``."""
    if not isinstance(x, UserInput) or len(x.shape) != 4:
        raise unsupported(node, "convolution of anything but a model input [B, C, H, W]")
    if not is_tensor(weight):
        raise unsupported(node, "convolution with a computed weight")
    out_ch, in_ch, p, q = (int(s) for s in weight.shape)
    full = op_name(node.target) == "aten.convolution"  # (..., transposed, output_padding, groups)
    transposed = rest[0] if full and rest else False
    groups = rest[-1] if full and rest else (rest[0] if rest else 1)
    pads = (0, 0) if padding == "valid" else pair(padding)
    if pair(stride) != (p, q) or pads != (0, 0) or pair(dilation) != (1, 1) or groups != 1 or (
            transposed):
        raise unsupported(node, "convolution other than a patch embedding (stride == kernel, "
                          "no padding, dilation 1, one group)")
    b, c, hh, ww = x.shape
    gh, gw = hh // p, ww // q
    n = gh * gw
    prefix, suffix, gap = conv_reserve(conv, node)
    index, name = x.index, f"{x.name}.patches"

    def im2col(arrays: list[np.ndarray], index: int = index) -> np.ndarray:
        return image_patches(arrays[index], (p, q), prefix, suffix)

    data = im2col(conv.user)
    rows = prefix + n + suffix
    value = conv.add_input(name, (b, rows, c * p * q), data, True, im2col)
    conv.rewrites.append(f"{node.name}: patch embedding as a GEMM on host-laid-out patches "
                         f"{name} [{b}, {prefix}+{n}+{suffix}, {c * p * q}]")
    wmat = to_numpy(weight).reshape(out_ch, -1).T
    act = Act(value, (b, rows, c * p * q))
    out = emit_linear(conv, node, act, wmat, conv.const_key(weight, f"{name}.weight"),
                      None if bias is None else to_numpy(bias),
                      None if bias is None else conv.const_key(bias, f"{name}.bias"))
    return out.with_(shape=(b, out_ch, gh, gw), form="channels", dims=(b, out_ch, n),
                     prefix=prefix, suffix=suffix, gap=gap, linear=None,
                     bias=None if bias is None else to_numpy(bias))


def pair(value: Any) -> tuple[int, int]:
    """A conv hyper-parameter as (height, width): ``2``, ``[2]`` and ``[2, 2]`` alike."""
    if isinstance(value, (list, tuple)):
        return (int(value[0]), int(value[-1]))
    return (int(value), int(value))


def conv_reserve(conv: Converter, node: Any) -> tuple[int, int, tuple[int, int]]:
    """Constant tokens a patch embedding's tokens are later concatenated between (a CLS token
    ahead, YOLOS's detection tokens behind): the zero patch rows to reserve ahead of and
    behind each image's patches; and ``gap`` (position, count): tokens a second
    concatenation inserts after the first ``position`` tokens (DINOv2's registers after
    CLS, once the position table is added), reserved as well."""
    prefix, suffix, cat = _reserve(conv, node)
    if cat is None:
        return prefix, suffix, (0, 0)
    gap = _inserted(conv, cat)
    return prefix + gap[1], suffix, gap


def _constant(conv: Converter, node: Any, seen: dict[Any, bool] | None = None) -> bool:
    """Whether ``node`` depends on no user input (graph order does not matter here)."""
    seen = {} if seen is None else seen
    if node not in seen:
        users = {spec.arg.name for spec in conv.program.graph_signature.input_specs
                 if spec.kind.name == "USER_INPUT"}
        seen[node] = node.op != "placeholder" or node.name not in users
        seen[node] = seen[node] and all(_constant(conv, n, seen) for n in node.all_input_nodes)
    return seen[node]


def _inserted(conv: Converter, cat: Any) -> tuple[int, int]:
    """``(k, R)`` when ``cat``'s value, after constant additions, is only read as
    ``cat([x[:, :k], constants (R tokens), x[:, k:]], 1)``, else ``(0, 0)``."""
    current = cat
    while len(current.users) == 1:
        user = next(iter(current.users))
        if op_name(user.target) == "aten.add" and len(user.args) == 2 and _constant(
                conv, user.args[1] if user.args[0] is current else user.args[0]):
            current = user
        elif op_name(user.target) in ("aten.dropout", "aten.contiguous", "aten.clone"):
            current = user
        else:
            return 0, 0
    slices = list(current.users)
    if len(slices) != 2 or any(op_name(s.target) != "aten.slice" or s.args[1] != 1
                               for s in slices):
        return 0, 0
    joins = {next(iter(s.users)) for s in slices if len(s.users) == 1}
    if len(joins) != 1:
        return 0, 0
    join = joins.pop()
    parts = list(join.args[0])
    if op_name(join.target) != "aten.cat" or len(parts) < 3 or parts[0] not in slices or (
            parts[-1] not in slices) or not all(_constant(conv, p) for p in parts[1:-1]):
        return 0, 0
    k = int(parts[0].args[3]) if len(parts[0].args) > 3 else 0
    if parts[0].args[2] not in (0, None) or parts[-1].args[2] != k:
        return 0, 0
    return k, sum(int(p.meta["val"].shape[1]) for p in parts[1:-1])


def _reserve(conv: Converter, node: Any) -> tuple[int, int, Any]:
    """(rows ahead, rows behind, the concatenation) of the first concatenation with
    constant tokens the patch tokens reach through shape-only operations."""
    current = node
    while len(current.users) == 1:
        user = next(iter(current.users))
        kind = op_name(user.target)
        if kind == "aten.cat":
            parts = list(user.args[0])
            others = [p for p in parts if p is not current]
            dim = user.args[1] if len(user.args) > 1 else user.kwargs.get("dim", 0)
            if current not in parts or any(p in conv.dynamic for p in others) or dim % 3 != 1:
                return 0, 0, None
            at = parts.index(current)
            return (sum(int(p.meta["val"].shape[1]) for p in parts[:at]),
                    sum(int(p.meta["val"].shape[1]) for p in parts[at + 1:]), user)
        if kind not in ("aten.flatten", "aten.transpose", "aten.permute", "aten.view",
                        "aten.reshape", "aten.contiguous", "aten.clone", "aten.dropout",
                        "aten.to"):
            return 0, 0, None
        current = user
    return 0, 0, None

