"""Lookups: ``aten.embedding`` of a program input's ids (a token embedding), which runs on
the device as popops MultiSlice (``lowering.lookup``).

A lookup whose ids are constants (``position_embedding(arange)``) never reaches a rule: the
converter folds it into a table. A lookup of ids the program computes on the device is
refused in one line: only a program input's ids are looked up.
"""

from __future__ import annotations

from typing import Any

from ipu_stack.frontend.convert import Converter, unsupported
from ipu_stack.frontend.forms import Act, UserInput
from ipu_stack.frontend.rules import is_tensor, rule, to_numpy
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
