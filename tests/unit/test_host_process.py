"""The host side in its own process: the same verdict as on a thread, its failures come back
as the same error, and a device failure stops it."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from ipu_stack.device.simulator import SimulatedIpu
from ipu_stack.pipeline import CompileOptions, compile_workload
from ipu_stack.runtime.execute import run_package
from ipu_stack.runtime.session import load_package
from ipu_stack.util.errors import CompileError, DeviceFault
from ipu_stack.verdict import host_process, host_side
from ipu_stack.workloads import get_workload

pytestmark = pytest.mark.skipif(not host_process.fork_available(), reason="no fork here")


@pytest.fixture(scope="module")
def compiled(tmp_path_factory, cache_dir):
    workload = get_workload("siglip-layer")
    params = workload.resolve({"tokens": 17, "dim": 64, "hidden": 96, "heads": 4})
    result = compile_workload(workload, params, tmp_path_factory.mktemp("host"),
                              CompileOptions(cache_dir=str(cache_dir), diagnostics=True))
    return result


def _run(compiled):
    tensors = dict(compiled.tensors)
    return run_package(load_package(compiled.package), compiled.graph, tensors)


def test_process_and_thread_give_the_same_verdict(compiled, monkeypatch):
    forked = _run(compiled)
    monkeypatch.setattr(host_side, "fork_available", lambda: False)
    threaded = _run(compiled)
    assert forked.passed and threaded.passed
    assert [(s.stage, s.max_ulps, s.mismatch, s.elements) for s in forked.verdict.stages] == [
        (s.stage, s.max_ulps, s.mismatch, s.elements) for s in threaded.verdict.stages]
    assert len(forked.verdict.stages) > 3  # every probed stage was judged in the child
    assert forked.verdict.fidelity == threaded.verdict.fidelity
    for name, values in threaded.reference.items():
        if name in forked.reference:
            np.testing.assert_array_equal(np.asarray(forked.reference[name], np.float32),
                                          np.asarray(values, np.float32))
    assert set(forked.reference) == {v.name for v in compiled.graph.by_role("output")}


def test_a_failure_in_the_child_is_raised_as_the_same_error(compiled, monkeypatch):
    def broken(*args, **kwargs):
        raise CompileError("the reference could not be built")

    monkeypatch.setattr(host_side, "host_side", broken)
    with pytest.raises(CompileError, match="the reference could not be built"):
        _run(compiled)


def test_a_device_failure_stops_the_child(compiled, monkeypatch):
    original = SimulatedIpu.call

    def failing(self, program, tensors, on_probes=None):
        if program == "run":
            raise DeviceFault("tile 3 caught fire")
        return original(self, program, tensors, on_probes)

    monkeypatch.setattr(SimulatedIpu, "call", failing)
    started = time.perf_counter()
    with pytest.raises(DeviceFault, match="tile 3 caught fire"):
        _run(compiled)
    assert time.perf_counter() - started < 60


def test_arrays_cross_the_pipe_unchanged(tmp_path: Path):
    import multiprocessing

    from ipu_stack.ir.precision import f143
    from ipu_stack.ir.values import StoredTensor

    parent, child = multiprocessing.get_context("fork").Pipe()
    codes = np.arange(256, dtype=np.uint8).view(f143(-3).dtype).reshape(16, 16)
    values = np.linspace(-3, 3, 35, dtype=np.float32).reshape(5, 7)
    host_process._send_items(parent, [("probe", StoredTensor(f143(-3), codes)), ("out", values)])
    header = host_process.json.loads(child.recv_bytes())
    assert header == {"kind": "items", "count": 2}
    name, stored = host_process._receive_array(child)
    assert name == "probe" and stored.precision == f143(-3)
    assert stored.stored.tobytes() == codes.tobytes() and stored.stored.dtype == codes.dtype
    name, array = host_process._receive_array(child)
    assert name == "out" and np.array_equal(array, values) and array.flags.writeable
