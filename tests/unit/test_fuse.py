"""Superstep fusion of a decode step (``lowering.fuse``): every dependency of the program as
lowered is kept (checked here by an access walk of its own), the fused program verifies, the
device computes the same bytes as the unfused program in fewer cycles, and the planner's
estimate still equals what the device timed."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from tests.helpers import cli

from ipu_stack import pipeline
from ipu_stack.ir.layout import BlockLayout
from ipu_stack.ir.precision import F16
from ipu_stack.kernels.base import KernelInstance
from ipu_stack.kernels.copy import copy_params
from ipu_stack.lowering.driver import lower, lower_windows
from ipu_stack.lowering.fuse import fuse_steps, fuse_supersteps
from ipu_stack.lowering.lower import Lowering
from ipu_stack.lowering.program import Call, ComputeSet, Exchange, HostRead, Loop
from ipu_stack.lowering.verify import verify_program
from ipu_stack.phases import stages as compile_stages
from ipu_stack.phases.costing import finalist_choices, stage_shape
from ipu_stack.phases.stages import build_graph_and_tilings, side_by_side_choice
from ipu_stack.phases.state import Build, CompileOptions
from ipu_stack.planning.fit import MemoryBudget
from ipu_stack.planning.gemm import gemm_candidates
from ipu_stack.planning.repeat import find_layer_loop
from ipu_stack.planning.stages import GemmStage, find_stages, sibling_runs
from ipu_stack.runtime.session import load_package
from ipu_stack.target import IPU21
from ipu_stack.util.errors import CompileError, PlacementError
from ipu_stack.workloads import get_workload

STEP = {"vocab": 50, "dim": 16, "hidden": 24, "layers": 2, "heads": 4, "kv_heads": 2,
        "tokens": 1, "context": 6, "batch": 2, "precision": "f16"}
ARGS = ["smollm2-135m", "--vocab", "50", "--dim", "16", "--hidden", "24", "--layers", "2",
        "--heads", "4", "--kv-heads", "2", "--tokens", "1", "--context", "6", "--batch", "2",
        "--finalists", "1"]


def lowered(fuse: bool, unroll: bool = False):
    workload = get_workload("smollm2-135m")
    graph, _ = workload.build(workload.resolve(STEP))
    stages = find_stages(graph)
    loop = None if unroll else find_layer_loop(graph, stages)
    if loop is not None:
        stages = loop.compact(stages)
    plans = [gemm_candidates(stage_shape(graph, s), IPU21)[0] if isinstance(s, GemmStage)
             else None for s in stages]
    return lower(graph, list(zip(stages, plans, strict=True)), IPU21, loop=loop, fuse=fuse)


def accesses(step) -> tuple[set[int], set[int]]:
    """Buffers a step reads and writes, walked here apart from ``lowering.fuse``."""
    if isinstance(step, ComputeSet):
        read, written = set(), set()
        for call in step.calls:
            kinds = {k: w for k, _, w in call.instance.impl.accesses(call.instance.params)}
            for k, (buffer, _) in enumerate(call.operands):
                if buffer >= 0:
                    (written if kinds.get(k, False) else read).add(buffer)
        return read, written
    if isinstance(step, Exchange):
        return set(step.src_buf.tolist()), set(step.dst_buf.tolist())
    if isinstance(step, HostRead):
        return {step.buffer}, set()
    return set(), {step.buffer}


def key(step) -> tuple:
    """A compute set or phase by its kind and name (unique in a lowered program), a host
    step by itself (fusion keeps host steps as they are)."""
    if isinstance(step, ComputeSet | Exchange):
        return type(step).__name__, step.name
    return "host", id(step)


def positions(run) -> dict[tuple, int]:
    """Each original step at the run step it ended up in."""
    where = {}
    for index, step in enumerate(run):
        if isinstance(step, Loop):
            continue
        names = step.name.split("+") if isinstance(step, ComputeSet | Exchange) else [None]
        for name in names:
            found = key(step) if name is None else (type(step).__name__, name)
            assert found not in where, found
            where[found] = index
    return where


@pytest.mark.parametrize(("unroll", "window"), [(False, 0), (True, 0), (False, 3)])
def test_fusion_keeps_every_dependency_of_the_lowered_order(unroll: bool, window: int) -> None:
    program = lowered(False, unroll)
    original = list(program.run)
    steps = [s for s in original if not isinstance(s, Loop)]
    loops = [(original.index(s), s.length) for s in original if isinstance(s, Loop)]
    assert len(positions(original)) == len(steps)
    fuse_supersteps(program, window)
    program.compute_lifetimes()
    verify_program(program, IPU21, "fused")
    where = positions(program.run)
    assert len(where) == len(steps) and len(program.run) < len(original)  # each step, once
    for later, step in enumerate(steps):
        read, written = accesses(step)
        for earlier in steps[:later]:
            before_read, before_written = accesses(earlier)
            if (before_written & (read | written)) or (before_read & written):
                assert where[key(earlier)] < where[key(step)], (key(earlier), key(step))
    assert len(loops) == (0 if unroll else 1)
    for at, length in loops:  # the loop's body fused on its own: the same steps inside,
        (loop,) = [s for s in program.run if isinstance(s, Loop)]  # but its invariant
        start = program.run.index(loop)  # phases, which run once before it
        inside = set(positions(program.run[start + 1:start + 1 + loop.length]))
        body = original[at + 1:at + 1 + length]
        moved = {key(s) for s in body} - inside
        assert inside <= {key(s) for s in body} and all(where[k] < start for k in moved)
        body_writes = set().union(*(accesses(s)[1] for s in body))
        for step in body:
            if key(step) in moved:  # a phase that reads nothing a pass writes
                assert isinstance(step, Exchange) and not accesses(step)[0] & body_writes


def test_independent_grids_of_a_decode_step_share_supersteps() -> None:
    """q, k and v read the same rows: their GEMM calls run in one superstep on tiles of
    their own."""
    fused = lowered(True)
    gemms = [s for s in fused.run if isinstance(s, ComputeSet) and ".gemm+" in s.name]
    assert gemms, [s.name for s in fused.run]
    for step in gemms:
        tiles = [set(c.tiles.tolist()) for c in step.calls]
        assert all(not (a & b) for i, a in enumerate(tiles) for b in tiles[i + 1:])


def _copy(name: str, src: int, dst: int, tile: int = 0) -> ComputeSet:
    instance = KernelInstance("copy", copy_params(1, 4, 4, 4))
    zero = np.zeros(1, dtype=np.int64)
    return ComputeSet(name, [Call(instance, np.array([tile], np.int32),
                                  [(src, zero), (dst, zero)])])


def test_steps_join_the_earliest_superstep_after_what_they_need() -> None:
    layout = BlockLayout(1, 2, F16, 1, 2, np.zeros((1, 1, 1), dtype=np.int32))
    steps = [_copy("a", 0, 1), _copy("b", 1, 2), HostRead("t", layout, 2),
             _copy("c", 0, 3, tile=5), _copy("d", 2, 0)]
    out = fuse_steps(steps)
    # c needs nothing a, b wrote: it joins a; the read follows b; d writes what a and c read
    assert [getattr(s, "name", "read") for s in out] == ["a+c", "b", "read", "d"]


def test_a_window_keeps_a_step_among_the_last_supersteps() -> None:
    """A chain a -> b -> c and a step e that needs none of it: unbounded, e joins a; with a
    window of W supersteps, the earliest of the last W."""
    def steps():
        return [_copy("a", 0, 1), _copy("b", 1, 2), _copy("c", 2, 3), _copy("e", 10, 11, 7)]

    assert [s.name for s in fuse_steps(steps())] == ["a+e", "b", "c"]
    assert [s.name for s in fuse_steps(steps(), 2)] == ["a", "b+e", "c"]
    assert [s.name for s in fuse_steps(steps(), 1)] == ["a", "b", "c+e"]


TOWER = {"blocks": 2, "tokens": 16, "dim": 64, "hidden": 128, "heads": 2}
TOWER_ARGS = ["siglip-layer", "--blocks", "2", "--tokens", "16", "--dim", "64", "--hidden",
              "128", "--heads", "2", "--finalists", "1"]


def test_a_tower_that_does_not_place_fused_is_lowered_unfused(tmp_path, monkeypatch,
                                                              caplog) -> None:
    """Steps fused with their neighbours keep buffers alive together: where no fused
    program places, down to the floor, the compile starts over unfused from the memory
    asked for."""
    tried, options = _compile_refusing(
        tmp_path, monkeypatch, caplog, lambda o: PlacementError(
            "placement failed: fused, for this test") if o.fuse_window else None,
        "siglip-layer", TOWER)
    assert len(tried) > 2 and all(o.fuse_window == 8 for o in tried[:-1])
    assert tried[1].memory_proportion < 1.0  # the fused chain plans for less memory first
    assert tried[-1].fuse_window == 0 and tried[-1].memory_proportion == 1.0
    assert "the fused programs did not place" in caplog.text
    assert options["fuse_window"] == 0


@pytest.mark.parametrize("args", [ARGS, TOWER_ARGS], ids=["decode step", "tower"])
def test_the_device_computes_the_same_bytes_in_fewer_cycles(tmp_path, args) -> None:
    records, outputs = [], []
    for flag in ("--fuse-supersteps", "--no-fuse-supersteps"):
        folder = tmp_path / flag
        code, out, err = cli(["bench", *args, flag, "--json", "--out", str(folder / "pkg"),
                              "--save-tensors", str(folder / "tensors")])
        assert code == 0, err
        records.append(json.loads(out.strip().splitlines()[-1]))
        with np.load(folder / "tensors" / "outputs.npz") as saved:
            outputs.append({name: saved[name].copy() for name in saved.files})
    fused, plain = records
    assert fused["numericalTest"] == plain["numericalTest"] == "PASS"
    assert fused["estimatedCycles"] == fused["cycles"] < plain["cycles"]
    assert outputs[0].keys() == outputs[1].keys()
    for name, values in outputs[0].items():
        assert np.array_equal(values, outputs[1][name]), name


def test_siblings_that_overfill_the_chip_are_planned_on_shares_of_it() -> None:
    """SmolLM2's gate and up need 864 tiles each at their fastest: the decode step's extra
    finalist plans each on half the chip (their columns are equal); q, k and v (540
    together) keep theirs."""
    workload = get_workload("smollm2-135m")
    params = workload.resolve({"layers": 1, "tokens": 1, "context": 32})
    options = CompileOptions()
    build = Build(workload=workload, params=params, out_dir=Path("unused"), options=options,
                  target=options.machine(), memo=None)
    build_graph_and_tilings(build)
    first = finalist_choices(build.candidates, 1)[0]
    runs = sibling_runs(build.stages)
    names = [[build.graph.value(build.stages[i].out).name for i in run] for run in runs]
    assert names == [["layer0.attn.q.mm", "layer0.attn.k.mm", "layer0.attn.v.mm"],
                     ["layer0.gate.mm", "layer0.up.mm"]]
    (chosen,) = side_by_side_choice(build, first)
    qkv, mlp = runs
    assert sum(first[i].tiles_used for i in mlp) > IPU21.tiles
    assert all(chosen[i].tiles_used <= IPU21.tiles // 2 for i in mlp)
    assert all(chosen[i] is first[i] for i in qkv)


def test_side_by_side_plans_that_do_not_fit_leave_the_others(monkeypatch, caplog) -> None:
    """The extra finalist is dropped with a log line when the fitter cannot fit it; the
    compile goes on with the finalists that fit (TinyLlama's F16 step on its fourth chip)."""
    extra: list = []

    def choice(build, plans):
        extra.append(list(plans))
        return [extra[-1]]

    fit = compile_stages.fit_plans

    def refusing(plans, *args):
        if extra and plans is extra[-1]:
            raise CompileError("does not fit: the side-by-side plans, for this test")
        return fit(plans, *args)

    monkeypatch.setattr(compile_stages, "side_by_side_choice", choice)
    monkeypatch.setattr(compile_stages, "fit_plans", refusing)
    workload = get_workload("smollm2-135m")
    params = workload.resolve(STEP)
    options = CompileOptions(finalists=1)
    build = Build(workload=workload, params=params, out_dir=Path("unused"), options=options,
                  target=options.machine(), memo=None)
    build_graph_and_tilings(build)
    with caplog.at_level("INFO", logger="ipu_stack.package.build"):
        compile_stages.choose_fitting_plans(build)
    assert extra and len(build.finalists) == 1
    assert "the side-by-side plans do not fit" in caplog.text


def _compile_refusing(tmp_path, monkeypatch, caplog, refuse, name: str = "smollm2-135m",
                      params: dict | None = None) -> tuple[list, dict]:
    """The small decode step (or workload ``name`` at ``params``) compiled with its
    placement refused where ``refuse(options)`` gives an error: each try's options, and the
    package's options record."""
    place = pipeline.lower_and_place
    tried: list[CompileOptions] = []

    def placing(build, dump):
        placed = place(build, dump)
        tried.append(build.options)
        failure = refuse(build.options)
        if failure is not None:
            raise failure
        return placed

    monkeypatch.setattr(pipeline, "lower_and_place", placing)
    workload = get_workload(name)
    with caplog.at_level("INFO", logger="ipu_stack.package.build"):
        result = pipeline.compile_workload(workload, workload.resolve(params or STEP),
                                           tmp_path, CompileOptions(finalists=1))
    return tried, load_package(result.package).manifest["options"]


def test_a_decode_step_that_does_not_place_side_by_side_goes_stage_by_stage(
        tmp_path, monkeypatch, caplog) -> None:
    """Grids side by side overlap where one after another they would not: when that does
    not place, the same compile lowers the step one stage after another (and its package
    says so), before it plans for less memory."""
    tried, options = _compile_refusing(tmp_path, monkeypatch, caplog, lambda o: PlacementError(
        "placement failed: side by side, for this test") if o.fuse_supersteps else None)
    assert [o.fuse_supersteps for o in tried] == [True, False]
    assert "the side-by-side decode step did not place" in caplog.text
    assert options["fuse_supersteps"] is False


def test_a_small_target_keeps_every_grid_and_head_on_its_tiles() -> None:
    """On 48 tiles (a pipeline group's share) the row band and the cache's holders still
    fit the target, RoPE's heads never count below tile 0, and the program verifies."""
    small = IPU21.with_tiles(48)
    lowering = Lowering(_graph(), small)
    firsts = [lowering.next_row_tile(16) for _ in range(3)]
    assert all(0 <= first - 15 and first < small.tiles for first in firsts)
    graph = _graph()
    stages = find_stages(graph)
    loop = find_layer_loop(graph, stages)
    stages = loop.compact(stages)
    plans = [gemm_candidates(stage_shape(graph, s), small)[0] if isinstance(s, GemmStage)
             else None for s in stages]
    program = lower(graph, list(zip(stages, plans, strict=True)), small, loop=loop)
    verify_program(program, small, "small target")


def test_every_row_chunk_of_a_stage_shares_its_grid() -> None:
    """A plan in row chunks holds its weights once: every chunk's calls run on the tiles
    of the stage's one grid (its weights' buffer is there)."""
    graph = _graph()
    stages = find_stages(graph)
    plans = []
    for stage in stages:
        plan = None
        if isinstance(stage, GemmStage):
            found = gemm_candidates(stage_shape(graph, stage), IPU21, keep=16)
            plan = found[0]
            single = [p for p in found if p.row_splits == 1]
            if stage.kind == "matmul" and single:
                plan = dataclasses.replace(single[0], row_chunks=2)
        plans.append(plan)
    assert any(p is not None and p.row_chunks == 2 for p in plans)
    program = lower(graph, list(zip(stages, plans, strict=True)), IPU21)
    verify_program(program, IPU21, "row chunks")


def _graph():
    workload = get_workload("smollm2-135m")
    graph, _ = workload.build(workload.resolve(STEP))
    return graph


def test_a_decode_step_short_of_interleaved_memory_plans_for_less_of_it(
        tmp_path, monkeypatch, caplog) -> None:
    """Side by side, a stage's weights share tiles with its siblings': where placement finds
    a tile short of interleaved memory, the step is planned for a little less of it
    (8 KiB a try) and stays side by side; the package records the reserve."""
    step = pipeline.INTERLEAVED_RESERVE_STEP

    def short(options):
        if options.interleaved_reserve >= 2 * step:
            return None
        failure = PlacementError("placement failed: interleaved, for this test")
        failure.interleaved = True
        return failure

    tried, options = _compile_refusing(tmp_path, monkeypatch, caplog, short)
    assert [(o.fuse_supersteps, o.interleaved_reserve) for o in tried] == [
        (True, 0), (True, step), (True, 2 * step)]
    assert "planning again with less interleaved memory" in caplog.text
    assert options["interleaved_reserve"] == 2 * step and "fuse_supersteps" not in options
    whole, less = (MemoryBudget.for_target(IPU21, 1.0, interleaved_reserve=r) for r in (0, step))
    assert (whole.interleaved - less.interleaved, whole.bytes) == (step, less.bytes)


def test_the_unfused_lowering_is_kept_where_its_schedule_is_cheaper(tmp_path, monkeypatch,
                                                                    caplog) -> None:
    """Every finalist of a tower is lowered fused and unfused; the cheaper estimate wins
    and the package's options say which (here the fused one is made to cost more)."""
    lowered_with: list[tuple[int, ...]] = []
    real_lower, real_estimate = compile_stages.lower_windows, compile_stages.refined_estimate

    def lowering(*args):
        programs = real_lower(*args)
        lowered_with.append(args[-1])
        for window, program in zip(args[-1], programs, strict=True):
            program.fused_for_this_test = window
        return programs

    def estimating(plans, program, *rest):
        estimate = dict(real_estimate(plans, program, *rest))
        estimate["cycles"] += 10**6 if program.fused_for_this_test else 0
        return estimate

    monkeypatch.setattr(compile_stages, "lower_windows", lowering)
    monkeypatch.setattr(compile_stages, "refined_estimate", estimating)
    _, options = _compile_refusing(tmp_path, monkeypatch, caplog, lambda o: None,
                                   "siglip-layer", TOWER)
    assert lowered_with[0] == (8, 0) and options["fuse_window"] == 0
    assert "selected physically scheduled operator-plan finalist selected=0 fuse_window=0" \
        in caplog.text


def test_one_lowering_fused_for_each_window_equals_a_lowering_for_each() -> None:
    """The compile lowers a tower once and fuses a copy for each window it weighs: each
    program is the one a lowering of its own gives, steps, loop and lifetimes, and fusing
    the copy leaves the other as it was."""
    workload = get_workload("siglip-layer")
    graph, _ = workload.build(workload.resolve({"tokens": 17, "dim": 64, "heads": 4,
                                                "hidden": 96, "blocks": 3}))
    stages = find_stages(graph)
    loop = find_layer_loop(graph, stages)
    assert loop is not None
    stages = loop.compact(stages)
    staged = list(zip(stages, [gemm_candidates(stage_shape(graph, s), IPU21)[0]
                               if isinstance(s, GemmStage) else None for s in stages],
                      strict=True))

    def shape(program) -> tuple:
        return ([(type(s).__name__, getattr(s, "name", None), getattr(s, "length", None))
                 for s in program.run],
                [(b.first, b.last) for b in program.buffers])

    together = lower_windows(graph, staged, IPU21, False, loop, True, False, (3, 0))
    apart = [lower(graph, staged, IPU21, loop=loop, window=window) for window in (3, 0)]
    assert [shape(p) for p in together] == [shape(p) for p in apart]
    assert len(together[0].run) < len(together[1].run)  # the window fused steps
