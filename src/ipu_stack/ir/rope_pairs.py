"""Rotation pairs side by side: a KV-cached attention's q and k projections with each
head's columns reordered so RoPE's rotate-half pairs ``(i, i + d/2)`` become the adjacent
columns ``(2i, 2i + 1)``.

Why: a decode step's q and k leave their GEMMs in column blocks of a few columns a tile
(``lowering.gemm_stage``).  Rotate-half pairs lie ``d/2`` columns apart, in other blocks,
so the rotation first gathers each head whole on a tile of its own: an exchange phase and
its sync a layer (``RowLowering.rope_by_heads``).  With each head's columns in the order
``0, d/2, 1, d/2 + 1, ...`` every pair lies in one block, and the rotation runs where the
GEMM left it (``RowLowering.rope_in_place``).  Nothing a user sees changes: the scores
``q . k`` sum the same products, q and k reordered alike (the sum's order changes, so its
last bits may), the keys in the cache are reordered alike, and the values, the context
and everything after them are untouched.  The rewrite is made only where every use of the
rotated q and k ends in that product (through a cache write, the cache's reads, or the
grouped-query repeat), and where the projections' weights are used by nothing else, so no
output sees the order.  A prompt's pass and its decode step are rewritten alike (their
caches are handed from one to the other).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import MutableMapping
from dataclasses import replace
from typing import Any

import numpy as np

from ipu_stack.ir.graph import Graph, Operation
from ipu_stack.ir.values import reorder_columns

# the operations a rotated key passes through on its way to a ``qk`` product: written into
# the cache (its rows input), or repeated for grouped-query heads (a matmul with a constant
# selection of whole heads, which commutes with any reordering inside a head)
_KEY_CARRIERS = ("cache_write", "cache_fill")


def pair_order(head_dim: int) -> np.ndarray:
    """Within one head, the old column of each new one: ``2i -> i``, ``2i + 1 -> i + d/2``."""
    half = head_dim // 2
    return np.stack([np.arange(half), np.arange(half) + half], axis=1).reshape(-1)


def _weight(graph: Graph, value_id: int) -> int | None:
    """``value_id`` when it is a weight, else None."""
    return value_id if graph.value(value_id).role == "weight" else None


def _projection(graph: Graph, rope: Operation) -> list[int] | None:
    """The weights whose columns the rope's input comes from (a matmul's, and a bias
    added to it), when the input is that projection's alone; else None."""
    x = rope.inputs[0]
    if len(graph.consumers(x)) != 1:
        return None
    op = graph.producer(x)
    found: list[int] = []
    if op is not None and op.kind == "bias_add":
        bias = _weight(graph, op.inputs[1])
        if bias is None or len(graph.consumers(op.inputs[0])) != 1:
            return None
        found.append(bias)
        op = graph.producer(op.inputs[0])
    if op is None or op.kind != "matmul" or (w := _weight(graph, op.inputs[1])) is None:
        return None
    return [w, *found]


def _rope_behind(graph: Graph, value_id: int, as_key: bool) -> Operation | None:
    """The ``halves`` rope a ``qk`` product's operand comes from: directly (q), or for the
    keys through a cache write or a head repeat; None when it does not."""
    op = graph.producer(value_id)
    while as_key and op is not None and (op.kind in _KEY_CARRIERS or (
            op.kind == "matmul" and _weight(graph, op.inputs[1]) is not None)):
        op = graph.producer(op.inputs[1] if op.kind in _KEY_CARRIERS else op.inputs[0])
    if op is None or op.kind != "rope" or op.attrs.get("pairs") != "halves" or \
            op.attrs.get("rotary", op.attrs["head_dim"]) != op.attrs["head_dim"]:
        return None  # (a part of each head turned keeps its pairs: not rewritten)
    return op


def _uses_end_in_products(graph: Graph, value_id: int, position: int) -> bool:
    """Whether every use of ``value_id`` is a ``qk`` product's operand ``position`` (0: the
    queries, 1: the keys), for keys also through cache writes and head repeats."""
    for op in graph.consumers(value_id):
        if op.kind == "head_matmul" and op.attrs.get("mode") == "qk" and \
                op.inputs[position] == value_id and op.inputs[1 - position] != value_id:
            continue
        carries = position == 1 and (
            (op.kind in _KEY_CARRIERS and op.inputs[1] == value_id) or
            (op.kind == "matmul" and op.inputs[0] == value_id
             and _weight(graph, op.inputs[1]) is not None))
        if not carries or any(graph.value(o).role == "output" for o in op.outputs):
            return False
        if not all(_uses_end_in_products(graph, o, 1) for o in op.outputs):
            return False
    return graph.value(value_id).role != "output"


def _pairs(graph: Graph) -> list[tuple[Operation, Operation]]:
    """Each (q rope, k rope) pair that meets a ``qk`` product, once."""
    found: dict[tuple[int, int], tuple[Operation, Operation]] = {}
    for op in graph.operations:
        if op.kind != "head_matmul" or op.attrs.get("mode") != "qk":
            continue
        q, k = _rope_behind(graph, op.inputs[0], False), _rope_behind(graph, op.inputs[1], True)
        if q is not None and k is not None:
            found[(q.id, k.id)] = (q, k)
    return list(found.values())


def interleave_rope_pairs(graph: Graph, tensors: MutableMapping[str, Any]) -> int:
    """Rewrite ``graph`` and ``tensors`` in place (module docstring): each q and k rope that
    may take interleaved pairs, with its projection's columns reordered; how many ropes."""
    if not any(op.kind in _KEY_CARRIERS for op in graph.operations):
        return 0  # no cache: a prompt's pass alone, whose rows are whole anyway
    ropes: dict[int, Operation] = {}
    weights: dict[int, int] = {}  # weight value -> the head width its columns are in
    for q, k in _pairs(graph):
        sources = [_projection(graph, q), _projection(graph, k)]
        if any(s is None for s in sources) or q.attrs["head_dim"] != k.attrs["head_dim"]:
            continue
        if not (_uses_end_in_products(graph, q.outputs[0], 0)
                and _uses_end_in_products(graph, k.outputs[0], 1)):
            continue
        # the keys' cache holds them in the new order too (its initial bytes included)
        states = [op.inputs[0] for op in graph.consumers(k.outputs[0])
                  if op.kind in _KEY_CARRIERS]
        for rope, found in zip((q, k), (sources[0], [*(sources[1] or ()), *states]),
                               strict=True):
            ropes[rope.id] = rope
            weights.update((value, int(rope.attrs["head_dim"])) for value in found or ())
    reads = Counter(i for op in graph.operations for i in op.inputs)
    if any(reads[value] != 1 for value in weights):
        return 0  # a projection's weight read elsewhere would see the new order
    for value, head_dim in weights.items():
        cols = graph.value(value).type.shape[-1]
        order = (np.arange(cols // head_dim)[:, None] * head_dim + pair_order(head_dim)
                 ).reshape(-1)
        reorder_columns(tensors, graph.value(value).name, order)
    for index, op in enumerate(graph.operations):
        if op.id in ropes:
            attrs = {k: v for k, v in op.attrs.items() if k != "pairs"}
            graph.operations[index] = replace(op, attrs={**attrs, "pairs": "interleaved"})
    return len(ropes)
