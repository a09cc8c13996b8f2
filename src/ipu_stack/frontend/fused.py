"""Fused projections (one linear layer computing k, v or q, k, v side by side), split at
compile time into one GEMM per part.

``nn.MultiheadAttention`` projects keys and values with one weight and separates them with
``unflatten(-1, (2, E)) ... select(0, i)``; timm-style blocks do ``reshape(B, N, 3, H, d)
.permute(2, 0, 3, 1, 4).unbind(0)``.  Slicing the result would move data, but slicing the
*weight* does not: the part ``i`` is ``x @ W[:, i*E:(i+1)*E] + b[i*E:(i+1)*E]``.  A linear
layer whose every user splits its last dimension is therefore kept as a :class:`Fused`
value (no IR operation yet); views and permutes that keep the group axis separate make it a
:class:`Split` that remembers where that axis is and what was done to each part; selecting
a part emits that part's GEMM and replays the recorded views and permutes on it.  A fused
value used whole is emitted as the full GEMM, so the look-ahead can never change a result.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from math import prod
from typing import Any

import numpy as np

from ipu_stack.frontend import forms
from ipu_stack.frontend.convert import op_name
from ipu_stack.frontend.forms import Act
from ipu_stack.frontend.linear import emit_linear


@dataclass(frozen=True)
class Fused:
    """A linear layer not yet emitted: ``x @ weight (+ bias)``, output ``shape``."""

    x: Act
    weight: np.ndarray  # [in, out]
    bias: np.ndarray | None
    key: str
    bias_key: str | None
    shape: tuple[int, ...]
    node: Any = field(compare=False)


@dataclass(frozen=True)
class Split:
    """A fused output viewed with its ``groups`` parts along ``axis``; ``ops`` are the views
    and permutes each part goes through after it is selected."""

    fused: Fused
    groups: int
    axis: int
    shape: tuple[int, ...]
    ops: tuple[tuple[str, tuple[int, ...]], ...]
    # the parts side by side in the last axis of each head (GPT-NeoX's ``view(B, T, H, 3d)``
    # then ``chunk(3, -1)``): the width of a part there; 0 where ``axis`` is their own axis
    within_heads: int = 0

    @property
    def part_cols(self) -> int:
        return self.fused.shape[-1] // self.groups


def is_fused_user(user: Any, rank: int) -> bool:
    """Whether an FX user of a linear layer's result splits its last dimension into a
    group axis (``unflatten(-1, (k, E))`` or a ``view``/``reshape`` adding two axes)."""
    kind = op_name(user.target)
    if kind == "aten.unflatten":
        sizes = user.args[2] if len(user.args) > 2 else ()
        return len(sizes) == 2 and 1 < int(sizes[0]) <= 4
    if kind in ("aten.view", "aten.reshape"):
        shape = user.args[1] if len(user.args) > 1 else ()
        if len(shape) == rank + 2 or (len(shape) == rank + 1 and chunked_heads(user)):
            return True
        # the leading axes viewed back (GPT-2's Conv1D: ``addmm`` of the rows, then
        # ``view(B, T, 3E)``), every user of that splitting it
        return leading_view(user) and bool(user.users) and all(
            is_fused_user(u, len(user.meta["val"].shape)) for u in user.users)
    if kind in ("aten.chunk", "aten.split", "aten.split_with_sizes"):
        dim = user.args[2] if len(user.args) > 2 else user.kwargs.get("dim", 0)
        return int(dim) % rank == rank - 1
    if kind == "aten.slice":  # Phi-3's ``qkv[..., :q]``, ``qkv[..., q:q + kv]``, ...
        dim = user.args[1] if len(user.args) > 1 else 0
        step = user.args[4] if len(user.args) > 4 else 1
        return int(dim) % rank == rank - 1 and step == 1
    return False


def chunked_heads(view: Any) -> int:
    """For FX ``view`` (a projection's rows as ``[B, T, H, k d]``): ``k`` when its every use,
    through transposes that keep the last axis, is ``chunk(k, -1)``; else 0."""
    found: set[int] = set()
    stack = [view]
    while stack:
        for user in stack.pop().users:
            kind = op_name(user.target)
            if kind == "aten.transpose" and -1 not in [a % 4 - 4 for a in user.args[1:3]]:
                stack.append(user)
            elif kind == "aten.chunk" and len(user.args) > 2 and int(user.args[2]) in (-1, 3):
                found.add(int(user.args[1]))
            else:
                return 0
    return found.pop() if len(found) == 1 else 0


def heads_view(value: Fused, shape: tuple[int, ...], groups: int) -> Split | None:
    """``value`` viewed as ``[B, T, H, groups x d]`` (GPT-NeoX's fused q, k and v, a head's
    three side by side): the weight's columns reordered so each part's are one run, as a
    :class:`Split` whose parts are selected by ``chunk(groups, -1)``."""
    cols = value.shape[-1]
    heads, width = shape[-2], shape[-1]
    if len(shape) != 4 or heads * width != cols or width % groups:
        return None
    d = width // groups
    order = np.arange(cols).reshape(heads, groups, d).transpose(1, 0, 2).reshape(-1)
    reordered = Fused(value.x, value.weight[:, order],
                      None if value.bias is None else value.bias[order],
                      f"{value.key}.heads{groups}",
                      None if value.bias_key is None else f"{value.bias_key}.heads{groups}",
                      value.shape, value.node)
    return Split(reordered, groups, 3, tuple(shape), (("view", (*shape[:-1], d)),),
                 within_heads=d)


def leading_view(node: Any) -> bool:
    """Whether FX ``node`` views its input with other leading axes and the same last one."""
    before = getattr(node.args[0], "meta", {}).get("val") if node.args else None
    after = node.meta.get("val")
    return before is not None and after is not None and len(before.shape) > 0 and \
        len(after.shape) > 0 and before.shape[-1] == after.shape[-1]


def view(value: Fused | Split, shape: tuple[int, ...]) -> Split | None:
    """``value`` viewed as ``shape`` with the group axis kept separate, or None."""
    if isinstance(value, Fused):
        lead, cols = prod(value.shape[:-1]), value.shape[-1]
        for axis, size in enumerate(shape):
            if size > 1 and cols % size == 0 and prod(shape[:axis]) == lead and (
                    prod(shape[axis + 1:]) == cols // size):
                inner = shape[:axis] + shape[axis + 1:]
                return Split(value, size, axis, shape, (("view", inner),))
        return None
    before, after = prod(value.shape[:value.axis]), prod(value.shape[value.axis + 1:])
    for axis, size in enumerate(shape):
        if size == value.groups and prod(shape[:axis]) == before and (
                prod(shape[axis + 1:]) == after):
            inner = shape[:axis] + shape[axis + 1:]
            return Split(value.fused, value.groups, axis, shape, (*value.ops, ("view", inner)))
    return None


def permute(value: Split, perm: tuple[int, ...]) -> Split | None:
    n = len(value.shape)
    perm = tuple(p % n for p in perm)
    if value.within_heads:  # the parts stay in the last axis, which must stay last
        if perm[-1] != n - 1:
            return None
        shape = tuple(value.shape[p] for p in perm)
        return replace(value, shape=shape, ops=(*value.ops, ("permute", perm)))
    axis = perm.index(value.axis)
    inner = tuple(p - (p > value.axis) for p in perm if p != value.axis)
    shape = tuple(value.shape[p] for p in perm)
    return Split(value.fused, value.groups, axis, shape, (*value.ops, ("permute", inner)))


def part(conv: Any, node: Any, value: Split, index: int) -> Act | None:
    """Part ``index``: its own GEMM (weight and bias columns sliced), then the recorded
    views and permutes; None when a form cannot follow them."""
    fused = value.fused
    cols = value.part_cols
    columns = slice(index * cols, (index + 1) * cols)
    bias = None if fused.bias is None else fused.bias[columns]
    act = emit_linear(conv, fused.node, fused.x, fused.weight[:, columns],
                      f"{fused.key}[{columns.start}:{columns.stop}]", bias,
                      None if fused.bias_key is None else
                      f"{fused.bias_key}[{columns.start}:{columns.stop}]", f".part{index}")
    conv.rewrites.append(f"{fused.node.name}: fused projection part {index} as its own GEMM")
    for kind, arg in value.ops:
        if kind == "view":
            act = forms.reshape(act, forms.resolve_shape(arg, prod(act.shape)))
        else:
            act = forms.permute(act, arg)
        if act is None:
            return None
    return act


def columns(conv: Any, node: Any, value: Fused, start: int, stop: int) -> Act:
    """Columns ``start:stop`` of a fused projection (a slice of its last axis): their own
    GEMM, the weight's and bias's columns sliced."""
    span = slice(start, stop)
    bias = None if value.bias is None else value.bias[span]
    act = emit_linear(conv, value.node, value.x, value.weight[:, span],
                      f"{value.key}[{start}:{stop}]", bias,
                      None if value.bias_key is None else f"{value.bias_key}[{start}:{stop}]",
                      f".cols{start}")
    conv.rewrites.append(f"{value.node.name}: fused projection columns {start}:{stop} as "
                         "their own GEMM")
    return act
