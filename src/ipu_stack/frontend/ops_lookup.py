"""Lookups: ``aten.embedding`` of a program input's ids (a token embedding), which runs on
the device as popops MultiSlice (``lowering.lookup``); and a row of each sequence picked at
a position the host computes from the ids (CLIP's pooled end-of-text row: ``eq`` and
``argmax`` on the ids are host preprocessing, the gather a device lookup).

A lookup whose ids are constants (``position_embedding(arange)``) never reaches a rule: the
converter folds it into a table. A lookup of ids the program computes on the device is
refused in one line: only a program input's ids are looked up.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from ipu_stack.frontend.convert import Converter, unsupported
from ipu_stack.frontend.forms import Act, HostIds, UserInput
from ipu_stack.frontend.rules import activation, is_tensor, rule, to_numpy
from ipu_stack.ir.precision import F16


@rule("aten.embedding")
def _embedding(conv: Converter, node: Any, weight: Any, indices: Any, padding_idx: int = -1,
               scale_grad_by_freq: bool = False, sparse: bool = False) -> Act:
    if not is_tensor(weight) or len(weight.shape) != 2:
        raise unsupported(node, "a lookup table that is not a constant [rows, width] tensor")
    if not isinstance(indices, UserInput):
        raise unsupported(node, "a lookup of ids computed on the device (only a program "
                                "input's ids are looked up)")
    table = to_numpy(weight)
    key = conv.const_key(weight, conv.name(node, ".table"))
    table_id = conv.weight(key, table, matrix=False)
    ids = conv.id_input(indices, node, table.shape[0])
    out = conv.b.op("embedding", [ids, table_id], F16, conv.name(node))
    return Act(out, (*indices.shape, table.shape[1]))


@rule("aten.eq")
def _equal(conv: Converter, node: Any, x: Any, value: Any) -> HostIds:
    """``ids == value`` on the host (CLIP's end-of-text test)."""
    if isinstance(x, UserInput):
        x = HostIds(x.index, x.name, x.shape, x.shape)
    if not isinstance(x, HostIds) or not isinstance(value, (int, float)):
        raise unsupported(node, "a comparison other than a program input's ids with a number")
    return replace(x, steps=(*x.steps, ("eq", float(value))))


@rule("aten.argmax")
def _argmax(conv: Converter, node: Any, x: Any, dim: Any = None, keepdim: bool = False
            ) -> HostIds:
    """The first position of the largest value along the last axis, on the host."""
    if not isinstance(x, HostIds) or dim not in (-1, len(x.shape) - 1) or keepdim:
        raise unsupported(node, "an argmax other than over the last axis of host ids")
    return replace(x, shape=x.shape[:-1], steps=(*x.steps, ("argmax", None)))


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
