"""Support memory: what a tile needs before any tensor (runtime, code, exchange tables).

Support memory is placed first, from the bottom of tile memory, as the reference does
(``allocated package support memory ...``); tensors go into what is left.
"""

from __future__ import annotations

import numpy as np

from ipu_stack.ir.layout import round_up
from ipu_stack.lowering.program import ComputeSet, Program
from ipu_stack.target import Target

HOST_CODE_BYTES = 620  # reference log 004: host_code_bytes=620
HOST_DATA_BYTES = 404  # reference log 004: host_data_bytes=404
LAYER_ADDRESS_BYTES = 4  # one 32-bit address per layer and per-layer weight on a tile


def code_bytes_per_tile(program: Program, target: Target) -> np.ndarray:
    """Bytes of kernel code each tile needs: every distinct kernel instance it runs."""
    seen: dict[str, set[int]] = {}
    sizes: dict[str, int] = {}
    for _, _, step in program.steps():
        if isinstance(step, ComputeSet):
            for call in step.calls:
                key = call.instance.key
                seen.setdefault(key, set()).update(call.tiles.tolist())
                sizes[key] = call.instance.impl.code_bytes
    code = np.zeros(target.tiles, dtype=np.int64)
    for key, tiles in seen.items():
        code[np.fromiter(tiles, dtype=np.int64)] += sizes[key]
    return code


def layer_table_bytes(program: Program, target: Target) -> np.ndarray:
    """The per-layer address table of a layer loop: on every tile that holds a per-layer
    weight, one address word per layer (what its kernels and sends load on each pass)."""
    table = np.zeros(target.tiles, dtype=np.int64)
    found = program.loop()
    if found is None:
        return table
    _, loop = found
    for slot in loop.slots:
        table[program.buffers[slot.buffers[0]].tiles] += LAYER_ADDRESS_BYTES * loop.count
    return table


def support_bytes(program: Program, table_bytes: np.ndarray, target: Target) -> dict[str, np.ndarray]:
    """Per-tile support sizes by kind, and ``total`` rounded to the interleaved alignment."""
    code = code_bytes_per_tile(program, target)
    runtime = np.full(target.tiles, int(target.runtime_support_bytes), dtype=np.int64)
    host = np.full(target.tiles, HOST_CODE_BYTES + HOST_DATA_BYTES, dtype=np.int64)
    layers = layer_table_bytes(program, target)
    total = runtime + host + code + table_bytes.astype(np.int64) + layers
    total = np.array([round_up(int(v), 32) for v in total], dtype=np.int64)
    return {
        "runtime": runtime,
        "host": host,
        "code": code,
        "exchange_tables": table_bytes.astype(np.int64),
        "layer_tables": layers,
        "total": total,
    }
