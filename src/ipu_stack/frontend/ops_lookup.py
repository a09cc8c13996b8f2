"""Lookups: ``aten.embedding`` of a program input's ids (a token embedding), which runs on
the device as popops MultiSlice (``lowering.lookup``); and a row of each sequence picked at
a position the host computes from the ids (CLIP's pooled end-of-text row: ``eq`` and
``argmax`` on the ids are host preprocessing, the gather a device lookup).

A lookup whose ids are constants (``position_embedding(arange)``) never reaches a rule: the
converter folds it into a table. A lookup of ids the program computes on the device is
refused in one line: only a program input's ids are looked up.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ipu_stack.frontend.convert import Converter, op_name, unsupported
from ipu_stack.frontend.forms import Act, HostIds, UserInput
from ipu_stack.frontend.rules import activation, is_tensor, rule, to_numpy
from ipu_stack.ir.precision import F16, I32
from ipu_stack.util.errors import UsageError


@rule("aten.embedding")
def _embedding(conv: Converter, node: Any, weight: Any, indices: Any, padding_idx: int = -1,
               scale_grad_by_freq: bool = False, sparse: bool = False) -> Act:
    if not is_tensor(weight) or len(weight.shape) != 2:
        raise unsupported(node, "a lookup table that is not a constant [rows, width] tensor")
    if not isinstance(indices, (UserInput, HostIds)):
        raise unsupported(node, "a lookup of ids computed on the device (only a program "
                                "input's ids, or the host's arithmetic on them, are looked up)")
    table = to_numpy(weight)
    key = conv.const_key(weight, conv.name(node, ".table"))
    table_id = conv.weight(key, table, matrix=False)
    ids = conv.id_input(indices, node, table.shape[0]) if isinstance(indices, UserInput) \
        else _host_ids(conv, node, indices, table.shape[0])
    out = conv.b.op("embedding", [ids, table_id], F16, conv.name(node))
    return Act(out, (*indices.shape, table.shape[1]))


def _host_ids(conv: Converter, node: Any, ids: HostIds, rows: int) -> int:
    """An I32 input of ids the host computes (RoBERTa's positions), checked to fall within
    the table whenever they are made."""
    shape, index, name = (*ids.shape, 1), ids.index, conv.name(node, ".ids")

    def make(arrays: list[np.ndarray]) -> np.ndarray:
        values = ids.evaluate(arrays[index])
        if values.size and (values.min() < 0 or values.max() >= rows):
            raise UsageError(f"{name}: the host computed ids {values.min():g} to "
                             f"{values.max():g}, outside the table's [0, {rows})")
        return values.reshape(shape).astype(np.float32)

    conv.rewrites.append(f"{node.name}: ids computed from {ids.name} on the host (host "
                         "preprocessing), looked up on the device")
    return conv.host_input(name, shape, make)


def reads_positions(node: Any, host_nodes: set[Any]) -> bool:
    """Whether ``node`` looks a constant table up at ids from the host's position arithmetic
    (GPT-2's learned position embedding in a cache step, ``wpe(cache_position)``)."""
    return op_name(node.target) == "aten.embedding" and len(node.args) > 1 \
        and node.args[1] in host_nodes and node.args[0] not in host_nodes


def position_lookup(conv: Converter, node: Any, weight: Any) -> Act:
    """A table looked up at positions the host computes before each call: the ids are a
    per-call input, the lookup popops MultiSlice on the device as a token lookup is (the
    table stays on the device; a row computed on the host would send a row, not an id)."""
    if not is_tensor(weight) or len(weight.shape) != 2:
        raise unsupported(node, "a lookup table that is not a constant [rows, width] tensor")
    index_node, name = node.args[1], conv.name(node, ".ids")
    shape = tuple(int(s) for s in index_node.meta["val"].shape)
    table = to_numpy(weight)
    rows = table.shape[0]

    def make(arrays: list[np.ndarray]) -> np.ndarray:
        values = np.asarray(conv.replay(index_node, arrays), np.int64)
        if values.size and (values.min() < 0 or values.max() >= rows):
            raise UsageError(f"{name}: positions {values.min()} to {values.max()} are outside "
                             f"the {rows}-row table {node.args[0].name} (the model's largest "
                             "position)")
        return values.reshape(*shape, 1).astype(np.float32)

    table_id = conv.weight(conv.const_key(weight, conv.name(node, ".table")), table,
                           matrix=False)
    ids = conv.per_call_input(name, make, I32)
    conv.rewrites.append(f"{node.name}: {node.args[0].name} looked up on the device at the "
                         "positions the host computes before each call")
    out = conv.b.op("embedding", [ids, table_id], F16, conv.name(node))
    conv.dynamic.add(node)  # a device value: what reads it is mapped, not folded
    return Act(out, (*shape, table.shape[1]))


def host_ids(x: Any) -> HostIds | None:
    """A program input's ids, or the host's arithmetic on them, as :class:`HostIds`."""
    if isinstance(x, UserInput):
        return HostIds(x.index, x.name, x.shape, x.shape)
    return x if isinstance(x, HostIds) else None


def host_arithmetic(node: Any, kind: str, x: Any, y: Any) -> HostIds:
    """``ids + n``, ``ids - n``, ``n - ids``, ``ids * n``, or the sum, difference or product
    of two results of arithmetic on the same input's ids (``add``/``sub``/``mul``: an
    exclusive running count is ``cumsum(ids) - ids``), on the host."""
    first, second = host_ids(x), host_ids(y)
    if first is not None and second is not None and second.index == first.index:
        return first.then({"add": "plus", "sub": "minus", "mul": "times"}[kind], second)
    if first is None and second is not None and isinstance(x, (int, float)):
        if kind == "sub":  # n - ids
            return second.then("mul", -1.0).then("add", float(x))
        first, y = second, x
    if first is not None and isinstance(y, (int, float)):
        return first.then("add", -float(y)) if kind == "sub" else first.then(kind, float(y))
    raise unsupported(node, "arithmetic of a program input's ids with something other than "
                            "a number or the same ids")


@rule("aten.eq", "aten.ne")
def _equal(conv: Converter, node: Any, x: Any, value: Any) -> HostIds:
    """``ids == value`` (CLIP's end-of-text test), ``ids != value`` (RoBERTa's padding) on
    the host."""
    x = host_ids(x)
    if x is None or not isinstance(value, (int, float)):
        raise unsupported(node, "a comparison other than a program input's ids with a number")
    return x.then("ne" if "ne" in str(node.target) else "eq", float(value))


@rule("aten.cumsum")
def _cumsum(conv: Converter, node: Any, x: Any, dim: int, dtype: Any = None) -> HostIds:
    x = host_ids(x)
    if x is None:
        raise unsupported(node, "a running sum of anything but a program input's ids")
    return x.then("cumsum", int(dim) % len(x.shape))


@rule("aten.remainder", "aten.fmod")
def _remainder(conv: Converter, node: Any, x: Any, divisor: Any) -> HostIds:
    """``ids % n`` (the divisor's sign, as Python's) or ``fmod(ids, n)`` (the dividend's),
    on the host."""
    x = host_ids(x)
    if x is None or not isinstance(divisor, (int, float)) or divisor == 0:
        raise unsupported(node, "a remainder other than of a program input's ids by a number")
    return x.then("fmod" if "fmod" in str(node.target) else "remainder", float(divisor))


@rule("aten.flip")
def _flip(conv: Converter, node: Any, x: Any, dims: Any) -> HostIds:
    """Ids reversed along axes (a reverse running count is ``flip(cumsum(flip(ids)))``),
    on the host."""
    x = host_ids(x)
    if x is None:
        raise unsupported(node, "a flip of anything but a program input's ids")
    return x.then("flip", tuple(int(d) % len(x.shape) for d in dims))


@rule("aten.gather")
def _gather(conv: Converter, node: Any, x: Any, dim: int, index: Any,
            sparse_grad: bool = False) -> HostIds:
    """A constant table read at host-computed ids (RoBERTa's token types at its
    positions): more host arithmetic."""
    index = host_ids(index)
    if index is None or not is_tensor(x):
        raise unsupported(node, "a gather other than of a constant at a program input's ids")
    table = to_numpy(x)
    return index.then("take", (table, int(dim) % table.ndim))


@rule("aten.argmax")
def _argmax(conv: Converter, node: Any, x: Any, dim: Any = None, keepdim: bool = False
            ) -> HostIds:
    """The first position of the largest value along the last axis, on the host. An argmax
    of the device's values (a step returning its token) is refused: its reference would be
    the tokens, not the values the verdict judges; generate's ``--choose device`` adds one
    after a step that returns its logits."""
    if not isinstance(x, HostIds):
        raise unsupported(node, "an argmax of the device's values (export the logits: "
                          "generate --choose device chooses the token on the device)")
    if dim not in (-1, len(x.shape) - 1) or keepdim:
        raise unsupported(node, "an argmax other than over the last axis of host ids")
    return x.then("argmax", None, x.shape[:-1])


@rule("aten.index")
def _index(conv: Converter, node: Any, x: Any, indices: Any) -> Act:
    """``x[arange(B), positions]``: one row of each sequence picked at a position the host
    computed from the ids (CLIP's pooled end-of-text row), gathered on the device by a
    lookup whose table is the activation ``[B T, D]``."""
    act = activation(conv, node, x)
    if (act.form != "rows" or len(act.shape) != 3 or len(indices) != 2
            or not is_tensor(indices[0]) or not isinstance(indices[1], HostIds)):
        raise unsupported(node, "indexing other than x[arange(B), host-computed positions] "
                                "of a [B, T, D] activation")
    batch, tokens, width = act.shape
    if not np.array_equal(to_numpy(indices[0]), np.arange(batch)) or \
            indices[1].shape != (batch,):
        raise unsupported(node, "indexing other than x[arange(B), host-computed positions] "
                                "of a [B, T, D] activation")
    picked = indices[1]

    def rows(arrays: list[np.ndarray], picked: HostIds = picked) -> np.ndarray:
        position = picked.evaluate(arrays[picked.index])
        return (np.arange(batch) * tokens + position).astype(np.float32).reshape(batch, 1)

    name = conv.name(node, ".rows")
    ids = conv.host_input(name, (batch, 1), rows)
    conv.rewrites.append(f"{conv.name(node)}: positions from {picked.name} computed on the "
                         "host (host preprocessing), rows gathered on the device by a lookup")
    precision = conv.b.graph.value(act.value).type.precision
    out = conv.b.op("embedding", [ids, act.value], precision, conv.name(node))
    return Act(out, (batch, width))
