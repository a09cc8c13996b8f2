"""Hugging Face towers (small configs) import exactly: the conversion check compares the
imported graph, in float64 on the exact weights, with torch's own float32 output."""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from ipu_stack.frontend import import_program  # noqa: E402
from tests.helpers import one_error_line  # noqa: E402


def _siglip(layers: int, head: bool = False):
    config = transformers.SiglipVisionConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
        patch_size=14, image_size=56, vision_use_head=head)
    return transformers.SiglipVisionModel(config).eval(), torch.randn(1, 3, 56, 56)


def test_siglip_tower_imports_exactly() -> None:
    torch.manual_seed(0)
    model, pixels = _siglip(2)
    started = time.perf_counter()
    program = torch.export.export(model, (pixels,))
    assert time.perf_counter() - started < 5.0  # about 0.2 s here; full width: docs/frontend.md
    for precision in ("fp8", "f16"):
        imported = import_program(program, precision=precision)
        assert imported.conversion_error < 1e-5
        kinds = [op.kind for op in imported.graph.operations]
        assert kinds.count("head_matmul") == 4 and kinds.count("layer_norm") == 5


def test_vit_with_cls_token_imports_exactly() -> None:
    torch.manual_seed(1)
    config = transformers.ViTConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                    num_attention_heads=4, patch_size=16, image_size=64)
    model = transformers.ViTModel(config, add_pooling_layer=False).eval()
    program = torch.export.export(model, (torch.randn(2, 3, 64, 64),))
    imported = import_program(program, precision="fp8")
    assert imported.conversion_error < 1e-5
    assert any("constant token" in r for r in imported.converted.rewrites)
    patches = imported.graph.by_role("input")[0]
    assert patches.type.shape == (2, 17, 768)  # CLS row + 16 patches of 3 x 16 x 16


def test_siglip_attention_pooling_head_imports_exactly() -> None:
    """The MAP head (nn.MultiheadAttention with a learned probe): the fused k/v projection
    is split into two GEMMs, the probe's query is replicated over the token rows, and the
    pooled vector stays replicated; both outputs (tokens and pooled) are checked."""
    torch.manual_seed(2)
    model, pixels = _siglip(1, head=True)
    program = torch.export.export(model, (pixels,))
    imported = import_program(program, precision="fp8")
    assert imported.conversion_error < 1e-5
    assert len(imported.converted.outputs) == 2
    rewrites = " ".join(imported.converted.rewrites)
    assert "fused projection part 1" in rewrites and "constant query" in rewrites


def test_a_causal_lm_with_a_constant_input_is_listed_and_refused_in_one_line(tmp_path, capsys
                                                                             ) -> None:
    """``LlamaForCausalLM`` exported for prefill with ``use_cache=False``: the constant input
    is specialised (no traceback), ``ops`` lists every operation, and the one the product
    has no device kernel for yet, the token embedding, is named, as ``bench`` names it."""
    from ipu_stack.cli import main
    from ipu_stack.frontend.workload import call_arguments, user_input_values

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=True)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 256, (1, 16))
    program = torch.export.export(model, (ids,), kwargs={"use_cache": False})
    values = dict(user_input_values(program))
    assert values["use_cache"] is False and tuple(values["input_ids"].shape) == (1, 16)
    args, kwargs = call_arguments(program, [ids.numpy()])
    assert kwargs == {"use_cache": False} and torch.equal(args[0], ids)
    path = tmp_path / "llama.pt2"
    torch.export.save(program, str(path))
    assert main(["ops", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    unsupported = [line for line in out if line.startswith("NO ")]
    assert len(unsupported) == 1 and "aten.embedding.default" in unsupported[0]
    assert "model.embed_tokens (Embedding)" in unsupported[0]
    assert out[-1] == f"operations={len(out) - 1} supported={len(out) - 2} unsupported=1"
    code = main(["bench", str(path), "--out", str(tmp_path / "pkg")])
    line = one_error_line(code, capsys.readouterr().err)
    assert line.startswith("error: unsupported operation aten.embedding.default in module "
                           "model.embed_tokens (Embedding)")
