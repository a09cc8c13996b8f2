"""Emit the device program: the placed program with every address resolved, typed.

The device reads nothing else, so this is where the program becomes self-contained: kernel
instances by index, per-call tile lists and operand addresses, per-phase transfers with
absolute source and destination addresses plus the schedule's chunks, host streams with
each block's tiles and addresses, and the allocation map.  The result is a
:class:`~ipu_stack.contract.DeviceProgram`, verified against the machine before it is
written (the same verifier the device runs at load).
"""

from __future__ import annotations

import numpy as np

from ipu_stack.contract import (
    Allocations,
    Call,
    Compute,
    DeviceProgram,
    Exchange,
    HostRead,
    HostWrite,
    Loop,
    Step,
    StreamLayout,
    TensorSpec,
    verify_program,
)
from ipu_stack.exchange import Schedule
from ipu_stack.ir.precision import Precision
from ipu_stack.kernels.base import KernelInstance
from ipu_stack.lowering import program as lowered
from ipu_stack.memory.placement import Placement
from ipu_stack.target import Target


class _Kernels:
    """Kernel instances in first-use order, by index."""

    def __init__(self) -> None:
        self.instances: list[KernelInstance] = []
        self.index: dict[KernelInstance, int] = {}

    def __call__(self, instance: KernelInstance) -> int:
        if instance not in self.index:
            self.index[instance] = len(self.instances)
            self.instances.append(instance)
        return self.index[instance]


def _stream(step: lowered.HostWrite | lowered.HostRead, placement: Placement,
            slot_of: dict[int, int]) -> HostWrite | HostRead:
    tiles = np.asarray(step.layout.tiles, dtype=np.int32)
    flat = tiles.ravel()
    addresses = np.where(flat >= 0, placement.addresses[step.buffer, np.maximum(flat, 0)], -1)
    addresses = addresses.reshape(tiles.shape).astype(np.int64)
    lay = step.layout
    layout = StreamLayout(lay.rows, lay.cols, lay.precision, lay.row_block, lay.col_block,
                          lay.transposed)
    if isinstance(step, lowered.HostWrite):
        return HostWrite(step.tensor, layout, tiles, addresses)
    passes = None if step.passes is None else tuple(tuple(p) for p in step.passes)
    return HostRead(step.tensor, layout, tiles, addresses, tuple(step.origin),
                    step.checkpoint, step.operation, passes,  # type: ignore[arg-type]
                    slot_of.get(step.buffer))


def _compute(step: lowered.ComputeSet, placement: Placement, kernels: _Kernels,
             slot_of: dict[int, int]) -> Compute:
    calls = []
    for call in step.calls:
        addresses = np.stack(
            [placement.address(buf, call.tiles) + offsets for buf, offsets in call.operands],
            axis=1).astype(np.int64)
        # operand k comes from the per-layer table on each pass
        slots = tuple((k, slot_of[buf]) for k, (buf, _) in enumerate(call.operands)
                      if buf in slot_of)
        calls.append(Call(kernels(call.instance), np.asarray(call.tiles, dtype=np.int32),
                          addresses, slots))
    return Compute(step.name, tuple(calls))


def _exchange(step: lowered.Exchange, schedule: Schedule, phase: int, placement: Placement,
              slot_of: dict[int, int]) -> Exchange:
    src_addr = placement.addresses[step.src_buf, step.src_tile] + step.src_off
    dst_addr = placement.addresses[step.dst_buf, step.dst_tile] + step.dst_off
    src_slot = None
    if any(int(b) in slot_of for b in np.unique(step.src_buf)):
        # sends of a per-layer weight: their source address comes from the table
        src_slot = np.array([slot_of.get(int(b), -1) for b in step.src_buf], dtype=np.int32)
    if any(int(b) in slot_of for b in np.unique(step.dst_buf)):
        raise ValueError(f"exchange {step.name} writes a per-layer weight")

    def i64(a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(a, dtype=np.int64)

    def i32(a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(a, dtype=np.int32)

    return Exchange(
        step.name, phase, schedule.kind, int(schedule.lower_bound), i32(step.src_tile),
        i64(src_addr), i64(step.words), i64(step.dst_offsets), i32(step.dst_tile),
        i64(dst_addr), i64(schedule.chunk_transfer), i64(schedule.chunk_start),
        i64(schedule.chunk_words),
        None if schedule.chunk_lanes is None else i64(schedule.chunk_lanes), src_slot)


def _allocations(program: lowered.Program, placement: Placement) -> Allocations:
    """The allocation map: lets the device check every access lies inside a live operand."""
    buffer_ids, tiles = np.nonzero(placement.addresses >= 0)
    first = np.array([b.first for b in program.buffers], dtype=np.int64)
    last = np.array([b.last for b in program.buffers], dtype=np.int64)
    nbytes = np.array([b.nbytes for b in program.buffers], dtype=np.int64)
    return Allocations(tiles.astype(np.int64), placement.addresses[buffer_ids, tiles]
                       .astype(np.int64), nbytes[buffer_ids], first[buffer_ids],
                       last[buffer_ids])


def emit_program(program: lowered.Program, placement: Placement,
                 schedules: dict[int, Schedule], target: Target) -> DeviceProgram:
    """The verified device program of a placed program and its exchange schedules."""
    kernels = _Kernels()
    steps: dict[str, list[Step]] = {"initialize": [], "run": []}
    phase = 0
    found = program.loop()
    slot_of = found[1].slot_of() if found is not None else {}
    for name, index, step in program.steps():
        if isinstance(step, lowered.Loop):
            # each slot's per-layer address table ([layers, tiles], -1 where not held)
            tables = tuple(placement.addresses[np.array(slot.buffers)].astype(np.int64)
                           for slot in step.slots)
            steps[name].append(Loop(step.name, step.count, step.length, tables))
        elif isinstance(step, (lowered.HostWrite, lowered.HostRead)):
            steps[name].append(_stream(step, placement, slot_of if name == "run" else {}))
        elif isinstance(step, lowered.ComputeSet):
            steps[name].append(_compute(step, placement, kernels, slot_of))
        elif isinstance(step, lowered.Exchange):
            steps[name].append(_exchange(step, schedules[index], phase, placement, slot_of))
            phase += 1
    tensors = {name: TensorSpec(tuple(info["shape"]), Precision.from_json(info["precision"]),
                                info) for name, info in program.tensors.items()}
    device = DeviceProgram(tuple(kernels.instances), tuple(steps["initialize"]),
                           tuple(steps["run"]), tensors, _allocations(program, placement))
    verify_program(device, target)
    return device
