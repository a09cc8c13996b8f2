"""Swapped-operand GEMM plans (``planning.gemm``): the row as the AMP's weights, the weight
block stored transposed and streamed, the depth partials reduce-scattered by columns."""

from __future__ import annotations

import numpy as np
import pytest
from tests.helpers import bench

from ipu_stack.ir.interpret import split_depth_matmul, swapped_split
from ipu_stack.ir.layout import BlockLayout
from ipu_stack.ir.precision import F16, f143
from ipu_stack.ir.rounding import f32_matmul
from ipu_stack.planning import gemm as planning_gemm
from ipu_stack.planning.fit import DoesNotFit, MemoryBudget, SideBySide, fit_plans
from ipu_stack.planning.gemm import (
    GemmShape,
    cost_plan,
    gemm_search,
    interleaved_transient_bytes,
    resident_bytes,
    transient_bytes,
)
from ipu_stack.target import IPU21

GATE = GemmShape(0, 1, 2048, 5632, 1, True)  # TinyLlama's gate at one row


@pytest.mark.parametrize("precision", [F16, f143()])
def test_a_transposed_layout_stores_each_block_transposed(precision) -> None:
    rng = np.random.default_rng(3)
    rows, cols, row_block, col_block = 10, 7, 4, 3
    tiles = np.arange(9, dtype=np.int32).reshape(3, 3, 1)
    layout = BlockLayout(rows, cols, precision, row_block, col_block, tiles, True)
    stored = precision.quantize(rng.standard_normal((rows, cols)).astype(np.float32))
    blocks = layout.to_blocks(stored)
    item = precision.itemsize
    pitch = -(-row_block * item // 4) * 4
    assert layout.pitch == pitch and layout.block_bytes == col_block * pitch
    padded = np.zeros((12, 9), dtype=stored.dtype)
    padded[:rows, :cols] = stored
    for i in range(3):
        for j in range(3):
            block = padded[i * 4:i * 4 + 4, j * 3:j * 3 + 3]
            lines = blocks[i, j].reshape(col_block, pitch)
            for c in range(col_block):  # stored line c: the block's column c
                assert lines[c, :row_block * item].tobytes() == block[:, c].tobytes()
    np.testing.assert_array_equal(layout.from_blocks(blocks).view(np.uint8),
                                  stored.view(np.uint8))
    assert "stored transposed" in layout.human() and layout.to_json()["transposed"]


def test_a_swapped_plan_is_priced_by_hand() -> None:
    """R1 x C22 x D32: 64-deep blocks, 256 columns a tile, 8 a depth tile's slice."""
    plan = cost_plan(GATE, 1, 22, 32, swapped=True)
    assert plan is not None and plan.swapped
    assert (plan.row_block, plan.depth_block, plan.col_block, plan.slice_shape) == (
        1, 64, 256, (1, 8))
    # the AMP: 294 + 2 depth passes x (256 rows x 4 + 160); the syncs go with the phases
    assert plan.costs["gemm"] == 294 + 2 * (4 * 256 + 160)
    assert plan.costs["a_exchange"] == 90 + 237 + 64 // 4  # a 64-byte row slice
    assert plan.costs["reduce_exchange"] == 90 + 237 + 31 * 8 * 2 // 4  # 31 FP16 slices of 8
    assert resident_bytes(plan) == 256 * 64  # the block, transposed
    # only the row (64 bytes) and the partial row (256 FP16) sit in interleaved memory
    assert interleaved_transient_bytes(plan) == 64 + 256 * 2
    assert transient_bytes(plan) == 64 + 512 + 31 * 8 * 2 + 8 * 2  # received, FP16 out


@pytest.mark.parametrize("shape, splits", [
    (GemmShape(0, 4, 2048, 5632, 1, True), (4, 22, 32)),  # more rows than SWAP_ROWS
    (GemmShape(0, 1, 2048, 5632, 1, True, groups=2), (1, 22, 32)),  # head products
    (GemmShape(0, 1, 2048, 5632, 1, True, b_resident=False), (1, 22, 32)),  # activation B
    (GATE, (2, 22, 32)),  # a row group without a row
    (GATE, (1, 200, 32)),  # 6,400 slices of 5,632 columns: some empty
    (GATE, (1, 22, 65)),  # a depth tile without depth
])
def test_swapped_plans_refuse_what_they_cannot_run(shape, splits) -> None:
    assert cost_plan(shape, *splits, swapped=True) is None


def test_the_search_takes_a_swapped_plan_where_it_is_faster() -> None:
    best, _ = gemm_search(GATE, IPU21.with_tiles(736), keep=1, mode="fp8")
    assert best[0].swapped and best[0].estimated_cycles < 5000
    plain = [p for p in gemm_search(GATE, IPU21.with_tiles(736), keep=50, mode="fp8")[0]
             if not p.swapped]
    assert plain[0].estimated_cycles > best[0].estimated_cycles + 2000


def test_swapped_weights_leave_interleaved_memory_free() -> None:
    """Eleven layers of swapped weights fit where plain plans' weights, which the AMP
    loads from interleaved memory, could not."""
    plan = cost_plan(GATE, 1, 22, 32, swapped=True)
    assert plan is not None
    budget = MemoryBudget(600_000, 112 * 1024)
    chosen, moves = fit_plans([plan], [[]], budget, repeats=[11])
    assert chosen == [plan] and moves == 0
    plain = cost_plan(GATE, 1, 22, 32)
    assert plain is not None and resident_bytes(plain) * 11 > budget.interleaved
    with pytest.raises(Exception, match="interleaved memory"):
        fit_plans([plain], [[]], budget, repeats=[11])


def test_the_reference_adds_a_swapped_plans_partials_owner_first_by_column() -> None:
    """Each output column's depth tile adds its own block's float32 partial first, then
    the others in depth order: checked against a loop over the columns."""
    rng = np.random.default_rng(5)
    depth, cols, block, splits, bn = 96, 40, 32, 3, 24  # slices of 8 columns
    x = rng.standard_normal((1, depth)).astype(np.float32) * 1e3
    w = rng.standard_normal((depth, cols)).astype(np.float32)
    record = {"mode": "f16", "depth_block": block, "depth_splits": splits, "col_block": bn,
              "swapped": True}
    got = split_depth_matmul(w.T, x.T, swapped_split(record, cols)).T
    parts = [f32_matmul(x[:, k:k + block], w[k:k + block]) for k in range(0, depth, block)]
    want = np.empty((1, cols), dtype=np.float32)
    for j in range(cols):
        owner = (j % bn) // (bn // splits)
        total = parts[owner][0, j]
        for k in range(splits):
            if k != owner:
                total = np.float32(total + parts[k][0, j])
        want[0, j] = total
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("mode", ["fp8", "f16"])
def test_a_decode_step_runs_swapped_plans_at_the_references_bits(tmp_path, monkeypatch,
                                                                   mode) -> None:
    """A 512-wide decode step whose MLP and LM head the planner swaps: PASS at the host
    reference's bits, the estimate the device's count, and fewer cycles than with swapped
    plans ruled out."""
    args = ["--dim", "512", "--hidden", "4096", "--layers", "1", "--heads", "8",
            "--kv-heads", "2", "--vocab", "16384", "--context", "6", "--tokens", "1",
            "--gemm-mode", mode]
    cycles = {}
    for rows in (3, 0):
        monkeypatch.setattr(planning_gemm, "SWAP_ROWS", rows)
        folder = tmp_path / f"swap{rows}"
        run = bench("smollm2-135m", *args, folder=folder, cache_dir=folder / "cache")
        assert run.record["numericalTest"] == "PASS"
        assert run.record["maximumAbsoluteError"] == 0.0
        assert run.record["estimateError"] == 0.0
        assert ("operands swapped" in run.stderr) == (rows > 0)
        cycles[rows] = run.record["cycles"]
    assert cycles[3] < cycles[0] - 500  # the LM head above all


def test_siblings_side_by_side_hold_one_weight_block_a_tile() -> None:
    """A decode step's gate and up run side by side on grids of their own: a tile holds
    one of their blocks, which the fitter counts once where the grids fit the chip."""
    gate = cost_plan(GATE, 1, 22, 32, swapped=True)
    up = cost_plan(GemmShape(1, 1, 2048, 5632, 1, True), 1, 22, 32, swapped=True)
    assert gate is not None and up is not None and gate.tiles_used == 704
    budget = MemoryBudget(11 * resident_bytes(gate) + 20_000)
    apart = SideBySide(((0, 1),), 1472)
    assert apart.weights([gate, up], [11, 11]) == 11 * resident_bytes(gate)
    assert SideBySide(((0, 1),), 1400).weights([gate, up], [11, 11]) == \
        22 * resident_bytes(gate)  # the grids overlap on a smaller chip
    assert fit_plans([gate, up], [[], []], budget, [11, 11], apart) == ([gate, up], 0)
    with pytest.raises(DoesNotFit):
        fit_plans([gate, up], [[], []], budget, [11, 11])


def test_two_rows_search_swapped_plans_with_depth_splits() -> None:
    """At two rows a plain plan's row block of one cannot split the depth, a swapped plan
    (a row a row group) can: the search takes it where it is fastest."""
    shape = GemmShape(0, 2, 2048, 5632, 1, True)
    best, _ = gemm_search(shape, IPU21.with_tiles(736), keep=1, mode="fp8")
    assert best[0].swapped and best[0].row_splits == 2 and best[0].depth_splits > 1
    assert best[0].estimated_cycles <= cost_plan(shape, 2, 11, 32, swapped=True).estimated_cycles
