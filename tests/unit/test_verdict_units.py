"""Units of the verdict: ulp distances in every stored precision, and the scaled ulps that
keep a cancelling sum from looking like a bug."""

from __future__ import annotations

import numpy as np

from ipu_stack.ir.precision import F16, F32, f143, f152
from ipu_stack.verdict.judge import scaled_ulps, ulp_distance


def test_ulp_distance_counts_representable_steps_across_zero() -> None:
    # F16 neighbours of 1.0 are 2^-10 apart above and 2^-11 below
    a = np.array([1.0, 1.0, 1.0, -0.0, 2.0**-24], dtype=np.float32)
    b = np.array([1.0 + 2**-10, 1.0 - 2**-11, 1.0 + 3 * 2**-10, 0.0, -(2.0**-24)],
                 dtype=np.float32)
    np.testing.assert_array_equal(ulp_distance(a, b, F16), [1, 1, 3, 0, 2])


def test_ulp_distance_in_fp8_with_a_scale() -> None:
    # F143 with scale 2^-3: 1.0 is stored as 8.0, whose neighbours are 7.5 and 9.0
    p = f143(-3)
    a = np.array([1.0, 1.0, 1.0], dtype=np.float32)
    b = np.array([9.0 / 8, 7.5 / 8, 10.0 / 8], dtype=np.float32)
    np.testing.assert_array_equal(ulp_distance(a, b, p), [1, 1, 2])
    # e5m2 (bias 16): 3.0 = 1.5 x 2^1 is code 0 10001 10 = 0x46; -3.0 is 0x46 codes below 0
    assert ulp_distance(np.array([3.0]), np.array([-3.0]), f152()).item() == 2 * 0x46


def test_non_finite_values_are_far() -> None:
    a = np.array([np.nan, np.inf, 1.0], dtype=np.float32)
    b = np.ones(3, dtype=np.float32)
    assert (ulp_distance(a, b, F32)[:2] >= 1 << 30).all()


def test_scaled_ulps_measure_small_elements_at_the_tensor_rms() -> None:
    # a sum that cancels: one element near zero is off by one ulp of the operands (2^-10)
    expected = np.array([1.0, -1.0, 1.0, 2.0**-14], dtype=np.float32)
    device = expected.copy()
    device[3] += 2.0**-10
    assert ulp_distance(device, expected, F16)[3] > 100
    # one ulp at 1.0 (2^-10) is two ulps at the RMS, 0.87 (2^-11)
    assert scaled_ulps(device, expected, F16)[3] == 2.0
    # a large element's own ulps are unchanged
    device[0] = 1.0 + 2**-10 * 5
    assert scaled_ulps(device, expected, F16)[0] == 5


def _one_stage(rows: int = 16, cols: int = 16):
    """x (F16) -> scale by 0.3 -> out (F16, rounded): one stage whose rerun is exact."""
    from ipu_stack.ir.graph import GraphBuilder
    from ipu_stack.ir.interpret import evaluate
    from ipu_stack.ir.types import TensorType

    b = GraphBuilder("one")
    x = b.input("x", TensorType((rows, cols), F16))
    b.output(b.op("scale", [x], F16, "out", factor=0.3))
    graph = b.build()
    tensors = {"x": F16.round_trip(np.random.default_rng(3).standard_normal((rows, cols)))}
    return graph, tensors, evaluate(graph, tensors)


def _judge(graph, tensors, reference, out):
    from ipu_stack.verdict.judge import judge

    return judge(graph, tensors, {"out": out}, reference)


def test_judge_passes_the_exact_result_and_names_a_wrong_element() -> None:
    graph, tensors, reference = _one_stage()
    exact = reference["out"].copy()
    assert _judge(graph, tensors, reference, exact).passed
    # the largest element (measured in its own ulps) of 256 (0.4 %, under the 2^-7 share)
    # five F16 ulps off: too many ulps
    at = np.unravel_index(np.argmax(np.abs(exact)), exact.shape)
    wrong = exact.copy()
    wrong[at] = np.float16(wrong[at]) + 5 * np.spacing(np.float16(wrong[at]))
    verdict = _judge(graph, tensors, reference, wrong)
    assert not verdict.passed and "stageAgreement" in verdict.failed_parts
    assert verdict.first_failure.stage == "out" and verdict.first_failure.max_ulps == 5
    # one element one ulp off: a float32 summation-order flip, allowed by agreement
    flip = exact.copy()
    flip[at] = np.float16(flip[at]) + np.spacing(np.float16(flip[at]))
    assert _judge(graph, tensors, reference, flip).agreement_passed


def test_judge_fails_a_large_share_of_one_ulp_differences() -> None:
    graph, tensors, reference = _one_stage()
    many = reference["out"].copy()
    many[:2] = (np.float16(many[:2]) + np.spacing(np.float16(many[:2]))).astype(np.float32)
    verdict = _judge(graph, tensors, reference, many)  # 32 of 256 elements: 12.5 %
    assert not verdict.passed and verdict.first_failure.max_ulps == 1
    assert verdict.first_failure.mismatch == 32 / 256


def test_fidelity_fails_a_device_noisier_than_the_precision_path() -> None:
    """An FP8 result (rounding noise well above the F16 floor): a device whose error is the
    same pattern 1.8x larger is inside the tail limit (2.0) but not the RMS limit (1.5)."""
    from ipu_stack.ir.graph import GraphBuilder
    from ipu_stack.ir.interpret import evaluate, evaluate_float64
    from ipu_stack.ir.types import TensorType
    from ipu_stack.verdict.judge import judge

    b = GraphBuilder("fp8-out")
    x = b.input("x", TensorType((16, 16), F16))
    b.output(b.op("scale", [x], f143(-4), "out", factor=0.3))
    graph = b.build()
    tensors = {"x": F16.round_trip(np.random.default_rng(5).standard_normal((16, 16)))}
    reference, ideal = evaluate(graph, tensors), evaluate_float64(graph, tensors)
    noise = reference["out"].astype(np.float64) - ideal["out"]

    def fidelity(out: np.ndarray):  # type: ignore[no-untyped-def]
        return judge(graph, tensors, {"out": out}, reference, ideal=ideal).fidelity

    same = fidelity(reference["out"])
    assert same.passed and same.noise_ratio == 1.0 and same.tail_ratio == 1.0
    louder = fidelity(ideal["out"] + 1.8 * noise)
    assert louder.tail_ratio <= 2.0 and abs(louder.noise_ratio - 1.8) < 1e-6
    assert not louder.passed


def test_a_depth_split_gemm_stage_is_rerun_whole_when_some_of_its_rows_differ() -> None:
    """A stage's rerun on the device's inputs: when one row of a GEMM's input differs from
    the reference's (an FP8 flip upstream), a row-local stage is rerun on that row only; a
    depth-split F16-mode GEMM adds its blocks' float32 partials in the order of the row
    blocks its tiles own, which a rerun of one row cannot follow, so it is rerun whole and
    the device's exact result agrees."""
    from ipu_stack.ir.graph import GraphBuilder
    from ipu_stack.ir.interpret import evaluate, evaluate_operations, split_depth_matmul
    from ipu_stack.ir.types import TensorType
    from ipu_stack.verdict.judge import judge

    rows, depth, cols = 8, 64, 16
    b = GraphBuilder("split")
    x = b.input("x", TensorType((rows, depth), F16))
    y = b.input("y", TensorType((rows, depth), F16))
    h = b.op("add", [x, y], F16, "h")
    w = b.weight("w", TensorType((depth, cols), F16))
    out = b.op("matmul", [h, w], F32, "out")
    b.output(out)
    graph = b.build()
    split = {"mode": "f16", "depth_block": 32, "depth_splits": 2, "col_block": cols,
             "row_chunks": [[0, rows, rows]]}
    matmul_op = graph.producer(out)
    modes = {str(matmul_op.id): split}
    rng = np.random.default_rng(7)
    tensors = {"x": (rng.standard_normal((rows, depth)) * 300).astype(np.float16).astype(
                   np.float32),
               "y": np.zeros((rows, depth), np.float32),
               "w": (rng.standard_normal((depth, cols)) * 300).astype(np.float16).astype(
                   np.float32)}
    reference = evaluate(graph, tensors, modes)
    device_h = reference["h"].copy()
    device_h[3] = (device_h[3] * 1.5).astype(np.float16)  # one row differs upstream
    whole = evaluate_operations(graph, [matmul_op.id], {h: device_h, w: tensors["w"]},
                                modes)[out]
    # the test can fail: row 3 alone in the plain order differs from the owners' order
    alone = split_depth_matmul(device_h[3:4], tensors["w"], split)
    assert not np.array_equal(alone[0], whole[3])
    verdict = judge(graph, tensors, {"h": device_h, "out": whole}, reference, modes)
    (stage,) = [s for s in verdict.stages if s.stage == "out"]
    assert stage.mismatch == 0.0 and stage.max_ulps == 0
