"""The vision towers of issue 23 at small widths (2 layers of width 64): each imports exactly
(the conversion check against torch's float32 output), maps to the operations it should
(quick GELU, tanh, SwiGLU, RMS norm, biased softmax, split-halves RoPE), and runs on the
simulated ipu21 to a PASS against torch.  Full widths: ``python benchmarks/bench_frontend.py
zoo`` (``docs/frontend.md``)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from ipu_stack.frontend import attention as attention_module  # noqa: E402
from ipu_stack.frontend import import_program, make_workload  # noqa: E402
from ipu_stack.pipeline import CompileOptions, compile_workload  # noqa: E402
from ipu_stack.runtime.execute import run_package  # noqa: E402
from ipu_stack.runtime.groups import read_system  # noqa: E402
from ipu_stack.runtime.record import run_record  # noqa: E402
from ipu_stack.runtime.session import load_package  # noqa: E402
from ipu_stack.util.errors import ConversionError  # noqa: E402

WIDTH = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             patch_size=16, image_size=64)


def tower(name: str) -> torch.nn.Module:
    """A small tower of each family (random init, eval mode)."""
    torch.manual_seed(sum(map(ord, name)))
    make = {
        "clip": lambda: transformers.CLIPVisionModel(transformers.CLIPVisionConfig(**WIDTH)),
        "vit_pooler": lambda: transformers.ViTModel(transformers.ViTConfig(**WIDTH)),
        "aimv2": lambda: transformers.Aimv2VisionModel(transformers.Aimv2VisionConfig(**WIDTH)),
        "beit": lambda: transformers.BeitModel(transformers.BeitConfig(
            **WIDTH, use_relative_position_bias=True)),
        "dinov3": lambda: transformers.DINOv3ViTModel(transformers.DINOv3ViTConfig(
            **WIDTH, num_register_tokens=4)),
        "dinov2_registers": lambda: transformers.Dinov2WithRegistersModel(
            transformers.Dinov2WithRegistersConfig(**WIDTH, num_register_tokens=4)),
        "mlcd": lambda: transformers.MLCDVisionModel(transformers.MLCDVisionConfig(**WIDTH)),
        "yolos": lambda: transformers.YolosModel(transformers.YolosConfig(
            **{**WIDTH, "image_size": [64, 64]}, num_detection_tokens=5),
            add_pooling_layer=False),
        "siglip_head": lambda: transformers.SiglipVisionModel(transformers.SiglipVisionConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            patch_size=14, image_size=56, vision_use_head=True)),
    }[name]
    model = make().eval()
    if name == "beit":  # the table starts at zero: give every head its own bias
        for module in model.modules():
            if hasattr(module, "relative_position_bias_table"):
                torch.nn.init.normal_(module.relative_position_bias_table, std=0.5)
    return model


def exported(name: str, batch: int = 2):
    model = tower(name)
    size = model.config.image_size
    height, width = (size, size) if isinstance(size, int) else size
    return torch.export.export(model, (torch.randn(batch, 3, height, width),))


EXPECTED = {  # operations each tower must map to (kind or activation function: count)
    "clip": {"quick_gelu": 2, "layer_norm": 6},
    "vit_pooler": {"tanh": 1, "gelu": 2},
    "aimv2": {"swiglu": 2, "rms_norm": 6},
    "beit": {"biased_softmax": 2},
    "dinov3": {"rope": 4},
    "siglip_head": {"softmax": 3},
    "yolos": {"softmax": 2},
    "dinov2_registers": {"softmax": 2},
}


def _kinds(graph) -> Counter:
    return Counter(op.attrs.get("function", op.kind) for op in graph.operations)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_tower_imports_exactly(name: str) -> None:
    imported = import_program(exported(name), precision="fp8")
    assert imported.conversion_error < 1e-5
    kinds = _kinds(imported.graph)
    for kind, count in EXPECTED[name].items():
        assert kinds[kind] == count, (kind, kinds)


def test_dinov3_rotates_split_halves_and_leaves_the_prefix_tokens_alone() -> None:
    graph = import_program(exported("dinov3", batch=1), precision="f16").graph
    ropes = [op for op in graph.operations if op.kind == "rope"]
    assert ropes and all(op.attrs["pairs"] == "halves" for op in ropes)
    cos = graph.value(ropes[0].inputs[1])
    tables = import_program(exported("dinov3", batch=1), precision="f16").tensors
    table = tables[cos.name]
    assert table.shape == (1 + 4 + 16, 8)  # CLS + 4 registers + 16 patches, d/2 = 8
    assert np.all(table[:5] == 1.0) and not np.all(table[5:] == 1.0)


def test_yolos_detection_tokens_are_reserved_behind_the_patches() -> None:
    imported = import_program(exported("yolos"), precision="f16")
    patches = imported.graph.by_role("input")[0]
    assert patches.type.shape == (2, 1 + 16 + 5, 3 * 16 * 16)  # CLS, patches, 5 detection
    assert any("1 + 5 constant token(s)" in r for r in imported.converted.rewrites)


@pytest.mark.parametrize("batch", [1, 2])
def test_token_first_attention_output_imports_at_any_batch(batch: int) -> None:
    """MLCD permutes attention's [B, T, H, d] output to [T, B, H, d], projects it there and
    permutes back: layout forms only (``theads``, ``tmajor``), no data movement."""
    imported = import_program(exported("mlcd", batch), precision="f16")
    assert imported.conversion_error < 1e-5
    assert _kinds(imported.graph)["rope"] == 4


def test_a_transposed_bias_table_is_caught_by_the_conversion_check(monkeypatch) -> None:
    """Fault injection: BEiT's gathered bias with its query and key axes swapped."""
    program = exported("beit")
    assert import_program(program, precision="f16").conversion_error < 1e-5
    original = attention_module.additive_mask

    def transposed(*args):
        table = original(*args)
        return None if table is None else np.ascontiguousarray(np.swapaxes(table, -1, -2))

    monkeypatch.setattr(attention_module, "additive_mask", transposed)
    monkeypatch.setattr("ipu_stack.frontend.ops_gemm.additive_mask", transposed)
    with pytest.raises(ConversionError, match="conversion check failed"):
        import_program(program, precision="f16")


class Gates(torch.nn.Module):
    """Each new operation on its own: sigmoid, SiLU (not gating), a product of two
    activations, ``nn.RMSNorm`` (``aten.rms_norm``), a boolean mask and an eager additive
    bias on attention scores."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(32, 32), torch.nn.Linear(32, 32)
        self.qkv = torch.nn.Linear(32, 96)
        self.norm = torch.nn.RMSNorm(32, eps=1e-5)
        self.bias = torch.nn.Parameter(torch.randn(1, 4, 8, 8))
        mask = torch.rand(1, 1, 8, 8) > 0.3
        mask[..., 0] = True  # every query attends to something
        self.register_buffer("mask", mask)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = self.b(x)
        h = torch.sigmoid(self.a(x)) * b + torch.nn.functional.silu(b)
        q, k, v = self.qkv(self.norm(h)).view(2, 8, 3, 4, 8).permute(2, 0, 3, 1, 4).unbind(0)
        masked = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=self.mask)
        scores = (q @ k.transpose(-2, -1)) * 0.3 + self.bias
        eager = scores.softmax(-1) @ v
        return (masked + eager).transpose(1, 2).reshape(2, 8, 32) + x


def test_single_operations_import_exactly() -> None:
    torch.manual_seed(21)
    program = torch.export.export(Gates().eval(), (torch.randn(2, 8, 32),))
    imported = import_program(program, precision="f16")
    assert imported.conversion_error < 1e-5
    kinds = _kinds(imported.graph)
    assert kinds["sigmoid"] == 1 and kinds["silu"] == 1 and kinds["mul"] == 1
    assert kinds["rms_norm"] == 1 and kinds["biased_softmax"] == 2


def _bench(program, precision: str, tmp_path: Path, cache_dir: Path, lock_path: Path) -> dict:
    workload = make_workload(program, "zoo")
    params = workload.resolve({"precision": precision})
    result = compile_workload(workload, params, tmp_path / precision,
                              CompileOptions(cache_dir=str(cache_dir)))
    run = run_package(load_package(result.package), result.graph, result.tensors, lock_path,
                      model=workload.reference)
    return run_record(run, run.package, read_system(run.package), result.graph,
                      workload.benchmark_fields(params), result.package, None)


@pytest.mark.parametrize("name, precision", [
    ("clip", "fp8"), ("vit_pooler", "f16"), ("aimv2", "fp8"), ("beit", "fp8"),
    ("dinov3", "f16"), ("siglip_head", "fp8"), ("dinov2_registers", "fp8")])
def test_tower_passes_on_the_device(name: str, precision: str, tmp_path: Path, cache_dir: Path,
                                    lock_path: Path) -> None:
    record = _bench(exported(name), precision, tmp_path, cache_dir, lock_path)
    assert record["numericalTest"] == "PASS", record
    assert record["referenceSource"] == "torch"
    assert record.get("loopLayers") == 2  # the two layers ran as one loop body


def test_single_operations_pass_on_the_device(tmp_path: Path, cache_dir: Path,
                                              lock_path: Path) -> None:
    torch.manual_seed(22)
    program = torch.export.export(Gates().eval(), (torch.randn(2, 8, 32),))
    record = _bench(program, "fp8", tmp_path, cache_dir, lock_path)
    assert record["numericalTest"] == "PASS", record
    assert record["activationCycles"] > 0 and record["rmsNormCycles"] > 0


class WrittenNorms(torch.nn.Module):
    """Layer norms as users write them: Cohere's (``x - mean`` made twice, ``rsqrt``, the
    scale after), ConvNeXt's (``x - mean`` made once and read twice, ``/ sqrt``, a scale and
    a shift), and an RMS norm divided by its root."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(32, 32), torch.nn.Linear(32, 32)
        self.w1, self.w2, self.w3 = (torch.nn.Parameter(1 + 0.1 * torch.randn(32))
                                     for _ in range(3))
        self.shift = torch.nn.Parameter(0.1 * torch.randn(32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(-1, keepdim=True)
        variance = (x - mean).pow(2).mean(-1, keepdim=True)
        h = self.w1 * ((x - mean) * torch.rsqrt(variance + 1e-5))
        h = self.a(h)
        centred = h - h.mean(-1, keepdim=True)
        h = centred / torch.sqrt(centred.pow(2).mean(-1, keepdim=True) + 1e-6)
        h = self.b(self.w2 * h + self.shift)
        return self.w3 * (h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6))


def test_norms_written_out_import_as_one_operation_each(tmp_path: Path, cache_dir: Path,
                                                         lock_path: Path) -> None:
    """Each written-out norm is one ``layer_norm`` or ``rms_norm`` (its scale folded in),
    the import within float64 of PyTorch, and the program PASSes on the device."""
    torch.manual_seed(23)
    program = torch.export.export(WrittenNorms().eval(), (torch.randn(2, 8, 32) * 3 + 1,))
    imported = import_program(program, precision="f16")
    assert imported.conversion_error < 1e-5
    kinds = _kinds(imported.graph)
    assert kinds["layer_norm"] == 2 and kinds["rms_norm"] == 1 and "scale" not in kinds
    record = _bench(program, "f16", tmp_path, cache_dir, lock_path)
    assert record["numericalTest"] == "PASS", record


class UnequalParts(torch.nn.Module):
    """One projection split into unequal parts (queries and fewer keys and values)."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.o, self.kv = (torch.nn.Linear(32, 64), torch.nn.Linear(32, 32),
                                     torch.nn.Linear(16, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).split([32, 16, 16], -1)
        return self.o(q) + self.kv(k) - self.kv(v)


def test_a_projection_split_into_unequal_parts_is_one_gemm_a_part() -> None:
    torch.manual_seed(24)
    program = torch.export.export(UnequalParts().eval(), (torch.randn(2, 8, 32),))
    imported = import_program(program, precision="f16")
    assert imported.conversion_error < 1e-5
    gemms = [op for op in imported.graph.operations if op.kind == "matmul"]
    assert sorted(imported.graph.value(op.inputs[1]).type.shape[-1] for op in gemms) == \
        [16, 16, 32, 32, 32, 32]  # the three parts' own columns, then o and kv twice
