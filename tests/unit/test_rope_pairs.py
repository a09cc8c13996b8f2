"""RoPE's rotate-half pairs made adjacent (``ir.rope_pairs``) and run where q's and k's GEMMs
leave them (``RowLowering.rope_in_place``), with the angles gathered once before the layer
loop (``lowering.fuse.loop_invariant``) and the cache's holders off the rows' tiles.

The rewrite must not change what the model computes: checked against the graph as built
without it, in float64, and against a numpy rotation written here."""

from __future__ import annotations

import numpy as np
import pytest

from ipu_stack.ir.graph import GraphBuilder
from ipu_stack.ir.interpret import evaluate_float64
from ipu_stack.ir.precision import F16, I32
from ipu_stack.ir.rope_pairs import interleave_rope_pairs, pair_order
from ipu_stack.ir.types import TensorType
from ipu_stack.ir.values import DeferredTensors
from ipu_stack.lowering.driver import lower
from ipu_stack.lowering.fuse import HOIST_BYTES, loop_invariant
from ipu_stack.lowering.program import Exchange, Loop, Slot
from ipu_stack.pipeline import stage_shape
from ipu_stack.planning.gemm import gemm_candidates
from ipu_stack.planning.stages import GemmStage, find_stages
from ipu_stack.target import IPU21
from ipu_stack.workloads import decoder, get_workload


def _rotate_half(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, d: int) -> np.ndarray:
    """Llama's ``x cos + rotate_half(x) sin`` on every head of ``x`` ``[rows, heads d]``."""
    heads = x.reshape(x.shape[0], -1, d)
    first, second = heads[..., : d // 2], heads[..., d // 2:]
    rotated = np.concatenate([-second, first], axis=-1)
    c, s = np.concatenate([cos, cos], -1)[:, None], np.concatenate([sin, sin], -1)[:, None]
    return (heads * c + rotated * s).reshape(x.shape)


def _rotate_adjacent(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, d: int) -> np.ndarray:
    """Pairs ``(2i, 2i + 1)`` turned by angle ``i``."""
    pairs = x.reshape(x.shape[0], -1, d // 2, 2)
    c, s = cos[:, None], sin[:, None]
    return np.stack([pairs[..., 0] * c - pairs[..., 1] * s,
                     pairs[..., 0] * s + pairs[..., 1] * c], -1).reshape(x.shape)


def test_the_order_makes_rotate_half_pairs_adjacent() -> None:
    rng = np.random.default_rng(0)
    d, heads = 8, 3
    x = rng.normal(size=(4, heads * d))
    angles = rng.normal(size=(4, d // 2))
    order = (np.arange(heads)[:, None] * d + pair_order(d)).reshape(-1)
    assert pair_order(d).tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    expected = _rotate_half(x, np.cos(angles), np.sin(angles), d)[:, order]
    got = _rotate_adjacent(x[:, order], np.cos(angles), np.sin(angles), d)
    np.testing.assert_allclose(got, expected, rtol=1e-12)


def _step(monkeypatch: pytest.MonkeyPatch | None = None, **extra: int):
    if monkeypatch is not None:
        monkeypatch.setattr(decoder, "interleave_rope_pairs", lambda graph, tensors: 0)
    model = get_workload("smollm2-135m")
    graph, tensors = model.build(model.resolve({"layers": 2, "tokens": 1, "context": 32,
                                                "batch": 1, **extra}))
    return graph, tensors


@pytest.mark.parametrize("tokens", [1, 8], ids=["decode-step", "prompt-pass"])
def test_a_cached_attention_computes_the_same_after_the_rewrite(monkeypatch, tokens) -> None:
    """The decode step (keys through the cache) and the prompt's pass (keys through the
    grouped-query repeat, and into the cache): every rope turned interleaved, q's and k's
    weights reordered, the outputs the same in float64; the values are not touched."""
    before, plain = _step(monkeypatch, tokens=tokens)
    monkeypatch.undo()
    after, tensors = _step(tokens=tokens)
    ropes = [op for op in after.operations if op.kind == "rope"]
    assert len(ropes) == 4 and all(op.attrs["pairs"] == "interleaved" for op in ropes)
    assert all(op.attrs["pairs"] == "halves" for op in before.operations if op.kind == "rope")
    q = np.asarray(tensors["layer1.attn.q.w"])
    np.testing.assert_array_equal(q[:, 1], np.asarray(plain["layer1.attn.q.w"])[:, 32])
    np.testing.assert_array_equal(np.asarray(tensors["layer1.attn.v.w"]),
                                  np.asarray(plain["layer1.attn.v.w"]))
    names = [v.name for v in after.by_role("output")]
    ideal, rewritten = evaluate_float64(before, plain), evaluate_float64(after, tensors)
    for name in names:
        np.testing.assert_allclose(rewritten[name], ideal[name], rtol=1e-9, atol=1e-9)


def test_a_prompt_pass_without_a_cache_keeps_its_pairs() -> None:
    model = get_workload("smollm2-135m")
    graph, _ = model.build(model.resolve({"layers": 1, "tokens": 8, "context": 0}))
    assert [op.attrs["pairs"] for op in graph.operations if op.kind == "rope"] == \
        ["halves", "halves"]


def _attention(q_is_output: bool = False, shared_weight: bool = False):
    """A one-layer cached attention of 2 heads of 8, built by hand."""
    b = GraphBuilder("attention")
    x = b.input("x", TensorType((1, 16), F16))
    wq = b.weight("wq", TensorType((16, 16), F16))
    wk = wq if shared_weight else b.weight("wk", TensorType((16, 16), F16))
    cache = b.weight("cache", TensorType((32, 16), F16))
    cos, sin = (b.input(n, TensorType((1, 4), F16)) for n in ("cos", "sin"))
    slots = b.input("slots", TensorType((1, 1), I32))
    q = b.op("rope", [b.op("matmul", [x, wq], F16, "q.mm"), cos, sin], F16, "q", head_dim=8,
             pairs="halves")
    k = b.op("rope", [b.op("matmul", [x, wk], F16, "k.mm"), cos, sin], F16, "k", head_dim=8,
             pairs="halves")
    written = b.op("cache_write", [cache, k, slots], F16, "written", positions=32, kv_heads=2)
    scores = b.op("head_matmul", [q, written], F16, "scores", mode="qk", heads=2, tokens=1,
                  kv_heads=2, kv_tokens=32)
    b.output(scores)
    if q_is_output:
        b.output(q)
    tensors = DeferredTensors()
    for name in ("wq", "wk", "cache"):
        tensors.defer(name, lambda name=name: np.arange(256 if name != "cache" else 512,
                                                       dtype=np.float32).reshape(-1, 16))
    return b.build(), tensors


def test_the_rewrite_reorders_weights_when_they_are_made() -> None:
    graph, tensors = _attention()
    assert interleave_rope_pairs(graph, tensors) == 2
    assert tensors.pending == 3  # nothing made at compile time
    order = (np.arange(2)[:, None] * 8 + pair_order(8)).reshape(-1)
    for name in ("wq", "wk", "cache"):
        width = 16
        np.testing.assert_array_equal(tensors[name][0], np.arange(width)[order])


@pytest.mark.parametrize("case", ["q-is-an-output", "one-weight-for-q-and-k"])
def test_an_order_that_would_be_seen_is_left_alone(case: str) -> None:
    graph, tensors = _attention(q_is_output=case == "q-is-an-output",
                                shared_weight=case == "one-weight-for-q-and-k")
    assert interleave_rope_pairs(graph, tensors) == 0
    assert all(op.attrs["pairs"] == "halves" for op in graph.operations if op.kind == "rope")


def test_a_decode_layer_turns_q_and_k_where_their_gemms_leave_them() -> None:
    """No exchange gathers a head before RoPE (each block of 16 columns turns its own
    pairs where q's and k's reduce left it), the angles move once before the layer loop,
    and no cache holder copies its rows across (a holder is never a row's tile; at 160
    positions, spread evenly, some were)."""
    graph, _ = _step(layers=1, context=160)
    stages = find_stages(graph)
    plans = [gemm_candidates(stage_shape(graph, s), IPU21)[0] if isinstance(s, GemmStage)
             else None for s in stages]
    program = lower(graph, list(zip(stages, plans, strict=True)), IPU21, paired=True)
    names = [s.name for s in program.exchanges()]
    assert not [n for n in names if ".heads" in n]
    ropes = [c for c in program.compute_sets() if c.name.endswith(".rope")]
    assert ropes and all(call.instance.params["cols"] == 16 for c in ropes for call in c.calls)
    cache_writes = {f"stage{s.index}" for s in stages if getattr(s, "kind", "") == "cache_write"}
    assert len(cache_writes) == 2
    assert not [c.name for c in program.compute_sets()
                if c.name.endswith(".copy") and c.name.split(".")[0] in cache_writes]


def _phase(name: str, src: int, dst: int) -> Exchange:
    one = np.ones(1, dtype=np.int64)
    return Exchange(name, np.array([0], np.int32), np.array([src]), np.zeros(1, np.int64),
                    one, np.array([0, 1]), np.array([1], np.int32), np.array([dst]),
                    np.zeros(1, np.int64))


def test_only_phases_that_move_the_same_bytes_every_pass_leave_the_loop() -> None:
    """Buffers: 0 before the loop, 9 a per-layer weight; a reads 0 (invariant), b reads
    what c writes, c reads what a writes (a pass's order), d reads the slot, e writes what
    c writes, f writes what r read before it (and nothing else writes), g reads 0 into a
    buffer too large to hold across the loop, w writes the per-layer weight."""
    body = [_phase("b", 3, 4), _phase("a", 0, 2), _phase("c", 2, 3), _phase("d", 9, 5),
            _phase("e", 0, 3), _phase("r", 7, 8), _phase("f", 0, 7), _phase("g", 0, 6),
            _phase("w", 0, 9)]
    loop = Loop("layers", 2, len(body), [Slot([9, 19])])
    sizes = {b: 64 for b in range(20)} | {6: HOIST_BYTES + 4}
    hoisted, rest = loop_invariant(body, loop, sizes)
    assert [s.name for s in hoisted] == ["a"]
    assert [s.name for s in rest] == ["b", "c", "d", "e", "r", "f", "g", "w"]
