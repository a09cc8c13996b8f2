"""Fragmentation: address range used beyond the bytes live at once, per tile."""

from __future__ import annotations

import numpy as np

from ipu_stack.lowering.program import Program
from ipu_stack.memory.placement import fragmentation, place_storage
from ipu_stack.target import IPU21, MemoryClass


def _program(buffers: list[tuple[int, MemoryClass, int, int]]) -> Program:
    program = Program()
    for nbytes, memory_class, first, last in buffers:
        bid = program.add_buffer(f"b{len(program.buffers)}", np.array([3]), nbytes, memory_class,
                                 "test")
        program.buffers[bid].first, program.buffers[bid].last = first, last
    return program


def test_dead_bytes_are_reused_so_nothing_is_wasted() -> None:
    program = _program([(4096, MemoryClass.STANDARD, 0, 1), (4096, MemoryClass.STANDARD, 2, 3)])
    support = np.full(IPU21.tiles, 1024, dtype=np.int64)
    placement = place_storage(program, support, IPU21)
    result = fragmentation(placement, program, IPU21)
    assert placement.addresses[0, 3] == placement.addresses[1, 3]  # the second reuses the first
    assert result["busiest_tile"] == 0.0
    assert result["busiest_extent_bytes"] == 1024 + 4096


def test_interleaved_rule_shows_as_a_gap() -> None:
    program = _program([(4096, MemoryClass.INTERLEAVED, 0, 3)])
    support = np.zeros(IPU21.tiles, dtype=np.int64)
    placement = place_storage(program, support, IPU21)
    result = fragmentation(placement, program, IPU21)
    extent = IPU21.interleaved_base + 4096 - IPU21.memory_base
    assert result["busiest_extent_bytes"] == extent
    assert result["busiest_tile"] == round(1 - 4096 / extent, 4)
