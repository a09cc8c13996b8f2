"""The new elementwise kernels (``activation`` chain steps, ``mul``, ``swiglu``, ``rms_norm``)
on a fake tile memory, against float64 formulas written here from the definitions; the host
reference's activations against the same formulas; and their popops prices.

The formulas are deliberately not the kernels' forms (the kernels use SciPy's ``expit``; the
host reference uses ``(1 + tanh(z/2)) / 2``; here ``1 / (1 + exp(-z))`` in float64), so a
wrong slope, sign or epsilon in either shows as a rounding that is not one of the two
neighbours of the exact value.
"""

from __future__ import annotations

import numpy as np
import pytest
from tests.helpers import random_stored
from tests.unit.test_rowwise import (
    COLS,
    ROWS,
    assert_rounds,
    fake_memory,
    pitch_for,
    put,
    rope_case,
    rotate_half_exact,
    round64,
    run_and_read,
    values_of,
)

from ipu_stack.device import pricing
from ipu_stack.ir.graph import GraphBuilder
from ipu_stack.ir.interpret import evaluate_operations
from ipu_stack.ir.precision import F16, F32, Precision, f143
from ipu_stack.ir.types import TensorType
from ipu_stack.kernels.rowwise import row_params
from ipu_stack.planning import costs
from ipu_stack.target import timing
from ipu_stack.testing.reference import rms_norm_normce


def sigmoid64(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


FORMULAS = {
    "sigmoid": sigmoid64,
    "tanh": np.tanh,
    "silu": lambda x: x * sigmoid64(x),
    "quick_gelu": lambda x: x * sigmoid64(1.702 * x),
}
SLACK = 2.0**-20  # float32 evaluation error, relative to |x| (plus a floor for sigma)


def _chain(function: str, out: Precision, std: float = 2.5) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(11)
    mem = fake_memory()
    x = random_stored(rng, F16, (2, ROWS, COLS), std=std)
    x_pitch, out_pitch = pitch_for(COLS, F16, 4), pitch_for(COLS, out, 8)
    addresses = [16, -1, -1, 2000]
    put(mem, addresses[0], x_pitch, x)
    params = row_params("chain", ROWS, COLS, F16, x_pitch, out, out_pitch,
                        chain=[[function, out.to_json()]])
    return run_and_read(params, mem, addresses, out), values_of(x, F16)


@pytest.mark.parametrize("out", [F16, f143(-5)], ids=["f16", "fp8"])
@pytest.mark.parametrize("function", list(FORMULAS))
def test_activation_step_rounds_the_exact_function(function: str, out: Precision) -> None:
    device, x = _chain(function, out)
    exact = FORMULAS[function](x)
    assert_rounds(device, exact, out, slack=SLACK * (np.abs(x) + 1.0), nearest_fraction=0.97)


def test_activations_have_the_right_shape_where_it_matters() -> None:
    """Anchors a slope or sign error cannot hide behind: sigma(0) = 1/2, tanh odd and
    increasing, SiLU and quick GELU vanish for large negative inputs and are the identity
    for large positive ones."""
    device, x = _chain("sigmoid", F16)
    assert np.all(np.diff(device[0, 0][np.argsort(x[0, 0])]) >= 0)
    device, x = _chain("tanh", F16)
    assert np.all(np.sign(device) == np.sign(round64(np.tanh(x), F16)))
    for function in ("silu", "quick_gelu"):
        device, x = _chain(function, F16, std=12.0)
        big = np.abs(x) > 20
        assert np.allclose(device[big], np.maximum(x[big], 0.0), rtol=2**-10, atol=1e-6)


def test_host_reference_activations_match_the_formulas() -> None:
    """``ir.interpret`` (the host reference at device precision) for each function."""
    rng = np.random.default_rng(12)
    b = GraphBuilder("acts")
    x = b.input("x", TensorType((4, 32), F32))
    outs = [b.op("activation", [x], F32, f"y.{f}", function=f) for f in FORMULAS]
    for value in outs:
        b.output(value)
    graph = b.build()
    data = (rng.standard_normal((4, 32)) * 3.0).astype(np.float32)
    got = evaluate_operations(graph, [op.id for op in graph.operations], {x: data})
    for value, function in zip(outs, FORMULAS, strict=True):
        exact = FORMULAS[function](data.astype(np.float64))
        assert np.allclose(got[value], exact, rtol=1e-6, atol=1e-6), function


# ---------------------------------------------------------------------------------- products
@pytest.mark.parametrize("op", ["mul", "swiglu"])
def test_product_kernels(op: str) -> None:
    rng = np.random.default_rng(13)
    mem = fake_memory()
    out = f143(-3)
    a = random_stored(rng, F16, (2, ROWS, COLS), std=2.0)
    b = random_stored(rng, F16, (2, ROWS, COLS), std=1.5)
    a_pitch, b_pitch, out_pitch = pitch_for(COLS, F16, 4), pitch_for(COLS, F16, 12), 32
    addresses = [0, 700, -1, 1800]
    put(mem, addresses[0], a_pitch, a)
    put(mem, addresses[1], b_pitch, b)
    params = row_params(op, ROWS, COLS, F16, a_pitch, out, out_pitch, F16, b_pitch)
    device = run_and_read(params, mem, addresses, out)
    av, bv = values_of(a, F16), values_of(b, F16)
    exact = (FORMULAS["silu"](av) if op == "swiglu" else av) * bv
    assert_rounds(device, exact, out, slack=SLACK * np.abs(exact), nearest_fraction=0.97)


# ---------------------------------------------------------------------------------- RMS norm
@pytest.mark.parametrize("out", [F16, f143(-4)], ids=["f16", "fp8"])
def test_rms_norm_with_an_epsilon_that_matters(out: Precision) -> None:
    """Rows whose mean square (about 1e-5) is comparable with eps: an epsilon dropped,
    misplaced or scaled moves every output far beyond one rounding."""
    rng = np.random.default_rng(14)
    mem = fake_memory()
    x = random_stored(rng, F16, (2, ROWS, COLS), std=3e-3)
    gamma = random_stored(rng, F16, (2, 1, COLS), std=0.2, offset=1.0)
    x_pitch, out_pitch, aux_pitch = pitch_for(COLS, F16, 8), pitch_for(COLS, out, 4), 64
    addresses = [64, 1024, -1, 2048]
    put(mem, addresses[0], x_pitch, x)
    put(mem, addresses[1], aux_pitch, gamma)
    eps = 1e-5
    params = row_params("rms_norm", ROWS, COLS, F16, x_pitch, out, out_pitch, F16, aux_pitch,
                        eps=eps)
    device = run_and_read(params, mem, addresses, out)
    xv, gv = values_of(x, F16), values_of(gamma, F16)
    exact = xv / np.sqrt(np.mean(xv**2, axis=-1, keepdims=True) + eps) * gv
    # F16 rows and scale of a width a multiple of 4: NormCE's loops, whose F16 result the
    # output stores (FP8: rounded once more)
    normce = np.stack([rms_norm_normce(xv[t], gv[t, 0], eps) for t in range(2)])
    assert_rounds(device, normce, out, nearest_fraction=1.0)
    # within a few F16 steps of the exact normalisation (three F16 roundings)
    assert np.abs(normce - exact).max() <= 6 * 2.0**-10 * np.abs(exact).max()
    without = xv / np.sqrt(np.mean(xv**2, axis=-1, keepdims=True)) * values_of(gamma, F16)
    assert np.abs(without - exact).max() > 0.1  # the test data makes eps matter


# ---------------------------------------------------------------------------------- prices
def test_activation_prices_are_the_popops_supervisor_estimates() -> None:
    """UnaryOp1D: 6 x (17 + ceil(n/6 / 4) x loop) + 9, BinaryOp1D MULTIPLY HALF:
    6 x (26 + ceil(n/6 / 4) x 3), each plus the 11-cycle launch (poplibs)."""
    n = 6 * 40  # 40 elements a worker: 10 four-half loops
    assert costs.estimate_activation(n, "sigmoid") == 11 + 6 * (17 + 10 * 6) + 9
    assert costs.estimate_activation(n, "tanh") == 11 + 6 * (17 + 10 * 4) + 9
    multiply = 11 + 6 * (26 + 10 * 3)
    assert costs.estimate_activation(n, "mul") == multiply
    assert costs.estimate_activation(n, "silu") == 11 + 6 * (17 + 60) + 9 + multiply
    assert costs.estimate_activation(n, "swiglu") == 11 + 6 * (17 + 60) + 9 + 2 * multiply
    assert costs.estimate_activation(n, "quick_gelu") == 11 + 6 * (17 + 60) + 9 + 2 * multiply
    work = timing.Work("sigmoid", {"per_worker": [40] * 6})
    assert pricing.price_work(work) == costs.estimate_activation(n, "sigmoid")
    assert costs.estimate_rms_norm(3, 1152) == costs.estimate_layer_norm(3, 1152)
    assert "assumed" in timing.PRICES["rms_norm_fraction"].source


# ---------------------------------------------------------------------------------- row kernels
def test_rope_in_split_halves_rotates_channel_i_with_i_plus_half() -> None:
    xv, cos, sin, device, _ = rope_case(15, 8, 3, pairs="halves")
    assert_rounds(device, rotate_half_exact(xv, cos, sin, 8, 8), F16)


def test_biased_softmax_adds_its_table_row_by_row() -> None:
    """An asymmetric bias with -inf entries (a boolean mask): transposing the table, or
    adding it before the scale, changes the result far beyond one rounding."""
    rng = np.random.default_rng(16)
    mem = fake_memory()
    cols = 9
    x = random_stored(rng, F16, (2, ROWS, cols), std=2.0)
    bias = rng.standard_normal((2, ROWS, cols)).astype(np.float16)
    bias[:, :, 3] = -np.inf
    x_pitch, b_pitch, out_pitch = pitch_for(cols, F16, 4), pitch_for(cols, F16, 8), 32
    addresses = [0, 700, -1, 1800]
    put(mem, addresses[0], x_pitch, x)
    put(mem, addresses[1], b_pitch, bias)
    params = row_params("biased_softmax", ROWS, cols, F16, x_pitch, F16, out_pitch, F16, b_pitch,
                        scale=0.5)
    device = run_and_read(params, mem, addresses, F16)
    z = values_of(x, F16) * 0.5 + bias.astype(np.float64)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    assert_rounds(device, e / e.sum(axis=-1, keepdims=True), F16)
    assert np.all(device[:, :, 3] == 0.0)
