"""The typed system program: its wire form round trip, the verifier's refusals (each with its
message), hostile records refused in one line, and a fuzz of the records over seeds."""

from __future__ import annotations

import copy
import dataclasses
import json
import random

import numpy as np
import pytest
from tests.helpers import cli, one_error_line

from ipu_stack.contract.system import (
    Steps,
    system_from_manifest,
    system_to_manifest,
    verify_system,
)
from ipu_stack.exchange import Transfers
from ipu_stack.package import write_package
from ipu_stack.pipeline import CompileOptions
from ipu_stack.runtime.groups import read_system
from ipu_stack.runtime.session import load_package
from ipu_stack.strategy import compile_pipeline
from ipu_stack.target import IPU21
from ipu_stack.util.errors import IpuStackError, PackageError
from ipu_stack.workloads import get_workload

TOWER = {"layers": 4, "image": 28, "patch": 7, "dim": 64, "hidden": 96, "heads": 4}


@pytest.fixture(scope="module", params=[1, 2], ids=["one-chip", "two-chips"])
def system_package(request, tmp_path_factory, cache_dir):
    workload = get_workload("siglip-vision")
    params = workload.resolve(dict(TOWER))
    folder = tmp_path_factory.mktemp(f"system{request.param}")
    result = compile_pipeline(workload, params, folder,
                              CompileOptions(cache_dir=str(cache_dir), chips=request.param),
                              groups=2)
    return load_package(result.package)


def test_the_package_is_a_verified_system_that_round_trips(system_package):
    system = read_system(system_package)
    chips = 2 if "system" in system_package.manifest else 1
    assert system.chips == chips and len(system.groups) == 2 * chips
    assert [g.chip for g in system.groups] == [k // 2 for k in range(2 * chips)]
    assert system.steps == Steps(2 * chips - 1, 2 * chips - 1)
    assert [h.link for h in system.handoffs] == [k % 2 == 1 for k in range(2 * chips - 1)]
    records, arrays = system_to_manifest(system)
    again = system_from_manifest({**system_package.manifest, **records}, arrays, "ipu21")
    assert again == system
    assert records["pipeline"] == system_package.manifest["pipeline"]
    for name, array in arrays.items():
        assert np.array_equal(array, system_package.arrays[name]), name


def _group(system, k, **fields):
    groups = list(system.groups)
    groups[k] = dataclasses.replace(groups[k], **fields)
    return dataclasses.replace(system, groups=tuple(groups))


def _handoff(system, k, **fields):
    handoffs = list(system.handoffs)
    handoffs[k] = dataclasses.replace(handoffs[k], **fields)
    return dataclasses.replace(system, handoffs=tuple(handoffs))


def _moved_transfers(system, k, tile):
    t = system.handoffs[k].transfers
    dst = t.dst.copy()
    dst[0] = tile
    return _handoff(system, k, transfers=Transfers(t.tiles, t.src, t.dst_offsets, dst, t.words))


def _late_chunk(system, k):
    s = system.handoffs[k].schedule
    words = s.chunk_words.copy()
    words[0] -= 1  # the chunks no longer move the transfer's words
    return _handoff(system, k, schedule=dataclasses.replace(s, chunk_words=words))


REFUSALS = [
    (lambda s: _group(s, 1, tile_base=s.groups[0].tile_base), "tiles overlap another group"),
    (lambda s: _group(s, 1, tile_base=IPU21.tiles - 2), "exceed the chip's 1472"),
    (lambda s: _group(s, 1, chip=1), "group 1 is on chip 1, not 0"),
    (lambda s: _group(s, 1, program=7), "group 1 runs program 7 of"),
    (lambda s: _group(s, 1, first_layer=s.groups[1].first_layer + 1), "not from"),
    (lambda s: _group(s, 0, input="patches"), "group 0 has an input hand-off"),
    (lambda s: _handoff(s, 0, tensor="other"), "hand-off 0 moves other"),
    (lambda s: _handoff(s, 0, receiver=0), "joins groups 0 and 0"),
    (lambda s: _handoff(s, 0, schedule=None), "has no exchange schedule"),
    (lambda s: _moved_transfers(s, 0, 0), "transfers leave its groups' tiles"),
    (lambda s: _late_chunk(s, 0), "hand-off 0's exchange"),
    (lambda s: dataclasses.replace(s, handoffs=s.handoffs[:-1]), "hand-offs join"),
    (lambda s: dataclasses.replace(s, steps=Steps(0, 0)), "fills and drains in"),
    (lambda s: dataclasses.replace(s, chips=9), "a C600 cluster holds 1 to 8 cards"),
    (lambda s: dataclasses.replace(s, chip_tiles=1216), "written for 1216 tiles"),
]


@pytest.mark.parametrize(("change", "message"), REFUSALS)
def test_the_verifier_refuses_what_the_machine_cannot_run(system_package, change, message):
    system = read_system(system_package)
    with pytest.raises(PackageError, match="system package is invalid") as refused:
        verify_system(change(system), IPU21)
    assert message in str(refused.value)
    assert "\n" not in str(refused.value)


RECORD_EDITS = [
    (lambda m, a: m["pipeline"].pop("groups"), "pipeline.groups: expected a list"),
    (lambda m, a: m["pipeline"]["groups"][1].update(tiles="many"),
     "pipeline.groups[1].tiles: expected an integer"),
    (lambda m, a: m["pipeline"]["groups"][0].update(first_layer=0.3),
     "expected a whole or half layer count"),
    (lambda m, a: m["pipeline"].update(groups=[{}] * 2000), "entries exceed the limit"),
    (lambda m, a: m["pipeline"]["handoffs"][0].update(transfers=10 ** 9), "the arrays hold"),
    (lambda m, a: a.pop("handoff.0.words"), "lacks the array handoff.0.words"),
    (lambda m, a: a.update({"handoff.0.src_tile": np.full(3, 1 << 40, np.int64)}),
     "values outside"),
    (lambda m, a: a.update({"handoff.0.words": np.zeros((2, 2), np.int64)}),
     "is not a 1-D integer array"),
    (lambda m, a: m["pipeline"]["handoffs"][0].update(link="yes"), "expected true or false"),
    (lambda m, a: m["pipeline"].update(steps=[]), "pipeline.steps: expected an object"),
]


@pytest.mark.parametrize(("edit", "message"), RECORD_EDITS)
def test_hostile_records_are_refused_before_anything_is_sized(system_package, edit, message):
    manifest = copy.deepcopy(system_package.manifest)
    arrays = dict(system_package.arrays)
    edit(manifest, arrays)
    with pytest.raises(PackageError, match="system package is invalid") as refused:
        verify_system(system_from_manifest(manifest, arrays, "ipu21"), IPU21)
    assert message in str(refused.value)


def _random_value(rng: random.Random):
    return rng.choice([None, True, -1, 0, 1, 3, 2 ** 31, 2 ** 62, 0.5, float("nan"), "x", "",
                       [], {}, [1, 2], {"a": 1}])


def _mutate(record, rng: random.Random) -> None:
    """Replace, delete or add one field somewhere in the (nested) record."""
    node = record
    while True:
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        if not keys:
            return
        key = rng.choice(keys)
        child = node[key]
        if isinstance(child, (dict, list)) and child and rng.random() < 0.7:
            node = child
            continue
        action = rng.random()
        if action < 0.7 or isinstance(node, list):
            node[key] = _random_value(rng)
        else:
            del node[key]
        return


@pytest.mark.parametrize("seed", range(7000, 7400))
def test_fuzzed_system_records_are_read_or_refused_never_crash(system_package, seed):
    rng = random.Random(seed)
    manifest = json.loads(json.dumps({k: system_package.manifest[k]
                                      for k in ("pipeline", "system")
                                      if k in system_package.manifest}))
    for _ in range(rng.randint(1, 3)):
        _mutate(manifest, rng)
    try:
        verify_system(system_from_manifest(manifest, dict(system_package.arrays), "ipu21"),
                      IPU21)
    except IpuStackError as refused:
        assert "\n" not in str(refused)


def test_the_cli_refuses_a_mutated_system_package_in_one_line(system_package, tmp_path):
    manifest = copy.deepcopy(system_package.manifest)
    manifest["pipeline"]["groups"][1]["tile_base"] = manifest["pipeline"]["groups"][0][
        "tile_base"]
    bad = tmp_path / "bad.ipuexe"
    write_package(bad, target=system_package.target,
                  compiler_version=system_package.compiler_version, manifest=manifest,
                  arrays=dict(system_package.arrays))
    for command in (["run", str(bad)], ["inspect", str(bad)]):
        line = one_error_line(*cli(command)[::2])
        assert "system package is invalid: group 1's tiles overlap" in line, command


def test_groups_that_disagree_with_their_tower_are_refused_before_running(system_package,
                                                                          tmp_path):
    """A group sharing an earlier group's program maps its names to the tower's: without
    one of them the group would load another layer's weight, and that layer's goes unloaded;
    a GEMM mode routed to an operation that is no matmul would round the wrong product."""
    shared = [g for g in system_package.manifest["pipeline"]["groups"] if g["names"]]
    if not shared:
        pytest.skip("no group shares a program here")
    edits = []
    weight = next(k for k in shared[0]["names"] if k.endswith(".w") or k.endswith(".b"))
    edits.append((lambda m: m["pipeline"]["groups"][shared[0]["index"]]["names"].pop(weight),
                  "loads the tower's weight"))
    edits.append((lambda m: m["pipeline"]["groups"][0]["source_ops"].reverse(),
                  "names no matmul of the tower"))
    for number, (edit, message) in enumerate(edits):
        manifest = copy.deepcopy(system_package.manifest)
        edit(manifest)
        bad = tmp_path / f"bad{number}.ipuexe"
        write_package(bad, target=system_package.target,
                      compiler_version=system_package.compiler_version, manifest=manifest,
                      arrays=dict(system_package.arrays))
        line = one_error_line(*cli(["run", str(bad), "--engine", "inprocess"])[::2])
        assert message in line, line
