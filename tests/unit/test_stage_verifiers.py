"""The verifiers between compile stages: a real program and its placement pass them, and
each deliberately broken one is caught with a one-line message naming the stage and the
problem (``lowering/verify.py``, ``memory/verify.py``, run by ``pipeline._run_stages``)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import ipu_stack.phases.stages as stages_module
from ipu_stack.lowering.program import ComputeSet, Exchange, HostWrite, Program
from ipu_stack.lowering.verify import verify_program
from ipu_stack.memory.placement import Placement
from ipu_stack.memory.verify import verify_placement
from ipu_stack.phases.state import Build, CompileOptions
from ipu_stack.pipeline import VERIFY_ENV, compile_workload, lower_and_place, plan, verifying
from ipu_stack.target import MemoryClass, Target
from ipu_stack.util.errors import CompileError
from ipu_stack.workloads import get_workload

SMALL = {"tokens": 17, "dim": 64, "hidden": 96}


@pytest.fixture(scope="module")
def placed(cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Build:
    """siglip-mlp, small, planned, lowered and placed (nothing written)."""
    workload = get_workload("siglip-mlp")
    options = CompileOptions(cache_dir=str(cache_dir))
    build = Build(workload, workload.resolve(dict(SMALL)), tmp_path_factory.mktemp("verify"),
                  options, options.machine(), None, {})
    plan(build)
    lower_and_place(build)
    return build


def _step(program: Program, name: str) -> ComputeSet | Exchange:
    (step,) = [s for s in program.run if getattr(s, "name", None) == name]
    return step


def _buffer(program: Program, name: str) -> int:
    (found,) = [b.id for b in program.buffers if b.name == name]
    return found


def _message(error: pytest.ExceptionInfo[CompileError]) -> str:
    text = str(error.value)
    assert "\n" not in text
    return text


def test_a_real_program_and_its_placement_pass(placed: Build) -> None:
    assert placed.program is not None and placed.placement is not None
    verify_program(placed.program, placed.target, "after lowering")
    verify_placement(placed.program, placed.placement, placed.target, "after placement")


# ------------------------------------------------------------------ the lowered program
def _tile_out_of_range(program: Program, target: Target) -> None:
    call = _step(program, "stage0.gemm").calls[0]
    call.tiles = call.tiles.copy()
    call.tiles[-1] = target.tiles


def _buffer_not_on_tile(program: Program, target: Target) -> None:
    step = _step(program, "stage0.operands")
    step.dst_tile = step.dst_tile.copy()
    step.dst_tile[0] = target.tiles - 2  # neither the sender (the rows land on the last
    # tile) nor a tile of the GEMM's grid


def _access_outside_buffer(program: Program, target: Target) -> None:
    program.buffers[_buffer(program, "stage0.partial")].nbytes = 16


def _interleaved_operand_in_standard(program: Program, target: Target) -> None:
    program.buffers[_buffer(program, "stage0.partial")].memory_class = MemoryClass.STANDARD


def _sends_to_itself(program: Program, target: Target) -> None:
    step = _step(program, "stage0.operands")
    step.dst_tile = step.dst_tile.copy()
    step.dst_tile[0] = step.src_tile[0]


def _part_of_a_word(program: Program, target: Target) -> None:
    step = _step(program, "stage0.operands")
    step.src_off = step.src_off.copy()
    step.src_off[0] += 2


def _destinations_out_of_order(program: Program, target: Target) -> None:
    step = _step(program, "stage0.operands")
    step.dst_offsets = step.dst_offsets.copy()
    step.dst_offsets[-1] += 1


def _read_before_written(program: Program, target: Target) -> None:
    weights = _buffer(program, "w1.0")
    program.initialize = [s for s in program.initialize
                          if not (isinstance(s, HostWrite) and s.buffer == weights)]
    program.compute_lifetimes()


def _touched_after_its_lifetime(program: Program, target: Target) -> None:
    buffer = program.buffers[_buffer(program, "gelu.0")]
    buffer.last = buffer.first + 1


PROGRAM_FAULTS: dict[str, tuple[Callable[[Program, Target], None], str]] = {
    "tile out of range": (_tile_out_of_range, "tile 1472 is not one of ipu21's 1472 tiles"),
    "buffer not on the tile": (_buffer_not_on_tile, "('stage0.a') is not on tile 1470"),
    "access outside the buffer": (_access_outside_buffer,
                                  "accesses bytes [0, 32) of buffer 3 ('stage0.partial'), "
                                  "which has 16"),
    "interleaved operand": (_interleaved_operand_in_standard,
                            "the kernel takes it only from interleaved memory"),
    "send to itself": (_sends_to_itself, "sends to itself"),
    "part of a word": (_part_of_a_word, "are not whole words inside it"),
    "destinations out of order": (_destinations_out_of_order,
                                  "transfer arrays disagree in length or destination order"),
    "read before written": (_read_before_written,
                            "reads buffer 2 ('w1.0') before any step writes it"),
    "touched outside its lifetime": (_touched_after_its_lifetime,
                                     "touches buffer 4 ('gelu.0') outside its lifetime [5, 6]"),
}


@pytest.mark.parametrize("fault", list(PROGRAM_FAULTS))
def test_the_program_verifier_catches(placed: Build, fault: str) -> None:
    breaks, expected = PROGRAM_FAULTS[fault]
    program = copy.deepcopy(placed.program)
    assert program is not None
    breaks(program, placed.target)
    with pytest.raises(CompileError) as error:
        verify_program(program, placed.target, "after stage lower")
    message = _message(error)
    assert message.startswith("after stage lower: ") and expected in message, message


# ------------------------------------------------------------------ the placement
def _overlap(placement: Placement, program: Program, target: Target) -> None:
    weights, partial = _buffer(program, "w1.0"), _buffer(program, "stage0.partial")
    placement.addresses[partial] = placement.addresses[weights]


def _beyond_memory(placement: Placement, program: Program, target: Target) -> None:
    weights = _buffer(program, "w2.0")
    placement.addresses[weights, 0] = target.memory_end - 8


def _holder(placement: Placement, buffer: int) -> int:
    """The first tile holding ``buffer``."""
    return int(np.flatnonzero(placement.addresses[buffer] >= 0)[0])


def _misaligned(placement: Placement, program: Program, target: Target) -> None:
    x = _buffer(program, "x")
    placement.addresses[x, _holder(placement, x)] += 4


def _in_support_memory(placement: Placement, program: Program, target: Target) -> None:
    x = _buffer(program, "x")
    placement.addresses[x, _holder(placement, x)] = target.memory_base


def _missing(placement: Placement, program: Program, target: Target) -> None:
    placement.addresses[_buffer(program, "stage0.a"), 0] = -1


PLACEMENT_FAULTS: dict[str, tuple[Callable[[Placement, Program, Target], None], str]] = {
    "overlap": (_overlap, "buffers 2 ('w1.0', steps 0-10) and 3 ('stage0.partial', steps 4-5) "
                          "share bytes on tile 0"),
    "beyond tile memory": (_beyond_memory, "on tile 0 ends beyond its memory class's range"),
    "misaligned": (_misaligned, "is not aligned for its memory class"),
    "in support memory": (_in_support_memory, "overlaps the tile's support memory"),
    "missing address": (_missing, "buffer 1 ('stage0.a') has no address on tile 0, which "
                                  "holds it"),
}


@pytest.mark.parametrize("fault", list(PLACEMENT_FAULTS))
def test_the_placement_verifier_catches(placed: Build, fault: str) -> None:
    breaks, expected = PLACEMENT_FAULTS[fault]
    assert placed.program is not None and placed.placement is not None
    placement = copy.deepcopy(placed.placement)
    breaks(placement, placed.program, placed.target)
    with pytest.raises(CompileError) as error:
        verify_placement(placed.program, placement, placed.target, "after stage place")
    message = _message(error)
    assert message.startswith("after stage place: ") and expected in message, message


# ------------------------------------------------------------------ in the compile
def test_verifying_follows_the_option_or_the_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(VERIFY_ENV, raising=False)
    assert not verifying(CompileOptions())
    assert verifying(CompileOptions(verify_stages=True))
    monkeypatch.setenv(VERIFY_ENV, "0")
    assert not verifying(CompileOptions())
    monkeypatch.setenv(VERIFY_ENV, "1")
    assert verifying(CompileOptions())


def test_verifying_changes_no_byte(tmp_path: Path, cache_dir: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(VERIFY_ENV, raising=False)
    workload = get_workload("siglip-mlp")
    params = workload.resolve(dict(SMALL))
    packages = [compile_workload(workload, params, tmp_path / str(verify),
                                 CompileOptions(cache_dir=str(cache_dir), verify_stages=verify))
                .package.read_bytes() for verify in (False, True)]
    assert packages[0] == packages[1]


def test_a_broken_stage_stops_the_compile_naming_it(tmp_path: Path, cache_dir: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A lowering that sends half a word stops the compile right after the stage that
    lowered it, when verifying (here through the environment): the exchange scheduler
    sees tiles and word counts, not the offsets inside buffers."""
    real = stages_module.lower_windows

    def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        programs = real(*args, **kwargs)
        broken_steps: set[int] = set()  # the programs of two windows may share a step
        for program in programs:
            step = next(s for s in program.run if isinstance(s, Exchange) and s.transfers)
            if id(step) not in broken_steps:
                broken_steps.add(id(step))
                step.src_off = np.array(step.src_off, copy=True)
                step.src_off[0] += 2
        return programs

    monkeypatch.setattr(stages_module, "lower_windows", broken)
    monkeypatch.setenv(VERIFY_ENV, "1")
    workload = get_workload("siglip-mlp")
    with pytest.raises(CompileError) as error:
        compile_workload(workload, workload.resolve(dict(SMALL)), tmp_path,
                         CompileOptions(cache_dir=str(cache_dir)))
    message = _message(error)
    assert message.startswith("after stage lower_and_schedule_finalists (select_finalist): ")
    assert "are not whole words inside it" in message
    assert not (tmp_path / "model.ipuexe").exists()
