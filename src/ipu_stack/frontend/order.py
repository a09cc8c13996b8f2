"""ATen rules, row orders: rolls, permutes of the leading axes and strided slices that move
whole rows, kept as an order over the rows (``Act.order``) instead of moved.

A Swin block rolls its grid (``torch.roll`` over height and width), cuts it into windows
(a ``view`` and a ``transpose`` of the leading axes), attends, and puts the windows back
and rolls them back; patch merging takes ``x[:, r::2, c::2]`` and concatenates the four.
Every one of those keeps each row whole: only which row is where changes. The importer
tracks that as an index (logical row ``l`` is IR row ``order[l]``) through views, permutes
and rolls, and row-local operations (norms, linear layers, GELU, residual adds) run on
the rows where they lie, the result in the same order. Rows move only where a rule needs
them in order (``Converter.in_order``: one ``gather_rows``, an exchange on the device), or
where two operands of an add lie in different orders (the right one, a block's attention
output, moves into the left one's, the residual stream's); a concatenation of strided
slices of one value is one gather too. Zero padding that adds no rows passes through.
"""

from __future__ import annotations

from math import prod
from typing import Any

import numpy as np

from ipu_stack.frontend.convert import Converter, unsupported
from ipu_stack.frontend.forms import Act
from ipu_stack.frontend.rules import activation, rule
from ipu_stack.ir.types import RowIndex


def ordered(act: Act) -> bool:
    """Whether ``act``'s logical rows are not its IR value's rows as they lie: out of order,
    or each made of several IR rows side by side."""
    return act.order is not None or act.group > 1


def rows_of(act: Act) -> np.ndarray:
    """The IR row of each logical row of a rows-form value, as an array over its leading
    axes (and, where each is ``group`` IR rows side by side, one more axis of those)."""
    lead = act.shape[:-1]
    held = act.order.rows if act.order is not None else np.arange(prod(lead) * act.group)
    return held.reshape((*lead, act.group) if act.group > 1 else lead)


def reordered(act: Act, rows: np.ndarray, shape: tuple[int, ...]) -> Act:
    """``act`` viewed as ``shape`` with logical row ``l`` at IR row ``rows.flat[l]`` (no
    order where that is the IR's own)."""
    flat = np.ascontiguousarray(rows.reshape(-1))
    # the IR's own order only where every row of the value is still there: an ordered
    # value may be a strided slice, fewer rows than its IR value holds
    same = act.order is None and np.array_equal(flat, np.arange(prod(act.shape[:-1]) *
                                                                 act.group))
    return act.with_(shape=shape, order=None if same else RowIndex(flat), linear=None)


def keeps_rows(act: Act, last_axis_kept: bool) -> bool:
    """Whether a rule may move ``act``'s rows as an order: a rows-form value without lazy
    terms or hidden rows, whose last axis stays the columns."""
    return (isinstance(act, Act) and act.form == "rows" and last_axis_kept and not act.lazy
            and not (act.prefix or act.suffix or act.gap[1]) and act.attention is None
            and not act.cached)


def permuted(act: Act, perm: tuple[int, ...]) -> Act:
    """A permute of the leading axes (the last stays last) as an order."""
    grouped_axis = (len(perm) - 1,) if act.group > 1 else ()
    rows = rows_of(act).transpose((*perm[:-1], *grouped_axis))
    return reordered(act, rows, tuple(act.shape[p] for p in perm))


def merged_rows(shape: tuple[int, ...], resolved: tuple[int, ...]) -> int:
    """How many consecutive rows a view of ``shape`` as ``resolved`` puts side by side in
    one row (its last axis that many times wider, its leading axes that many times fewer);
    0 where it does not."""
    if not shape or not resolved or resolved[-1] % shape[-1]:
        return 0
    count = resolved[-1] // shape[-1]
    return count if count > 1 and prod(resolved[:-1]) * count == prod(shape[:-1]) else 0


def split_rows(act: Act, resolved: tuple[int, ...]) -> int:
    """How many rows a view of ``act`` as ``resolved`` splits each of its rows into, where
    each is that many of its IR rows side by side (``Act.group``: undoing a merge moves
    nothing); 0 where it does not."""
    shape = act.shape
    if not resolved or shape[-1] % resolved[-1]:
        return 0
    count = shape[-1] // resolved[-1]
    return count if count > 1 and act.group % count == 0 and \
        prod(resolved[:-1]) == prod(shape[:-1]) * count else 0


def grouped(act: Act, shape: tuple[int, ...], count: int) -> Act:
    """``act`` viewed as ``shape``, each row ``count`` of its consecutive rows side by side
    (SmolVLM's pixel shuffle): the rows stay where they lie until a rule reads them
    (``Converter.in_order``: one ``gather_rows`` of ``group`` rows a row)."""
    return act.with_(shape=shape, group=act.group * count, linear=None)


def ungrouped(act: Act, shape: tuple[int, ...], count: int) -> Act:
    """``act`` viewed as ``shape``, each row split back into ``count`` rows (the inverse of
    :func:`grouped`): the rows stay where they lie."""
    return act.with_(shape=shape, group=act.group // count, linear=None)


def viewed(act: Act, shape: tuple[int, ...]) -> Act:
    """A view that keeps the last axis: the same rows, leading axes regrouped."""
    return act.with_(shape=shape, linear=None)


def in_same_order(conv: Converter, node: Any, x: Act, y: Act) -> tuple[Act, Act]:
    """Two rows-form operands of a row-local operation in one order: ``x`` moved into
    ``y``'s when they differ (a residual add: the block's attention output, left in its
    windows' order, moves to where the stream holds its rows, so the stream keeps one order
    and a stage's blocks move rows alike), both into logical order where ``y``'s rows are
    not every row of its value."""
    if x.order == y.order:
        return x, y
    wanted = rows_of(y).reshape(-1)
    held = conv.b.graph.value(y.value).type.rows
    if x.shape[:-1] != y.shape[:-1] or len(wanted) != held or (
            len(np.unique(wanted)) != held):  # y holds rows no logical row of it names
        return conv.in_order(x, node), conv.in_order(y, node)
    holder = np.empty(len(wanted), dtype=np.int64)
    holder[wanted] = np.arange(len(wanted))  # the logical row each IR row of y holds
    source = rows_of(x).reshape(-1)[holder]
    moved = conv.in_order(x.with_(order=RowIndex(source)), node)
    return moved.with_(order=y.order), y


def gathered_parts(conv: Converter, node: Any, parts: list[Act]) -> Act:
    """``cat(parts, -1)`` of strided slices of one value: each result row their rows side
    by side, one ``gather_rows`` of ``len(parts)`` rows a row."""
    first = conv.plain(parts[0], node)
    picks = np.stack([rows_of(conv.plain(p, node)).reshape(-1) for p in parts], axis=1)
    name = conv.name(node)
    precision = conv.b.graph.value(first.value).type.precision
    value = conv.b.op("gather_rows", [first.value], precision, name,
                      index=RowIndex(picks.reshape(-1)), group=len(parts))
    conv.rewrites.append(f"{node.name}: {len(parts)} strided slices concatenated by one "
                         "gather")
    shape = (*first.shape[:-1], first.shape[-1] * len(parts))
    return Act(value, shape)


def concatenable(parts: list[Any], dim: int) -> bool:
    """Whether ``cat(parts, dim)`` is a gather of one value's rows: rows-form parts of one
    IR value and one shape, along the last axis."""
    if len(parts) < 2 or not all(isinstance(p, Act) for p in parts):
        return False
    rank = len(parts[0].shape)
    return dim % rank == rank - 1 and all(
        keeps_rows(p, True) and p.value == parts[0].value and p.shape == parts[0].shape
        for p in parts)


def strided(act: Act, dim: int, start: int, end: int, step: int) -> Act:
    """``act[..., start:end:step, ...]`` along a leading axis: a subset of its rows."""
    index = [slice(None)] * (len(act.shape) - 1)
    index[dim] = slice(start, end, step)
    rows = rows_of(act)[tuple(index)]
    return reordered(act, rows, (*rows.shape, act.shape[-1]))


@rule("aten.roll")
def _roll(conv: Converter, node: Any, x: Any, shifts: Any, dims: Any = ()) -> Act:
    act = activation(conv, node, x)
    shifts = [int(s) for s in (shifts if isinstance(shifts, (list, tuple)) else [shifts])]
    dims = [int(d) % len(act.shape) for d in (dims if isinstance(dims, (list, tuple))
                                              else [dims])]
    if not dims or len(dims) != len(shifts) or not keeps_rows(
            act, len(act.shape) - 1 not in dims):
        raise unsupported(node, "a roll of anything but the leading axes of a rows value")
    return reordered(act, np.roll(rows_of(act), shifts, dims), act.shape)


@rule("aten.pad", "aten.constant_pad_nd")
def _pad(conv: Converter, node: Any, x: Any, pad: Any, *rest: Any, **kwargs: Any) -> Act:
    """Zero padding that adds nothing (Swin's ``maybe_pad`` on a grid windows tile)."""
    act = activation(conv, node, x)
    if any(int(p) for p in pad):
        raise unsupported(node, "padding that adds rows or columns (a grid that windows or "
                          "a patch merging do not tile)")
    return act
