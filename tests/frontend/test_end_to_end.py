"""Imported models compiled, run on the simulated ipu21 and judged against PyTorch itself.

Small configs (2 layers of width 64, 16 patches + CLS) so the module runs in well under a
minute; the full-size Hugging Face towers are in ``benchmarks/bench_frontend.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ipu_stack.frontend import import_program, make_workload  # noqa: E402
from ipu_stack.frontend import walk as walk_module  # noqa: E402
from ipu_stack.ir.interpret import evaluate  # noqa: E402
from ipu_stack.pipeline import CompileOptions, compile_workload  # noqa: E402
from ipu_stack.runtime.execute import run_package  # noqa: E402
from ipu_stack.runtime.groups import read_system  # noqa: E402
from ipu_stack.runtime.record import run_record  # noqa: E402
from ipu_stack.util.errors import ConversionError  # noqa: E402
from tests.frontend.models import TinyVit, export  # noqa: E402


def _peaked_vit():
    torch.manual_seed(3)
    return export(TinyVit(layers=2, sharpen=5.0, gelu="tanh"), torch.randn(2, 3, 32, 32))


def _run(program, precision: str, tmp_path: Path, cache_dir: Path, lock_path: Path,
         **extra):
    workload = make_workload(program, "tiny")
    params = workload.resolve({"precision": precision, **extra})
    result = compile_workload(workload, params, tmp_path / workload.identifier(params),
                              CompileOptions(cache_dir=str(cache_dir)))
    from ipu_stack.runtime.session import load_package

    run = run_package(load_package(result.package), result.graph, result.tensors, lock_path,
                      model=workload.reference)
    record = run_record(run, run.package, read_system(run.package), result.graph,
                        workload.benchmark_fields(params), result.package, None)
    return result, run, record


def test_peaked_attention_passes_against_torch_at_fp8(tmp_path: Path, cache_dir: Path,
                                                      lock_path: Path) -> None:
    program = _peaked_vit()
    result, run, record = _run(program, "fp8", tmp_path, cache_dir, lock_path)
    assert record["numericalTest"] == "PASS", record
    assert record["referenceSource"] == "torch"
    assert record["conversionError"] < 1e-5
    assert record["gemmModes"]  # the GEMMs ran
    # the test data makes attention peaked: most rows put over half their weight on one key
    values = evaluate(result.graph, result.tensors)
    probs = [values[result.graph.value(op.outputs[0]).name] for op in result.graph.operations
             if op.kind == "softmax"]
    assert len(probs) == 2 and all(np.mean(p.max(axis=-1) > 0.5) > 0.5 for p in probs)
    # fidelity is measured against torch: the device's error against torch's float32 output
    device = next(iter(run.outputs.values())).reshape(-1).astype(np.float64)
    with torch.no_grad():
        torch_out = program.module()(torch.from_numpy(_inputs(program))).numpy().reshape(-1)
    error = device - torch_out
    assert np.sqrt(np.mean(error**2)) == pytest.approx(run.verdict.fidelity.rms_error, rel=1e-4)


def test_attention_in_fp8_passes_against_torch(tmp_path: Path, cache_dir: Path,
                                              lock_path: Path) -> None:
    """``--attention fp8`` on an imported model (the eager q @ k^T pattern): both products of
    every layer read FP8 operands written by their producers (no cast added), the run
    PASSes against torch, and the identifier and record say which attention ran."""
    program = _peaked_vit()
    result, run, record = _run(program, "fp8", tmp_path, cache_dir, lock_path,
                               attention="fp8")
    graph = result.graph
    products = [op for op in graph.operations if op.kind == "head_matmul"]
    assert len(products) == 4
    for op in products:
        for operand in op.inputs:
            assert graph.value(operand).type.precision.is_fp8
            assert graph.producer(operand).kind != "cast"
    assert record["numericalTest"] == "PASS", record
    assert record["attention"] == "fp8"
    assert result.package.parent.name.endswith("-attnfp8")
    f16 = import_program(program, precision="fp8", name="tiny")
    assert sum(v.type.precision.is_fp8 for v in f16.graph.values) + 8 == sum(
        v.type.precision.is_fp8 for v in graph.values)  # q, k, v, probs of each layer


def test_attention_operand_read_elsewhere_keeps_f16() -> None:
    """An attention operand that something else reads too is not rounded to FP8 for it:
    that product keeps F16 and the import says why."""

    class Shared(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = torch.nn.Linear(32, 96)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q, k, v = self.qkv(x).view(1, 8, 3, 2, 16).permute(2, 0, 3, 1, 4)
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v)
            return o.transpose(1, 2).reshape(1, 8, 32) + v.transpose(1, 2).reshape(1, 8, 32)

    torch.manual_seed(5)
    imported = import_program(export(Shared(), torch.randn(1, 8, 32)), precision="fp8",
                              attention="fp8")
    graph = imported.graph
    qk, pv = [op for op in graph.operations if op.kind == "head_matmul"]
    assert all(graph.value(i).type.precision.is_fp8 for i in qk.inputs)
    assert not any(graph.value(i).type.precision.is_fp8 for i in pv.inputs)
    assert any("kept in F16" in r for r in imported.converted.rewrites)


def test_an_imports_weights_are_held_once() -> None:
    """The exact weights are read-only views of the loaded program's parameters (no float32
    copy), and the device's weights are held as their storage codes (one byte an FP8
    weight), so an imported model costs little more than the program it was loaded from."""
    from ipu_stack.ir.values import StoredTensor

    torch.manual_seed(6)
    program = export(TinyVit(layers=1), torch.randn(1, 3, 32, 32))
    imported = import_program(program, precision="fp8")
    params = [t.detach().numpy() for t in program.state_dict.values()]
    graph = imported.graph
    matrices = [v.name for v in graph.by_role("weight") if v.type.precision.is_fp8]
    assert matrices
    for name in matrices:
        exact = imported.converted.exact[name]
        assert not exact.flags.writeable
        assert any(np.shares_memory(exact, held) for held in params), name
        stored = imported.converted.tensors[name]
        assert isinstance(stored, StoredTensor) and stored.nbytes == exact.size
        value = graph.value(next(v.id for v in graph.values if v.name == name))
        np.testing.assert_array_equal(np.asarray(stored), value.type.precision.round_trip(exact))


def test_a_files_program_is_let_go_once_imported_and_loaded_again(tmp_path, monkeypatch
                                                                  ) -> None:
    """A ``.pt2``'s program is dropped after its import (the run holds the device's weights,
    not torch's) and loaded again, its sha256 checked, when another import needs it."""
    import gc
    import weakref

    from ipu_stack.frontend import workload as imported
    from ipu_stack.util.errors import UsageError

    torch.manual_seed(7)
    path = tmp_path / "tiny.pt2"
    torch.export.save(export(TinyVit(layers=1), torch.randn(1, 3, 32, 32)), str(path))
    loads, load = [], imported.load_program

    def counted(where):
        loads.append(load(where))
        return loads[-1]
    monkeypatch.setattr(imported, "load_program", counted)
    workload, base = imported.imported_workload(path)
    params = workload.resolve({**base, "precision": "f16"})
    graph, _ = workload.build(params)
    first = weakref.ref(loads.pop())
    gc.collect()
    assert first() is None  # nothing holds the loaded program
    assert workload.benchmark_fields(params)["inputShapes"] == "1x3x32x32"  # kept
    again, _ = workload.build({**params, "seed": 1})  # another import: loaded again
    assert len(loads) == 1 and again.dump() == graph.dump()
    path.write_bytes(path.read_bytes() + b"\0")
    with pytest.raises(UsageError, match="changed since the package was compiled"):
        workload.build({**params, "seed": 2})


def _inputs(program) -> np.ndarray:
    from ipu_stack.frontend.user_inputs import random_inputs

    return random_inputs(program, 0)[0]


def test_mean_pooled_model_passes_at_f16(tmp_path: Path, cache_dir: Path,
                                         lock_path: Path) -> None:
    torch.manual_seed(4)
    program = export(TinyVit(layers=1, pool=True, cls=False), torch.randn(1, 3, 32, 32))
    result, run, record = _run(program, "f16", tmp_path, cache_dir, lock_path)
    assert record["numericalTest"] == "PASS", record
    assert record["gemmModes"] == "f16"
    out = next(iter(run.outputs.values())).reshape(16, -1)
    np.testing.assert_array_equal(out, np.broadcast_to(out[:1], out.shape))  # replicated rows


def test_a_small_qk_error_is_caught_by_the_conversion_check(monkeypatch) -> None:
    """Mutation check: with peaked attention, a 3% error in the softmax scale (a q/k-path
    error) moves the outputs far past the conversion check's limit."""
    program = _peaked_vit()
    assert import_program(program, precision="f16").conversion_error < 1e-5
    original = walk_module.Importer.run

    def skewed(self):
        result = original(self)
        for op in result.graph.operations:
            if op.kind == "softmax":
                op.attrs["scale"] *= 1.03
        return result

    monkeypatch.setattr(walk_module.Importer, "run", skewed)
    with pytest.raises(ConversionError, match="conversion check failed"):
        import_program(program, precision="f16")


def test_every_weight_comes_from_the_state_dict() -> None:
    torch.manual_seed(5)
    module = TinyVit(layers=1)
    program = export(module, torch.randn(1, 3, 32, 32))
    imported = import_program(program, precision="fp8")
    state = {k: v.detach().numpy() for k, v in module.state_dict().items()}
    fc1 = imported.converted.exact["blocks.0.fc1.weight"]
    np.testing.assert_array_equal(fc1, state["blocks.0.fc1.weight"].T)
    graph = imported.graph
    gemm = {op.inputs[1] for op in graph.operations if op.kind == "matmul"}
    weights = graph.by_role("weight")
    assert gemm and all(graph.value(i).type.precision.kind == "F8F143" for i in gemm)
    others = [v for v in weights if v.id not in gemm]
    assert others and all(v.type.precision.kind == "F16" for v in others)
    # the position table (with the CLS token folded in) is one F16 weight, added once
    adds = [op for op in graph.operations if op.kind == "add"
            and graph.value(op.inputs[1]).role == "weight"]
    assert len(adds) == 1 and graph.value(adds[0].inputs[1]).type.shape == (17, 64)


class LayerScaled(torch.nn.Module):
    """PE's layer scale: ``x + gamma * fc(x)``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(32, 32)
        self.gamma = torch.nn.Parameter(torch.rand(32) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(x) * self.gamma


def test_layer_scale_is_folded_into_the_weights() -> None:
    torch.manual_seed(12)
    module = LayerScaled()
    imported = import_program(export(module, torch.randn(1, 8, 32)), precision="f16")
    assert imported.conversion_error < 1e-5
    assert [op.kind for op in imported.graph.operations] == ["matmul", "bias_add", "add"]
    expected = (module.fc.weight * module.gamma[:, None]).detach().numpy().T
    np.testing.assert_allclose(imported.converted.exact["fc.weight"], expected, rtol=1e-6)


def test_a_classifier_chooses_its_label_on_the_device(tmp_path: Path, cache_dir: Path,
                                                      lock_path: Path) -> None:
    """``--choose device`` on an imported classifier: the output is each image's label
    (an argmax where the last product leaves its logits), the logits still judged against
    PyTorch's, and the host reads 4 bytes an image instead of its logits."""
    torch.manual_seed(5)

    class Classifier(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.hidden, self.head = torch.nn.Linear(32, 64), torch.nn.Linear(64, 700)

        def forward(self, x):
            return self.head(torch.nn.functional.gelu(self.hidden(x)))

    program = export(Classifier().eval(), torch.randn(3, 32))
    records = {}
    for choose in ("host", "device"):
        result, run, records[choose] = _run(program, "f16", tmp_path / choose, cache_dir,
                                            lock_path, choose=choose)
        assert records[choose]["numericalTest"] == "PASS", records[choose]
    (images,) = result.graph.by_role("input")  # the run's own (seeded) images
    logits = program.module()(torch.as_tensor(result.tensors[images.name])).detach().numpy()
    labels = run.outputs["next_token"].reshape(-1).astype(int)
    top = np.sort(logits, axis=1)
    chosen = logits[np.arange(3), labels]
    assert (chosen >= top[:, -2] - 1e-2).all()  # torch's best, or within F16 of it
    assert records["device"]["hostBytes"] == records["host"]["hostBytes"] - 3 * 700 * 2 + 3 * 4
