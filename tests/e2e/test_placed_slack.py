"""A compile that places with room to spare plans again for that room (``pipeline._into_slack``).

The planner leaves an assumed reserve of each tile for support memory.  Here the reserve is
made huge (``support_reserve``), so the fitter must trade cycles for memory, and placement
then finds the tiles nearly empty: the compile plans again for the measured room and takes
the faster plans only when they place and schedule faster.  A small layer keeps each compile
to a second or two.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

import ipu_stack.phases.stages as stages_module
import ipu_stack.pipeline as pipeline_module
from ipu_stack.pipeline import CompileOptions, compile_workload
from ipu_stack.runtime.execute import run_package
from ipu_stack.runtime.session import load_package
from ipu_stack.target import IPU21
from ipu_stack.workloads import get_workload
from tests.helpers import placement_fails_on_call

LAYER = ("siglip-layer", {"tokens": 64, "dim": 256, "heads": 4, "hidden": 512})
TILE = IPU21.memory_end - IPU21.memory_base
TIGHT = TILE - 3 * 1024 - 800  # leaves the planner 3 872 bytes of a tile: it must trade


def _compile(tmp_path: Path, cache_dir: Path, name: str, **options):
    workload = get_workload(LAYER[0])
    params = workload.resolve(LAYER[1])
    options.setdefault("cache_dir", str(cache_dir))
    return compile_workload(workload, params, tmp_path / name, CompileOptions(**options))


def _lines(caplog: pytest.LogCaptureFixture, start: str) -> list[dict[str, str]]:
    return [dict(re.findall(r"(\w+)=(\S+)", r.getMessage())) for r in caplog.records
            if r.getMessage().startswith(start)]


@pytest.fixture()
def info_logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="ipu_stack")
    return caplog


def _no_slack(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pipeline_module, "SLACK_MIN", 1 << 40)


def test_a_tight_plan_is_planned_again_for_the_room_placement_left(tmp_path, cache_dir,
                                                                 info_logs, monkeypatch):
    slack = _compile(tmp_path, cache_dir, "slack", support_reserve=TIGHT)
    (line,) = _lines(info_logs, "planned again into the placed slack")
    placed = [int(f["peak_bytes"]) for f in _lines(info_logs, "placed storage")]
    assert len(placed) == 2  # the first plans, then the plans for the room they left
    # the room is the fullest tile's free bytes after the first placement, less the margin
    assert int(line["slack_bytes"]) == TILE - placed[0]
    reserve = int(line["support_reserve"])
    assert reserve == TILE - (TILE - TIGHT) - int(line["slack_bytes"]) + pipeline_module.SLACK_MARGIN
    assert int(line["estimated_cycles"]) < int(line["first_estimated_cycles"])
    assert slack.estimate["cycles"] == int(line["final_cycles"]) < int(line["first_final_cycles"])
    assert slack.peak_bytes == placed[1]
    # the package records the reserve its plans were made with
    manifest = load_package(slack.package).manifest
    assert manifest["options"]["support_reserve"] == reserve

    _no_slack(monkeypatch)
    first = _compile(tmp_path, cache_dir, "first", support_reserve=TIGHT)
    assert first.estimate["cycles"] == int(line["first_final_cycles"])
    # the same plans as a compile asked for that reserve (which has nothing left to trade)
    direct = _compile(tmp_path, cache_dir, "direct", support_reserve=reserve)
    assert direct.plans == slack.plans
    assert direct.estimate == slack.estimate


def test_the_replanned_package_runs_faster_and_passes(tmp_path, cache_dir, lock_path,
                                                     monkeypatch):
    """The simulator's timing of what each package executed, not the planner's word."""
    runs = []
    for name in ("slack", "first"):
        if name == "first":
            _no_slack(monkeypatch)
        result = _compile(tmp_path, cache_dir, name, support_reserve=TIGHT)
        ran = run_package(load_package(result.package), result.graph, result.tensors,
                          lock_path)
        assert ran.passed
        runs.append(ran.run.cycles)
    assert runs[0] < runs[1]


def test_plans_for_the_slack_that_do_not_place_leave_the_first_package(tmp_path, cache_dir,
                                                                      info_logs, monkeypatch):
    original = stages_module.place_storage
    placement_fails_on_call(monkeypatch, 2, "test: the plans for the slack do not fit")
    kept = _compile(tmp_path, cache_dir, "kept", support_reserve=TIGHT)
    (line,) = _lines(info_logs, "kept the first plans: the plans for the placed slack do not "
                                "place")
    assert "the plans for the slack do not fit" in " ".join(
        r.getMessage() for r in info_logs.records if r.getMessage().startswith("kept"))
    assert not _lines(info_logs, "planned again into the placed slack")
    assert not _lines(info_logs, "planning again with less memory")  # not a retry
    assert int(line["slack_bytes"]) > pipeline_module.SLACK_MIN
    monkeypatch.setattr(stages_module, "place_storage", original)
    _no_slack(monkeypatch)
    first = _compile(tmp_path, cache_dir, "first", support_reserve=TIGHT)
    # byte for byte the package (and memory profile) a compile without the trial writes
    assert kept.package.read_bytes() == first.package.read_bytes()
    profile = "memory/memory-profile.json"
    assert json.loads((tmp_path / "kept" / profile).read_text()) == json.loads(
        (tmp_path / "first" / profile).read_text())


def test_untraded_or_retried_plans_are_not_planned_again(tmp_path, cache_dir, info_logs):
    """With the default reserve the small layer's fastest plans fit: no trial; a compile
    asked for less memory keeps to it; and one asked only whether it fits (a capacity
    probe: ``slack=False``) is not planned twice."""
    _compile(tmp_path, cache_dir, "roomy")
    _compile(tmp_path, cache_dir, "asked", support_reserve=TIGHT, memory_proportion=0.9)
    _compile(tmp_path, cache_dir, "probe", support_reserve=TIGHT, slack=False)
    assert len(_lines(info_logs, "traded cycles for memory")) >= 2  # the last two traded
    assert not [r for r in info_logs.records
                if "slack" in r.getMessage()]
    assert len(_lines(info_logs, "placed storage")) == 3


@pytest.mark.slow  # tests/reliability/test_determinism.py keeps packages' bytes in the default run
def test_the_replanned_package_is_deterministic(tmp_path, cache_dir):
    one = _compile(tmp_path, cache_dir, "one", support_reserve=TIGHT)
    two = _compile(tmp_path, cache_dir, "two", support_reserve=TIGHT)
    assert one.package.read_bytes() == two.package.read_bytes()


@pytest.mark.parametrize("chips, groups", [(2, 1), (1, 2)], ids=["alone-on-its-chip",
                                                                 "side-by-side"])
def test_only_a_group_alone_on_its_chip_is_planned_again(tmp_path, cache_dir, info_logs,
                                                         chips, groups):
    """Groups side by side on a chip share its supersteps and take the slowest group's layer
    plans (``strategy.compile._align_programs``): planning one of them for its own room
    would be undone there, so only a group alone on its chip is planned again."""
    from ipu_stack.strategy import compile_pipeline

    workload = get_workload("siglip-vision")
    params = workload.resolve({"layers": 4, "image": 28, "patch": 7, "dim": 64, "hidden": 96,
                               "heads": 4})
    compile_pipeline(workload, params, tmp_path, CompileOptions(
        cache_dir=str(cache_dir), chips=chips, support_reserve=TIGHT), groups=groups)
    assert _lines(info_logs, "traded cycles for memory")
    replanned = _lines(info_logs, "planned again into the placed slack")
    assert (len(replanned) == 2) if chips == 2 else not replanned


def test_stage_dumps_are_the_plans_taken(tmp_path, cache_dir):
    """``--dump-stages`` shows what was compiled: after a replan, every stage's artifact is
    the replanned build's, not the first build's."""
    dump = tmp_path / "dump"
    slack = _compile(tmp_path, cache_dir, "slack", support_reserve=TIGHT, dump_stages=str(dump))
    chosen = (dump / "03-select_finalist.txt").read_text()
    assert f'"cycles": {slack.estimate["cycles"]}' in chosen
    assert all(f"  {plan}" in chosen for plan in slack.plans)
    placed = json.loads((dump / "06-place_storage.json").read_text())
    assert placed["peak_bytes"] == slack.peak_bytes
