"""Lowering of a tiny ``attention`` graph: head groups, transposed keys, exchange phases.

The graph is the diagnostic attention block (q, k, v projections, Q.K^T, softmax, P.V,
output projection) at 17 tokens, 64 dims and 4 heads of 16, planned the way
``pipeline.compile_workload`` plans it (the cheapest candidate of every GEMM stage), and
checked for structure: every head (and image) of a ``head_matmul`` stage computes on its own
tiles and receives exactly its share of the operands, only Q.K^T reads B transposed, and every
exchange phase has a schedule the independent verifier accepts.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from tests.helpers import cli

from ipu_stack.exchange import verify_schedule
from ipu_stack.lowering.driver import lower
from ipu_stack.lowering.lower import stage_groups
from ipu_stack.lowering.program import ComputeSet, Exchange, Program
from ipu_stack.pipeline import schedule_program, stage_shape, to_transfers
from ipu_stack.planning.gemm import GemmPlan, cost_plan, gemm_candidates
from ipu_stack.planning.stages import GemmStage, RowStage, find_stages
from ipu_stack.target import IPU21
from ipu_stack.workloads import get_workload

TOKENS, DIM, HEADS = 17, 64, 4
HEAD_DIM = DIM // HEADS
# q, k and v (stages 0-2) read the same rows in the same tiling: one gather serves all three
DEFAULT_PHASES = ["stage0.operands", "stage3.operands", "stage3.right", "stage4.rows",
                  "stage5.operands", "stage5.right", "stage6.operands"]


def build(batch: int, precision: str = "fp8"):
    workload = get_workload("attention")
    params = workload.resolve({"tokens": TOKENS, "dim": DIM, "heads": HEADS,
                               "batch": batch, "precision": precision})
    graph, _ = workload.build(params)
    return graph, find_stages(graph)


def default_plans(graph, stages) -> list[GemmPlan | None]:
    return [gemm_candidates(stage_shape(graph, s), IPU21)[0] if isinstance(s, GemmStage)
            else None for s in stages]


def depth_split_plans(graph, stages) -> list[GemmPlan | None]:
    """The cheapest plan with a depth split where a stage has one (a reduce phase each)."""
    plans = []
    for s in stages:
        if not isinstance(s, GemmStage):
            plans.append(None)
            continue
        found = gemm_candidates(stage_shape(graph, s), IPU21, keep=100)
        split = [p for p in found if p.depth_splits > 1]
        plans.append(split[0] if split else found[0])
    return plans


def compute_set(program: Program, name: str) -> ComputeSet:
    (found,) = [c for c in program.compute_sets() if c.name == name]
    return found


def buffer_id(program: Program, name: str) -> int:
    (found,) = [b.id for b in program.buffers if b.name == name]
    return found


def delivered_bytes(program: Program, phase: str, buffer: int) -> np.ndarray:
    """Bytes each tile receives into ``buffer`` in exchange ``phase`` plus its on-tile copies."""
    got = np.zeros(IPU21.tiles, dtype=np.int64)
    for step in program.exchanges():
        if step.name != phase:
            continue
        for k in range(step.transfers):
            lo, hi = step.dst_offsets[k], step.dst_offsets[k + 1]
            for j in range(lo, hi):
                if step.dst_buf[j] == buffer:
                    got[step.dst_tile[j]] += 4 * int(step.words[k])
    copies = [c for c in program.compute_sets() if c.name == f"{phase}.copy"]
    for cs in copies:
        for call in cs.calls:
            if call.operands[1][0] == buffer:
                p = call.instance.params
                got[call.tiles] += p["rows"] * p["row_bytes"]
    return got


@pytest.fixture(params=[1, 2], ids=["batch1", "batch2"])
def lowered(request):
    graph, stages = build(request.param)
    plans = default_plans(graph, stages)
    program = lower(graph, list(zip(stages, plans, strict=True)), IPU21)
    return request.param, graph, stages, plans, program


def test_stages_of_the_attention_block(lowered) -> None:
    _, _, stages, plans, _ = lowered
    kinds = [(s.kind, s.attrs.get("mode")) for s in stages]
    assert kinds == [("matmul", None)] * 3 + [("head_matmul", "qk"), ("softmax", None),
                                              ("head_matmul", "pv"), ("matmul", None)]
    assert isinstance(stages[4], RowStage)
    assert [p is None for p in plans] == [False] * 4 + [True] + [False] * 2


def test_head_groups_compute_on_disjoint_tiles(lowered) -> None:
    batch, graph, stages, plans, program = lowered
    for stage, plan in zip(stages, plans, strict=True):
        if not (isinstance(stage, GemmStage) and stage.kind == "head_matmul"):
            continue
        groups = stage_groups(graph, stage, plan)
        assert len(groups) == batch * HEADS
        gemm = compute_set(program, f"stage{stage.index}.gemm")
        tiles = np.concatenate([call.tiles for call in gemm.calls])
        assert len(tiles) == len(np.unique(tiles)), "a tile runs two GEMM calls"
        owner = {}
        for g, group in enumerate(groups):
            for tile in range(group.tile_base, group.tile_base + plan.tiles_used):
                assert tile not in owner, f"tile {tile} in groups {owner.get(tile)} and {g}"
                owner[tile] = g
        assert set(tiles.tolist()) == set(owner)
        assert max(owner) < IPU21.tiles
        per_group = np.bincount([owner[t] for t in tiles.tolist()], minlength=len(groups))
        assert (per_group == plan.tiles_used).all()
        # the epilogue runs on the group's tiles that finish rows (a depth split's last
        # sub-block can be empty when the rows do not divide)
        reduce = compute_set(program, f"stage{stage.index}.reduce")
        finishing = set(np.concatenate([c.tiles for c in reduce.calls]).tolist())
        assert finishing <= set(owner)
        assert len(finishing) >= len(groups) * plan.col_splits * (
            -(-TOKENS // plan.sub_rows) if plan.depth_splits > 1 else plan.row_splits)

        # every group receives exactly one head window of A and of B, replicated as planned
        # (rows move as whole words: a row of 17 F16 takes 36 bytes)
        item = graph.value(stage.a).type.precision.itemsize
        head_row = -(-HEAD_DIM * item // 4) * 4
        if stage.attrs["mode"] == "qk":  # A: q [T, d] over column splits; B: k [T, d] over rows
            a_bytes = TOKENS * head_row * plan.col_splits
        else:  # A: probabilities [T, T]; B: v [T, d]
            a_bytes = TOKENS * (-(-TOKENS * item // 4) * 4) * plan.col_splits
        b_bytes = TOKENS * head_row * plan.row_splits
        name = f"stage{stage.index}"
        a_got = delivered_bytes(program, f"{name}.operands", buffer_id(program, f"{name}.a"))
        b_got = delivered_bytes(program, f"{name}.right", buffer_id(program, f"{name}.b"))
        for g, group in enumerate(groups):
            span = slice(group.tile_base, group.tile_base + plan.tiles_used)
            assert a_got[span].sum() == a_bytes, (g, "A")
            assert b_got[span].sum() == b_bytes, (g, "B")
        assert a_got.sum() == a_bytes * len(groups) and b_got.sum() == b_bytes * len(groups)


def test_only_qk_reads_b_transposed(lowered) -> None:
    _, _, stages, _, program = lowered
    for stage in stages:
        if not isinstance(stage, GemmStage):
            continue
        calls = compute_set(program, f"stage{stage.index}.gemm").calls
        assert calls
        flags = {call.instance.params["b_transposed"] for call in calls}
        expected = stage.kind == "head_matmul" and stage.attrs["mode"] == "qk"
        assert flags == {expected}, stage
        if stage.kind == "head_matmul":
            for call in calls:
                p = call.instance.params
                assert p["rows"] <= TOKENS
                if stage.attrs["mode"] == "qk":
                    assert p["depth"] <= HEAD_DIM and p["cols"] <= TOKENS
                else:
                    assert p["depth"] <= TOKENS and p["cols"] <= HEAD_DIM


def _check_schedules(program: Program) -> list[str]:
    schedules = schedule_program(program, IPU21)
    steps = {index: step for _, index, step in program.steps() if isinstance(step, Exchange)}
    assert set(schedules) == set(steps)
    for index, schedule in schedules.items():
        transfers = to_transfers(steps[index], IPU21)
        verify_schedule(transfers, schedule)  # raises on a port conflict or a lost word
        assert schedule.horizon >= schedule.lower_bound > 0
    return [steps[i].name for i in sorted(steps)]


def test_exchange_phases_verify(lowered) -> None:
    _, _, stages, plans, program = lowered
    expected = []  # a depth-split head product adds its reduce phase after its operands
    for name in DEFAULT_PHASES:
        expected.append(name)
        index = int(name.split(".")[0][len("stage"):])
        if name.endswith(".right") and plans[index].depth_splits > 1:
            expected.append(f"stage{index}.reduce")
    assert _check_schedules(program) == expected
    assert all(step.transfers > 0 for step in program.exchanges())


def test_depth_split_plans_add_reduce_phases_that_verify() -> None:
    graph, stages = build(2)
    plans = depth_split_plans(graph, stages)
    split = [s.index for s, p in zip(stages, plans, strict=True) if p and p.depth_splits > 1]
    assert 5 in split  # P.V: depth = tokens splits; Q.K^T (depth = head_dim) has none here
    program = lower(graph, list(zip(stages, plans, strict=True)), IPU21)
    names = _check_schedules(program)
    reduces = [n for n in names if n.endswith(".reduce")]
    assert reduces == [f"stage{i}.reduce" for i in split]
    assert len(names) == len(DEFAULT_PHASES) + len(split)


def test_every_stage_result_gets_a_probe_read_and_no_exchange() -> None:
    graph, stages = build(1)
    plans = list(zip(stages, default_plans(graph, stages), strict=True))
    checked = lower(graph, plans, IPU21)
    names = [e.name for e in checked.exchanges()]
    assert not any("checkpoint" in n or "probe" in n for n in names)
    reads = [s for s in checked.run if getattr(s, "checkpoint", None) is not None]
    # one checkpoint per stage but the last (the output); head stages read one piece per head
    # (P.V's stage ends in the fused FP8 cast, so its checkpoint is attn.context8)
    assert sorted({r.checkpoint for r in reads}) == list(range(len(stages) - 1))
    pieces: dict[str, int] = {}
    for r in reads:
        pieces[r.tensor] = pieces.get(r.tensor, 0) + 1
    assert pieces == {"attn.q.mm": 1, "attn.k.mm": 1, "attn.v.mm": 1, "attn.scores": HEADS,
                      "attn.probs": 1, "attn.context8": HEADS}


def test_fp8_scores_without_a_depth_split_are_read_where_the_amp_stored_them() -> None:
    """With FP8 operands (``--attention fp8``) Q.K^T runs in the FP8 mode; with one depth
    block its FP16 partials are its F16 result, so no reduce kernel runs and the softmax
    reads the partials' buffer.  A depth-split plan still sums its partials (one head of
    64, so the 64-deep product can split into two 32-deep FP8 blocks)."""
    workload = get_workload("siglip-attention")
    params = workload.resolve({"tokens": TOKENS, "dim": DIM, "heads": 1, "hidden": 96,
                               "attention": "fp8"})
    graph, _ = workload.build(params)
    stages = find_stages(graph)
    (qk,) = [s for s in stages if isinstance(s, GemmStage) and s.attrs.get("mode") == "qk"]
    assert graph.value(qk.a).type.precision.is_fp8 and graph.value(qk.b).type.precision.is_fp8
    found = gemm_candidates(stage_shape(graph, qk), IPU21, keep=200)
    single = [p for p in found if p.depth_splits == 1 and p.mode == "fp8"][0]
    split = [p for p in found if p.depth_splits > 1 and p.mode == "fp8"][0]
    assert "epilogue" not in single.costs and split.costs["epilogue"] > 0
    for plan, reduced in ((single, False), (split, True)):
        plans = [plan if s is qk else p for s, p in zip(stages, default_plans(graph, stages),
                                                        strict=True)]
        program = lower(graph, list(zip(stages, plans, strict=True)), IPU21)
        names = {c.name for c in program.compute_sets()}
        assert (f"stage{qk.index}.reduce" in names) is reduced
        _check_schedules(program)


def test_a_softmax_runs_where_whole_row_scores_lie() -> None:
    """With a Q.K^T plan of one column block every score block holds whole rows: the
    softmax runs on those tiles (no gather into the landing layout, no second copy), and
    the planner charged that plan no gather while a column-split plan pays one."""
    graph, stages = build(1)
    qk = stages[3]
    assert stage_shape(graph, qk).rows_read_in_place
    split = gemm_candidates(stage_shape(graph, qk), IPU21)[0]
    assert split.col_splits > 1
    whole = cost_plan(stage_shape(graph, qk), 9, 1, 1, IPU21, mode=split.mode)
    assert "rows_exchange" not in whole.costs and split.costs["rows_exchange"] > 0
    plans = [whole if s is qk else p for s, p in zip(stages, default_plans(graph, stages),
                                                     strict=True)]
    program = lower(graph, list(zip(stages, plans, strict=True)), IPU21)
    names = _check_schedules(program)
    assert "stage4.rows" not in names
    softmax = compute_set(program, "stage4.softmax")
    scores = {c.operands[0][0] for c in compute_set(program, "stage3.gemm").calls}
    scores |= {c.operands[3][0] for c in compute_set(program, "stage3.reduce").calls}
    assert {c.operands[0][0] for c in softmax.calls} <= scores
    rows = sum(c.instance.params["rows"] * len(c.tiles) for c in softmax.calls)
    assert rows == HEADS * TOKENS  # every row of every head once
    ran = np.concatenate([c.tiles for c in softmax.calls])
    assert len(ran) == len(np.unique(ran))  # one call a tile


def test_products_in_waves_run_on_the_device_bit_for_bit(tmp_path) -> None:
    """1,600 head products (a batch of 100 sequences, 16 heads) on 1,472 tiles: each
    ``head_matmul`` runs in two waves of 800 on the same tiles; the layer passes against the
    host reference bit for bit, the estimate is the device's count, and the package says
    the waves."""
    code, out, err = cli(["--quiet", "bench", "vit-layer", "--batch", "100", "--tokens", "4",
                          "--dim", "64", "--heads", "16", "--hidden", "96", "--json",
                          "--out", str(tmp_path)])
    record = json.loads(out)
    assert code == 0 and record["numericalTest"] == "PASS", (record, err)
    assert record["maximumAbsoluteError"] == 0.0
    assert record["estimateError"] == 0.0
    code, out, _ = cli(["inspect", str(tmp_path), "--json"])
    assert sum("in 2 waves" in plan for plan in json.loads(out)["plans"]) == 2
