"""Emit the package contents: a JSON manifest and named arrays, with every address resolved.

The device reads nothing else, so this is where the program becomes self-contained: kernel
instances by id, per-call tile lists and operand addresses, per-phase transfers with
absolute source and destination addresses plus the schedule's chunks, and host streams
with each block's tiles and addresses.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ipu_stack.exchange import Schedule
from ipu_stack.kernels.base import KernelInstance
from ipu_stack.lowering.program import ComputeSet, Exchange, HostRead, HostWrite, Program
from ipu_stack.memory.placement import Placement


class Emitter:
    """Collects arrays under short names and kernel instances by id."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}
        self.kernels: list[KernelInstance] = []
        self.kernel_ids: dict[KernelInstance, int] = {}

    def kernel(self, instance: KernelInstance) -> int:
        if instance not in self.kernel_ids:
            self.kernel_ids[instance] = len(self.kernels)
            self.kernels.append(instance)
        return self.kernel_ids[instance]

    def put(self, name: str, array: np.ndarray, dtype: Any) -> str:
        self.arrays[name] = np.ascontiguousarray(np.asarray(array, dtype=dtype))
        return name


def _host_step(
    emitter: Emitter, prefix: str, step: HostWrite | HostRead, placement: Placement
) -> dict:
    tiles = step.layout.tiles
    flat = tiles.ravel()
    addresses = np.where(flat >= 0, placement.addresses[step.buffer, np.maximum(flat, 0)], -1)
    extra = {}
    if isinstance(step, HostRead):
        extra = {"origin": list(step.origin), "checkpoint": step.checkpoint,
                 "operation": step.operation}
    return {
        **extra,
        "kind": "host_write" if isinstance(step, HostWrite) else "host_read",
        "tensor": step.tensor,
        "layout": step.layout.to_json(),
        "tiles": emitter.put(f"{prefix}/tiles", tiles, np.int32),
        "addresses": emitter.put(f"{prefix}/addresses", addresses.reshape(tiles.shape), np.int64),
    }


def emit_program(
    program: Program,
    placement: Placement,
    schedules: dict[int, Schedule],
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Manifest fragment (``kernels``, ``programs``) and arrays for the package."""
    emitter = Emitter()
    programs: dict[str, list[dict]] = {"initialize": [], "run": []}
    phase = 0
    for name, index, step in program.steps():
        prefix = f"s{index}"
        if isinstance(step, (HostWrite, HostRead)):
            programs[name].append(_host_step(emitter, prefix, step, placement))
        elif isinstance(step, ComputeSet):
            calls = []
            for c, call in enumerate(step.calls):
                addresses = np.stack(
                    [placement.address(buf, call.tiles) + offsets for buf, offsets in call.operands],
                    axis=1,
                )
                calls.append(
                    {
                        "kernel": emitter.kernel(call.instance),
                        "tiles": emitter.put(f"{prefix}/c{c}/tiles", call.tiles, np.int32),
                        "addresses": emitter.put(f"{prefix}/c{c}/addresses", addresses, np.int64),
                    }
                )
            programs[name].append({"kind": "compute", "name": step.name, "calls": calls})
        elif isinstance(step, Exchange):
            schedule = schedules[index]
            src_addr = placement.addresses[step.src_buf, step.src_tile] + step.src_off
            dst_addr = placement.addresses[step.dst_buf, step.dst_tile] + step.dst_off
            entry = {
                "kind": "exchange",
                "name": step.name,
                "phase": phase,
                "kind_selected": schedule.kind,
                "lower_bound": int(schedule.lower_bound),
            }
            columns = [
                ("src_tile", step.src_tile, np.int32),
                ("src_addr", src_addr, np.int64),
                ("words", step.words, np.int64),
                ("dst_offsets", step.dst_offsets, np.int64),
                ("dst_tile", step.dst_tile, np.int32),
                ("dst_addr", dst_addr, np.int64),
                ("chunk_transfer", schedule.chunk_transfer, np.int64),
                ("chunk_start", schedule.chunk_start, np.int64),
                ("chunk_words", schedule.chunk_words, np.int64),
            ]
            if schedule.chunk_lanes is not None:  # paired-tiles option: two-lane chunks
                columns.append(("chunk_lanes", schedule.chunk_lanes, np.int64))
            for key, array, dtype in columns:
                entry[key] = emitter.put(f"{prefix}/{key}", array, dtype)
            programs[name].append(entry)
            phase += 1
    kernels = [
        {"name": k.name, "key": k.key, **k.to_json()} for k in emitter.kernels
    ]
    # the allocation map: lets the device check every access lies inside a live operand
    buffer_ids, tiles = np.nonzero(placement.addresses >= 0)
    first = np.array([b.first for b in program.buffers], dtype=np.int64)
    last = np.array([b.last for b in program.buffers], dtype=np.int64)
    nbytes = np.array([b.nbytes for b in program.buffers], dtype=np.int64)
    allocations = {
        "tile": emitter.put("alloc/tile", tiles, np.int32),
        "address": emitter.put("alloc/address", placement.addresses[buffer_ids, tiles], np.int64),
        "bytes": emitter.put("alloc/bytes", nbytes[buffer_ids], np.int64),
        "first": emitter.put("alloc/first", first[buffer_ids], np.int64),
        "last": emitter.put("alloc/last", last[buffer_ids], np.int64),
    }
    return {"kernels": kernels, "programs": programs, "allocations": allocations}, emitter.arrays
