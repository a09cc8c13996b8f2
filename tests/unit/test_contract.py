"""The typed device program: wire form round trip, the one verifier, bounds before sizing."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

from ipu_stack.contract import (
    Compute,
    DeviceProgram,
    Exchange,
    HostRead,
    Loop,
    from_manifest,
    to_manifest,
    verify_program,
)
from ipu_stack.pipeline import CompileOptions, compile_workload
from ipu_stack.runtime.session import load_package
from ipu_stack.target import IPU21
from ipu_stack.util.errors import DeviceFault, PackageError
from ipu_stack.workloads import get_workload

CASES = {
    "siglip-mlp": {"tokens": 17, "dim": 64, "hidden": 96},
    "siglip-vision": {"layers": 2, "image": 28, "patch": 7, "dim": 64, "hidden": 96, "heads": 4},
}


@pytest.fixture(scope="module", params=sorted(CASES))
def compiled(request, tmp_path_factory, cache_dir):
    """A real compiled program: the typed form codegen made and the package it wrote."""
    name = request.param
    workload = get_workload(name)
    out = tmp_path_factory.mktemp(name)
    result = compile_workload(workload, workload.resolve(dict(CASES[name])), out,
                              CompileOptions(cache_dir=str(cache_dir)))
    return result.device_program, load_package(result.package)


def test_program_survives_manifest_round_trip(compiled):
    program, package = compiled
    assert isinstance(program, DeviceProgram)
    read = from_manifest(package.manifest, package.arrays)
    assert read == program
    fragment, arrays = to_manifest(read)
    again = from_manifest({**package.manifest, **fragment}, arrays)
    assert again == program
    # the written arrays are exactly the package's (names, dtypes, bytes)
    for name, array in arrays.items():
        stored = package.arrays[name]
        assert stored.dtype == array.dtype and np.array_equal(stored, array), name


def test_equality_is_by_value(compiled):
    program, _ = compiled
    exchange = next(s for s in program.run if isinstance(s, Exchange))
    moved = copy.deepcopy(exchange)
    assert moved == exchange
    moved.dst_addr[0] += 4
    assert moved != exchange


def test_tower_program_has_typed_loop(compiled):
    program, _ = compiled
    loops = [s for s in program.run if isinstance(s, Loop)]
    if program.run and any(isinstance(s, HostRead) and s.passes for s in program.run):
        assert len(loops) == 1 and loops[0].count == 2
        assert all(t.shape == (2, IPU21.tiles) for t in loops[0].slots)


def _with(package, edit) -> tuple[dict, dict]:
    manifest = copy.deepcopy(package.manifest)
    arrays = dict(package.arrays)
    edit(manifest, arrays)
    return manifest, arrays


def _first(manifest: dict, kind: str) -> dict:
    return next(s for s in manifest["programs"]["run"] if s["kind"] == kind)


def test_verifier_refuses_an_access_outside_tile_memory(compiled):
    _, package = compiled

    def edit(manifest, arrays):
        call = _first(manifest, "compute")["calls"][0]
        moved = arrays[call["addresses"]].copy()
        moved[0, 0] = IPU21.memory_end - 4
        arrays[call["addresses"]] = moved

    program = from_manifest(*_with(package, edit))
    with pytest.raises(PackageError, match=r"run step \d+ \(compute\) \S+ accesses address "
                                           r"\d+ outside tile memory"):
        verify_program(program, IPU21)


def test_verifier_refuses_a_tile_that_does_not_exist(compiled):
    _, package = compiled

    def edit(manifest, arrays):
        step = _first(manifest, "exchange")
        tiles = arrays[step["dst_tile"]].copy()
        tiles[0] = IPU21.tiles + 3
        arrays[step["dst_tile"]] = tiles

    program = from_manifest(*_with(package, edit))
    with pytest.raises(PackageError, match=rf"names tile {IPU21.tiles + 3}, which does not "
                                           "exist on ipu21"):
        verify_program(program, IPU21)


def test_verifier_refuses_a_port_conflict(compiled):
    _, package = compiled

    def edit(manifest, arrays):
        step = _first(manifest, "exchange")
        starts = arrays[step["chunk_start"]].copy()
        starts[:] = 0  # every chunk at once: a tile sends two chunks in one cycle
        arrays[step["chunk_start"]] = starts

    manifest, arrays = _with(package, edit)
    step = _first(manifest, "exchange")
    if len(np.unique(arrays[step["src_tile"]])) == len(arrays[step["chunk_start"]]):
        pytest.skip("no tile sends twice in the first phase")
    with pytest.raises(DeviceFault, match="exchange schedule fault"):
        verify_program(from_manifest(manifest, arrays), IPU21)


def test_verifier_refuses_an_access_outside_live_allocations(compiled):
    _, package = compiled

    def edit(manifest, arrays):
        step = _first(manifest, "exchange")
        moved = arrays[step["dst_addr"]].copy()
        moved[0] = IPU21.memory_end - 64  # inside memory, outside every placed operand
        arrays[step["dst_addr"]] = moved

    with pytest.raises(DeviceFault, match=r"exchange \S+ destination on tile \d+ touches "
                                          r"\[\d+, \d+\) at step \d+, outside every operand"):
        verify_program(from_manifest(*_with(package, edit)), IPU21)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("a_pitch", 2**40, "parameter a_pitch: 1099511627776 exceeds the limit"),
    ("rows", -5, "parameter rows: expected an integer >= 1, found -5"),
    ("mode", "fp4", "parameter mode: expected one of fp8, f16, found 'fp4'"),
    ("b_transposed", 1, "parameter b_transposed: expected true or false, found 1"),
    ("tables", 7, "parameter tables: expected one of 1, 2, found 7"),
])
def test_kernel_parameters_are_bounded_before_anything_is_sized(compiled, key, value, message):
    _, package = compiled

    def edit(manifest, arrays):
        for kernel in manifest["kernels"]:
            if kernel["family"] == "gemm":
                kernel["params"][key] = value

    with pytest.raises(PackageError, match=r"package program is invalid: kernel \d+ " + message):
        from_manifest(*_with(package, edit))


def test_compute_steps_are_typed(compiled):
    program, _ = compiled
    computes = [s for s in program.run if isinstance(s, Compute)]
    assert computes and all(c.calls for c in computes)
    for step in computes:
        for call in step.calls:
            assert call.tiles.dtype == np.int32 and call.addresses.dtype == np.int64
            assert call.addresses.shape[0] == call.tiles.shape[0]
            assert 0 <= call.kernel < len(program.kernels)


def test_load_runs_the_same_verifier(compiled, tmp_path: Path):
    """The device refuses what the verifier refuses, with the same line."""
    from ipu_stack.device import SimulatedIpu
    from ipu_stack.package import Package

    _, package = compiled

    def edit(manifest, arrays):
        call = _first(manifest, "compute")["calls"][0]
        moved = arrays[call["addresses"]].copy()
        moved[0, 0] = IPU21.memory_end - 4
        arrays[call["addresses"]] = moved

    manifest, arrays = _with(package, edit)
    with pytest.raises(PackageError, match="outside tile memory"):
        SimulatedIpu(IPU21).load(Package(manifest, arrays, package.sha256, package.target,
                                         package.compiler_version))


def test_a_tensor_too_large_to_hold_is_refused_before_sizing(compiled):
    _, package = compiled

    def edit(manifest, arrays):
        name = next(iter(manifest["tensors"]))
        manifest["tensors"][name]["shape"] = [1 << 20, 1 << 20]

    with pytest.raises(PackageError, match=r"holds more than 1073741824 elements"):
        from_manifest(*_with(package, edit))


def test_a_tile_number_beyond_int32_is_refused_not_wrapped(compiled):
    _, package = compiled

    def edit(manifest, arrays):
        call = _first(manifest, "compute")["calls"][0]
        tiles = arrays[call["tiles"]].astype(np.int64)
        tiles[0] = (1 << 32) - 5  # would wrap to tile -5 as int32
        arrays[call["tiles"]] = tiles

    with pytest.raises(PackageError, match=r"tile or slot number 4294967291 is out of range"):
        from_manifest(*_with(package, edit))


@pytest.mark.parametrize("value", [1 << 62, -5])
def test_an_address_that_would_overflow_the_range_check_is_refused(compiled, value):
    """``address + length`` must not wrap around int64 past the verifier's range check."""
    _, package = compiled

    def edit(manifest, arrays):
        step = _first(manifest, "exchange")
        moved = arrays[step["src_addr"]].copy()
        moved[0] = value
        arrays[step["src_addr"]] = moved

    with pytest.raises(PackageError, match=rf"holds {value}, outside \[-1, 4294967296\]"):
        from_manifest(*_with(package, edit))
