"""A static KV cache, as ``transformers.integrations.executorch`` exports a decoder's step.

Such a program holds each layer's keys and values in buffers ``[B, kv heads, positions, d]``
and writes the step's rows into them in place (``aten.index_copy_`` along the positions at
``cache_position``); the mask and the RoPE angles are computed from ``cache_position`` too.
The importer keeps the split a serving stack makes: the arithmetic on the positions runs on
the host before each call (the walk evaluates it, ``Converter.replay`` again at every call),
and the device gets its results as inputs: each sequence's cache slots, the mask row, the
RoPE tables.  A buffer written this way becomes a *state* (``cache_write``: the device
writes it in place and keeps it from call to call), and attention reads it whole with its
key/value heads shared by the query heads (``Act.cached``), as the builtin decode step does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ipu_stack.frontend.convert import (
    TRANSPARENT,
    Converter,
    op_name,
    unsupported,
    user_input_nodes,
)
from ipu_stack.frontend.forms import Act
from ipu_stack.frontend.rules import activation, is_tensor, rule
from ipu_stack.ir.graph import POSITION_GRAIN
from ipu_stack.ir.precision import F16, I32

CACHE_WRITES = ("aten.index_copy_", "aten.index_copy")


def cache_buffers(program: Any) -> list[str]:
    """The buffers a program writes along their positions (its static KV cache), by name."""
    kinds = {spec.arg.name: spec.kind.name for spec in program.graph_signature.input_specs}
    return [node.args[0].name for node in program.graph.nodes
            if node.op == "call_function" and op_name(node.target) in CACHE_WRITES
            and kinds.get(getattr(node.args[0], "name", ""), "") in ("BUFFER", "CONSTANT_TENSOR")]


def position_inputs(program: Any) -> list[str]:
    """Integer program inputs that no lookup reads, in a program with a static KV cache:
    the cache positions a step writes (``cache_position``), whose arithmetic the host does."""
    if not cache_buffers(program):
        return []
    names = []
    for node in user_input_nodes(program):
        value = node.meta.get("val")
        if hasattr(value, "dtype") and not value.dtype.is_floating_point and \
                not _looked_up(node):
            names.append(node.name)
    return names


def _looked_up(node: Any) -> bool:
    frontier = [node]
    while frontier:
        for user in frontier.pop().users:
            kind = op_name(user.target)
            if kind == "aten.embedding" and len(user.args) > 1:
                return True
            if kind in TRANSPARENT:
                frontier.append(user)
    return False


@rule(*CACHE_WRITES)
def _index_copy(conv: Converter, node: Any, cache: Any, dim: int, index: Any, source: Any
                ) -> Act:
    """``cache.index_copy_(2, positions, rows)``: the step's key or value rows written into
    a layer's cache at slots the host computes from the positions; a step of several tokens
    imported at positions ``0 .. N - 1`` (a prompt's pass, which generate calls at the
    cache's start only: ``frontend/step.py``) fills them with a static copy, as the
    builtin's prompt's pass does (``cache_fill``), where runtime slots would cost a
    ``MultiUpdate`` scan of every row's offset."""
    buffer, index_node = node.args[0], node.args[2]
    if not is_tensor(cache) or buffer.op != "placeholder":
        raise unsupported(node, "an in-place copy into something other than a program buffer "
                          "(a static KV cache)")
    if index_node not in conv.host_nodes:
        raise unsupported(node, "a cache write at positions not computed from the program's "
                          "position input")
    act = conv.plain(activation(conv, node, source), node)
    if cache.ndim != 4 or dim % 4 != 2 or act.form != "heads_major":
        raise unsupported(node, "a cache write that is not rows [B, heads, T, d] into a "
                          "[B, heads, positions, d] cache along its positions")
    batch, heads, positions, width = (int(s) for s in cache.shape)
    b, tokens, h, d = act.dims
    if (b, h, d) != (batch, heads, width):
        raise unsupported(node, f"rows {list(act.shape)} written into a cache "
                          f"{list(cache.shape)}")
    if positions % POSITION_GRAIN:
        raise unsupported(node, f"a cache of {positions} positions (the device's cache "
                          f"holders take whole blocks of {POSITION_GRAIN}: export with "
                          f"max_cache_len a multiple of {POSITION_GRAIN})")
    name = conv.name(node)
    initial = cache.detach().float().permute(0, 2, 1, 3).reshape(batch * positions,
                                                                   heads * width).numpy()
    state = conv.weight(f"{name}.cache", initial, False)  # F16

    def slots(arrays: list[np.ndarray]) -> np.ndarray:
        where = np.asarray(conv.replay(index_node, arrays), np.int64).reshape(tokens)
        rows = np.arange(batch)[:, None] * positions + where[None, :]
        return rows.reshape(batch, tokens, 1).astype(np.float32)

    where = np.asarray(index.detach(), np.int64)
    if where.size != tokens or where.min() < 0 or where.max() >= positions:
        raise unsupported(node, f"{tokens} rows written at positions {where.tolist()[:4]}, "
                          f"outside the cache's {positions}")
    if tokens > 1 and np.array_equal(where, np.arange(tokens)):  # a prompt's pass
        written = conv.b.op("cache_fill", [state, act.value], F16, f"{name}.written",
                            positions=positions, kv_heads=heads)
        how = f"filled at positions 0 .. {tokens - 1} (a static copy)"
    else:
        written = conv.b.op("cache_write", [state, act.value, conv.per_call_input(
            "slots", slots, I32)], F16, f"{name}.written", positions=positions,
            kv_heads=heads)
        how = "written in place at the host's slots"
    conv.rewrites.append(f"{node.name}: the buffer {buffer.name} is a KV cache the device "
                         f"keeps ({name}.cache), {how}")
    return Act(written, tuple(int(s) for s in cache.shape), "heads_major",
               (batch, positions, heads, width), cached=heads)
