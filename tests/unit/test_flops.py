"""The flop count behind ``effectiveGemmTflops`` and the FP8 roofline: every GEMM counts,
the attention products included (a roofline without them is too generous)."""

from __future__ import annotations

from ipu_stack.ir.graph import GraphBuilder
from ipu_stack.ir.precision import F16
from ipu_stack.ir.types import TensorType
from ipu_stack.runtime.record import gemm_flops
from ipu_stack.workloads.base import get_workload


def test_matmuls_and_both_attention_products_count() -> None:
    batch, tokens, heads, head_dim, width = 2, 5, 3, 4, 7
    dim = heads * head_dim
    b = GraphBuilder("flops")
    x = b.input("x", TensorType((batch * tokens, dim), F16))
    w = b.weight("w", TensorType((dim, width), F16))
    b.output(b.op("matmul", [x, w], F16, "y"))
    scores = b.op("head_matmul", [x, x], F16, "scores", mode="qk", heads=heads, tokens=tokens)
    b.output(b.op("head_matmul", [scores, x], F16, "context", mode="pv", heads=heads,
                  tokens=tokens))
    one_product = batch * heads * tokens * tokens * head_dim  # each of qk and pv
    assert gemm_flops(b.build()) == 2 * (batch * tokens * dim * width + 2 * one_product)


def test_so400m_tower_counts_its_attention() -> None:
    """siglip-vision: 27 layers of 729 x 1152 projections (q, k, v, o: 4 x 1152^2; MLP
    2 x 1152 x 4304) and attention (2 x 729 x 1152 a token), plus the 588-deep patch
    embedding: the issue's 333 G MAC an image."""
    workload = get_workload("siglip-vision")
    graph, _ = workload.build({**workload.defaults(), "layers": 1})
    tokens, dim, hidden = 729, 1152, 4304
    layer = tokens * (4 * dim * dim + 2 * dim * hidden + 2 * tokens * dim)
    assert gemm_flops(graph) == 2 * (layer + tokens * 588 * dim)
    assert round(2 * (27 * layer + tokens * 588 * dim) / 2e9) == 333
