"""The pipeline strategy through the real CLI: bench, inspect, run and profile of a small
tower cut into two groups, the auto strategy's fall-back, and the one-line refusals."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from tests.helpers import bench, cli, one_error_line

TOWER = ["--layers", "4", "--image", "28", "--patch", "7", "--dim", "64", "--hidden", "96",
         "--heads", "4"]


@pytest.fixture(scope="module")
def piped(tmp_path_factory, cache_dir):
    folder = tmp_path_factory.mktemp("piped")
    return bench("siglip-vision", *TOWER, "--strategy", "pipeline", "--groups", "2",
                 "--images", "3", "--profile", str(folder / "profile"), folder=folder,
                 cache_dir=cache_dir)


def test_bench_streams_every_image_through_the_groups(piped):
    record = piped.record
    assert record["numericalTest"] == "PASS" and record["imagesPassed"] == 3
    assert record["strategy"] == "pipeline" and record["pipelineGroups"] == 2
    assert record["groupLayers"] == "2,2" and record["groupTiles"] == 736
    assert record["cycles"] == record["stepCycles"] >= record["groupCyclesMax"]
    assert record["groupCyclesMin"] <= record["groupCyclesMax"]
    # the host sides are forked processes: the largest one's peak comes back with its verdict
    assert isinstance(record["hostPeakBytes"], int) and record["hostPeakBytes"] > 2**20
    assert record["latencyMicroseconds"] > record["cycles"] / 1500  # two steps at least
    assert record["imagesPerSecond"] == pytest.approx(1.5e9 / record["cycles"], rel=1e-3)
    # an image's host transfers (its pixels in, its outputs out) are added to its step
    assert record["qps"] == record["imagesPerSecond"]
    assert record["hostMicroseconds"] > 0
    assert record["qpsWithHost"] == pytest.approx(
        1 / (record["cycles"] / 1.5e9 + record["hostMicroseconds"] * 1e-6), rel=1e-3)
    assert record["handoffCycles"] > 0 and record["fillCycles"] > 0
    # the planner merges the groups' priced supersteps as the chip runs them: its step is
    # the executed one, alignment included
    assert record["estimatedCycles"] == record["cycles"] and record["estimateError"] == 0
    assert record["alignmentCycles"] == \
        record["cycles"] - record["groupCyclesMax"] - record["handoffCycles"] >= 0
    assert "pipeline grouping chosen groups=2" in piped.stderr
    assert (piped.folder / "profile" / "report.html").read_text().count("group 1: layers") >= 1


def test_the_pipeline_profile_names_each_groups_layers(piped):
    """Both groups run one program (compiled for layers 0-1); the merged supersteps name
    the layers each group ran: group 1's parts are layers 2 and 3."""
    profile = json.loads((piped.folder / "profile" / "profile.json").read_text())["profile"]
    layers = {0: set(), 1: set()}
    for step in profile["steps"]:
        names = step["name"].split(" | ")
        parts = step["part"].split(" | ")
        assert len(names) == len(parts), step
        for name, part in zip(names, parts, strict=True):
            if name.startswith("g") and part.startswith("layer "):
                layers[int(name.split()[0][1:])].add(int(part.split()[1]))
    assert layers == {0: {0, 1}, 1: {2, 3}}
    # the report links each group program's placement page, relative to the report
    report = piped.folder / "profile" / "report.html"
    links = re.findall(r'class="placement-link" href="([^"]+)">(group \d: layers [\d-]+)<',
                       report.read_text())
    assert [label for _, label in links][:1] == ["group 0: layers 0-1"]
    assert all((report.parent / path).is_file() for path, _ in links)


def test_inspect_and_run_a_pipeline_package(piped):
    package = str(piped.folder / "pkg" / "model.ipuexe")
    code, out, err = cli(["inspect", package, "--json"])
    assert code == 0, err
    summary = json.loads(out)
    assert [g["layers"] for g in summary["groups"]] == [[0, 2], [2, 4]]
    assert summary["handoffs"][0]["tensor"] == "layer1.residual2"
    code, out, err = cli(["run", package, "--json"])
    assert code == 0, err
    again = json.loads(out.strip().splitlines()[-1])
    assert again["cycles"] == piped.record["cycles"] and again["images"] == 2


def test_a_pipeline_runs_with_poison_checks_and_saves_every_images_outputs(piped, tmp_path):
    package = str(piped.folder / "pkg" / "model.ipuexe")
    saved = tmp_path / "tensors"
    code, out, err = cli(["run", package, "--json", "--poison", "--save-tensors", str(saved)])
    assert code == 0, err[-3000:]
    again = json.loads(out.strip().splitlines()[-1])
    assert again["cycles"] == piped.record["cycles"] and again["imagesPassed"] == 2
    with np.load(saved / "outputs.npz") as outputs, \
            np.load(saved / "inputs_weights.npz") as given:
        assert sorted(outputs.files) == ["image0/post_ln.out", "image1/post_ln.out"]
        assert "patches" in given.files and "__precisions__" in given.files


def test_a_group_program_is_inspected_on_its_tiles_and_not_run_alone(piped):
    whole = piped.folder / "pkg" / "model.ipuexe"
    group = piped.folder / "pkg" / "group1" / "model.ipuexe"
    code, out, err = cli(["inspect", str(group), "--json"])
    assert code == 0, err
    summary = json.loads(out)
    assert summary["tiles"] == "736 of 1472: one pipeline group's program"
    assert summary["workload"].endswith(".group1")
    for command in ("run", "profile"):
        code, _, err = cli([command, str(group)])
        line = one_error_line(code, err)
        assert line == (f"error: {group} is one pipeline group's program (736 of 1472 tiles), "
                        f"which runs only inside its pipeline: run the pipeline's package "
                        f"{whole}")


def test_the_layers_strategy_streams_micro_batches(tmp_path, cache_dir):
    """A batch larger than one program holds: ``--images 3`` runs the batch-2 program three
    times on its loaded chip, each micro-batch executed, timed and judged."""
    one = bench("siglip-vision", *TOWER, "--batch", "2", "--save-tensors",
                str(tmp_path / "one"), folder=tmp_path / "a", cache_dir=cache_dir)
    three = bench("siglip-vision", *TOWER, "--batch", "2", "--images", "3", "--save-tensors",
                  str(tmp_path / "three"), "--profile", str(tmp_path / "profile"),
                  folder=tmp_path / "b", cache_dir=cache_dir)
    record = three.record
    assert record["numericalTest"] == "PASS" and record["imagesPassed"] == 3
    assert record["strategy"] == "layers" and record["pipelineGroups"] == 1
    # the same program: each micro-batch takes the one batch's cycles, whatever its values
    assert record["cycles"] == one.record["cycles"] == record["estimatedCycles"]
    assert record["totalCycles"] == 3 * record["cycles"] and record["fillCycles"] == 0
    assert record["qps"] == pytest.approx(2 * 1.5e9 / record["cycles"], rel=1e-3)
    assert record["rooflinePercent"] == one.record["rooflinePercent"]
    single = np.load(tmp_path / "one" / "outputs.npz")
    streamed = np.load(tmp_path / "three" / "outputs.npz")
    name = single.files[0]
    assert np.array_equal(streamed[f"image0/{name}"], single[name])  # the same first batch
    assert not np.array_equal(streamed[f"image1/{name}"], streamed[f"image0/{name}"])
    assert not np.array_equal(streamed[f"image2/{name}"], streamed[f"image1/{name}"])
    # the profile is of one micro-batch's step, with the package's own placement page
    profile = json.loads((tmp_path / "profile" / "profile.json").read_text())["profile"]
    assert profile["cycles"] == record["cycles"]
    assert [label for label, _ in profile["placement_pages"]] == ["the whole chip"]


def test_auto_falls_back_to_layers_with_the_reason(tmp_path, cache_dir):
    """And an engine asked for a run that has no chips to spread is said to go unused."""
    result = bench("siglip-mlp", "--tokens", "17", "--dim", "64", "--hidden", "96",
                   "--strategy", "auto", "--engine", "local", folder=tmp_path,
                   cache_dir=cache_dir)
    assert result.record["numericalTest"] == "PASS"
    assert "WARNING ipu_stack.runtime: --engine has no chips to spread: one program and one " \
           "image run in this process engine=local" in result.stderr
    assert "strategy chosen strategy=layers reason=\"no pipeline: " in result.stderr
    assert "has no repeated layers" in result.stderr


@pytest.mark.parametrize(("extra", "message"), [
    (["siglip-mlp", "--tokens", "17", "--strategy", "pipeline"],
     "cannot be pipelined: it has no repeated layers"),
    (["siglip-vision", *TOWER, "--strategy", "pipeline", "--groups", "5"],
     "cannot cut 4 layers into 5 groups"),
    (["siglip-vision", *TOWER, "--images", "0"], "--images must be at least 1"),
    (["siglip-vision", *TOWER, "--strategy", "pipeline", "--groups", "2", "--images", "1"],
     "--images 1 is fewer than the pipeline's 2 groups"),
    (["siglip-vision", *TOWER, "--strategy", "pipeline", "--images", "1"],
     "1 image cannot fill a pipeline of 2 or more groups"),
])
def test_refusals_are_one_line(tmp_path, extra, message):
    code, _, err = cli(["bench", *extra, "--out", str(tmp_path / "pkg")])
    assert code == 2
    assert message in one_error_line(code, err)


def test_sweep_takes_the_strategy_as_an_axis(tmp_path, cache_dir):
    from ipu_stack.cli import main
    from ipu_stack.sweep import read_results

    out = tmp_path / "sweep"
    code = main(["--quiet", "sweep", "siglip-vision", *TOWER, "--grid",
                 "strategy=layers,pipeline", "--grid", "groups=2", "-o", str(out),
                 "--workers", "1", "--cache-dir", str(cache_dir)])
    assert code == 0
    records = {r["strategy"]: r for r in read_results(out / "results.jsonl")}
    assert set(records) == {"layers", "pipeline"}
    assert all(r["status"] == "ok" for r in records.values())
    assert records["pipeline"]["pipelineGroups"] == 2
    assert records["layers"]["latencyMicroseconds"] == records["layers"]["deviceMicroseconds"]
    page = (out / "sweep.html").read_text()
    assert "pipeline" in page and "layers" in page


def test_a_compile_over_an_older_pipeline_removes_its_group_programs(piped, tmp_path,
                                                                      cache_dir):
    """The layers program compiled into the pipeline's folder leaves no group program
    beside it that the new package does not hold; other files stay."""
    import shutil

    out = tmp_path / "pkg"
    shutil.copytree(piped.folder / "pkg", out)
    (out / "group7").mkdir()
    (out / "group7" / "notes.txt").write_text("not a program")
    (out / "group1.notes").mkdir()
    (out / "group1.notes" / "model.ipuexe").write_bytes(b"kept: not a program's folder name")
    assert (out / "group0" / "model.ipuexe").is_file()
    code, _, err = cli(["compile", "siglip-vision", *TOWER, "--strategy", "layers",
                        "-o", str(out), "--cache-dir", str(cache_dir), "-v"])
    assert code == 0, err[-3000:]
    assert sorted(p.name for p in out.iterdir() if p.is_dir() and p.name.startswith("group")) \
        == ["group1.notes", "group7"]
    assert "stale group programs removed" in err and 'programs="group0,group1"' in err


def test_groups_sharing_a_chip_are_lowered_unfused(piped):
    """Superstep fusion would join a stem group's steps otherwise than the others', so the
    groups would no longer share supersteps: each group's program is lowered unfused."""
    from ipu_stack.runtime.session import load_package

    for folder in sorted((piped.folder / "pkg").glob("group*")):
        options = load_package(folder / "model.ipuexe").manifest["options"]
        assert options["fuse_window"] == 0, folder.name
