"""A tower pipelined over two linked chips through the real CLI: every image checked, the
step built from what each chip's worker executed plus the priced link hand-off, the same
figures from every engine, a package whose chips disagree on a hand-off refused, a worker
that dies named by its chip, and the one-line refusals."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import signal

import numpy as np
import pytest

from tests.helpers import bench, cli, one_error_line, stages_left_at_finish

TOWER = ["--layers", "4", "--image", "28", "--patch", "7", "--dim", "64", "--hidden", "96",
         "--heads", "4"]
CLOCK = 1.5e9
LINK_BYTES_PER_SECOND = 31.25e9  # docs/multichip.md: 2 links of a 1 Tbps-bidirectional 4, each way
HOP_AND_SYNC = 1500 + 3000  # the assumed hop and cross-card sync (docs/multichip.md)


@pytest.fixture(scope="module")
def linked(tmp_path_factory, cache_dir):
    folder = tmp_path_factory.mktemp("linked")
    return bench("siglip-vision", *TOWER, "--chips", "2", "--groups", "2", "--images", "2",
                 "--profile", str(folder / "profile"), folder=folder, cache_dir=cache_dir)


def test_two_chips_stream_every_image_and_time_the_step_from_both(linked):
    r = linked.record
    assert r["numericalTest"] == "PASS" and r["imagesPassed"] == 2
    assert r["chips"] == 2 and r["groupsPerChip"] == 2 and r["pipelineGroups"] == 4
    assert r["executionTiles"] == 2 * 1472 and r["groupTiles"] == 736
    # the period: the slower chip's full step, then the link phase every card waits for
    assert r["cycles"] == max(r["chipStepCycles"]) + r["linkCycles"]
    # the planner's step: each chip's groups' priced supersteps merged as the chip runs them
    assert r["estimatedCycles"] == r["cycles"]
    assert r["imagesPerSecond"] == pytest.approx(CLOCK / r["cycles"], rel=1e-3)
    assert r["imagesPerSecond"] <= r["fp8RooflineImagesPerSecond"]
    # one image's activation crosses: 16 tokens x 64 dims, at least one byte each
    assert r["linkBytes"] >= 16 * 64
    cable = math.ceil(r["linkBytes"] * CLOCK / LINK_BYTES_PER_SECOND)
    assert r["linkCycles"] >= cable + HOP_AND_SYNC
    assert r["linkSharePercent"] == pytest.approx(100 * r["linkCycles"] / r["cycles"], abs=0.01)
    assert len(r["workerPeakBytes"]) == 2 and min(r["workerPeakBytes"]) > 0
    assert isinstance(r["hostPeakBytes"], int) and r["hostPeakBytes"] > 2**20
    assert r["latencyMicroseconds"] * 1500 >= 4 * r["cycles"] * 0.5  # four steps' worth
    assert "chips loaded chips=2 engine=local" in linked.stderr
    # each card has its own PCIe link: the first chip's carries the image in, more than the
    # last chip's carries out (16 rows of 64)
    first, last = r["chipHostBytes"]
    assert first >= 16 * 7 * 7 * 3 * 2 and 0 < last < first  # 16 patches in, F16 rows out
    assert r["hostMicroseconds"] == pytest.approx(
        math.ceil(first * CLOCK / 32e9) / CLOCK * 1e6, abs=1e-3)


def test_the_profile_has_a_track_a_chip_and_each_chip_its_step(linked):
    from ipu_stack.profile import load_profile

    folder = linked.folder / "profile"
    events = json.loads((folder / "trace.json").read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert names == {"chip 0: layers 0-1", "chip 1: layers 2-3"}
    links = [e for e in events if e.get("cat") == "link"]
    assert len(links) == 2 and {e["args"]["cycles"] for e in links} == {
        linked.record["linkCycles"]}
    chips = [load_profile(folder / f"chip{k}" / "profile.json") for k in (0, 1)]
    assert [p.cycles for p in chips] == linked.record["chipStepCycles"]
    assert load_profile(folder / "profile.json").cycles == max(linked.record["chipStepCycles"])
    assert (folder / "chip1" / "report.html").read_text().count("group 3: layers 3-3") >= 1


def test_the_package_places_the_groups_on_both_chips(linked):
    code, out, err = cli(["inspect", str(linked.folder / "pkg" / "model.ipuexe"), "--json"])
    assert code == 0, err
    summary = json.loads(out)
    assert [g["layers"] for g in summary["groups"]] == [[0, 1], [1, 2], [2, 3], [3, 4]]
    assert summary["chips"] == 2 and [g["chip"] for g in summary["groups"]] == [0, 0, 1, 1]
    assert [h["link"] for h in summary["handoffs"]] == [False, True, False]
    assert summary["estimate"]["link_cycles"] and len(summary["estimate"]["chip_cycles"]) == 2


def test_running_the_package_again_gives_the_same_cycles(linked):
    code, out, err = cli(["run", str(linked.folder / "pkg" / "model.ipuexe"), "--json"])
    assert code == 0, err
    again = json.loads(out.strip().splitlines()[-1])
    for key in ("cycles", "chipStepCycles", "linkCycles", "latencyMicroseconds"):
        assert again[key] == linked.record[key], key


def test_every_option_runs_over_chips_in_this_process(linked, tmp_path):
    """The in-process engine runs both chips one after another with poison checks, a named
    device and every image's outputs saved: the same figures as the forked workers, and the
    saved outputs are the run's."""
    saved = tmp_path / "tensors"
    code, out, err = cli(["run", str(linked.folder / "pkg" / "model.ipuexe"), "--json",
                          "--engine", "inprocess", "--poison", "--device", "multichip-test",
                          "--save-tensors", str(saved)])
    assert code == 0, err[-3000:]
    again = json.loads(out.strip().splitlines()[-1])
    assert again["engine"] == "inprocess" and again["imagesPassed"] == 2
    # one process has no workers whose peaks to report; the forked ones each have their own
    assert "workerPeakBytes" not in again and min(linked.record["workerPeakBytes"]) > 0
    for key in ("cycles", "chipStepCycles", "linkCycles", "linkBytes", "noiseRatio"):
        assert again[key] == linked.record[key], key
    with np.load(saved / "outputs.npz") as outputs:
        assert sorted(outputs.files) == ["image0/post_ln.out", "image1/post_ln.out"]
        assert not np.array_equal(outputs["image0/post_ln.out"], outputs["image1/post_ln.out"])


@pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                    reason="Ray is not installed (pip install 'ipu-stack[ray]')")
def test_ray_actors_give_the_same_figures(linked):
    code, out, err = cli(["run", str(linked.folder / "pkg" / "model.ipuexe"), "--json",
                          "--engine", "ray"])
    assert code == 0, err[-3000:]
    ray = json.loads(out.strip().splitlines()[-1])
    assert ray["engine"] == "ray" and ray["numericalTest"] == "PASS"
    for key in ("cycles", "chipStepCycles", "linkCycles", "linkBytes", "latencyMicroseconds",
                "noiseRatio"):
        assert ray[key] == linked.record[key], key


def test_chips_that_disagree_on_a_handoff_are_refused(linked, tmp_path):
    from ipu_stack.package import read_package, write_package
    from ipu_stack.runtime.groups import read_system

    package = read_package(linked.folder / "pkg" / "model.ipuexe")
    link = next(h for h in read_system(package).handoffs if h.link)
    arrays = dict(package.arrays)
    key = f"handoff.{link.sender}.src_tile"
    assert arrays[key].size >= 2
    arrays[key] = np.roll(arrays[key], 1)  # the same blocks, sent in another order
    bad = tmp_path / "bad.ipuexe"
    write_package(bad, target=package.target, compiler_version=package.compiler_version,
                  manifest=package.manifest, arrays=arrays)
    code, _, err = cli(["run", str(bad)])
    line = one_error_line(code, err)
    assert "from chip 0 to chip 1" in line and "disagree" in line


def test_a_worker_that_dies_is_named_by_its_chip(linked, cache_dir):
    from ipu_stack.runtime.engines import LocalEngine, WorkerFailed
    from ipu_stack.runtime.session import load_package
    from ipu_stack.workloads import get_workload
    from ipu_stack.workloads.calibration import cache_folder

    package = load_package(linked.folder / "pkg" / "model.ipuexe")
    workload = get_workload("siglip-vision")
    with cache_folder(cache_dir):
        graph, tensors = workload.build(workload.resolve(package.manifest["workload"]["params"]))
    engine = LocalEngine(package, 2, tensors, graph)
    try:
        engine.wait_ready()
        os.kill(engine.processes[1].pid, signal.SIGKILL)
        with pytest.raises(WorkerFailed, match=r"chip 1's worker died \(exit code -9\)"):
            engine.next()
    finally:
        engine.close()


@pytest.mark.parametrize(("extra", "message"), [
    (["--chips", "9"], "--chips 9: a C600 cluster holds 1 to 8 cards"),
    (["--chips", "0"], "--chips 0: a C600 cluster holds 1 to 8 cards"),
    (["--chips", "2", "--strategy", "layers"], "the layers strategy runs on one chip"),
    (["--chips", "4", "--groups", "2"], "cannot cut 4 layers into 8 groups (2 on each of 4 chips)"),
    (["--chips", "2", "--groups", "2", "--images", "1"],
     "--images 1 is fewer than the pipeline's 2 groups a chip"),
])
def test_multichip_refusals_are_one_line(tmp_path, cache_dir, extra, message):
    code, _, err = cli(["bench", "siglip-vision", *TOWER, *extra, "--out", str(tmp_path / "p"),
                        "--cache-dir", str(cache_dir), "--finalists", "1"])
    assert message in one_error_line(code, err)


def test_capacity_finds_the_fewest_chips(cache_dir):
    code, out, err = cli(["capacity", "siglip-vision", *TOWER, "--max-chips", "4", "--json",
                          "--cache-dir", str(cache_dir)])
    assert code == 0, err
    record = json.loads(out)
    assert record["minimumChips"] == 1 and record["tried"] == {"1": "fits"}
    assert record["compiles"] == 1
    assert re.fullmatch(r"\d+ bytes: weights \d+, .*", record["fullestTile"]), record


def test_sweep_takes_chips_as_an_axis(tmp_path, cache_dir):
    from ipu_stack.cli import main
    from ipu_stack.sweep import read_results

    out = tmp_path / "sweep"
    code = main(["--quiet", "sweep", "siglip-vision", *TOWER, "--grid", "chips=1,2",
                 "-o", str(out), "--workers", "1", "--cache-dir", str(cache_dir)])
    assert code == 0
    records = {r["point"]["chips"]: r for r in read_results(out / "results.jsonl")}
    assert set(records) == {1, 2} and all(r["status"] == "ok" for r in records.values())
    assert records[1]["strategy"] == "layers" and "chips" not in records[1]
    assert records[2]["strategy"] == "pipeline" and records[2]["chips"] == 2
    assert records[2]["executionTiles"] == 2944


@pytest.mark.parametrize(("workload", "patch", "tokens"), [
    ("siglip2-giant", "16", 4),  # 32 px / patch 16: 2 x 2 patches, no CLS
    ("pe-giant", "14", 5),  # 28 px / patch 14: 2 x 2 patches + CLS, 2D RoPE
])
def test_the_giant_towers_small_versions_over_two_chips(tmp_path, cache_dir, workload, patch,
                                                        tokens):
    image = str(2 * int(patch))
    result = bench(workload, "--layers", "2", "--dim", "64", "--hidden", "128", "--heads", "4",
                   "--image", image, "--chips", "2", folder=tmp_path, cache_dir=cache_dir)
    r = result.record
    assert r["numericalTest"] == "PASS" and r["chips"] == 2 and r["groupsPerChip"] == 1
    assert r["patch"] == int(patch) and r["tokens"] == tokens
    assert r["linkBytes"] >= tokens * 64 and r["linkCycles"] > 0


def test_a_rate_above_the_chips_roofline_is_an_error(linked, cache_dir):
    from ipu_stack.runtime.groups import read_system
    from ipu_stack.runtime.record import run_record
    from ipu_stack.runtime.session import load_package
    from ipu_stack.runtime.stream import GroupRun, StreamRun
    from ipu_stack.util.errors import DeviceError
    from ipu_stack.workloads import get_workload
    from ipu_stack.workloads.calibration import cache_folder

    package = load_package(linked.folder / "pkg" / "model.ipuexe")
    workload = get_workload("siglip-vision")
    with cache_folder(cache_dir):
        graph, _ = workload.build(workload.resolve(package.manifest["workload"]["params"]))
    # a step of 10 cycles: far beyond what 1472 tiles x 128 MACs a cycle can do
    run = StreamRun(4, 4, runs={(g, 0): GroupRun(g, 0, 10, [10], 0, ["compute"])
                                for g in range(4)}, step_cycles=[10] * 7, chip_steps=[[10] * 7])
    with pytest.raises(DeviceError, match="exceeds the FP8 roofline of 1 chip"):
        run_record(run, package, read_system(package), graph, {"batch": 1}, "pkg", None)


def test_each_chips_hand_off_reaches_the_host_side_as_the_chip_finishes(tmp_path, cache_dir,
                                                                          monkeypatch):
    """Within a chip each group's hand-off, and between chips the chip's output, go to the
    host side as soon as they are made: every stage is judged while the workers run, none
    is left for the verdict's end."""
    import ipu_stack.verdict.host_side as host_side
    from ipu_stack.pipeline import CompileOptions
    from ipu_stack.runtime.session import load_package
    from ipu_stack.runtime.stream import run_stream, stream_images
    from ipu_stack.strategy import compile_pipeline
    from ipu_stack.workloads import get_workload

    workload = get_workload("siglip-vision")
    params = workload.resolve({"layers": 4, "image": 28, "patch": 7, "dim": 64, "hidden": 96,
                               "heads": 4})
    result = compile_pipeline(workload, params, tmp_path,
                              CompileOptions(cache_dir=str(cache_dir), chips=2), groups=2)
    # the host sides on threads of this process, to count what each left for its end
    monkeypatch.setattr(host_side, "fork_available", lambda: False)
    left = stages_left_at_finish(monkeypatch)
    images = stream_images(workload, params, result.graph, result.tensors, 2)
    run = run_stream(load_package(result.package), result.graph, result.tensors, images)
    assert run.passed and left == [0, 0]
    assert all(len(v.stages) > 4 * 10 for v in run.verdicts)  # four layers' stages judged


def test_capacity_refuses_chip_counts_before_building_the_model(monkeypatch, cache_dir):
    """Counts whose memory cannot hold pe-giant's weights, and a pipeline the footprint
    refuses, are answered from the parameters alone: the model is never built (its FP8
    calibration took about four minutes before the answer)."""
    from dataclasses import replace

    from ipu_stack.workloads.base import REGISTRY

    def built(params):
        raise AssertionError("the workload was built")
    monkeypatch.setitem(REGISTRY, "pe-giant", replace(REGISTRY["pe-giant"], build=built))
    code, out, err = cli(["capacity", "pe-giant", "--max-chips", "2", "--json",
                          "--cache-dir", str(cache_dir)])
    record = json.loads(out)
    assert code == 2 and record["minimumChips"] == 0, err
    assert record["tried"]["1"].startswith("the weights alone take at least 1")
    assert "does not fit" in record["tried"]["2"]
    assert record["compiles"] == 1  # one chip was refused from the weights alone
