"""Poison mode: reading memory that nothing wrote is a fault naming tile, address and phase."""

from __future__ import annotations

from pathlib import Path

import pytest

from ipu_stack.device import simulator
from ipu_stack.pipeline import CompileOptions, compile_workload
from ipu_stack.runtime.execute import run_package
from ipu_stack.runtime.session import load_package
from ipu_stack.util.errors import DeviceFault
from ipu_stack.workloads import get_workload


def _compiled(tmp_path: Path, cache_dir: Path, name: str, **params):
    workload = get_workload(name)
    resolved = workload.resolve(params)
    result = compile_workload(workload, resolved, tmp_path, CompileOptions(cache_dir=str(cache_dir)))
    return load_package(result.package), result.graph, result.tensors


@pytest.mark.parametrize("name", ["siglip-mlp", "siglip-layer", "pe-block"])
def test_compiled_programs_never_read_unwritten_memory(tmp_path, cache_dir, lock_path, name):
    package, graph, tensors = _compiled(tmp_path, cache_dir, name, tokens=17, dim=64, hidden=96,
                                        **({} if name == "siglip-mlp" else {"heads": 4}))
    assert run_package(package, graph, tensors, lock_path, poison=True).passed


def test_moving_padding_nothing_wrote_is_no_fault_until_a_kernel_reads_it(
        tmp_path, cache_dir, lock_path):
    """A reduce-scatter sends a ragged column block's whole rows, padding included; the
    padding's bytes arrive unwritten, as they left, and the reduce never reads them.  At
    these widths (49 tokens, 2 heads of 64) that move was a fault before definedness
    travelled with the words."""
    package, graph, tensors = _compiled(tmp_path, cache_dir, "siglip-layer", tokens=49,
                                        dim=128, hidden=256, heads=2)
    assert run_package(package, graph, tensors, lock_path, poison=True).passed


def test_missing_input_is_a_poison_fault(tmp_path, cache_dir, lock_path, monkeypatch):
    package, graph, tensors = _compiled(tmp_path, cache_dir, "siglip-mlp", tokens=17, dim=64,
                                        hidden=96)
    original = simulator.SimulatedIpu._host_write

    def forget_input(self, step, host):
        if step.tensor == "x":
            return 0  # the host never sends the input
        return original(self, step, host)

    monkeypatch.setattr(simulator.SimulatedIpu, "_host_write", forget_input)
    with pytest.raises(DeviceFault, match=r"poison: exchange stage0.operands sends from tile \d+ "
                                          r"address \d+, which was never written"):
        run_package(package, graph, tensors, lock_path, poison=True)


def test_kernel_reading_unwritten_weights_is_a_poison_fault(tmp_path, cache_dir, lock_path,
                                                             monkeypatch):
    package, graph, tensors = _compiled(tmp_path, cache_dir, "siglip-mlp", tokens=17, dim=64,
                                        hidden=96)
    original = simulator.SimulatedIpu._host_write

    def forget_weight(self, step, host):
        if step.tensor == "w1.0":
            return 0
        return original(self, step, host)

    monkeypatch.setattr(simulator.SimulatedIpu, "_host_write", forget_weight)
    with pytest.raises(DeviceFault, match=r"poison: gemm_f8\w* in stage0.gemm on tile \d+ reads "
                                          r"address \d+, which was never written"):
        run_package(package, graph, tensors, lock_path, poison=True)


def _tampered(package, edit):
    from ipu_stack.package import Package

    arrays = {k: v.copy() for k, v in package.arrays.items()}
    edit(package.manifest, arrays)
    return Package(package.manifest, arrays, package.sha256, package.target,
                   package.compiler_version)


def test_kernel_straying_outside_its_operand_is_a_fault(tmp_path, cache_dir):
    from ipu_stack.device import SimulatedIpu
    from ipu_stack.target import IPU21

    package, _, _ = _compiled(tmp_path, cache_dir, "siglip-mlp", tokens=17, dim=64, hidden=96)

    def shift_gemm_output(manifest, arrays):
        gemm = next(s for s in manifest["programs"]["run"] if s.get("name") == "stage0.gemm")
        arrays[gemm["calls"][0]["addresses"]][0, 2] += 64  # partial written 64 bytes too far

    bad = _tampered(package, shift_gemm_output)
    with pytest.raises(DeviceFault, match=r"kernel gemm_f8\w* in stage0.gemm on tile \d+ touches "
                                          r"\[\d+, \d+\) at step \d+, outside every operand"):
        SimulatedIpu(IPU21).load(bad)


def test_transfer_landing_outside_its_operand_is_a_fault(tmp_path, cache_dir):
    from ipu_stack.device import SimulatedIpu
    from ipu_stack.target import IPU21

    package, _, _ = _compiled(tmp_path, cache_dir, "siglip-mlp", tokens=17, dim=64, hidden=96)

    def shift_destination(manifest, arrays):
        step = next(s for s in manifest["programs"]["run"] if s["kind"] == "exchange")
        arrays[step["dst_addr"]][0] -= 4096  # into memory no live value owns

    with pytest.raises(DeviceFault, match=r"exchange stage0.operands destination on tile \d+ "
                                          r"touches \[\d+, \d+\) at step \d+, outside every"):
        SimulatedIpu(IPU21).load(_tampered(package, shift_destination))
