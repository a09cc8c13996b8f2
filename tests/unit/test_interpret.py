"""The oracle behind every verdict, tested on its own: ``ir.interpret`` against formulas
written out here in float64 numpy, for every operation it evaluates.

Precisions are F32 for the outputs (so the only rounding is float32 arithmetic) unless a
test is about rounding; the FP8 GEMM mode's FP16 partials get a case of their own.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from ipu_stack.ir.graph import GraphBuilder
from ipu_stack.ir.interpret import evaluate, evaluate_float64
from ipu_stack.ir.precision import F16, F32, f143
from ipu_stack.ir.types import TensorType
from ipu_stack.testing.reference import gelu_tanh_half_loop

RNG = np.random.default_rng(11)


def _run(kind: str, shapes: list[tuple[int, ...]], out_precision=F32, modes=None, **attrs):
    b = GraphBuilder("one-op")
    ids, tensors = [], {}
    for i, shape in enumerate(shapes):
        name = f"in{i}"
        value = RNG.standard_normal(shape).astype(np.float32)
        ids.append(b.input(name, TensorType(shape, F32)) if i == 0 else
                   b.weight(name, TensorType(shape, F32)))
        tensors[name] = value
    out = b.op(kind, ids, out_precision, "out", **attrs)
    b.output(out)
    graph = b.build()
    return evaluate(graph, tensors, modes), evaluate_float64(graph, tensors), tensors


def _close(got, want, rtol=1e-5) -> None:
    np.testing.assert_allclose(np.asarray(got, np.float64).reshape(want.shape), want,
                               rtol=rtol, atol=rtol * np.abs(want).max())


def test_matmul() -> None:
    got, ideal, t = _run("matmul", [(5, 7), (7, 3)])
    want = t["in0"].astype(np.float64) @ t["in1"]
    _close(got["out"], want)
    _close(ideal["out"], want, 1e-12)


def test_matmul_in_fp8_mode_keeps_fp16_partials() -> None:
    """64 deep: two 32-deep passes.  Pass one gives 128 x 16 + 1 = 2049, which FP16 stores as
    2048; pass two adds 1 again: 2048 with FP16 partials, 2050 with F32 partials."""
    b = GraphBuilder("fp8")
    x = b.input("x", TensorType((1, 64), f143(0)))
    w = b.weight("w", TensorType((64, 2), f143(0)))
    b.output(b.op("matmul", [x, w], F32, "out"))
    graph = b.build()
    a = np.zeros((1, 64), np.float32)
    a[0, 0], a[0, 1], a[0, 32] = 128, 1, 1
    c = np.zeros((64, 2), np.float32)
    c[0], c[1], c[32] = 16, 1, 1
    t = {"x": a, "w": c}
    fp8 = evaluate(graph, t, {"0": {"mode": "fp8", "depth_block": 64}})["out"]
    np.testing.assert_array_equal(fp8, [[2048, 2048]])
    f16 = evaluate(graph, t, {"0": {"mode": "f16", "depth_block": 64}})["out"]
    np.testing.assert_array_equal(f16, [[2050, 2050]])
    # two depth blocks of 32: each block's own FP16 partial, summed in float32
    split = evaluate(graph, t, {"0": {"mode": "fp8", "depth_block": 32}})["out"]
    np.testing.assert_array_equal(split, [[2049, 2049]])


@pytest.mark.parametrize("kind", ["add", "bias_add"])
def test_add_and_bias(kind: str) -> None:
    shapes = [(4, 6), (4, 6)] if kind == "add" else [(4, 6), (6,)]
    got, _, t = _run(kind, shapes)
    _close(got["out"], t["in0"].astype(np.float64) + t["in1"])


@pytest.mark.parametrize("form", ["tanh", "none"])
def test_gelu(form: str) -> None:
    """The erf form in float32; the tanh form as the device's F16 loop computes it (every
    instruction rounded to F16: equal to the independent model of that loop, bit for bit,
    and within a few F16 steps of the formula), and the formula itself in the float64
    model."""
    got, ideal, t = _run("gelu", [(3, 8)], approximate=form)
    x = t["in0"].astype(np.float64)
    if form == "tanh":
        want = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
        np.testing.assert_array_equal(np.asarray(got["out"], np.float64).reshape(x.shape),
                                      gelu_tanh_half_loop(x))
        # F16 rounding of tanh near -1 cancels in 1 + tanh: about |x| 2^-13 for x < 0
        error = np.abs(got["out"].reshape(x.shape).astype(np.float64) - want)
        assert (error <= 2.0**-9 * np.abs(want) + 2.0**-11 * np.abs(x) + 2.0**-24).all()
        _close(ideal["out"], want)
    else:
        want = np.array([[0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in row] for row in x])
        _close(got["out"], want)


def test_the_f16_gelu_loop_saturates_and_is_odd_free() -> None:
    """Large inputs: x^3 overflows F16 and saturates, so GELU(x) = x for large positive x
    and 0 for large negative x, with no inf or nan."""
    b = GraphBuilder("gelu-edges")
    x = b.input("x", TensorType((1, 6), F32))
    b.output(b.op("gelu", [x], F32, "out", approximate="tanh"))
    values = np.array([[-300.0, -41.0, -1e-3, 0.0, 41.0, 300.0]], np.float32)
    got = evaluate(b.build(), {"x": values})["out"]
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got, gelu_tanh_half_loop(values).astype(np.float32))
    np.testing.assert_array_equal(got[0, [0, 1, 3]], [0.0, 0.0, 0.0])
    np.testing.assert_array_equal(got[0, [4, 5]], [41.0, 300.0])


def test_scale_and_cast() -> None:
    got, _, t = _run("scale", [(2, 5)], factor=0.125)
    _close(got["out"], t["in0"].astype(np.float64) * 0.125)
    got, _, t = _run("cast", [(2, 5)], out_precision=F16)
    np.testing.assert_array_equal(got["out"], t["in0"].astype(np.float16).astype(np.float32))


def test_softmax_with_scale() -> None:
    got, _, t = _run("softmax", [(3, 9)], scale=0.5)
    x = t["in0"].astype(np.float64) * 0.5
    e = np.exp(x - x.max(axis=1, keepdims=True))
    _close(got["out"], e / e.sum(axis=1, keepdims=True))


def test_layer_norm() -> None:
    got, _, t = _run("layer_norm", [(4, 16), (16,), (16,)], eps=1e-5)
    x = t["in0"].astype(np.float64)
    mean = x.mean(axis=1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=1, keepdims=True)
    _close(got["out"], (x - mean) / np.sqrt(var + 1e-5) * t["in1"] + t["in2"], 1e-4)


def test_rope_rotates_pairs_of_every_head() -> None:
    got, _, t = _run("rope", [(3, 8), (3, 2), (3, 2)], head_dim=4)
    x, cos, sin = (t[k].astype(np.float64) for k in ("in0", "in1", "in2"))
    want = np.empty_like(x)
    for row in range(3):
        for head in range(2):
            for i in range(2):
                a, b = x[row, head * 4 + 2 * i], x[row, head * 4 + 2 * i + 1]
                want[row, head * 4 + 2 * i] = a * cos[row, i] - b * sin[row, i]
                want[row, head * 4 + 2 * i + 1] = a * sin[row, i] + b * cos[row, i]
    _close(got["out"], want)


@pytest.mark.parametrize("mode", ["qk", "pv"])
def test_head_matmul(mode: str) -> None:
    tokens, heads, head_dim = 5, 2, 3
    if mode == "qk":
        shapes = [(tokens, heads * head_dim), (tokens, heads * head_dim)]
    else:
        shapes = [(heads * tokens, tokens), (tokens, heads * head_dim)]
    got, _, t = _run("head_matmul", shapes, mode=mode, heads=heads, tokens=tokens)
    a, b = t["in0"].astype(np.float64), t["in1"].astype(np.float64)
    if mode == "qk":
        want = np.concatenate([a[:, h * 3:(h + 1) * 3] @ b[:, h * 3:(h + 1) * 3].T
                               for h in range(heads)])
    else:
        want = np.concatenate([a[h * tokens:(h + 1) * tokens] @ b[:, h * 3:(h + 1) * 3]
                               for h in range(heads)], axis=1)
    _close(got["out"], want)


@pytest.mark.parametrize("mode", ["qk", "pv"])
def test_head_matmul_in_fp8_mode_keeps_fp16_partials(mode: str) -> None:
    """Each head's product is its own FP8 GEMM: 64 deep, two 32-deep passes.  Head 1 is
    set up as the matmul case above (2049 stored as 2048 after pass one, then + 1 again:
    2048 with FP16 partials, 2050 with float32 ones); head 0 is all zeros."""
    heads, tokens = 2, 64
    head_dim = 64 if mode == "qk" else 2
    b = GraphBuilder("fp8-heads")
    if mode == "qk":  # scores[h] = q_h @ k_h.T: q is [tokens, heads * 64], its depth 64
        a = np.zeros((tokens, heads * head_dim), np.float32)
        c = np.zeros((tokens, heads * head_dim), np.float32)
        a[0, 64], a[0, 65], a[0, 96] = 128, 1, 1  # row 0 of head 1's q
        c[0, 64], c[0, 65], c[0, 96] = 16, 1, 1  # row 0 of head 1's k
        want = (1, 0)  # head 1's block starts at row `tokens`: element (tokens, 0)
    else:  # context[:, h] = p_h @ v_h: p is [heads * tokens, tokens], its depth the tokens
        a = np.zeros((heads * tokens, tokens), np.float32)
        c = np.zeros((tokens, heads * head_dim), np.float32)
        a[tokens, 0], a[tokens, 1], a[tokens, 32] = 128, 1, 1  # row 0 of head 1's probs
        c[0, 2:4], c[1, 2:4], c[32, 2:4] = 16, 1, 1  # head 1's v columns
        want = (0, 2)
    x = b.input("x", TensorType(a.shape, f143(0)))
    w = b.input("w", TensorType(c.shape, f143(0)))
    b.output(b.op("head_matmul", [x, w], F32, "out", mode=mode, heads=heads, tokens=tokens))
    graph = b.build()
    t = {"x": a, "w": c}
    row = want[0] * tokens
    fp8 = evaluate(graph, t, {"0": {"mode": "fp8", "depth_block": 64}})["out"]
    assert fp8[row, want[1]] == 2048 and np.count_nonzero(fp8) == (1 if mode == "qk" else 2)
    f16 = evaluate(graph, t, {"0": {"mode": "f16", "depth_block": 64}})["out"]
    assert f16[row, want[1]] == 2050
    split = evaluate(graph, t, {"0": {"mode": "fp8", "depth_block": 32}})["out"]
    assert split[row, want[1]] == 2049


def test_outputs_are_rounded_to_their_precision() -> None:
    got, ideal, t = _run("scale", [(2, 3)], out_precision=f143(-2), factor=1.0)
    stored = f143(-2).round_trip(t["in0"])
    np.testing.assert_array_equal(got["out"], stored)
    _close(ideal["out"], t["in0"].astype(np.float64), 1e-12)  # the ideal never rounds


def test_watched_values_are_the_unrounded_values_each_handed_over_once() -> None:
    """``watch_unrounded`` hands the input and every computed value to the sink as it is
    made, with ``evaluate_unrounded``'s values, and keeps none of them itself."""
    from ipu_stack.ir.interpret import evaluate_unrounded, watch_unrounded

    b = GraphBuilder("chain")
    x = b.input("x", TensorType((4, 6), f143(0)))
    w = b.weight("w", TensorType((6, 5), F32))
    h = b.op("matmul", [x, w], f143(-1), "h")
    y = b.op("gelu", [h], F16, "y", form="tanh")
    b.output(b.op("scale", [y], F32, "out", factor=0.5))
    graph = b.build()
    tensors = {"x": f143(0).round_trip(RNG.standard_normal((4, 6)).astype(np.float32)),
               "w": RNG.standard_normal((6, 5)).astype(np.float32)}
    want = evaluate_unrounded(graph, tensors)
    seen: list[tuple[str, np.ndarray, object]] = []

    class Sink:
        def put(self, name, values, precision) -> None:
            seen.append((name, np.array(values), precision))

    assert watch_unrounded(graph, tensors, Sink()) is None
    assert [name for name, _, _ in seen] == ["x", "h", "y", "out"]
    for name, values, precision in seen:
        np.testing.assert_array_equal(values, want[name])
        assert precision == graph.values[[v.name for v in graph.values].index(name)].type.precision
    # unrounded: h is not rounded to its FP8 precision
    assert not np.array_equal(seen[1][1], f143(-1).round_trip(seen[1][1]))


def test_fitted_scales_are_the_largest_of_each_roles_values() -> None:
    """``fit_scales``: one exponent per role (2x headroom), the largest over the role's
    named values, from the unrounded values."""
    from ipu_stack.ir.interpret import evaluate_unrounded, fit_scales
    from ipu_stack.ir.precision import fit_scale_exponent

    b = GraphBuilder("two roles")
    x = b.input("x", TensorType((3, 4), F32))
    a = b.op("scale", [x], f143(0), "a.out", factor=8.0)
    c = b.op("scale", [a], f143(0), "c.out", factor=0.25)
    b.output(b.op("scale", [c], F32, "y", factor=1.0))
    graph = b.build()
    tensors = {"x": RNG.standard_normal((3, 4)).astype(np.float32)}
    want = evaluate_unrounded(graph, tensors)
    got = fit_scales(graph, tensors, ["x", "a.out", "c.out"],
                     lambda name: "act" if name.endswith(".out") else name)
    assert got == {"x": fit_scale_exponent(want["x"], headroom=2.0),
                   "act": max(fit_scale_exponent(want[n], headroom=2.0)
                              for n in ("a.out", "c.out"))}
    assert got["act"] == fit_scale_exponent(want["a.out"], headroom=2.0) != \
        fit_scale_exponent(want["c.out"], headroom=2.0)  # the larger role member wins


def test_the_f16_gelu_agrees_on_every_half_on_the_device_the_reference_and_the_model() -> None:
    """Every one of the 65,536 F16 inputs (infinities and NaN aside): the device kernel's
    chain, the host reference's operation and the independent model of the loop give the
    same half."""
    from ipu_stack.kernels.elementwise import apply_chain

    halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    halves = halves[np.isfinite(halves)].astype(np.float32)[None, :]
    b = GraphBuilder("gelu-all-halves")
    x = b.input("x", TensorType(halves.shape, F16))
    b.output(b.op("gelu", [x], F16, "out", approximate="tanh"))
    reference = evaluate(b.build(), {"x": halves})["out"]
    device = apply_chain(halves, [["round", F16.to_json()], ["gelu_tanh", F16.to_json()]], None)
    model = gelu_tanh_half_loop(halves.astype(np.float64))
    np.testing.assert_array_equal(reference, device)
    np.testing.assert_array_equal(device.astype(np.float64), model)
