"""ATen rules, layouts: pass-through operations, views, permutes, slices and token mixing
(``select``/``mean`` of tokens), ``cat`` of constant tokens.  Views move no data: they are
pattern-matched between layout forms (``frontend/forms.py``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from math import prod
from typing import Any

import numpy as np

from ipu_stack.frontend import forms, fused, order, patterns, rope
from ipu_stack.frontend.convert import Converter, op_name, unsupported
from ipu_stack.frontend.forms import Act, HeadRepeat, HostIds, UserInput
from ipu_stack.frontend.rules import activation, rule, to_numpy
from ipu_stack.ir.precision import F16


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
    if isinstance(x, (UserInput, HostIds)) and not node.meta["val"].dtype.is_floating_point:
        return x  # ids stay ids (``ids.long()``); host arithmetic starts at ``eq``
    if any(not d.is_floating_point for d in dtypes):
        raise unsupported(node, "conversion of an activation to a non-float dtype")
    return x


@rule("aten.dropout", "aten.feature_dropout")
def _dropout(conv: Converter, node: Any, x: Any, p: float = 0.0, train: bool = False) -> Any:
    if train and p > 0:
        raise unsupported(node, "dropout in training mode (export the model in eval())")
    return x


def _view(conv: Converter, node: Any, x: Any, shape: tuple[int, ...]) -> Any:
    if isinstance(x, HeadRepeat):
        b, kv, n, t, d = x.shape
        if forms.resolve_shape(shape, prod(x.shape)) != (b, kv * n, t, d):
            raise unsupported(node, f"a view of repeated heads as {list(shape)}")
        return repeat_heads(conv, node, x)
    if isinstance(x, UserInput) and not node.meta["val"].dtype.is_floating_point:
        # ids viewed before their lookup (CLIP's ``input_ids.view(-1, T)``): still ids
        return UserInput(x.index, x.name, forms.resolve_shape(shape, prod(x.shape)))
    if isinstance(x, fused.Fused) and (groups := fused.chunked_heads(node)) and (
            split := fused.heads_view(x, forms.resolve_shape(shape, prod(x.shape)), groups)):
        return split  # GPT-NeoX's q, k and v side by side in each head
    if isinstance(x, fused.Fused) and (resolved := forms.resolve_shape(
            shape, prod(x.shape)))[-1] == x.shape[-1]:  # its rows under other leading axes
        rows = _view(conv, node, x.x, (*resolved[:-1], x.x.shape[-1]))  # (GPT-2's Conv1D)
        return dataclasses.replace(x, x=rows, shape=resolved)
    if isinstance(x, (fused.Fused, fused.Split)):
        split = fused.view(x, forms.resolve_shape(shape, prod(x.shape)))
        if split is not None:
            return split
        x = conv.settle(node, x)  # a whole fused projection; a Split is refused there
    if isinstance(x, (rope.Pairs, rope.PairPart)):
        pairs = rope.view(x, forms.resolve_shape(shape, prod(x.shape)))
        if pairs is None:
            raise unsupported(node, f"view of a channel-pair value as {list(shape)}")
        return pairs
    act = activation(conv, node, x)
    total = prod(act.shape)
    resolved = forms.resolve_shape(shape, total)
    merged = order.merged_rows(act.shape, resolved)
    if order.ordered(act):  # rows out of order: regrouped leading axes stay so
        if order.keeps_rows(act, resolved[-1] == act.shape[-1]):
            return order.viewed(act, resolved)
        if merged and order.keeps_rows(act, True):
            return order.grouped(act, resolved, merged)
        split = order.split_rows(act, resolved)
        if split and order.keeps_rows(act, True):
            return order.ungrouped(act, resolved, split)  # a merge undone
        act = conv.in_order(act, node)
    if resolved == (*act.shape[:-1], act.shape[-1] // 2, 2) and rope.start(act) is not None:
        return rope.view(rope.start(act), resolved)  # type: ignore[arg-type]
    out = forms.reshape(act, resolved)
    if out is None and merged and order.keeps_rows(act, True):
        return order.grouped(act, resolved, merged)  # rows side by side (a pixel shuffle)
    if out is None:
        raise unsupported(node, f"view of a {act.form}-form value {list(act.shape)} as "
                          f"{list(shape)} moves data")
    return out


@rule("aten.view", "aten.reshape", "aten._unsafe_view")
def _reshape(conv: Converter, node: Any, x: Any, shape: Any) -> Act:
    return _view(conv, node, x, tuple(int(s) for s in shape))


SYMBOLIC = (rope.Pairs, rope.PairPart, fused.Fused, fused.Split)


def _shaped(conv: Converter, node: Any, x: Any) -> Any:
    """A value whose shape a view rule may change: symbolic values stay symbolic."""
    return x if isinstance(x, SYMBOLIC) else activation(conv, node, x)


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


def _part(conv: Converter, node: Any, x: fused.Split, index: int) -> Act:
    act = fused.part(conv, node, x, index)
    if act is None:
        raise unsupported(node, "a fused projection's part viewed in a way that moves data")
    return act


@rule("aten.unbind")
def _unbind(conv: Converter, node: Any, x: Any, dim: int = 0) -> list[Any]:
    if isinstance(x, fused.Split) and dim % len(x.shape) == x.axis:
        return [_part(conv, node, x, i) for i in range(x.groups)]
    if isinstance(x, rope.Pairs) and x.split and dim % len(x.shape) == len(x.shape) - 1:
        return [rope.component(x, 0), rope.component(x, 1)]
    raise unsupported(node, "unbinding an activation (only the pair axis of a RoPE view)")


@rule("aten.chunk", "aten.split", "aten.split_with_sizes")
def _chunk(conv: Converter, node: Any, x: Any, size: Any, dim: int = 0) -> list[Any]:
    """Equal parts of a fused projection's last dimension: one GEMM each; or a query/key
    split along its tokens (RoPE on some tokens only): token windows (``frontend/rope.py``)."""
    if isinstance(x, Act) and "split_with_sizes" in str(node.target) and (
            rope.token_axis(x) == dim % len(x.shape)):
        windows = rope.token_windows(x, [int(s) for s in size])
        if windows is not None:
            return windows
    if isinstance(x, fused.Split) and x.within_heads and dim % len(x.shape) == 3 and \
            "chunk" in str(node.target) and int(size) == x.groups:
        return [_part(conv, node, x, i) for i in range(x.groups)]
    if isinstance(x, fused.Fused) and dim % len(x.shape) == len(x.shape) - 1:
        cols = x.shape[-1]
        if "chunk" in str(node.target):
            groups = int(size)
        elif isinstance(size, int):
            groups = cols // size if cols % size == 0 else 0
        else:
            groups = len(size) if len(set(size)) == 1 else 0
        if groups > 1 and cols % groups == 0:
            split = fused.view(x, (*x.shape[:-1], groups, cols // groups))
            if split is not None:
                return [_part(conv, node, split, i) for i in range(groups)]
        if not isinstance(size, int) and sum(int(s) for s in size) == cols:
            # unequal parts (the queries, then fewer key and value heads): each a GEMM
            edges = np.cumsum([0, *(int(s) for s in size)])
            return [fused.columns(conv, node, x, int(a), int(b))
                    for a, b in zip(edges[:-1], edges[1:], strict=True)]
    raise unsupported(node, "splitting an activation (only equal parts of a linear layer's "
                      "output, or a query's or key's tokens)")


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
def _unsqueeze(conv: Converter, node: Any, x: Any, dim: int) -> Any:
    act = _shaped(conv, node, x)
    dim %= len(act.shape) + 1
    if dim == 2 and _heads_source(act):
        return HeadRepeat(act)  # grouped-query attention's repeat_kv begins
    return _view(conv, node, act, (*act.shape[:dim], 1, *act.shape[dim:]))


def _heads_source(x: Any) -> bool:
    base = x.base if isinstance(x, rope.Pairs) and not x.split and x.window is None else x
    return isinstance(base, Act) and len(x.shape) == 4 and (
        base.form == "heads_major" or base.form == "rows" and base.shape[1] == 1)


def repeat_heads(conv: Converter, node: Any, repeat: HeadRepeat) -> Any:
    """The source's heads each repeated ``repeats`` times, as the query heads read them:
    a product with a constant 0/1 selection matrix (F16, every output one input value,
    so exact); RoPE pairs keep their per-pair transform, which no head changes."""
    source = repeat.source
    if isinstance(source, rope.Pairs):
        return dataclasses.replace(source, base=_repeat_act(conv, node, source.base,
                                                            repeat.repeats))
    return _repeat_act(conv, node, source, repeat.repeats)


def _repeat_act(conv: Converter, node: Any, act: Act, repeats: int) -> Act:
    if act.cached:  # a KV cache: attention reads its key/value heads shared, as they are
        b, kv, t, d = act.shape
        return act.with_(shape=(b, kv * repeats, t, d), dims=(b, t, kv * repeats, d))
    act = conv.plain(act, node)
    b, kv, t, d = act.shape  # heads_major, or one head held as rows
    select = np.zeros((kv * d, kv * repeats * d), np.float32)
    for head in range(kv * repeats):
        group = head // repeats
        select[group * d:(group + 1) * d, head * d:(head + 1) * d] = np.eye(d)
    name = conv.name(node)
    weight = conv.weight(f"{name}.select", select, matrix=False)
    value = conv.b.op("matmul", [act.value, weight], F16, name)
    conv.rewrites.append(f"{node.name}: {kv} key/value heads repeated {repeats}x for "
                         "grouped-query attention (a 0/1 selection product)")
    return Act(value, (b, kv * repeats, t, d), "heads_major", (b, t, kv * repeats, d))


@rule("aten.squeeze")
def _squeeze(conv: Converter, node: Any, x: Any, dim: Any = None) -> Any:
    act = _shaped(conv, node, x)
    n = len(act.shape)
    dims = range(n) if dim is None else ([dim] if isinstance(dim, int) else list(dim))
    drop = {d % n for d in dims if act.shape[d % n] == 1}
    return _view(conv, node, act, tuple(s for i, s in enumerate(act.shape) if i not in drop))


@rule("aten.transpose")
def _transpose(conv: Converter, node: Any, x: Any, a: int, b: int) -> Any:
    act = _shaped(conv, node, x)
    return _permute(conv, node, act, forms.transpose_perm(len(act.shape), a, b))


@rule("aten.permute")
def _permute(conv: Converter, node: Any, x: Any, perm: Any) -> Any:
    if isinstance(x, fused.Split):
        permuted = fused.permute(x, tuple(int(p) for p in perm))
        if permuted is None:
            raise unsupported(node, "a permute of a fused projection's heads that moves the "
                              "channels of its parts")
        return permuted
    act = activation(conv, node, conv.settle(node, x))
    perm = tuple(int(p) % len(act.shape) for p in perm)
    kept = perm[-1] == len(act.shape) - 1
    if order.ordered(act) and not order.keeps_rows(act, kept):
        act = conv.in_order(act, node)
    out = forms.permute(act, perm) if not order.ordered(act) else None
    if out is None and order.keeps_rows(act, kept):
        return order.permuted(act, perm)  # whole rows in another order (Swin's windows)
    if out is None and _pooled_tokens(node, act, perm):
        b, n, d = act.shape
        return act.with_(shape=(b, d, n), form="channels", dims=(b, d, n), linear=None)
    if out is None:
        raise unsupported(node, f"permute {list(perm)} of a {act.form}-form value "
                          f"{list(act.shape)} moves data")
    return out


def _pooled_tokens(node: Any, act: Act, perm: tuple[int, ...]) -> bool:
    """``x.transpose(1, 2)`` of rows ``[B, T, D]`` read only by an adaptive pooling (Swin's
    pooler): held as it is, in the ``channels`` form the pooling reads."""
    user = patterns.only_user(node)
    return act.form == "rows" and len(act.shape) == 3 and perm == (0, 2, 1) and \
        user is not None and op_name(user.target) == "aten.adaptive_avg_pool1d"


@rule("aten.adaptive_avg_pool1d")
def _adaptive_avg_pool1d(conv: Converter, node: Any, x: Any, size: Any) -> Act:
    """``pool(x.transpose(1, 2), 1).flatten(1)``: the mean over the tokens (Swin's pooler),
    as ``mean(x, 1)`` makes it."""
    act = activation(conv, node, x)
    user = patterns.only_user(node)
    if list(size) != [1] or act.form != "channels" or act.prefix or act.suffix or \
            user is None or op_name(user.target) != "aten.flatten":
        raise unsupported(node, "an adaptive pooling other than a mean over the tokens, "
                          "flattened")
    b, d, n = act.dims
    tokens = act.with_(shape=(b, n, d), form="rows", dims=())
    return _mix_tokens(conv, node, tokens, np.full(n, 1.0 / n), keepdim=False)


@rule("aten.expand")
def _expand(conv: Converter, node: Any, x: Any, shape: Any, implicit: bool = False) -> Any:
    if isinstance(x, HeadRepeat):
        size = tuple(int(s) for s in shape)
        b, kv, _, t, d = x.shape
        if len(size) != 5 or (size[0], size[1], size[3], size[4]) != (b, kv, t, d):
            raise unsupported(node, "expanding a head axis other than repeat_kv's")
        return dataclasses.replace(x, repeats=size[2])
    if isinstance(x, HostIds) and tuple(int(s) for s in shape) in (x.shape, ()):
        return x  # host ids expanded to the shape they have
    act = activation(conv, node, x)
    size = tuple(s if s != -1 else act.shape[i - len(shape) + len(act.shape)]
                 for i, s in enumerate(shape))
    if size != act.shape:
        raise unsupported(node, "expanding an activation replicates data")
    return act


@rule("aten.slice")
def _slice(conv: Converter, node: Any, x: Any, dim: int = 0, start: Any = None, end: Any = None,
           step: int = 1) -> Any:
    if isinstance(x, Act) and x.order is not None and dim % len(x.shape) == len(x.shape) - 1:
        x = conv.in_order(x, node)  # a slice of the columns reads the rows in order
    sliced = tuple(getattr(node.meta.get("val"), "shape", ()))
    if 0 in sliced:  # Phi-3's ``q[..., rotary_dim:]`` at a full rotary: nothing, for a ``cat``
        return EmptySlice(sliced)
    if isinstance(x, fused.Fused) and dim % len(x.shape) == len(x.shape) - 1 and step == 1:
        first, stop = _bounds(start, end, x.shape[-1])
        if 0 <= first < stop:
            return fused.columns(conv, node, x, first, stop)
    part = None if _partial_half(node) else _rope_half(x, dim, start, end, step)
    if part is None and isinstance(x, Act) and dim % len(x.shape) == len(x.shape) - 1 and \
            step == 1:  # a partial RoPE's turned or passed channels
        part = rope.rotary_part(x, *_bounds(start, end, x.shape[-1]))
    if part is not None:
        return part
    act = activation(conv, node, conv.settle(node, x))
    last = dim % len(act.shape) == len(act.shape) - 1
    if order.keeps_rows(act, not last) and (act.order is not None or step != 1):
        first, stop = _bounds(start, end, act.shape[dim])
        return order.strided(act, dim % len(act.shape), first, stop, step)
    act = conv.in_order(act, node)
    if act.gap[1] and dim % len(act.shape) == 1 and step == 1:
        return GapSlice(act, *_bounds(start, end, act.shape[1]))
    dim %= len(act.shape)
    size = act.shape[dim]
    start, end = _bounds(start, end, size)
    if (start, end, step) == (0, size, 1):
        return act
    if act.form == "rows" and len(act.shape) == 3 and dim == 1 and end - start == 1:
        return _mix_tokens(conv, node, act, _one_hot(size, start), keepdim=True)
    user = patterns.only_user(node)
    if act.form == "rows" and len(act.shape) == 3 and dim == 1 and step == 1 and (
            user is not None and op_name(user.target) == "aten.mean"):
        return TokenWindow(act, start, end)  # x[:, a:b].mean(1): a mean over those tokens
    raise unsupported(node, "a slice that keeps part of an activation")


def _bounds(start: Any, end: Any, size: int) -> tuple[int, int]:
    """A slice's ``start:end`` of an axis of ``size`` as torch reads them: ``None`` the
    axis's ends, a negative bound from the end, the end clamped to the axis."""
    first = 0 if start is None else (start + size if start < 0 else start)
    return first, size if end is None else min(end + size if end < 0 else end, size)


def _partial_half(node: Any) -> bool:
    """Whether FX slice ``node`` (a half of a query's or key's channels) is a partial RoPE's
    part rather than ``rotate_half``'s: ``rotate_half`` negates its second half and
    concatenates its first, while a partial RoPE turns its first half (products, slices)
    and concatenates its second after the turned one."""
    users = [op_name(u.target) for u in node.users]
    first = node.args[2] if len(node.args) > 2 else 0
    if not users or (node.args[4] if len(node.args) > 4 else 1) != 1:
        return False  # (a strided slice is one component of interleaved pairs)
    if first in (0, None):
        return any(u not in ("aten.cat", "aten.neg") for u in users)
    return all(u == "aten.cat" for u in users)


def _rope_half(x: Any, dim: int, start: Any, end: Any, step: int) -> Any:
    """``q[..., :d/2]`` or ``q[..., d/2:]`` of a query/key (``rotate_half``): one half of
    its channel pairs in the split-halves layout; ``q[..., ::2]`` or ``q[..., 1::2]``
    (Cohere's interleaved ``rotate_half``): one component of its interleaved pairs; None
    when the slice is neither."""
    value = x if isinstance(x, rope.Pairs) else rope.start(x) if isinstance(x, Act) else None
    if value is None or dim % len(value.shape) != len(value.shape) - 1 or step not in (1, 2):
        return None
    d = value.shape[-1]
    first = 0 if start is None else (start + d if start < 0 else start)
    last = d if end is None else min(end + d if end < 0 else end, d)
    if step == 2:
        pairs = rope.view(value, (*value.shape[:-1], d // 2, 2)) if first in (0, 1) and \
            last >= d - 1 and d % 2 == 0 else None
        return None if pairs is None else rope.component(pairs, first)
    if (first, last) not in ((0, d // 2), (d // 2, d)):
        return None
    return rope.half(value, 0 if first == 0 else 1)


@dataclass(frozen=True)
class TokenWindow:
    """``x[:, start:end]`` of a rows value ``[B, T, D]`` whose only use is a mean over tokens
    (BEiT's pooler: the patch tokens without CLS), so it never needs to exist on its own."""

    act: Act
    start: int
    end: int


@rule("aten.select")
def _select(conv: Converter, node: Any, x: Any, dim: int, index: int) -> Any:
    if isinstance(x, fused.Split) and dim % len(x.shape) == x.axis:
        return _part(conv, node, x, index % x.groups)
    x = conv.settle(node, x) if isinstance(x, (fused.Fused, fused.Split)) else x
    if isinstance(x, rope.Pairs) and dim % len(x.shape) == len(x.shape) - 1 and x.split:
        return rope.component(x, index)
    act = activation(conv, node, x)
    dim %= len(act.shape)
    if act.shape[dim] == 1 and act.form in ("rows", "replicated") and act.attention is None:
        return _view(conv, node, act, act.shape[:dim] + act.shape[dim + 1:])
    if act.form == "rows" and len(act.shape) == 3 and dim == 1:
        return _mix_tokens(conv, node, act, _one_hot(act.shape[1], index % act.shape[1]),
                           keepdim=False)
    raise unsupported(node, "selecting part of an activation other than one token")


@rule("aten.mean")
def _mean(conv: Converter, node: Any, x: Any, dims: Any = None, keepdim: bool = False,
          dtype: Any = None) -> Act:
    if isinstance(x, patterns.Pending):  # an RMS norm's mean of squares (checked ahead)
        return patterns.advance(node, x, "mean_square")
    if isinstance(x, (Act, UserInput)) and patterns.centring(node):  # a layer norm written out
        return patterns.Centring(activation(conv, node, x))
    if isinstance(x, TokenWindow):
        if [d % 3 for d in (dims or [])] != [1]:
            raise unsupported(node, "a mean of a token slice over anything but its tokens")
        weights = np.zeros(x.act.shape[1])
        weights[x.start:x.end] = 1.0 / (x.end - x.start)
        return _mix_tokens(conv, node, x.act, weights, keepdim=keepdim)
    act = activation(conv, node, x)
    dims = [d % len(act.shape) for d in (dims if dims is not None else [])]
    if dims and all(act.shape[d] == 1 for d in dims) and act.form in ("rows", "replicated"):
        kept = tuple(1 if i in dims else s for i, s in enumerate(act.shape)) if keepdim else \
            tuple(s for i, s in enumerate(act.shape) if i not in dims)
        return _view(conv, node, act, kept)  # a mean over size-1 axes is the value itself
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
def _cat(conv: Converter, node: Any, parts: Any, dim: int = 0) -> Any:
    """``cat([constant tokens, patches], dim=1)``: the patches' GEMM already ran on an input
    with zero patch rows at the front of each image (``conv2d`` looked ahead), so those rows
    hold the conv bias; adding ``constant - bias`` there is the concatenation.  Parts of a
    rotary embedding (the two halves of ``rotate_half``, token windows) are concatenated
    symbolically (``frontend/rope.py``)."""
    parts = [p for p in parts if not isinstance(p, EmptySlice)]  # they add nothing
    if len(parts) == 1:
        return parts[0]
    if any(isinstance(p, rope.RotaryRest) for p in parts):
        return _join_rotary(conv, node, list(parts), dim)
    if any(isinstance(p, (rope.Pairs, rope.PairPart)) for p in parts):
        rank = len(parts[0].shape)
        last = dim % rank == rank - 1
        joined = rope.concat_halves(list(parts)) if last else rope.concat_tokens(list(parts))
        if joined is None:
            raise unsupported(node, "concatenating parts of a query or key other than the "
                              "halves of rotate_half or consecutive token windows")
        return joined
    if parts and isinstance(parts[0], GapSlice):
        return _fill_gap(conv, node, list(parts))
    parts = conv.settle(node, parts)
    if order.concatenable(list(parts), dim):  # patch merging's 2 x 2 neighbours
        return order.gathered_parts(conv, node, list(parts))
    parts = [conv.in_order(p, node) if isinstance(p, Act) else p for p in parts]
    acts = [p for p in parts if isinstance(p, Act)]
    if len(acts) != 1 or acts[0].prefix + acts[0].suffix == 0:
        raise unsupported(node, "concatenation of activations (only constant tokens around "
                          "the patch embedding are supported)")
    act = acts[0]
    b, n, d = act.shape
    if dim % 3 != 1:
        raise unsupported(node, "concatenation along a dimension other than tokens")
    at = next(i for i, p in enumerate(parts) if p is act)

    def tokens(constants: list[Any]) -> np.ndarray:
        blocks = [np.broadcast_to(to_numpy(p), (b, p.shape[1], d)) for p in constants]
        return np.concatenate(blocks, axis=1) if blocks else np.zeros((b, 0, d))

    head, tail = tokens(list(parts[:at])), tokens(list(parts[at + 1:]))
    k, gap = act.gap
    if head.shape[1] != act.prefix - gap or tail.shape[1] != act.suffix:
        raise unsupported(node, "constant tokens do not match the reserved patch rows")
    logical = head.shape[1] + n + act.suffix
    bias = act.bias if act.bias is not None else 0.0
    addend = np.zeros((b, logical, d))
    addend[:, :head.shape[1]] = head - bias
    addend[:, head.shape[1] + n:] = tail - bias
    conv.rewrites.append(f"{node.name}: {act.prefix} + {act.suffix} constant token(s) as zero "
                         "patch rows plus a corrected addend")
    return Act(act.value, (b, logical, d), addend=forms.open_gap(addend, act.gap).reshape(-1, d),
               origin=conv.name(node), gap=act.gap, bias=act.bias)


def _join_rotary(conv: Converter, node: Any, parts: list[Any], dim: int) -> Act:
    """``cat([rope(q[..., :r]), q[..., r:]], -1)``: the partial rope's output, which holds
    the passed channels of the same query or key as they were."""
    turned, rest = conv.settle(node, parts[0]), parts[-1]
    made = conv.b.graph.producer(turned.value) if isinstance(turned, Act) else None
    joined = None
    if len(parts) == 2 and isinstance(rest, rope.RotaryRest) and dim % 4 == 3 and (
            turned.value == rest.act.value or (made is not None and made.kind == "rope" and
                                                made.inputs[0] == rest.act.value)) and \
            turned.factor == rest.act.factor and turned.addend is None and \
            rest.act.addend is None:
        joined = rope.join_rotary(turned, rest)
    if joined is None:
        raise unsupported(node, "concatenating a query's or key's channels other than its "
                          "turned part and then the rest (a partial RoPE)")
    return joined


@dataclass(frozen=True)
class EmptySlice:
    """A slice holding no element (``shape`` has a 0): a concatenation drops it."""

    shape: tuple[int, ...]


@dataclass(frozen=True)
class GapSlice:
    """``x[:, start:end]`` of a value with reserved rows (``Act.gap``): waiting for the
    concatenation that puts constant tokens into them."""

    act: Act
    start: int
    end: int


def _fill_gap(conv: Converter, node: Any, parts: list[Any]) -> Act:
    """``cat([x[:, :k], constant tokens, x[:, k:]], 1)`` into the rows reserved after token k."""
    first, last = parts[0], parts[-1]
    act = first.act
    k, gap = act.gap
    b, t, d = act.shape
    tokens = [np.broadcast_to(to_numpy(p), (b, p.shape[1], d)) for p in parts[1:-1]]
    inserted = np.concatenate(tokens, axis=1)
    if last.act is not act or (first.start, first.end, last.start, last.end) != (0, k, k, t) or (
            inserted.shape[1] != gap):
        raise unsupported(node, "tokens inserted somewhere other than the reserved rows")
    addend = (act.addend if act.addend is not None else np.zeros((b * (t + gap), d))).copy()
    rows = addend.reshape(b, t + gap, d)
    rows[:, k:k + gap] = inserted - (act.bias if act.bias is not None else 0.0)
    conv.rewrites.append(f"{node.name}: {gap} constant token(s) inserted into reserved rows")
    return Act(act.value, (b, t + gap, d), addend=rows.reshape(-1, d), origin=conv.name(node))

