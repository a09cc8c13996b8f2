"""The builtin decoder (``smollm2-135m``): its graph in float64 against an independent numpy
Llama forward pass on the same weights (no torch), and its pieces against their formulas."""

from __future__ import annotations

import numpy as np
import pytest

from ipu_stack.ir.interpret import evaluate_float64
from ipu_stack.util.errors import UsageError
from ipu_stack.workloads import get_workload
from ipu_stack.workloads.decoder import head_selection, rope_1d_tables

SMALL = {"vocab": 50, "dim": 16, "hidden": 24, "layers": 2, "heads": 4, "kv_heads": 2,
         "tokens": 6, "batch": 2, "precision": "f16"}


def rms_norm(x: np.ndarray, gamma: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * gamma


def rotate_half(x: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], -1)


def llama_forward(t: dict[str, np.ndarray], p: dict) -> np.ndarray:
    """transformers' LlamaForCausalLM, written from its definition in numpy (float64)."""
    b, n, d = p["batch"], p["tokens"], p["dim"] // p["heads"]
    w = {k: np.asarray(v, np.float64) for k, v in t.items()}
    x = w["token_embedding"][t["ids"].reshape(b, n).astype(int)]
    angles = np.outer(np.arange(n), 1.0 / p["theta"] ** (np.arange(0, d, 2) / d))
    cos, sin = (np.concatenate([f(angles)] * 2, -1) for f in (np.cos, np.sin))
    causal = np.triu(np.full((n, n), -np.inf), 1)
    for i in range(p["layers"]):
        h = rms_norm(x, w[f"layer{i}.ln1.gamma"], p["eps"])

        def heads(y: np.ndarray, count: int) -> np.ndarray:
            return y.reshape(b, n, count, d).transpose(0, 2, 1, 3)

        q = heads(h @ w[f"layer{i}.attn.q.w"], p["heads"])
        k = heads(h @ w[f"layer{i}.attn.k.w"], p["kv_heads"])
        v = heads(h @ w[f"layer{i}.attn.v.w"], p["kv_heads"])
        q, k = (y * cos + rotate_half(y) * sin for y in (q, k))
        repeat = p["heads"] // p["kv_heads"]
        k, v = np.repeat(k, repeat, axis=1), np.repeat(v, repeat, axis=1)
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d) + causal
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        context = (probs @ v).transpose(0, 2, 1, 3).reshape(b, n, p["dim"])
        x = x + context @ w[f"layer{i}.attn.o.w"]
        h = rms_norm(x, w[f"layer{i}.ln2.gamma"], p["eps"])
        gate, up = h @ w[f"layer{i}.gate.w"], h @ w[f"layer{i}.up.w"]
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[f"layer{i}.down.w"]
    return rms_norm(x, w["final_norm.gamma"], p["eps"]) @ w["lm_head.w"]


def test_the_prefill_graph_is_llama_forward() -> None:
    workload = get_workload("smollm2-135m")
    params = workload.resolve(SMALL)
    graph, tensors = workload.build(params)
    values = evaluate_float64(graph, tensors)
    logits = values["logits"].reshape(SMALL["batch"], SMALL["tokens"], SMALL["vocab"])
    expected = llama_forward(dict(tensors), params)
    # the graph's RoPE tables are float32 (as the device holds them): ~1e-7 from float64
    assert np.abs(logits - expected).max() < 1e-6 * np.abs(expected).max()


def test_the_selection_repeats_each_head() -> None:
    x = np.random.default_rng(0).standard_normal((5, 2 * 4))
    out = x @ head_selection(2, 3, 4)
    for head in range(6):
        assert np.array_equal(out[:, head * 4:(head + 1) * 4],
                              x[:, (head // 3) * 4:(head // 3 + 1) * 4])


def test_rope_tables_are_position_times_frequency() -> None:
    cos, sin = rope_1d_tables(2, 5, 8, 10000.0)
    assert cos.shape == (10, 4) and np.allclose(cos[:5], cos[5:])
    assert np.isclose(np.arccos(cos[3, 1]), 3 * 10000.0 ** (-2 / 8), atol=1e-6)
    assert np.allclose(sin[0], 0.0)


def test_heads_must_group_evenly() -> None:
    workload = get_workload("smollm2-135m")
    with pytest.raises(UsageError, match="multiple of --kv-heads 3"):
        workload.build(workload.resolve({**SMALL, "kv_heads": 3}))
