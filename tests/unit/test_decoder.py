"""The builtin decoder (``smollm2-135m``): its graph in float64 against an independent numpy
Llama forward pass on the same weights (no torch), and its pieces against their formulas."""

from __future__ import annotations

import numpy as np
import pytest
from tests.helpers import llama_forward

from ipu_stack.ir.interpret import evaluate_float64
from ipu_stack.util.errors import UsageError
from ipu_stack.workloads import get_workload
from ipu_stack.workloads.decoder import head_selection, rope_1d_tables

SMALL = {"vocab": 50, "dim": 16, "hidden": 24, "layers": 2, "heads": 4, "kv_heads": 2,
         "tokens": 6, "batch": 2, "precision": "f16"}


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
