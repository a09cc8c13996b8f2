"""A decoder step exported with a static KV cache (``transformers.integrations.executorch``):
the position arithmetic runs on the host before each call, the cache buffers become device
state written in place, and ``generate MODEL.pt2`` matches the builtin's cycles and
PyTorch's own greedy tokens."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("transformers.integrations.executorch")

from ipu_stack.cli import main  # noqa: E402
from ipu_stack.frontend import import_program, imported_workload  # noqa: E402
from ipu_stack.testing.models import static_cache_step  # noqa: E402
from tests.frontend.models import drawn_vectors  # noqa: E402
from tests.helpers import one_error_line  # noqa: E402

CONTEXT = 32
SHAPE = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "max_position_embeddings": 256, "tie_word_embeddings": True}
BUILTIN = ["smollm2-135m", "--vocab", "256", "--dim", "64", "--hidden", "128", "--layers", "2",
           "--heads", "4", "--kv-heads", "2", "--eps", "1e-6", "--theta", "10000"]


def _step_program(context: int = CONTEXT, family: str = "llama", dynamic: bool = False,
                  **config):
    torch.manual_seed(0)
    classes = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
               "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
               "phi3": (transformers.Phi3Config, transformers.Phi3ForCausalLM),
               "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
               "gemma": (transformers.GemmaConfig, transformers.GemmaForCausalLM),
               "olmo": (transformers.OlmoConfig, transformers.OlmoForCausalLM),
               "olmo2": (transformers.Olmo2Config, transformers.Olmo2ForCausalLM),
               "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
               "stablelm": (transformers.StableLmConfig, transformers.StableLmForCausalLM),
               "phi": (transformers.PhiConfig, transformers.PhiForCausalLM),
               "neox": (transformers.GPTNeoXConfig, transformers.GPTNeoXForCausalLM),
               "cohere": (transformers.CohereConfig, transformers.CohereForCausalLM),
               "granite": (transformers.GraniteConfig, transformers.GraniteForCausalLM),
               "smollm3": (transformers.SmolLM3Config, transformers.SmolLM3ForCausalLM),
               "gemma2": (transformers.Gemma2Config, transformers.Gemma2ForCausalLM),
               "gemma3": (transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM)}[family]
    model = classes[1](classes[0](**{**SHAPE, **config}))
    if family != "llama":  # norm scales and biases away from their init, as trained ones are
        drawn_vectors(model)
    module = static_cache_step(model, context)
    if dynamic:  # a sequence length of 1 to 31: the prompt's pass from the same file
        tokens = torch.export.Dim("tokens", min=1, max=context - 1)
        return module.export(input_ids=torch.zeros((1, 4), dtype=torch.long),
                             cache_position=torch.arange(4), strict=False,
                             dynamic_shapes={"input_ids": {1: tokens},
                                             "cache_position": {0: tokens}})
    program = module.export(input_ids=torch.zeros((1, 1), dtype=torch.long),
                            cache_position=torch.tensor([0]))
    return (program, model) if config or family != "llama" else program


@pytest.fixture(scope="module")
def step_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("step") / "llama_step.pt2"
    torch.export.save(_step_program(), str(path))
    return path


def test_attention_in_fp8_over_an_f16_cache_says_what_ran(step_file, caplog) -> None:
    """``--attention fp8`` cannot move a product whose keys or values are the F16 cache:
    the record's ``attention`` says F16 and a warning says why, not ``fp8``."""
    workload, params = imported_workload(step_file)
    resolved = workload.resolve({**params, "precision": "fp8", "attention": "fp8"})
    with caplog.at_level(logging.WARNING, logger="ipu_stack.frontend"):
        graph, _ = workload.build(resolved)
    products = [op for op in graph.operations if op.kind == "head_matmul"]
    assert products and workload.benchmark_fields(resolved)["attention"] == "f16"
    assert any("--attention fp8 keeps attention products in F16" in r.getMessage()
               and f"kept={len(products)}" in r.getMessage() for r in caplog.records)


def test_the_host_computes_slots_mask_and_angles_for_each_position(step_file) -> None:
    """Each call's per-call inputs at position 7, against numpy: the cache slot, the mask
    row (every later position masked) and Llama's RoPE angles; the caches are F16 states
    each written by one cache_write, and importing leaves the program's buffers as they
    were (torch's reference run writes a copy)."""
    workload, params = imported_workload(step_file)
    graph, _ = workload.build(workload.resolve({**params, "precision": "f16"}))
    writes = [op for op in graph.operations if op.kind == "cache_write"]
    assert len(writes) == 4 and all(op.attrs["kv_heads"] == 2 and op.attrs["positions"] ==
                                    CONTEXT for op in writes)
    states = [graph.value(op.inputs[0]) for op in writes]
    assert all(s.role == "weight" and s.type.shape == (CONTEXT, 32) and
               s.type.precision.kind == "F16" for s in states)
    inputs = workload.step_inputs(params, np.array([9]), 7)
    assert sorted(inputs) == ["input_ids", "mask", "rope.cos", "rope.sin", "slots"]
    assert inputs["slots"].reshape(-1).tolist() == [7.0]
    assert inputs["input_ids"].reshape(-1).tolist() == [9.0]
    row = np.where(np.arange(CONTEXT) > 7, -np.inf, 0.0)
    np.testing.assert_array_equal(inputs["mask"], np.tile(row, (4, 1)))
    angles = 7 * 10000.0 ** (-np.arange(0, 16, 2) / 16)
    np.testing.assert_allclose(inputs["rope.cos"].reshape(-1), np.cos(angles), atol=1e-6)
    np.testing.assert_allclose(inputs["rope.sin"].reshape(-1), np.sin(angles), atol=1e-6)
    buffers = [t for name, t in workload.program.constants.items() if "cache" in name]
    assert buffers and all(not t.abs().sum() for t in buffers)


def test_generate_a_static_cache_step_matches_torch_and_the_builtins_cycles(
        step_file, tmp_path, capsys) -> None:
    """``generate MODEL.pt2``: the prompt a token a step, every step PASS, the tokens equal
    the host reference's and PyTorch's own greedy tokens, and a step takes the cycles of
    the builtin decode step of the same shape."""
    assert main(["ops", str(step_file)]) == 0
    listing = capsys.readouterr().out.splitlines()
    assert listing[-1].endswith("unsupported=0")
    assert any("aten.index_copy_" in line and "mapped" in line for line in listing)
    assert any("host (position arithmetic" in line for line in listing)
    code = main(["--quiet", "generate", str(step_file), "--prompt-tokens", "5",
                 "--new-tokens", "6", "--precision", "f16", "--json",
                 "--out", str(tmp_path / "generated")])
    record = json.loads(capsys.readouterr().out)
    assert code == 0 and record["numericalTest"] == "PASS", record
    assert record["prefill"] == "a token a step" and len(record["generated"]) == 6
    assert record["tokensMatch"] and record["torchTokenMatch"], record
    assert record["decodeCycles"] == record["decodeCyclesMin"]
    code = main(["--quiet", "bench", *BUILTIN, "--context", str(CONTEXT), "--tokens", "1",
                 "--precision", "f16", "--choose", "device", "--json",
                 "--out", str(tmp_path / "builtin")])
    builtin = json.loads(capsys.readouterr().out)  # both choose the token on the device
    assert code == 0 and builtin["cycles"] == record["decodeCycles"]


@pytest.mark.parametrize("family, config", [
    ("qwen2", {}),  # biases on q, k and v
    ("llama", {"rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 16}}),  # Llama 3's RoPE
    # one q, k, v product sliced by columns, one gate and up product chunked, and the
    # rotary part of each head (all of it) cut out and concatenated with the empty rest
    ("phi3", {"pad_token_id": 0}),
    ("mistral", {}),
    # the embedding scaled by the width's root, norms of (1 + weight), a GELU-tanh gate
    ("gemma", {"head_dim": 16}),
    ("olmo", {}),  # layer norms without a scale or shift
], ids=["qwen2", "llama3-rope", "phi3", "mistral", "gemma", "olmo"])
def test_other_llama_family_steps_generate_as_torch_does(family, config, tmp_path, capsys
                                                        ) -> None:
    """Generation PASS with PyTorch's tokens, and each call's RoPE tables at position 9 those
    of the model's own rotary embedding (Llama 3's frequency scaling included)."""
    program, model = _step_program(family=family, **config)
    path = tmp_path / "step.pt2"
    torch.export.save(program, str(path))
    code = main(["--quiet", "generate", str(path), "--prompt-tokens", "4", "--new-tokens", "4",
                 "--precision", "f16", "--json", "--out", str(tmp_path / "out")])
    record = json.loads(capsys.readouterr().out)
    assert code == 0 and record["numericalTest"] == "PASS", record
    assert record["tokensMatch"] and record["torchTokenMatch"], record
    workload, params = imported_workload(path)
    workload.build(workload.resolve({**params, "precision": "f16"}))
    inputs = workload.step_inputs(params, np.array([3]), 9)
    with torch.no_grad():
        cos, sin = model.model.rotary_emb(torch.zeros(1, 1, 16), torch.tensor([[9]]))
    np.testing.assert_allclose(inputs["rope.cos"].reshape(-1), cos.numpy().reshape(-1)[:8],
                               atol=1e-6)
    np.testing.assert_allclose(inputs["rope.sin"].reshape(-1), sin.numpy().reshape(-1)[:8],
                               atol=1e-6)


def test_a_dynamic_sequence_length_gives_the_prompts_pass(tmp_path, capsys) -> None:
    """An export whose sequence length is dynamic: the prompt's pass (the step re-exported
    at the prompt's length, writing its rows into the cache) runs once, then the one-token
    step; the same tokens as the prompt a token a step, and PyTorch's."""
    path = tmp_path / "dynamic.pt2"
    torch.export.save(_step_program(dynamic=True), str(path))
    records = []
    for extra in ([], ["--prompt-by-steps"]):
        code = main(["--quiet", "generate", str(path), "--prompt-tokens", "6", "--new-tokens",
                     "4", "--precision", "f16", "--json", "--out", str(tmp_path / "o"), *extra])
        records.append(json.loads(capsys.readouterr().out))
        assert code == 0 and records[-1]["numericalTest"] == "PASS", records[-1]
    whole, steps = records
    assert whole["prefill"] == "one pass" and steps["prefill"] == "a token a step"
    assert whole["generated"] == steps["generated"] and whole["torchTokenMatch"]
    assert whole["decodeCycles"] == steps["decodeCycles"]
    # the prompt's pass starts at the cache's start: a static fill, no runtime slots
    workload, params = imported_workload(path)
    graph, _ = workload.build(workload.resolve({**params, "tokens": 6}))
    kinds = [op.kind for op in graph.operations]
    assert kinds.count("cache_fill") == 4 and "cache_write" not in kinds
    assert not any(v.name.startswith("slots") for v in graph.by_role("input"))
    # and its LM head reads the last position alone: one row of logits a sequence
    logits = graph.by_role("output")[0]
    head = next(op for op in graph.operations if logits.id in op.outputs)
    assert logits.type.shape == (1, SHAPE["vocab_size"])
    assert graph.value(head.inputs[0]).type.rows == 1
    # the prompt's package runs on its own (its file re-imported at its length)
    assert main(["--quiet", "run", str(tmp_path / "o" / "prompt"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["numericalTest"] == "PASS"


class _PositionScaled(torch.nn.Module):
    """A step that writes its cache and also scales its output by the position."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(1, 2, CONTEXT, 8), persistent=False)
        self.proj = torch.nn.Linear(16, 16, bias=False)

    def forward(self, x: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        rows = h.view(1, 1, 2, 8).transpose(1, 2)
        self.cache.index_copy_(2, cache_position, rows)
        return h * cache_position.float()


class _StopsEarly(torch.nn.Module):
    """A step whose walk stops at an operation with no rule, before its mask arithmetic."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(1, 2, CONTEXT, 8), persistent=False)
        self.proj = torch.nn.Linear(16, 16, bias=False)

    def forward(self, x: torch.Tensor, cache_position: torch.Tensor) -> tuple[torch.Tensor,
                                                                                ...]:
        h = torch.nn.functional.hardswish(self.proj(x))
        self.cache.index_copy_(2, cache_position, h.view(1, 1, 2, 8).transpose(1, 2))
        return h, torch.arange(CONTEXT) <= cache_position


def test_ops_after_the_stop_counts_position_arithmetic_as_the_hosts() -> None:
    """Past the first unsupported call, arithmetic on the positions alone is still the
    host's (as a step that imports lists it), not a second unsupported operation."""
    from ipu_stack.frontend.listing import list_operations

    program = torch.export.export(_StopsEarly().eval(), (torch.randn(1, 1, 16),
                                                         torch.tensor([0])))
    rows = list_operations(program)
    assert [r["target"] for r in rows if not r["supported"]] == ["aten.hardswish.default"]
    assert [r["status"] for r in rows if r["target"] == "aten.le.Tensor"] == [
        "host (position arithmetic, not reached)"]


def test_position_arithmetic_on_the_device_and_odd_caches_are_refused(tmp_path, capsys
                                                                      ) -> None:
    """One line each: the position used as a device operand; a cache whose length is not
    whole blocks of 32; generate on a program that is not a step with a cache."""
    module = _PositionScaled().eval()
    program = torch.export.export(module, (torch.randn(1, 1, 16), torch.tensor([0])))
    with pytest.raises(Exception, match="computed from the position input"):
        import_program(program, precision="f16")
    path = tmp_path / "odd.pt2"
    torch.export.save(_step_program(context=40), str(path))
    code = main(["--quiet", "bench", str(path), "--precision", "f16"])
    assert "whole blocks of 32" in one_error_line(code, capsys.readouterr().err)
    plain = tmp_path / "plain.pt2"
    torch.export.save(torch.export.export(torch.nn.Linear(8, 8).eval(),
                                          (torch.randn(2, 8),)), str(plain))
    code = main(["--quiet", "generate", str(plain), "--prompt-tokens", "2", "--new-tokens", "2"])
    assert "not a decoder step with a static KV cache" in one_error_line(
        code, capsys.readouterr().err)


def test_a_per_head_norm_of_q_and_k_generates_as_torch_does(tmp_path, capsys) -> None:
    """Qwen3 normalises each head of q and k on its own (QK-norm; Gemma 3 and OLMo 2's
    whole-row form too): one ``rms_norm`` a head wide over the heads side by side.  Weights
    of a larger spread than transformers' default make the tokens differ step to step, and
    the dynamic export's prompt pass (whose conversion check against PyTorch sees q and k
    mixed over six positions) runs whole; every token is PyTorch's, and the decode step
    takes the cycles of the builtin ``qwen3-0.6b`` of the same shape."""
    path = tmp_path / "qwen3.pt2"
    torch.export.save(_step_program(family="qwen3", dynamic=True, head_dim=32,  # 64 / 4 = 16
                                    initializer_range=0.2), str(path))
    assert main(["ops", str(path)]) == 0
    assert "self_attn.q_norm (Qwen3RMSNorm)" in capsys.readouterr().out
    record = _generated_in_one_pass(path, tmp_path, capsys)
    assert len(set(record["generated"])) > 3, record
    workload, params = imported_workload(path)
    graph, _ = workload.build(workload.resolve({**params, "precision": "f16"}))
    norms = [op for op in graph.operations if op.kind == "rms_norm" and "group" in op.attrs]
    assert len(norms) == 4 and {op.attrs["group"] for op in norms} == {32}
    code = main(["--quiet", "bench", "qwen3-0.6b", *BUILTIN[1:], "--head-dim", "32",
                 "--context", str(CONTEXT), "--tokens", "1", "--precision", "f16",
                 "--choose", "device", "--json", "--out", str(tmp_path / "builtin")])
    builtin = json.loads(capsys.readouterr().out)  # the builtin of the same shape
    assert code == 0 and builtin["cycles"] == record["decodeCycles"], builtin


@pytest.mark.parametrize("family, config", [
    ("olmo2", {}),  # q_norm and k_norm over the whole of q and of k, before the heads split
    # a norm of each head after the heads are transposed, the queries scaled by a constant
    # of their own, every layer's window of 3 positions (the host's mask arithmetic)
    ("gemma3", {"head_dim": 16, "sliding_window": 3, "initializer_range": 0.05}),
    # the embedding, attention, residual branches and logits each scaled by a constant
    ("granite", {"embedding_multiplier": 12.0, "attention_multiplier": 0.1,
                 "residual_multiplier": 0.2, "logits_scaling": 8.0}),
    ("smollm3", {"no_rope_layer_interval": 2, "pad_token_id": 0}),  # every other layer NoPE
    # RoPE over the first quarter of each head (4 of 16 channels), the rest passed through;
    # Phi's attention and MLP side by side off one layer norm, biases everywhere
    ("stablelm", {"partial_rotary_factor": 0.25}),
    ("phi", {"partial_rotary_factor": 0.25}),
    # half of each head turned (Phi-1.5's): told from rotate_half's halves by their uses
    ("phi", {"partial_rotary_factor": 0.5}),
    # a layer norm written out with its mean, RoPE on q[..., ::2] and q[..., 1::2]
    ("cohere", {}),
    # one q, k and v product, each head's three side by side (chunked), a partial RoPE
    ("neox", {"rotary_pct": 0.25, "num_key_value_heads": 4}),  # (no grouped heads)
], ids=["olmo2", "gemma3-window", "granite", "smollm3-nope", "stablelm-partial-rope",
        "phi-partial-rope", "phi-half-rope", "cohere", "gpt-neox"])
def test_more_families_generate_as_torch_does(family, config, tmp_path, capsys) -> None:
    """OLMo 2's and Gemma 3's norms of q and k, Granite's scalings, SmolLM3's layers without
    RoPE, StableLM's and Phi's RoPE over part of each head, Cohere's layer norm written out
    and interleaved RoPE, GPT-NeoX's q, k and v chunked out of each head: PASS, every token PyTorch's, the
    prompt's pass whole (its conversion check sees q and k over six positions)."""
    path = tmp_path / "step.pt2"
    torch.export.save(_step_program(family=family, dynamic=True, **config), str(path))
    record = _generated_in_one_pass(path, tmp_path, capsys)
    # (the others' random weights repeat one token: the conversion check of the prompt's
    # pass against PyTorch is what checks their logits)
    assert family not in ("olmo2", "gemma3") or len(set(record["generated"])) > 1, \
        record


def _generated_in_one_pass(path, tmp_path, capsys) -> dict:
    """``generate`` of a dynamic export, 6 prompt tokens and 6 new, F16: PASS, the prompt's
    pass whole (its conversion check against PyTorch sees q and k over six positions), every
    token the host reference's and PyTorch's."""
    code = main(["--quiet", "generate", str(path), "--prompt-tokens", "6", "--new-tokens", "6",
                 "--precision", "f16", "--json", "--out", str(tmp_path / "out")])
    record = json.loads(capsys.readouterr().out)
    assert code == 0 and record["numericalTest"] == "PASS", record
    assert record["prefill"] == "one pass" and record["tokensMatch"], record
    assert record["torchTokenMatch"], record
    return record


def test_attention_written_out_over_the_cache_generates_as_torch_does(tmp_path, capsys
                                                                      ) -> None:
    """Gemma 2 writes its attention out to cap the scores' logits: ``q @ k^T`` with the
    cache's keys, ``tanh(s / cap) * cap``, the host's mask added, the softmax, the product
    with the cache's values; and it caps the final logits too.  Caps small enough to bend
    the scores and logits, a window of 3 positions on alternate layers (two masks the host
    computes each call): PASS, the prompt's pass whole (its conversion check against
    PyTorch over six positions), PyTorch's tokens."""
    path = tmp_path / "gemma2.pt2"
    torch.export.save(_step_program(
        family="gemma2", dynamic=True, head_dim=16, sliding_window=3, initializer_range=0.05,
        attn_logit_softcapping=0.5, final_logit_softcapping=1.0), str(path))
    _generated_in_one_pass(path, tmp_path, capsys)
    workload, params = imported_workload(path)
    graph, _ = workload.build(workload.resolve({**params, "precision": "f16"}))
    inputs = {v.name for v in graph.values if v.role == "input"}
    assert {"mask", "mask.1"} <= inputs  # the sliding window's and the whole cache's
    kinds = [op.kind for op in graph.operations]
    assert kinds.count("biased_softmax") == 2 and kinds.count("activation") == 3  # tanh caps


def test_a_prompt_pass_imported_wrongly_is_an_error_not_a_fallback(tmp_path, capsys,
                                                                    monkeypatch) -> None:
    """A conversion check that fails for the prompt's pass is an import defect: generate
    stops with its one line, where a pass that does not fit would go a token a step."""
    from ipu_stack.frontend import workload as workload_module

    path = tmp_path / "dynamic.pt2"
    torch.export.save(_step_program(dynamic=True), str(path))
    checked = workload_module.conversion_error

    def skewed_for_prompts(converted, expected):  # the step (one token) converts as it is
        ids = next(v for v in converted.graph.values if v.name == "input_ids")
        return 1.0 if ids.type.shape[1] > 1 else checked(converted, expected)
    monkeypatch.setattr(workload_module, "conversion_error", skewed_for_prompts)
    code = main(["--quiet", "generate", str(path), "--prompt-tokens", "6", "--new-tokens", "2",
                 "--precision", "f16", "--out", str(tmp_path / "out")])
    assert "conversion check failed" in one_error_line(code, capsys.readouterr().err)
