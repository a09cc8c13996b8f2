"""``--dump-stages``: every stage's artifact, consistent with what the compile produced; and
the stages' names: what each does, and the reference's phase name it is logged and dumped
under."""

from __future__ import annotations

import hashlib
import json
import logging
import re

from ipu_stack.cli import main
from ipu_stack.package import read_package
from ipu_stack.phases.dump import ARTIFACTS
from ipu_stack.phases.state import CompileOptions
from ipu_stack.pipeline import EMITTING, LOWERING, PLANNING, STAGES, compile_workload
from ipu_stack.workloads import get_workload

SMALL = ["siglip-mlp", "--tokens", "17", "--dim", "64", "--hidden", "96"]


def test_each_stage_writes_its_artifact(tmp_path, cache_dir):
    dump = tmp_path / "stages"
    code = main(["--quiet", "compile", *SMALL, "-o", str(tmp_path / "a"), "--cache-dir",
                 str(cache_dir), "--dump-stages", str(dump)])
    assert code == 0
    names = sorted(p.name for p in dump.iterdir())
    assert names == ["01-construct_mid.txt", "02-lower_mid.json", "03-select_finalist.txt",
                     "04-plan_kernels.json", "05-size_tile_code.json", "06-place_storage.json",
                     "07-write_memory_reports.txt", "08-emit_tile_code.json",
                     "09-write_package.txt"]
    package_path = tmp_path / "a" / "model.ipuexe"
    package = read_package(package_path)
    graph = (dump / "01-construct_mid.txt").read_text()
    assert graph.startswith("graph ") and " = matmul(" in graph
    program = json.loads((dump / "08-emit_tile_code.json").read_text())["program"]
    assert program["kernels"] == package.manifest["kernels"]
    assert len(program["programs"]["run"]) == len(package.manifest["programs"]["run"])
    kernels = json.loads((dump / "04-plan_kernels.json").read_text())
    assert {k["key"] for k in kernels} == {k["key"] for k in package.manifest["kernels"]}
    plans = (dump / "03-select_finalist.txt").read_text()
    assert all(plan in plans for plan in package.manifest["plans"])
    digest = hashlib.sha256(package_path.read_bytes()).hexdigest()
    assert (dump / "09-write_package.txt").read_text().split()[-1] == digest


def test_dumping_does_not_change_the_package(tmp_path, cache_dir):
    for folder, extra in (("plain", []), ("dumped", ["--dump-stages", str(tmp_path / "d")])):
        assert main(["--quiet", "compile", *SMALL, "-o", str(tmp_path / folder),
                     "--cache-dir", str(cache_dir), *extra]) == 0
    plain, dumped = ((tmp_path / f / "model.ipuexe").read_bytes() for f in ("plain", "dumped"))
    assert plain == dumped


LOGGED = ["construct_mid", "lower_mid", "select_finalist", "plan_kernels", "size_tile_code",
          "place_storage", "write_memory_reports", "emit_tile_code", "write_package"]


def test_stages_are_named_for_what_they_do_and_logged_in_the_references_words():
    assert [s.logged_as for s in STAGES] == LOGGED
    assert [s.name for s in STAGES] == [
        "build_graph_and_tilings", "choose_fitting_plans", "lower_and_schedule_finalists",
        "list_kernel_instances", "size_support_memory", "place_buffers",
        "write_memory_reports", "emit_device_program", "write_package"]
    assert all(s.run.__name__ == s.name for s in STAGES)
    assert sorted(ARTIFACTS) == sorted(s.name for s in STAGES)
    assert PLANNING + LOWERING + EMITTING == STAGES
    assert [s.number for s in STAGES] == list(range(1, len(STAGES) + 1))
    # the program is verified after it is lowered, the placement after it is made
    assert [s.name for s in STAGES if s.verify] == ["lower_and_schedule_finalists",
                                                    "place_buffers"]


def test_phase_lines_carry_the_logged_names_in_order(tmp_path, cache_dir, caplog):
    workload = get_workload("siglip-mlp")
    params = workload.resolve({"tokens": 17, "dim": 64, "hidden": 96})
    with caplog.at_level(logging.INFO, logger="ipu_stack"):
        compile_workload(workload, params, tmp_path, CompileOptions(cache_dir=str(cache_dir)))
    phases = [found.group(1) for r in caplog.records
              if (found := re.search(r"build phase finished phase=(\w+)", r.getMessage()))
              and found.group(1) != "gemm_candidates"]
    assert phases == LOGGED
