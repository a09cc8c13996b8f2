"""``--dump-stages``: every stage's artifact, consistent with what the compile produced."""

from __future__ import annotations

import hashlib
import json

from ipu_stack.cli import main
from ipu_stack.package import read_package

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
