"""A biased softmax's additive tables whose rows repeat over the scores': a bias held as the
period every window and image repeats, and a shift mask held one block a window, each block
serving its window's heads in turn (``table_maps``).  Checked against numpy expansions of
the same tables, in the graph's rule, the interpreter, the price and the verdict's rerun of
some rows."""

from __future__ import annotations

import numpy as np
import pytest

from ipu_stack.ir.graph import GraphBuilder, table_row_index
from ipu_stack.ir.interpret import evaluate, evaluate_operations
from ipu_stack.ir.precision import F16
from ipu_stack.ir.types import TensorType
from ipu_stack.kernels.base import KernelInstance
from ipu_stack.kernels.rowwise import row_params
from ipu_stack.phases.stages import row_stage_bytes
from ipu_stack.planning.costs import estimate_activation, kernel_cost
from ipu_stack.planning.stages import find_stages
from ipu_stack.util.errors import CompileError
from ipu_stack.verdict.judge import judge

IMAGES, WINDOWS, HEADS, TOKENS = 2, 3, 2, 4
ROWS = IMAGES * WINDOWS * HEADS * TOKENS  # scores [images, windows, heads, T, T] as rows


def _expanded_mask(mask: np.ndarray) -> np.ndarray:
    """``[W T, T]`` as the scores' rows: each window's block once per head, then per image."""
    blocks = mask.reshape(WINDOWS, 1, TOKENS, TOKENS)
    per_image = np.broadcast_to(blocks, (WINDOWS, HEADS, TOKENS, TOKENS))
    return np.tile(per_image.reshape(-1, TOKENS), (IMAGES, 1))


def test_the_row_index_is_the_numpy_expansion_of_each_table() -> None:
    bias = np.arange(HEADS * TOKENS)
    np.testing.assert_array_equal(table_row_index(ROWS, len(bias)),
                                  np.tile(bias, IMAGES * WINDOWS))
    mask = np.arange(WINDOWS * TOKENS * TOKENS).reshape(WINDOWS * TOKENS, TOKENS)
    picked = mask[table_row_index(ROWS, WINDOWS * TOKENS, TOKENS, HEADS)]
    np.testing.assert_array_equal(picked, _expanded_mask(mask))
    # one row a sequence for all its heads (block 1): row r adds row r // heads
    np.testing.assert_array_equal(table_row_index(12, 4, 1, 3), np.arange(12) // 3)


def _graph(rng: np.random.Generator) -> tuple:
    b = GraphBuilder("tables")
    x = b.input("x", TensorType((ROWS, TOKENS), F16))
    scores = b.op("scale", [x], F16, "scores", factor=1.0)
    bias = b.weight("bias", TensorType((HEADS * TOKENS, TOKENS), F16))
    mask = b.weight("mask", TensorType((WINDOWS * TOKENS, TOKENS), F16))
    b.output(b.op("biased_softmax", [scores, bias, mask], F16, "probs", scale=0.5,
                  table_maps=[[1, 1], [TOKENS, HEADS]]))
    tensors = {"x": F16.round_trip(rng.standard_normal((ROWS, TOKENS))),
               "bias": F16.round_trip(rng.standard_normal((HEADS * TOKENS, TOKENS)) * 0.1),
               # a different mask a window, so a block given to the wrong rows shows
               "mask": np.where(rng.random((WINDOWS * TOKENS, TOKENS)) < 0.4, -100.0, 0.0)}
    return b.build(), tensors


def test_two_tables_add_to_the_scaled_scores_as_numpy_expands_them() -> None:
    graph, tensors = _graph(np.random.default_rng(3))
    got = evaluate(graph, tensors)["probs"]
    shifted = 0.5 * tensors["x"].astype(np.float64) + np.tile(
        tensors["bias"], (IMAGES * WINDOWS, 1)) + _expanded_mask(tensors["mask"])
    e = np.exp(shifted - shifted.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(axis=-1, keepdims=True), rtol=2e-3, atol=1e-4)


def test_a_table_that_does_not_repeat_into_the_scores_is_refused() -> None:
    b = GraphBuilder("bad")
    scores = b.input("scores", TensorType((ROWS, TOKENS), F16))
    mask = b.weight("mask", TensorType((5 * TOKENS, TOKENS), F16))
    bias = b.weight("bias", TensorType((HEADS * TOKENS, TOKENS), F16))
    with pytest.raises(CompileError, match=r"table \[20, 4\] \(blocks of 4 rows, each 2 "
                                           r"times\) does not repeat into the scores"):
        b.op("biased_softmax", [scores, bias, mask], F16, "p", table_maps=[[1, 1], [4, 2]])
    with pytest.raises(CompileError, match="2 tables and 1 table maps"):
        b.op("biased_softmax", [scores, bias, bias], F16, "p", table_maps=[[1, 1]])


def test_the_planner_counts_repeated_tables_as_the_scores_rows_they_fill() -> None:
    """The lowering copies each table's rows beside the scores' (``mapped_rows``), so the
    planner's whole-row footprint of the softmax holds the scores, both tables at the
    scores' size and the probabilities: four rows of T halves for every row a tile holds
    (with only the scores and the output it planned for half what the tile holds)."""
    graph, _ = _graph(np.random.default_rng(5))
    (stage,) = [s for s in find_stages(graph) if getattr(s, "kind", "") == "biased_softmax"]
    tiles = 5
    per_tile = -(-ROWS // tiles)
    assert row_stage_bytes(graph, stage, tiles) == per_tile * 4 * TOKENS * 2


def test_a_second_table_costs_one_more_add() -> None:
    def cost(tables: int) -> int:
        params = row_params("biased_softmax", 6, 144, F16, 288, F16, 288, F16, 288,
                            scale=0.1, **({"tables": 2} if tables == 2 else {}))
        return kernel_cost(KernelInstance("row", params))
    assert cost(2) - cost(1) == estimate_activation(6 * 144, "add_bias") > 0


def test_the_verdict_reruns_a_row_with_its_own_window_mask() -> None:
    """The device's scores differ in one element of a row of the second window;
    its probabilities are the reference's (stale): the rerun of that row alone, with that
    row's bias and mask rows, disagrees; the right probabilities agree exactly (a rerun
    that gave the row another window's mask would not)."""
    graph, tensors = _graph(np.random.default_rng(5))
    reference = evaluate(graph, tensors)
    device = {name: reference[name].copy() for name in ("scores", "probs")}
    row = HEADS * TOKENS + 2  # image 0, window 1, head 0: mask row 6 (a period would say 10)
    key = int(np.flatnonzero(tensors["mask"][TOKENS + 2] == 0)[0])
    device["scores"][row, key] += 0.5  # a key its window's mask leaves in
    stale = {s.stage: s for s in judge(graph, tensors, device, reference).stages}
    assert 0 < stale["probs"].mismatch <= 1 / ROWS  # within the one row
    op = next(o for o in graph.operations if o.kind == "biased_softmax")
    device["probs"] = evaluate_operations(graph, [op.id], {
        op.inputs[0]: device["scores"], op.inputs[1]: tensors["bias"],
        op.inputs[2]: tensors["mask"]})[op.outputs[0]]
    fixed = {s.stage: s for s in judge(graph, tensors, device, reference).stages}
    assert fixed["probs"].mismatch == 0.0
