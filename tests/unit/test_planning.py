"""Planning: GEMM tiling candidates and fusion of elementwise chains into GEMM stages."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ipu_stack.ir.graph import GraphBuilder, Operation
from ipu_stack.ir.precision import F16, F32, f143
from ipu_stack.ir.types import TensorType
from ipu_stack.planning.gemm import GemmShape, cost_plan, gemm_candidates, transient_bytes
from ipu_stack.planning.stages import GemmStage, RowStage, find_stages
from ipu_stack.target import IPU21
from ipu_stack.util.errors import CompileError

SHAPES = [
    GemmShape(0, 1024, 1152, 4304, 1, True),
    GemmShape(0, 64, 768, 768, 2, False),
    GemmShape(0, 7, 100, 33, 1, True),
    GemmShape(0, 3000, 64, 16, 1, True, (("round", {"kind": "F16"}),), False),
    GemmShape(0, 1, 4096, 1, 2, False),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s.rows}x{s.depth}x{s.cols}")
def test_every_candidate_covers_the_matrix_and_fits_the_chip(shape: GemmShape) -> None:
    plans = gemm_candidates(shape, IPU21, keep=8)
    assert plans, "no candidate"
    for p in plans:
        step = 32 if p.mode == "fp8" else 16
        r, c, d = p.row_splits, p.col_splits, p.depth_splits
        assert p.tiles_used == r * c * d <= 1472
        assert r * p.row_block >= shape.rows
        assert c * p.col_block >= shape.cols
        assert d * p.depth_block >= shape.depth
        # no empty split: the last block of each axis still holds data
        assert (r - 1) * p.row_block < shape.rows
        assert (c - 1) * p.col_block < shape.cols
        assert (d - 1) * p.depth_block < shape.depth
        assert p.row_block % d == 0 and p.sub_rows * d == p.row_block
        assert p.depth_block % step == 0 and p.col_block % 16 == 0
        assert p.mode in (("fp8", "f16") if shape.fp8 else ("f16",))
        assert p.estimated_cycles == sum(p.costs.values()) > 0
        assert ("reduce_exchange" in p.costs) == (d > 1)
        tiles = {p.tile(i, j, k) for i in range(r) for j in range(c) for k in range(d)}
        assert tiles == set(range(p.tiles_used))
    cycles = [p.estimated_cycles for p in plans]
    assert cycles == sorted(cycles)


def test_cost_plan_rejects_empty_splits_and_rounds_blocks() -> None:
    shape = GemmShape(0, 10, 64, 32, 1, True)
    assert cost_plan(shape, 20, 1, 1, IPU21) is None  # 20 row splits of 1 leave 10 empty
    assert cost_plan(shape, 1, 1, 4, IPU21) is None  # depth blocks of 32: only 2 needed
    plan = cost_plan(shape, 3, 2, 2, IPU21)
    assert plan is not None
    assert (plan.row_block, plan.depth_block, plan.col_block) == (4, 32, 16)
    assert plan.describe() == "R3xC2xD2 blocks 4x32x16 mode=fp8"
    # A exchange: the sync before it (90), 4 rows x 32 FP8 bytes = 32 words, plus the
    # measured 237 per phase
    assert plan.costs["a_exchange"] == 90 + 32 + 237
    # reduce exchange: (D-1) x sub rows 2 x 16 columns of FP16 partials = 16 words
    assert plan.costs["reduce_exchange"] == 90 + 1 * 2 * 16 * 2 // 4 + 237
    # the GEMM: 294 + 1 pass x (4 x 4 rows + 160), no sync of its own
    assert plan.costs["gemm"] == 294 + 4 * 4 + 160
    f16 = cost_plan(shape, 3, 2, 2, IPU21, "f16")
    assert f16 is not None and f16.depth_block == 32  # two F16 passes of 16
    # F16 mode on FP8 data: 2 passes, plus the vendor's Cast1D of 4 x 32 + 32 x 16 = 640
    # elements: 107 a worker, 26 vectors of 4 at 1 cycle, remainder 3 (two bits set)
    assert f16.costs["gemm"] == 294 + 2 * (4 * 4 + 160) + 12 + 6 * (37 + 26 + 2 + 4)
    assert f16.costs["reduce_exchange"] == 90 + 1 * 2 * 16 * 4 // 4 + 237  # F32 partials


def test_more_tiles_make_a_big_gemm_cheaper_than_one_tile() -> None:
    shape = GemmShape(0, 512, 1024, 1024, 1, True)
    one = cost_plan(shape, 1, 1, 1, IPU21)
    best = gemm_candidates(shape, IPU21)[0]
    assert one is not None
    assert best.estimated_cycles * 50 < one.estimated_cycles
    assert best.tiles_used > 700


def _mlp(with_output_mid: bool = False):
    b = GraphBuilder("mlp")
    x = b.input("x", TensorType((4, 32), f143(-1)))
    w1 = b.weight("w1", TensorType((32, 48), f143(-3)))
    bias = b.weight("b1", TensorType((48,), F16))
    w2 = b.weight("w2", TensorType((48, 32), f143(-3)))
    h = b.op("matmul", [x, w1], F16, "fc1")
    h = b.op("bias_add", [h, bias], F16, "fc1.b")
    g = b.op("gelu", [h], F32, "act")
    c = b.op("cast", [g], f143(0), "act.q")
    y = b.op("matmul", [c, w2], F16, "fc2")
    if with_output_mid:
        b.output(g)
    b.output(y)
    return b.build()


def test_find_stages_fuses_bias_gelu_and_cast_into_the_matmul() -> None:
    g = _mlp()
    stages = find_stages(g)
    assert len(stages) == 2
    first, second = stages
    names = {v.id: v.name for v in g.values}
    assert (names[first.a], names[first.b], names[first.bias], names[first.out]) == (
        "x", "w1", "b1", "act.q"
    )
    assert [step[0] for step in first.chain] == ["round", "bias", "gelu_tanh", "cast"]
    assert [step[1]["kind"] for step in first.chain] == ["F16", "F16", "F32", "F8F143"]
    assert first.operations == (0, 1, 2, 3)
    assert (names[second.a], names[second.out], second.bias) == ("act.q", "fc2", None)
    assert second.chain == (("round", F16.to_json()),)


def test_a_graph_output_ends_the_chain() -> None:
    # "act" is an output: the chain stops there, and the cast after it is a row stage
    first, cast, second = find_stages(_mlp(with_output_mid=True))
    assert isinstance(first, GemmStage) and isinstance(second, GemmStage)
    assert [s[0] for s in first.chain] == ["round", "bias", "gelu_tanh"]
    assert isinstance(cast, RowStage)
    assert (cast.kind, cast.op, cast.inputs, cast.out) == ("cast", 3, (first.out,), second.a)

    b = GraphBuilder("g")
    x = b.input("x", TensorType((4, 32), F16))
    w1 = b.weight("w1", TensorType((32, 32), F16))
    w2 = b.weight("w2", TensorType((32, 16), F16))
    act = b.op("gelu", [b.op("matmul", [x, w1], F16, "mm1")], F16, "act", approximate="none")
    b.output(act)
    b.output(b.op("matmul", [act, w2], F32, "mm2"))
    first, second = find_stages(b.build())
    assert [s[0] for s in first.chain] == ["round", "gelu_erf"]
    assert first.out == act and second.a == act


def test_leading_elementwise_operation_is_a_row_stage() -> None:
    b = GraphBuilder("g")
    x = b.input("x", TensorType((4, 32), F16))
    w = b.weight("w", TensorType((32, 16), F16))
    y = b.op("gelu", [x], F16, "pre")
    b.output(b.op("matmul", [y, w], F16, "mm"))
    row, gemm = find_stages(b.build())
    assert isinstance(row, RowStage) and (row.kind, row.inputs, row.out) == ("gelu", (x,), y)
    assert isinstance(gemm, GemmStage) and gemm.a == y and gemm.chain == (("round", F16.to_json()),)


def test_unfusable_graphs_name_the_operation() -> None:
    b = GraphBuilder("g")
    x = b.input("x", TensorType((4, 32), F16))
    w = b.input("w", TensorType((32, 16), F16))
    b.output(b.op("matmul", [x, w], F16, "mm"))
    with pytest.raises(CompileError, match="matmul 0: right operand must be a weight"):
        find_stages(b.build())

    b = GraphBuilder("g")
    x = b.input("x", TensorType((4, 32), F16))
    w = b.weight("w", TensorType((32, 16), F16))
    m = b.op("matmul", [x, w], F16, "mm")
    b.output(b.op("gelu", [m], F16, "act", approximate="sigmoid"))
    with pytest.raises(CompileError, match="gelu approximate='sigmoid' is not tanh or none"):
        find_stages(b.build())

    g = b.build()
    g.operations[1] = Operation(1, "fft", (m,), g.operations[1].outputs)
    with pytest.raises(CompileError, match=r"operation 1 \(fft\) has no lowering"):
        find_stages(g)


def test_an_activation_b_is_gathered_once_per_stage_and_costed() -> None:
    """Attention's k or v (B not a weight) costs its `.right` phase: bk x bn FP8 bytes as
    words plus the measured phase cost, once however many row chunks the stage runs in; a
    weight B costs nothing to gather (it is resident)."""
    from ipu_stack.target.timing import p

    keys = GemmShape(0, 729, 72, 729, 1, True, b_resident=False)
    plan = cost_plan(keys, 10, 1, 1, IPU21)
    assert plan.costs["b_exchange"] == (p("sync") + 96 * 736 // 4  # 72 -> 96 deep
                                        + p("exchange_phase"))
    chunked = cost_plan(keys, 10, 1, 1, IPU21, chunks=3)
    assert chunked.costs["b_exchange"] == plan.costs["b_exchange"]
    assert chunked.costs["a_exchange"] > plan.costs["a_exchange"]  # A pays a phase a chunk
    assert "b_exchange" not in cost_plan(SHAPES[0], 9, 18, 9, IPU21).costs


def test_products_that_outnumber_the_tiles_run_in_waves() -> None:
    """Swin-L's 1,536 window-head score products at batch 4 on 1,472 tiles: two waves of
    768, each product on a tile of its own, every phase and compute set paid once a wave,
    and every wave's output held until the softmax reads it; below the tile count, one
    wave as before."""
    scores = GemmShape(0, 144, 32, 144, 1, True, groups=1536, b_resident=False)
    plans = gemm_candidates(scores, IPU21, keep=8)
    assert plans and all(p.waves == 2 and p.wave_groups == 768 for p in plans)
    assert all(p.tiles_used * p.wave_groups <= IPU21.tiles for p in plans)
    one = cost_plan(scores, plans[0].row_splits, plans[0].col_splits, plans[0].depth_splits,
                    IPU21, plans[0].mode)
    assert plans[0].costs == {key: 2 * value for key, value in one.costs.items()}
    assert transient_bytes(plans[0]) - transient_bytes(one) == \
        plans[0].sub_rows * -(-plans[0].col_block * 2 // 4) * 4
    assert "in 2 waves" in plans[0].describe()
    fewer = gemm_candidates(replace(scores, groups=1152), IPU21, keep=8)
    assert all(p.waves == 1 for p in fewer)


def test_a_key_split_scores_plan_pays_the_softmax_gather_and_its_copy() -> None:
    """With a softmax reading the output, a plan that splits the keys over C tiles pays the
    exchange into whole rows and a tile's share of the copy; a whole-row plan pays neither,
    and FP16 partials read in place are counted once."""
    from ipu_stack.planning.gemm import transient_bytes

    scores = GemmShape(0, 729, 72, 729, 1, True, (("round", {"kind": "F16"}),),
                       b_resident=False, rows_read_in_place=True)
    split = cost_plan(scores, 5, 6, 1, IPU21)
    whole = cost_plan(scores, 10, 1, 1, IPU21)
    rows = -(-729 // 30)  # the 30 tiles' share of the rows, 1 460 bytes each (729 F16, padded)
    assert split.costs["rows_exchange"] == 90 + rows * 1460 // 4 + 237
    assert "rows_exchange" not in whole.costs
    plain = cost_plan(replace(scores, rows_read_in_place=False), 5, 6, 1, IPU21)
    assert transient_bytes(split) - transient_bytes(plain) == rows * 1460
    out = whole.row_block * 736 * 2  # one copy: the FP16 partials are the F16 scores
    b = whole.depth_block * 736
    a = whole.row_block * 96
    assert transient_bytes(whole) == a + b + out


def test_a_paired_gather_is_priced_at_half_its_words_only_when_replicas_fill_pairs() -> None:
    """Paired tiles (the default): A's C column replicas lie side by side from an even
    tile, so with an even C every receiving pair takes the same words at two a cycle; an
    odd C leaves pairs split between two A blocks, and the gather is one lane."""
    shape = GemmShape(0, 1025, 1536, 8960, 1, True)
    paired = replace(shape, pair_lanes=2)
    words = 147 * 512 // 4  # R7 x D3: blocks 147 x 512 FP8 bytes
    even = cost_plan(paired, 7, 70, 3, IPU21)
    assert even is not None and even.costs["a_exchange"] == 90 + -(-words // 2) + 237
    plain = cost_plan(shape, 7, 70, 3, IPU21)
    assert plain is not None and plain.costs["a_exchange"] == 90 + words + 237
    odd = cost_plan(paired, 7, 35, 3, IPU21)
    assert odd is not None and odd.costs["a_exchange"] == 90 + words + 237
    # nothing else of the plan changes
    assert {k: v for k, v in even.costs.items() if k != "a_exchange"} == \
        {k: v for k, v in plain.costs.items() if k != "a_exchange"}


def test_paired_gathers_change_what_the_planner_prefers() -> None:
    """Halving A's gathers makes plans with more (even) column splits cheaper: the fastest
    paired plan for so400m's fc1 is at least as fast as the fastest unpaired one, and its
    A gather is priced at half its words."""
    shape = GemmShape(0, 729, 1152, 4304, 1, True)
    paired = gemm_candidates(replace(shape, pair_lanes=2), IPU21)[0]
    plain = gemm_candidates(shape, IPU21)[0]
    assert paired.estimated_cycles < plain.estimated_cycles
    assert paired.col_splits % 2 == 0
    words = paired.row_block * paired.depth_block // 4
    assert paired.costs["a_exchange"] == 90 + -(-words // 2) + 237


@pytest.mark.parametrize("cols", [576, 100, 16])
def test_a_lean_search_keeps_column_blocks_wide(cols: int) -> None:
    """``min_col_block``: no plan (fastest or on the memory front) splits the columns into
    blocks narrower than asked where the GEMM has the columns; without it the fastest
    plans of a tall GEMM split them into the narrowest, 16."""
    from ipu_stack.planning.gemm import gemm_search

    shape = GemmShape(0, 9216, 192, cols, 1, True)
    fastest, front = gemm_search(shape, IPU21, keep=4)
    lean, lean_front = gemm_search(shape, IPU21, keep=4, min_col_block=32)
    assert lean and lean_front
    for plan in lean + lean_front:
        assert plan.col_block >= min(32, cols) and plan.col_splits * plan.col_block >= cols
    if cols == 576:
        assert min(p.col_block for p in fastest + front) == 16
        assert lean[0].estimated_cycles >= fastest[0].estimated_cycles
