"""The pipeline strategy: layer groups cut from a tower, row chunks, the step schedule, and a
whole pipelined run on the simulator checked image by image."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from tests.helpers import stages_left_at_finish

from ipu_stack.ir.graph import GraphBuilder
from ipu_stack.ir.interpret import evaluate
from ipu_stack.ir.precision import F16
from ipu_stack.ir.types import TensorType
from ipu_stack.pipeline import CompileOptions
from ipu_stack.planning.gemm import GemmShape, chunk_sizes, cost_plan, transient_bytes
from ipu_stack.planning.groups import (
    PipelineError,
    chip_group_layers,
    group_layers,
    half_layer_bounds,
    layer_range,
    mid_layer_cuts,
    split_at_stages,
    split_tower,
    tower_loop,
)
from ipu_stack.planning.stages import find_stages
from ipu_stack.runtime.groups import read_system
from ipu_stack.runtime.session import load_package
from ipu_stack.runtime.stream import (
    GroupRun,
    RunSettings,
    merged_step,
    run_stream,
    step_schedule,
    stream_images,
)
from ipu_stack.strategy import compile_pipeline
from ipu_stack.strategy.compile import choose_groups
from ipu_stack.util.errors import CompileError
from ipu_stack.workloads import get_workload

TOWER = {"layers": 3, "image": 28, "patch": 7, "dim": 64, "hidden": 96, "heads": 4}


def test_layers_are_balanced_with_extras_in_the_middle():
    assert group_layers(27, 3) == [9, 9, 9]
    assert group_layers(27, 4) == [7, 7, 7, 6]
    assert group_layers(24, 5) == [5, 5, 5, 5, 4]
    assert group_layers(5, 3) == [2, 2, 1]
    with pytest.raises(PipelineError, match="cannot cut 2 layers into 3 groups"):
        group_layers(2, 3)


def test_chips_are_balanced_before_their_groups():
    # 50 layers on 4 chips are 12, 13, 13, 12; each chip's layers then go to its groups
    assert chip_group_layers(50, 4, 3) == [4, 4, 4, 4, 5, 4, 4, 5, 4, 4, 4, 4]
    assert chip_group_layers(27, 1, 4) == group_layers(27, 4)
    with pytest.raises(PipelineError, match="cannot cut 5 layers into 6 groups"):
        chip_group_layers(5, 2, 3)


@pytest.mark.parametrize("counts", [[3], [2, 1], [1, 1, 1]])
def test_groups_chained_compute_the_tower(counts):
    """Each group is a graph of its own; run one after another (each from the previous
    group's output) they give exactly the tower's values."""
    workload = get_workload("siglip-vision")
    graph, tensors = workload.build(workload.resolve(dict(TOWER)))
    whole = evaluate(graph, tensors)
    groups = split_tower(graph, counts)
    assert [g.layers for g in groups] == counts
    carried = {v.name: tensors[v.name] for v in graph.by_role("input")}
    for group in groups:
        inputs = {v.name: carried[v.name] for v in group.graph.by_role("input")}
        weights = {v.name: tensors[v.name] for v in group.graph.by_role("weight")}
        values = evaluate(group.graph, {**inputs, **weights})
        carried = {v.name: values[v.name] for v in group.graph.by_role("output")}
        assert group.output_name in carried
    output = graph.by_role("output")[0].name
    assert np.array_equal(carried[output], whole[output])


def test_a_tower_cut_inside_a_layer_computes_the_tower():
    """After attention's residual add one activation alone crosses: cut there (1.5 layers
    a group), the two groups chained give exactly the tower's values; a cut where more
    cross is refused in one line."""
    workload = get_workload("siglip-vision")
    graph, tensors = workload.build(workload.resolve(dict(TOWER)))
    stages = find_stages(graph)
    loop = tower_loop(graph, stages)
    (offset,) = mid_layer_cuts(graph)
    cut = loop.start + loop.length + offset  # layer 1, after its attention
    first, second = split_at_stages(graph, [cut])
    assert first.output_name == second.input_name == "layer1.residual1"
    assert (first.first, first.layers, second.first, second.layers) == (0, 1.5, 1.5, 1.5)
    assert half_layer_bounds(graph, [1.5, 1.5]) == [cut]
    assert half_layer_bounds(graph, [2, 1]) == [loop.start + 2 * loop.length]
    with pytest.raises(PipelineError, match=r"layer shares \[1.5, 1\] are not halves adding "
                                            "up to the tower's 3 layers"):
        half_layer_bounds(graph, [1.5, 1])
    assert sorted(first.source_ops + second.source_ops) == list(range(len(graph.operations)))
    whole = evaluate(graph, tensors)
    inputs = {v.name: tensors[v.name] for v in graph.by_role("input")}
    values = evaluate(first.graph, {**inputs, **{v.name: tensors[v.name]
                                                 for v in first.graph.by_role("weight")}})
    handed = {first.output_name: values[first.output_name]}
    values = evaluate(second.graph, {**handed, **{v.name: tensors[v.name]
                                                  for v in second.graph.by_role("weight")}})
    output = graph.by_role("output")[0].name
    assert np.array_equal(values[output], whole[output])
    with pytest.raises(PipelineError, match=f"cannot be cut before stage {cut - 1}: "
                                            "2 activations cross there"):
        split_at_stages(graph, [cut - 1])


def test_layer_ranges_read_whole_layers_inclusively_and_halves_as_spans():
    assert layer_range(0, 12) == "0-11"
    assert layer_range(12, 13) == "12-24"
    assert layer_range(0, 12.5) == "0-12.5"
    assert layer_range(12.5, 12.5) == "12.5-25"


def test_chips_whose_layers_do_not_divide_are_cut_inside_a_layer(tmp_path, cache_dir):
    """3 layers on 2 chips, one group a chip: the whole-layer cut gives one chip 2 layers;
    cut after layer 1's attention each chip gets 1.5, the planner ranks that cut first, and
    the system runs it and passes every image."""
    workload = get_workload("siglip-vision")
    params = workload.resolve(dict(TOWER))
    result = compile_pipeline(workload, params, tmp_path,
                              CompileOptions(cache_dir=str(cache_dir), chips=2), groups=1)
    assert [g.layers for g in result.groups] == [1.5, 1.5]
    assert result.groups[0].output_name == result.groups[1].input_name == "layer1.residual1"
    assert "cut inside layers (1.5,1.5 layers)" in result.reason
    package = load_package(result.package)
    assert [(g.first_layer, g.layers) for g in read_system(package).groups] \
        == [(0, 1.5), (1.5, 1.5)]
    images = stream_images(workload, params, result.graph, result.tensors, 2)
    run = run_stream(package, result.graph, result.tensors, images)
    assert run.passed and len(run.verdicts) == 2
    assert all(v.passed for v in run.verdicts)


def test_a_layer_reading_an_early_activation_is_refused():
    """Every layer adds the stem's output: nothing but the carried value may cross groups."""
    b = GraphBuilder("skip")
    x = b.input("x", TensorType((8, 16), F16))
    stem = b.op("scale", [x], F16, "stem", factor=0.5)
    h = stem
    for k in range(3):
        w = b.weight(f"l{k}.w", TensorType((16, 16), F16))
        h = b.op("matmul", [h, w], F16, f"l{k}.mm")
        h = b.op("add", [h, stem], F16, f"l{k}.out")
    b.output(h)
    with pytest.raises(PipelineError, match="skip cannot be pipelined: stem is read outside group 0"):
        split_tower(b.build(), [1, 1])


def test_a_group_that_does_not_compile_is_named(tmp_path, cache_dir, monkeypatch):
    """Every candidate's failure says which group failed: the groups are compiled one
    after another and the first that fails ends the candidate."""
    import ipu_stack.strategy.compile as strategy

    compiled = []

    def refuse_group_one(workload, params, out_dir, options, min_proportion=None):
        compiled.append(out_dir.name)
        if out_dir.name == "group1":
            raise CompileError("does not fit: a test's refusal")
        return real(workload, params, out_dir, options, min_proportion)

    real = strategy.compile_workload
    monkeypatch.setattr(strategy, "compile_workload", refuse_group_one)
    workload = get_workload("siglip-vision")
    params = workload.resolve(dict(TOWER))
    with pytest.raises(CompileError, match="no pipeline grouping compiles: 3 groups: group 1: "
                                           "does not fit: a test's refusal$"):
        compile_pipeline(workload, params, tmp_path, CompileOptions(cache_dir=str(cache_dir)),
                         groups=3)
    assert compiled == ["group0", "group1"]


def test_row_chunks_cost_each_chunk_and_hold_one_at_a_time():
    shape = GemmShape(op=0, rows=729, depth=1152, cols=4304, a_itemsize=1, fp8=True)
    whole = cost_plan(shape, 1, 34, 12, mode="fp8")
    chunked = cost_plan(shape, 1, 34, 12, mode="fp8", chunks=3)
    assert whole is not None and chunked is not None
    assert chunk_sizes(729, 3) == [243, 243, 243] and chunk_sizes(10, 4) == [3, 3, 2, 2]
    parts = [cost_plan(dataclasses.replace(shape, rows=243), 1, 34, 12, mode="fp8")]
    assert chunked.estimated_cycles == 3 * parts[0].estimated_cycles
    assert chunked.estimated_cycles > whole.estimated_cycles  # chunks never save cycles
    assert transient_bytes(chunked) < transient_bytes(whole)
    assert [row0 for row0, _ in chunked.chunks()] == [0, 243, 486]
    assert "in 3 row chunks" in chunked.describe()


@pytest.mark.parametrize("groups", [1, 2, 3])
def test_fill_steady_and_drain_counts(groups):
    images = 4
    steps = step_schedule(groups, images)
    assert len(steps) == images + groups - 1
    full = [s for s in steps if len(s) == groups]
    assert len(full) == images - groups + 1  # steady steps: every group busy
    assert sum(len(s) for s in steps) == images * groups  # each image through each group
    for number, busy in enumerate(steps):
        assert busy == [(g, number - g) for g in range(groups) if 0 <= number - g < images]


def test_merged_step_aligns_the_layer_loops():
    c, x = "compute", "exchange"
    stem_first = GroupRun(0, 0, 0, [5, 10, 20, 30], 0, [x, c, x, c])
    middle = GroupRun(1, 0, 0, [25, 25], 0, [x, c])
    # the middle group's two supersteps line up with the first group's last two:
    # 5 + 10 + max(20, 25) + max(30, 25), then the hand-off
    assert merged_step([stem_first, middle], 7) == 5 + 10 + 25 + 30 + 7
    # supersteps of different kinds never share: a lone exchange beside a lone compute
    assert merged_step([GroupRun(0, 0, 0, [4], 0, [x]), GroupRun(1, 0, 0, [6], 0, [c])],
                       0) == 10


def test_merge_keeps_identical_programs_in_step_and_names_members():
    from ipu_stack.device.alignment import merge

    kinds = ["exchange", "compute"] * 3
    cycles = [3, 9, 4, 8, 5, 7]
    merged = merge([(kinds, cycles), (kinds, cycles), (kinds, [c + 1 for c in cycles])])
    assert merged.total == sum(cycles) + len(cycles)
    assert merged.members.tolist() == [list(range(6))] * 3


@pytest.fixture(scope="module")
def pipelined(tmp_path_factory, cache_dir):
    workload = get_workload("siglip-vision")
    params = workload.resolve(dict(TOWER))
    result = compile_pipeline(workload, params, tmp_path_factory.mktemp("pipe"),
                              CompileOptions(cache_dir=str(cache_dir)), groups=3)
    return workload, params, result


def test_pipelined_tower_passes_every_image(pipelined):
    workload, params, result = pipelined
    package = load_package(result.package)
    system = read_system(package)
    assert [g.layers for g in system.groups] == [1, 1, 1]
    assert [g.tile_base for g in system.groups] == [0, 490, 980]
    assert [g.tiles for g in system.groups] == [490] * 3 and result.group_tiles == 490
    images = stream_images(workload, params, result.graph, result.tensors, 4)
    assert not np.array_equal(images[0]["patches"], images[1]["patches"])
    run = run_stream(package, result.graph, result.tensors, images)
    assert run.passed and len(run.verdicts) == 4
    assert len(run.step_cycles) == 4 + 3 - 1
    # every image's output is the one the groups compute when run alone on that image
    alone = run_stream(package, result.graph, result.tensors, images[2:3])
    for name, value in alone.outputs[0].items():
        assert np.array_equal(run.outputs[2][name], value)
    # steady steps: every group busy, the same cycles (they do not depend on the values)
    steady = run.step_cycles[2:4]
    assert steady[0] == steady[1] == run.steady_cycles
    # the planner prices each group's supersteps as the device executed them, and merges
    # them as the chip runs them side by side: its step is the executed one, and sharing
    # supersteps costs more than the slowest group alone here
    for group in system.groups:
        priced = result.compiled[group.program]
        executed = run.runs[(group.index, 0)]
        assert (priced.superstep_kinds, priced.superstep_cycles) == \
            (executed.kinds, executed.supersteps)
    assert result.estimate["cycles"] == run.steady_cycles
    assert result.estimate["alignment_cycles"][0] > 0
    assert run.steady_cycles > max(result.estimate["group_cycles"]) \
        + max(result.estimate["handoff_cycles"])


def test_step_cycles_do_not_depend_on_the_data(pipelined):
    workload, params, result = pipelined
    package = load_package(result.package)
    first = stream_images(workload, params, result.graph, result.tensors, 3)
    other = [{k: -v for k, v in image.items()} for image in reversed(first)]
    a = run_stream(package, result.graph, result.tensors, first)
    b = run_stream(package, result.graph, result.tensors, other)
    assert a.step_cycles == b.step_cycles
    assert not np.array_equal(a.outputs[0]["post_ln.out"], b.outputs[0]["post_ln.out"])


@pytest.mark.parametrize("name, fields", [
    ("siglip-layer", {"tokens": 37, "dim": 64, "hidden": 96, "heads": 4}),
    # the patch merging's GEMM makes the layer loop's input: in row chunks it is held in
    # pieces, which land in whole rows before the loop
    ("swin-l", {"batch": 2, "image": 32, "window": 4, "dim": 16, "depths": "2,4",
                "stage_heads": "2,4", "precision": "f16"}),
])
def test_row_chunked_plans_compute_the_same_bits(tmp_path, cache_dir, monkeypatch, name,
                                                  fields):
    """The same column and depth splits run as row chunks (one row split) give
    bit-identical outputs: a row is computed the same way whichever chunk or row block
    holds it (the depth blocks, where the partials round, are the same)."""
    import ipu_stack.phases.stages as stages
    from ipu_stack.pipeline import compile_workload
    from ipu_stack.runtime.execute import run_package

    workload = get_workload(name)
    params = workload.resolve(fields)
    options = CompileOptions(cache_dir=str(cache_dir), finalists=1)
    plain = compile_workload(workload, params, tmp_path / "plain", options)
    search = stages.gemm_search

    def chunked(shape, target, keep=4, mode="auto", min_col_block=0):
        found, front = search(shape, target, keep, mode, min_col_block)
        redone = [cost_plan(shape, 1, p.col_splits, p.depth_splits, mode=p.mode,
                            chunks=3) for p in found]
        return [r or p for r, p in zip(redone, found, strict=True)], front

    monkeypatch.setattr(stages, "gemm_search", chunked)
    split = compile_workload(workload, params, tmp_path / "chunked", options)
    package = load_package(split.package)
    assert any("in 3 row chunks" in plan for plan in package.manifest["plans"])
    steps = [s.get("name") for s in package.manifest["programs"]["run"]]
    assert ("layers.land" in steps) == (name == "swin-l")
    outputs = []
    for result in (plain, split):
        run = run_package(load_package(result.package), result.graph, result.tensors)
        assert run.passed
        outputs.append(run.outputs)
    for name, value in outputs[0].items():
        assert np.array_equal(value, outputs[1][name]), name


def test_the_step_by_kind_of_work_adds_up_to_the_planned_step(pipelined):
    from ipu_stack.testing.steps import step_by_kind

    _, _, result = pipelined
    by_kind = step_by_kind(result)
    assert sum(by_kind.values()) == result.estimate["cycles"]
    assert by_kind["hand-off between groups"] == max(result.estimate["handoff_cycles"])
    assert by_kind["AMP (GEMM)"] > 0 and by_kind["softmax"] > 0 \
        and by_kind["exchange: A operands"] > 0 and "exchange: other" not in by_kind


def test_profile_of_a_pipeline_step_has_a_track_per_group(pipelined, tmp_path):
    from ipu_stack.profile import write_profile_files
    from ipu_stack.profile.capture import profile_of_stream
    from ipu_stack.profile.trace import trace

    workload, params, result = pipelined
    package = load_package(result.package)
    images = stream_images(workload, params, result.graph, result.tensors, 3)
    run = run_stream(package, result.graph, result.tensors, images, RunSettings(record=True))
    profile = profile_of_stream(run, package, read_system(package), {"strategy": "pipeline"})
    assert [t[1:] for t in profile.tracks] == [[0, 490], [490, 980], [980, 1470]]
    # the profiled step is the period: its merged supersteps and the hand-off
    assert profile.cycles == run.steady_cycles
    busy = profile.active_tiles()
    assert busy.min() < 490 and busy.max() >= 980  # every group's tiles worked
    events = trace(profile)["traceEvents"]
    names = {e["args"]["name"] for e in events if e.get("name") == "thread_name"
             and e["pid"] == 4}
    assert names == {"group 0: layers 0-0", "group 1: layers 1-1", "group 2: layers 2-2"}
    write_profile_files(tmp_path, profile)
    assert "group 2: layers 2-2" in (tmp_path / "report.html").read_text()


def _resident_then_streamed(tmp_path, cache_dir, monkeypatch, params: dict, tilings,
                            **option_fields):
    """siglip-layer at ``params`` compiled and run twice, every weight GEMM forced to the
    first of ``tilings`` (``(r, c, d, mode)``) that fits, with its weights resident and then
    streamed, unfused (each stage's own phases): the packages and outputs (each passed)."""
    import ipu_stack.phases.stages as stages
    from ipu_stack.pipeline import compile_workload
    from ipu_stack.runtime.execute import run_package

    workload = get_workload("siglip-layer")
    resolved = workload.resolve(params)
    options = CompileOptions(cache_dir=str(cache_dir), finalists=1, **{"fuse_window": 0, **option_fields})
    search = stages.gemm_search

    def fixed(streamed: bool):
        def pick(shape, target, keep=4, mode="auto", min_col_block=0):
            found, front = search(shape, target, keep, mode, min_col_block)
            if not shape.b_resident:
                return found, front
            plans = [cost_plan(shape, r, c, d, mode=mode_, streamed=streamed)
                     for r, c, d, mode_ in tilings]
            return [p for p in plans if p is not None][:1] or found[:1], front
        return pick

    packages, outputs = [], []
    for streamed in (False, True):
        monkeypatch.setattr(stages, "gemm_search", fixed(streamed))
        result = compile_workload(workload, resolved, tmp_path / str(streamed), options)
        package = load_package(result.package)
        run = run_package(package, result.graph, result.tensors)
        assert run.passed
        packages.append(package)
        outputs.append(run.outputs)
    return packages, outputs


def test_streamed_weights_compute_the_same_bits(tmp_path, cache_dir, monkeypatch):
    """The same tilings with their weights held once and gathered per run give
    bit-identical outputs, hold less per tile, and move the weights in a phase of their
    own."""
    packages, outputs = _resident_then_streamed(
        tmp_path, cache_dir, monkeypatch, {"tokens": 37, "dim": 64, "hidden": 96, "heads": 4},
        ((2, 2, 2, "fp8"), (2, 2, 2, "f16")))
    assert all("weights streamed" in plan for plan in packages[1].manifest["plans"]
               if plan.startswith("R2xC2xD2"))
    assert any(s["name"].endswith(".right") for s in packages[1].manifest["programs"]["run"]
               if s["kind"] == "exchange")
    for name, value in outputs[0].items():
        assert np.array_equal(value, outputs[1][name]), name


def test_streamed_weights_are_all_gathered_as_unicasts_at_the_bound(tmp_path, cache_dir,
                                                                      monkeypatch):
    """Three row groups hold a streamed B's slices and each needs all three: as multicasts
    the phase could not meet its bound (while a holder sends, its two peers listen to it);
    split into unicasts, every tile sends and receives two slices and the schedule meets
    the endpoint bound exactly, with outputs bit-identical to resident weights."""
    from ipu_stack.contract.parse import from_manifest
    from ipu_stack.contract.program import Exchange

    packages, outputs = _resident_then_streamed(
        tmp_path, cache_dir, monkeypatch, {"tokens": 37, "dim": 96, "hidden": 192, "heads": 4},
        ((3, 2, 1, "fp8"),))
    package = packages[1]
    program = from_manifest(package.manifest, package.arrays)
    gathers = [s for s in program.run if isinstance(s, Exchange) and s.name.endswith(".right")]
    plans = package.manifest["plans"]  # one per GEMM stage, each with its B phase
    assert len(gathers) == len(plans) and sum("streamed" in p for p in plans) >= 4
    for step in (g for g, plan in zip(gathers, plans, strict=True) if "streamed" in plan):
        assert np.all(np.diff(step.dst_offsets) == 1), step.name  # one destination each
        assert step.schedule().horizon == step.lower_bound > 0, step.name
    for name, value in outputs[0].items():
        assert np.array_equal(value, outputs[1][name]), name


def test_a_program_short_of_memory_gathers_streamed_weights_as_multicasts(
        tmp_path, cache_dir, monkeypatch):
    """Lowered for fewer exchange transfers (``lean_table_rows``, the second chain), a
    streamed B over 17 row groups is gathered as multicasts to its 16 peers: each holder
    sends its slice once (one table entry, not 16); outputs bit-identical to resident."""
    from ipu_stack.contract.parse import from_manifest
    from ipu_stack.contract.program import Exchange
    from ipu_stack.lowering.gemm_stage import MULTICAST_GATHER_PEERS

    packages, outputs = _resident_then_streamed(
        tmp_path, cache_dir, monkeypatch, {"tokens": 68, "dim": 96, "hidden": 192, "heads": 4},
        ((17, 2, 1, "fp8"),), lean_table_rows=1000)
    package = packages[1]
    program = from_manifest(package.manifest, package.arrays)
    plans = package.manifest["plans"]
    gathers = [s for s in program.run if isinstance(s, Exchange) and s.name.endswith(".right")]
    streamed = [g for g, plan in zip(gathers, plans, strict=True) if "streamed" in plan]
    assert len(streamed) >= 4
    for step in streamed:
        fanout = np.diff(step.dst_offsets)
        assert fanout.max() == MULTICAST_GATHER_PEERS == 16, step.name
        # one transfer a slice: every holder sends each of its slices once
        held = set(zip(step.src_tile.tolist(), step.src_addr.tolist(), strict=True))
        assert len(held) == len(fanout)
    for name, value in outputs[0].items():
        assert np.array_equal(value, outputs[1][name]), name


def test_streamed_weights_leave_interleaved_memory_to_the_amp():
    """A resident plan's weights must sit in interleaved memory (the AMP reads them there);
    a streamed plan's are read only by the exchange, so a tower whose weights overflow
    interleaved memory still fits with streamed plans."""
    from ipu_stack.planning.fit import MemoryBudget, fit_plans
    from ipu_stack.planning.gemm import resident_bytes

    shape = GemmShape(op=0, rows=512, depth=1024, cols=1024, a_itemsize=2, fp8=False)
    resident = cost_plan(shape, 2, 16, 4, mode="f16")
    streamed = cost_plan(shape, 2, 16, 4, mode="f16", streamed=True)
    assert resident is not None and streamed is not None
    assert resident_bytes(streamed) < resident_bytes(resident)
    layers = 24
    budget = MemoryBudget(bytes=10 * layers * resident_bytes(resident),
                          interleaved=layers * resident_bytes(resident) // 2 + 300_000)
    fitted, moves = fit_plans([resident], [[resident, streamed]], budget, [layers])
    assert moves == 1 and fitted[0].streamed
    # the whole tile has room: the message names interleaved memory, not a total that fits
    with pytest.raises(CompileError, match=r"does not fit: .* found no choice that also keeps "
                       r"the AMP's weights and partials within the \d+ bytes of interleaved"):
        fit_plans([resident], [[resident]], budget, [layers])


def test_layer_body_plans_asked_for_are_taken_and_compute_right(tmp_path, cache_dir, caplog):
    """A program compiled with ``body_hints`` runs those plans in every layer (another
    group's, so that the two groups' supersteps line up) and still equals the reference;
    a hint that is no candidate of its stage leaves the program's own plans."""
    import logging

    from ipu_stack.phases.stages import build_graph_and_tilings, repeats
    from ipu_stack.phases.state import Build
    from ipu_stack.pipeline import compile_workload
    from ipu_stack.planning.stages import GemmStage
    from ipu_stack.runtime.execute import run_package

    workload = get_workload("siglip-vision")
    params = workload.resolve(dict(TOWER))
    options = CompileOptions(cache_dir=str(cache_dir), finalists=1)
    own = compile_workload(workload, params, tmp_path / "own", options)
    assert len(own.body_plans) >= 4  # the loop body's GEMMs (q, k, v, scores, ...)
    build = Build(workload, params, tmp_path, options, options.machine(), None, {})
    build_graph_and_tilings(build)
    body = [i for i, (stage, n) in enumerate(zip(build.stages, repeats(build), strict=True))
            if n > 1 and isinstance(stage, GemmStage)]
    # the first body GEMM on another plan of its stage, the rest as the program chose
    other = next(p.describe() for p in [*build.candidates[body[0]], *build.fronts[body[0]]]
                 if p is not None and p.describe() != own.body_plans[0])
    hints = (other, *own.body_plans[1:])
    with caplog.at_level(logging.INFO, logger="ipu_stack"):
        pinned = compile_workload(workload, params, tmp_path / "pinned", options,
                                  body_hints=hints)
    assert tuple(pinned.body_plans) == hints
    assert "took the layer body's plans asked for stages=" in caplog.text
    run = run_package(load_package(pinned.package), pinned.graph, pinned.tensors)
    assert run.passed
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="ipu_stack"):
        kept = compile_workload(workload, params, tmp_path / "kept", options,
                                body_hints=("R99xC1xD1 no such plan", *own.body_plans[1:]))
    assert kept.body_plans == own.body_plans
    assert "kept its own layer body plans: a plan asked for is not a candidate" in caplog.text


def test_programs_take_the_slowest_programs_layer_plans_only_when_no_slower(tmp_path,
                                                                            monkeypatch):
    """``_align_programs`` compiles again, with the slowest program's layer body plans,
    each program whose body is planned otherwise; it keeps the new one only when it took
    them all and is no slower than the slowest, and leaves alone a program that already
    agrees or has another body."""
    import ipu_stack.strategy.compile as strategy
    from ipu_stack.phases.state import CompileResult

    def result(cycles: int, body: list[str]) -> CompileResult:
        return CompileResult(tmp_path, None, {}, {"cycles": cycles}, body_plans=body)

    pace_body = ["A in 2 row chunks", "B"]
    compiled = {0: result(300, pace_body),            # the slowest: the stem's group
                1: result(250, ["A", "B"]),            # planned otherwise: aligned
                2: result(260, ["A", "B"]),            # aligned, but then slower than 300
                3: result(240, list(pace_body)),       # agrees already
                4: result(200, ["A"])}                 # another body: left alone
    asked = []
    aligned_cycles = {1: 280, 2: 310}

    def compile_again(workload, params, out_dir, options, min_proportion=None,
                      body_hints=()):
        index = int(out_dir.name.removeprefix("group").removesuffix(".aligned"))
        asked.append((out_dir.name, body_hints))
        return result(aligned_cycles[index], list(body_hints))

    monkeypatch.setattr(strategy, "compile_workload", compile_again)
    monkeypatch.setattr(strategy, "group_workload", lambda workload, group, tensors: None)
    before = dict(compiled)
    strategy._align_programs(None, {}, tmp_path, CompileOptions(), [None] * 5, None, 122,
                             compiled, None)
    assert asked == [("group1.aligned", tuple(pace_body)), ("group2.aligned", tuple(pace_body))]
    assert compiled[1].body_plans == pace_body and compiled[1].estimate["cycles"] == 280
    assert compiled[2] is before[2]  # 310 would lengthen the step: kept its own
    assert all(compiled[i] is before[i] for i in (0, 3, 4))


def test_each_hand_off_reaches_the_host_side_as_its_group_finishes(pipelined, monkeypatch):
    """The verdict judges a group's first stage on the hand-off the group before it made.
    That value goes to the host side as soon as that group has run, so every stage is
    judged while the device works: none waits for the verdict's end (where the 27-layer
    tower's host side once judged two thirds of its stages one after another, alone)."""
    import ipu_stack.verdict.host_side as host_side_module

    workload, params, result = pipelined
    monkeypatch.setattr(host_side_module, "fork_available", lambda: False)  # host side here
    left = stages_left_at_finish(monkeypatch)
    package = load_package(result.package)
    images = stream_images(workload, params, result.graph, result.tensors, 2)
    run = run_stream(package, result.graph, result.tensors, images)
    assert run.passed and left == [0, 0]
    assert all(len(v.stages) > 3 * 10 for v in run.verdicts)  # three layers' stages judged


def test_a_language_models_last_chip_can_take_half_a_layer_less():
    """The last chip holds the head (a language model's LM head is work the other chips do
    not have): with one group a chip the search also cuts inside a layer, the last chip half
    a layer lighter, and keeps that cut only where its planned GEMM cycles rank it first
    (a vocabulary of 262,144: yes; of 4,096: the whole-layer cut stays the only one)."""
    workload = get_workload("smollm2-135m")
    options = CompileOptions(chips=2, strategy="pipeline")
    found = {}
    for vocab in (524288, 4096):
        params = workload.resolve({"vocab": vocab, "dim": 64, "hidden": 96, "layers": 4,
                                   "heads": 4, "kv_heads": 2, "tokens": 1, "context": 64,
                                   "batch": 2, "precision": "f16"})
        graph, tensors = workload.build(params)
        ranked = choose_groups(workload, params, graph, tensors, options, (1,))
        found[vocab] = [(tuple(g.layers for g in c.groups), c.slowest) for c in ranked]
    (lighter, first), (whole, second) = found[524288]
    assert (lighter, whole) == ((2.5, 1.5), (2, 2)) and first < second
    assert [cut for cut, _ in found[4096]] == [(2, 2)]
