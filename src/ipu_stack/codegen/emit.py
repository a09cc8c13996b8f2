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
from ipu_stack.lowering.program import ComputeSet, Exchange, HostRead, HostWrite, Loop, Program
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
        if step.passes is not None:  # in a loop body: what this read is on each pass
            extra["passes"] = [list(p) for p in step.passes]
    return {
        **extra,
        "kind": "host_write" if isinstance(step, HostWrite) else "host_read",
        "tensor": step.tensor,
        "layout": step.layout.to_json(),
        "tiles": emitter.put(f"{prefix}/tiles", tiles, np.int32),
        "addresses": emitter.put(f"{prefix}/addresses", addresses.reshape(tiles.shape), np.int64),
    }


def _loop_step(emitter: Emitter, prefix: str, step: Loop, placement: Placement) -> dict:
    """The loop step: its count, body length and every slot's per-layer address table
    (``[layers, tiles]``, -1 where the weight is not on the tile)."""
    slots = []
    for s, slot in enumerate(step.slots):
        table = placement.addresses[np.array(slot.buffers)]
        slots.append(emitter.put(f"{prefix}/slot{s}", table, np.int64))
    return {"kind": "loop", "name": step.name, "count": step.count, "length": step.length,
            "slots": slots}


def emit_program(
    program: Program,
    placement: Placement,
    schedules: dict[int, Schedule],
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Manifest fragment (``kernels``, ``programs``) and arrays for the package."""
    emitter = Emitter()
    programs: dict[str, list[dict]] = {"initialize": [], "run": []}
    phase = 0
    found = program.loop()
    slot_of = found[1].slot_of() if found is not None else {}
    for name, index, step in program.steps():
        prefix = f"s{index}"
        if isinstance(step, Loop):
            programs[name].append(_loop_step(emitter, prefix, step, placement))
        elif isinstance(step, (HostWrite, HostRead)):
            programs[name].append(_host_step(emitter, prefix, step, placement))
        elif isinstance(step, ComputeSet):
            calls = []
            for c, call in enumerate(step.calls):
                addresses = np.stack(
                    [placement.address(buf, call.tiles) + offsets for buf, offsets in call.operands],
                    axis=1,
                )
                entry = {
                    "kernel": emitter.kernel(call.instance),
                    "tiles": emitter.put(f"{prefix}/c{c}/tiles", call.tiles, np.int32),
                    "addresses": emitter.put(f"{prefix}/c{c}/addresses", addresses, np.int64),
                }
                slots = [[k, slot_of[buf]] for k, (buf, _) in enumerate(call.operands)
                         if buf in slot_of]
                if slots:  # operand k comes from the per-layer table on each pass
                    entry["slots"] = slots
                calls.append(entry)
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
            if any(int(b) in slot_of for b in np.unique(step.src_buf)):
                # sends of a per-layer weight: their source address comes from the table
                src_slot = np.array([slot_of.get(int(b), -1) for b in step.src_buf])
                columns.append(("src_slot", src_slot, np.int32))
            if any(int(b) in slot_of for b in np.unique(step.dst_buf)):
                raise ValueError(f"exchange {step.name} writes a per-layer weight")
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
