"""Every exchange phase of every builtin workload goes through the verifier.

Small sizes of each workload are planned, lowered and scheduled exactly as ``compile`` does;
each phase's schedule must verify and finish no earlier than its endpoint lower bound (and,
for the phases the compiler emits, at it).
"""

from __future__ import annotations

import pytest

from ipu_stack.exchange import endpoint_lower_bound, verify_schedule
from ipu_stack.lowering.driver import lower
from ipu_stack.lowering.program import Program
from ipu_stack.pipeline import schedule_program, stage_shape, to_transfers
from ipu_stack.planning.gemm import gemm_candidates
from ipu_stack.planning.stages import GemmStage, find_stages
from ipu_stack.target import IPU21
from ipu_stack.workloads import REGISTRY

SMALL = {"tokens": 17, "dim": 64, "heads": 4, "kv_heads": 2, "hidden": 96, "image": 28, "patch": 7,
         "layers": 2, "window": 2, "depths": "2,2", "stage_heads": "4,8"}


def lowered(name: str, sizes: dict, rank: int, paired: bool = False) -> Program:
    """The program ``compile`` would lower for ``name`` at ``sizes`` (parameters the workload
    lacks are ignored) with each GEMM stage's ``rank``-th candidate plan (or its last)."""
    workload = REGISTRY[name]
    known = {p.name for p in workload.parameters}
    graph, _ = workload.build(workload.resolve({k: v for k, v in sizes.items() if k in known}))
    stages = find_stages(graph)
    plans = []
    for stage in stages:
        if isinstance(stage, GemmStage):
            found = gemm_candidates(stage_shape(graph, stage), IPU21)
            plans.append(found[min(rank, len(found) - 1)])
        else:
            plans.append(None)
    return lower(graph, list(zip(stages, plans, strict=True)), IPU21, paired=paired)


@pytest.mark.parametrize("name", sorted(REGISTRY))
@pytest.mark.parametrize("rank", [0, 1])
def test_every_phase_verifies_at_the_bound(name: str, rank: int) -> None:
    program = lowered(name, SMALL, rank)
    schedules = schedule_program(program, IPU21)
    exchanges = {i: s for _, i, s in program.steps() if i in schedules}
    assert exchanges, "every builtin workload exchanges data"
    for index, schedule in schedules.items():
        transfers = to_transfers(exchanges[index], IPU21)
        verify_schedule(transfers, schedule)
        assert schedule.horizon == endpoint_lower_bound(transfers), exchanges[index].name


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_phase_verifies_under_the_paired_option(name: str) -> None:
    """The same with the paired-tiles option: pair-aligned grids, two-lane chunks where
    eligible; every phase verifies against the paired bound and is never longer than the
    plain endpoint bound (the ordinary schedule is always a candidate)."""
    program = lowered(name, SMALL, 0, paired=True)
    schedules = schedule_program(program, IPU21, paired=True)
    exchanges = {i: s for _, i, s in program.steps() if i in schedules}
    for index, schedule in schedules.items():
        transfers = to_transfers(exchanges[index], IPU21)
        verify_schedule(transfers, schedule)
        assert schedule.paired
        assert schedule.lower_bound == endpoint_lower_bound(transfers, paired=True)
        assert schedule.horizon <= endpoint_lower_bound(transfers), exchanges[index].name
