"""Hugging Face towers (small configs) import exactly: the conversion check compares the
imported graph, in float64 on the exact weights, with torch's own float32 output."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from ipu_stack.frontend import import_program  # noqa: E402
from tests.frontend.models import QaLogits  # noqa: E402
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


def test_a_causal_lm_with_grouped_query_attention_passes_against_torch(tmp_path, capsys
                                                                         ) -> None:
    """``LlamaForCausalLM`` exported for prefill with ``use_cache=False``: the constant input
    is specialised (no traceback), ``ops`` lists every operation as supported (the token
    embedding a device lookup, grouped-query attention's head repeat a selection product),
    and the causal forward pass, RoPE, RMS norm, SwiGLU and the tied LM head PASS against
    torch at F16 and FP8."""
    from ipu_stack.cli import main
    from ipu_stack.frontend.user_inputs import call_arguments, user_input_values

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
    assert out[-1] == f"operations={len(out) - 1} supported={len(out) - 1} unsupported=0"
    assert any("aten.embedding" in line and line.startswith("yes") for line in out)
    builtin = ["smollm2-135m", "--vocab", "256", "--dim", "64", "--hidden", "128", "--layers",
               "2", "--heads", "4", "--kv-heads", "2", "--tokens", "16", "--eps", "1e-6",
               "--theta", "10000"]
    for precision in ("f16", "fp8"):
        code = main(["--quiet", "bench", str(path), "--precision", precision, "--json",
                     "--out", str(tmp_path / precision)])
        record = json.loads(capsys.readouterr().out)
        assert code == 0 and record["numericalTest"] == "PASS", record
        assert record["referenceSource"] == "torch" and record["conversionError"] < 1e-5
        # the builtin of the same shape is the same graph: the same cycles, no torch
        code = main(["--quiet", "bench", *builtin, "--precision", precision, "--json",
                     "--out", str(tmp_path / f"builtin-{precision}")])
        twin = json.loads(capsys.readouterr().out)
        assert code == 0 and twin["numericalTest"] == "PASS"
        assert twin["cycles"] == record["cycles"] and twin["weightBytes"] == \
            record["weightBytes"]


def test_gpt2_with_its_conv1d_projections_and_gelu_new_passes_against_torch(tmp_path, capsys
                                                                           ) -> None:
    """``GPT2LMHeadModel`` for prefill: its Conv1D projections are ``addmm`` of the rows
    viewed back to ``[B, T, 3E]`` and split into q, k and v (one GEMM a part), its MLP's
    ``gelu_new`` is written out (one GELU), its LM head tied: PASS against torch."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=300, n_positions=64, n_embd=64, n_layer=2,
                                     n_head=4)
    record = _prefill_record(transformers.GPT2LMHeadModel(config), 300, tmp_path, capsys)
    assert record["geluCycles"] > 0


def _prefill_record(model: torch.nn.Module, vocab: int, tmp_path, capsys) -> dict:
    """``model`` (a causal LM) exported for a 12-token prefill with ``use_cache=False`` and
    benched at F16: its record, checked to PASS against torch with the import exact."""
    from ipu_stack.cli import main

    program = torch.export.export(model.eval(), (torch.randint(0, vocab, (1, 12)),),
                                  kwargs={"use_cache": False})
    path = tmp_path / "prefill.pt2"
    torch.export.save(program, str(path))
    code = main(["--quiet", "bench", str(path), "--precision", "f16", "--json", "--out",
                 str(tmp_path / "out")])
    record = json.loads(capsys.readouterr().out)
    assert code == 0 and record["numericalTest"] == "PASS", record
    assert record["conversionError"] < 1e-5
    return record


class _Encoder(torch.nn.Module):
    """A transformers encoder returning plain tensors (its output class is not one
    ``torch.export.load`` can read back)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.model(input_ids=input_ids)
        return tuple(v for v in (out.last_hidden_state, getattr(out, "pooler_output", None))
                     if v is not None)


def _bert(vocab: int = 1000):
    config = transformers.BertConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128,
                                     num_hidden_layers=2, num_attention_heads=4,
                                     max_position_embeddings=64)
    return _Encoder(transformers.BertModel(config).eval()).eval()


def test_bert_looks_its_tokens_up_on_the_device_and_matches_torch(tmp_path, capsys) -> None:
    """``BertModel`` exported with ``input_ids`` only: the word lookup of the ids is a device
    ``embedding`` of an I32 input; positions and the token types (zeros) fold into
    constants; the pooler's first-token row is sliced. PASS against torch's own outputs."""
    from ipu_stack.cli import main

    torch.manual_seed(3)
    program = torch.export.export(_bert(), (torch.randint(0, 1000, (2, 16)),))
    imported = import_program(program, precision="f16")
    assert imported.conversion_error < 1e-5
    ids = imported.graph.by_role("input")[0]
    assert ids.type.shape == (2, 16, 1) and ids.type.precision.kind == "I32"
    lookups = [op for op in imported.graph.operations if op.kind == "embedding"]
    assert len(lookups) == 1 and imported.graph.value(lookups[0].inputs[1]).type.shape == (
        1000, 64)
    path = tmp_path / "bert.pt2"
    torch.export.save(program, str(path))
    assert main(["--quiet", "bench", str(path), "--out", str(tmp_path / "pkg"), "--json"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["numericalTest"] == "PASS" and record["referenceSource"] == "torch"
    assert record["multisliceCycles"] > 0


def test_ids_outside_the_table_and_computed_ids_are_refused_in_one_line(tmp_path, capsys
                                                                        ) -> None:
    from ipu_stack.cli import main

    torch.manual_seed(4)
    program = torch.export.export(_bert(), (torch.randint(0, 1000, (1, 8)),))
    path = tmp_path / "bert.pt2"
    torch.export.save(program, str(path))
    inputs = tmp_path / "ids.npz"
    np.savez(inputs, input_ids=np.full((1, 8), 1000))
    code = main(["bench", str(path), "--inputs", str(inputs), "--out", str(tmp_path / "p")])
    assert one_error_line(code, capsys.readouterr().err) == (
        f"error: --inputs {inputs}: input_ids holds ids outside [0, 1000) or not whole "
        "(1000 to 1000)")
    # ids computed on the device (the argmax of an activation) cannot be looked up: refused

    class Computed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table, self.fc = torch.nn.Embedding(50, 16), torch.nn.Linear(16, 50)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.table(torch.argmax(self.fc(self.table(ids)), -1))

    program = torch.export.export(Computed().eval(), (torch.randint(0, 50, (1, 8)),))
    path = tmp_path / "computed.pt2"
    torch.export.save(program, str(path))
    code = main(["bench", str(path), "--out", str(tmp_path / "q")])
    line = one_error_line(code, capsys.readouterr().err)
    assert line.startswith("error: unsupported operation aten.argmax.default") and \
        "an argmax of the device's values (export the logits: generate --choose device " \
        "chooses the token on the device)" in line, line


def test_clip_text_imports_with_its_pooler_and_runs_as_the_builtin(tmp_path, capsys) -> None:
    """``CLIPTextModel``: the token lookup on the device, the causal mask folded (one table
    the layers share), and the pooler's end-of-text positions computed by the host from the
    ids, their rows gathered by a device lookup. PASS against torch, in the same cycles as
    the builtin ``clip-text`` of the same shape."""

    torch.manual_seed(5)
    config = transformers.CLIPTextConfig(vocab_size=500, hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=2, num_attention_heads=4,
                                         bos_token_id=498, eos_token_id=499)
    clip = _Encoder(transformers.CLIPTextModel(config).eval()).eval()
    ids = torch.randint(0, 498, (3, 12))
    ids[:, 0], ids[0, 5:], ids[1, 11], ids[2, 3:] = 498, 499, 499, 499
    program = torch.export.export(clip, (ids,))
    imported = import_program(program, precision="f16",
                              inputs=[ids.numpy().astype(np.float32)])
    assert imported.conversion_error < 1e-5
    rows = imported.graph.by_role("input")[1]
    assert rows.type.precision.kind == "I32" and rows.type.shape == (3, 1)
    assert any("host preprocessing" in r for r in imported.converted.rewrites)
    # the layers' causal masks are one table, as the builtin's (the same memory and cycles)
    masks = [op.inputs[1] for op in imported.graph.operations if op.kind == "biased_softmax"]
    assert len(masks) == 2 and len(set(masks)) == 1
    _runs_as_the_builtin(program, "clip-text", tmp_path, capsys)


def _runs_as_the_builtin(program: object, builtin: str, tmp_path, capsys) -> None:
    """``program`` (2 layers, width 64, 4 heads, MLP 128, vocabulary 500, 12 tokens, batch
    3) saved and benched at F16: PASS against torch, in the cycles of ``builtin`` at that
    shape."""
    from ipu_stack.cli import main

    path = tmp_path / f"{builtin}.pt2"
    torch.export.save(program, str(path))
    assert main(["--quiet", "bench", str(path), "--out", str(tmp_path / "pkg"), "--json",
                 "--precision", "f16"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["numericalTest"] == "PASS" and record["referenceSource"] == "torch"
    assert main(["--quiet", "bench", builtin, "--layers", "2", "--vocab", "500", "--dim",
                 "64", "--heads", "4", "--hidden", "128", "--tokens", "12", "--batch", "3",
                 "--out", str(tmp_path / "builtin"), "--json"]) == 0
    same = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert same["numericalTest"] == "PASS" and same["cycles"] == record["cycles"]


def test_the_bert_encoder_with_token_types_runs_as_the_builtin(tmp_path, capsys) -> None:
    """``BertModel`` without its pooler, called with ``input_ids`` and ``token_type_ids``:
    both lookups on the device, PASS against torch in the same cycles as the builtin
    ``bert-base`` of the same shape (the builtin is the encoder of ByteMLPerf's model)."""

    class Encoder(torch.nn.Module):
        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor
                    ) -> torch.Tensor:
            return self.model(input_ids=input_ids,
                              token_type_ids=token_type_ids).last_hidden_state

    torch.manual_seed(8)
    config = transformers.BertConfig(vocab_size=500, hidden_size=64, intermediate_size=128,
                                     num_hidden_layers=2, num_attention_heads=4,
                                     max_position_embeddings=64)
    model = Encoder(transformers.BertModel(config, add_pooling_layer=False).eval()).eval()
    program = torch.export.export(model, (torch.randint(0, 500, (3, 12)),
                                          torch.randint(0, 2, (3, 12))))
    _runs_as_the_builtin(program, "bert-base", tmp_path, capsys)


def test_ids_cast_before_their_lookup_are_still_ids() -> None:
    """``embedding(ids.long())`` (a model fed int32 ids): the cast keeps them ids."""

    class Casting(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table = torch.nn.Embedding(50, 16)
            self.fc = torch.nn.Linear(16, 8)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.fc(self.table(ids.long()))

    torch.manual_seed(6)
    program = torch.export.export(Casting().eval(), (torch.randint(0, 50, (2, 4),
                                                                   dtype=torch.int32),))
    imported = import_program(program, precision="f16")
    assert imported.conversion_error < 1e-5
    assert [op.kind for op in imported.graph.operations][0] == "embedding"


def test_bert_for_question_answering_imports_its_squeezed_logits(tmp_path, capsys) -> None:
    """The QA head splits its [B, T, 2] logits into two [B, T, 1] halves and squeezes them:
    each is one GEMM column held as [B T, 1] (the ``column`` form), laid out by the host as
    an output. A squeezed value used by anything else is refused in one line."""
    from ipu_stack.cli import main

    class QuestionAnswering(torch.nn.Module):
        def __init__(self, softmax: bool = False) -> None:
            super().__init__()
            config = transformers.BertConfig(vocab_size=1000, hidden_size=64,
                                             intermediate_size=128, num_hidden_layers=1,
                                             num_attention_heads=4, max_position_embeddings=64)
            self.model = transformers.BertForQuestionAnswering(config).eval()
            self.softmax = softmax

        def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            out = self.model(input_ids=input_ids)
            if self.softmax:
                return out.start_logits.softmax(-1), out.end_logits
            return out.start_logits, out.end_logits

    torch.manual_seed(7)
    ids = torch.randint(0, 1000, (2, 16))
    program = torch.export.export(QuestionAnswering().eval(), (ids,))
    imported = import_program(program, precision="f16")
    assert imported.conversion_error < 1e-5
    outputs = imported.graph.by_role("output")
    assert [v.type.shape for v in outputs] == [(32, 1), (32, 1)]  # B T rows, one column
    path = tmp_path / "qa.pt2"
    torch.export.save(program, str(path))
    assert main(["--quiet", "bench", str(path), "--out", str(tmp_path / "pkg"), "--json"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["numericalTest"] == "PASS" and record["referenceSource"] == "torch"
    program = torch.export.export(QuestionAnswering(softmax=True).eval(), (ids,))
    path = tmp_path / "qa_softmax.pt2"
    torch.export.save(program, str(path))
    code = main(["bench", str(path), "--out", str(tmp_path / "p2")])
    line = one_error_line(code, capsys.readouterr().err)
    assert "a squeezed [2, 16] value used other than as an output" in line, line


def test_multi_query_attention_passes_against_torch(tmp_path, capsys) -> None:
    """One key/value head (multi-query attention): the key, held as rows, still takes RoPE,
    and its head is repeated for every query head."""
    torch.manual_seed(1)
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=32)
    _prefill_record(transformers.LlamaForCausalLM(config), 128, tmp_path, capsys)


def test_roberta_position_ids_are_host_arithmetic_and_pass_against_torch(tmp_path,
                                                                         capsys) -> None:
    """``RobertaForQuestionAnswering``: position ids from the input ids (``ne``, ``cumsum``,
    products and sums: padding keeps the padding position) computed by the host, looked up
    on the device; PASS against torch on ids with padding at the end."""
    from ipu_stack.cli import main
    from ipu_stack.frontend.forms import HostIds

    torch.manual_seed(0)
    config = transformers.RobertaConfig(
        vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=40, pad_token_id=1)
    model = QaLogits(transformers.RobertaForQuestionAnswering(config).eval())

    ids = torch.randint(3, 300, (2, 16))
    ids[0, 12:] = 1  # padding
    path = tmp_path / "roberta.pt2"
    torch.export.save(torch.export.export(model, (ids,)), str(path))
    np.savez(tmp_path / "ids.npz", input_ids=ids.numpy().astype(np.float32))
    code = main(["--quiet", "bench", str(path), "--precision", "f16", "--json", "--inputs",
                 str(tmp_path / "ids.npz"), "--out", str(tmp_path / "pkg")])
    record = json.loads(capsys.readouterr().out)
    assert code == 0 and record["numericalTest"] == "PASS", record
    assert record["conversionError"] < 1e-5
    # the host's steps against transformers' own position ids, padding included
    steps = HostIds(0, "input_ids", (2, 16), (2, 16), (
        ("ne", 1.0), ("cumsum", 1), ("add", 0.0)))
    mask = HostIds(0, "input_ids", (2, 16), (2, 16), (("ne", 1.0),))
    positions = steps.then("times", mask).then("add", 1.0).evaluate(ids.numpy())
    embeddings = transformers.models.roberta.modeling_roberta.RobertaEmbeddings
    expected = embeddings.create_position_ids_from_input_ids(ids, 1).numpy()
    assert np.array_equal(positions, expected) and positions[0, 12:].tolist() == [1] * 4
