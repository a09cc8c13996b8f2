"""What fills a tile, by category: weights, a KV cache, activations, partials, code, exchange
tables.

When a model does not fit, the first question is what took the space.  A tile's bytes at its
peak step are split into the buffers live there (weights, which stay resident; partial sums
and the F16 operand copies of the AMP; every other activation or operand) and its support
memory (kernel code, exchange tables, the layer loop's address tables, the runtime).
"""

from __future__ import annotations

import numpy as np

from ipu_stack.lowering.program import Program
from ipu_stack.memory.placement import Placement

PARTIAL_SUFFIXES = (".partial", ".received", ".f16")
ORDER = ("weights", "kv cache", "activations", "partials", "code", "exchange tables",
         "layer tables", "runtime")


def buffer_categories(program: Program) -> list[str]:
    """Each buffer's category, by buffer id (a state, resident like a weight, is the KV
    cache)."""
    weights = {step.buffer for step in program.initialize}
    states = {name for name, info in program.tensors.items() if info.get("role") == "state"}
    return [("kv cache" if b.name in states else "weights") if b.id in weights else
            "partials" if b.name.endswith(PARTIAL_SUFFIXES) else "activations"
            for b in program.buffers]


def tile_categories(program: Program, placement: Placement, support: dict[str, np.ndarray],
                    tile: int) -> dict[str, int]:
    """Bytes of ``tile`` by category at its peak step (placed buffers only)."""
    step = int(placement.peak_step[tile])
    out = dict.fromkeys(ORDER, 0)
    for buffer, category in zip(program.buffers, buffer_categories(program), strict=True):
        if placement.addresses[buffer.id, tile] >= 0 and buffer.first <= step <= buffer.last:
            out[category] += buffer.nbytes
    out["code"] = int(support["code"][tile])
    out["exchange tables"] = int(support["exchange_tables"][tile])
    out["layer tables"] = int(support.get("layer_tables", np.zeros(tile + 1))[tile])
    out["runtime"] = int(support["runtime"][tile] + support["host"][tile])
    return out


def describe(categories: dict[str, int]) -> str:
    """``weights 324000, activations 51200, ...`` (largest first, empty ones left out)."""
    parts = sorted(((v, k) for k, v in categories.items() if v), reverse=True)
    return ", ".join(f"{k} {v}" for v, k in parts)
