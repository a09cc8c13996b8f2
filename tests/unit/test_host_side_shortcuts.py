"""The host side's shortcuts give exactly what the long way gives.

The verdict skips the rerun of a stage whose device inputs equal the reference's (comparing
storage codes), reruns only the differing rows of a row-local stage, and the reference and
the reruns read a weight already stored in its precision without rounding it again.  Each
shortcut is checked against the long way, and each must still catch a device value that is
wrong in one element (a shortcut that returned the reference's value regardless would pass a
stale device result).
"""

from __future__ import annotations

import numpy as np
import pytest

from ipu_stack.ir import rounding
from ipu_stack.ir.graph import GraphBuilder
from ipu_stack.ir.interpret import evaluate, evaluate_operations, evaluate_steps
from ipu_stack.ir.precision import F16, F32, Precision, f143, f152
from ipu_stack.ir.types import TensorType
from ipu_stack.ir.values import (
    CompactValues,
    StoredTensor,
    as_precision,
    compact_weights,
    stored_round_trip,
)
from ipu_stack.verdict.judge import StageJudge, judge

TOKENS, CHANNELS, HEADS = 8, 16, 2


def _attention() -> tuple:
    """x -> q, k (FP8 weights) -> per-head scores -> softmax -> scaled FP8 output: a GEMM
    stage, a stage whose inputs and result have different row counts, and row stages."""
    b = GraphBuilder("attention")
    x = b.input("x", TensorType((TOKENS, CHANNELS), F16))
    wq = b.weight("wq", TensorType((CHANNELS, CHANNELS), f143(-3)))
    wk = b.weight("wk", TensorType((CHANNELS, CHANNELS), f143(-3)))
    q = b.op("matmul", [x, wq], F16, "q")
    k = b.op("matmul", [x, wk], F16, "k")
    scores = b.op("head_matmul", [q, k], F16, "scores", mode="qk", heads=HEADS,
                  tokens=TOKENS)
    probs = b.op("softmax", [scores], F16, "probs", scale=0.25)
    b.output(b.op("scale", [probs], f143(-4), "out", factor=0.5))
    graph = b.build()
    rng = np.random.default_rng(11)
    tensors = {"x": F16.round_trip(rng.standard_normal((TOKENS, CHANNELS))),
               "wq": f143(-3).round_trip(rng.standard_normal((CHANNELS, CHANNELS)) * 0.3),
               "wk": f143(-3).round_trip(rng.standard_normal((CHANNELS, CHANNELS)) * 0.3)}
    compact_weights(graph, tensors)
    return graph, tensors


def _run_judge(graph, tensors, device: dict[str, np.ndarray], stored: bool):
    """The host side's way (a compact reference, device values as storage codes) or the
    caller's way (plain arrays: the float comparison)."""
    if stored:
        reference = CompactValues()
        steps = evaluate_steps(graph, tensors, None, reference)
        while next(steps, StopIteration) is not StopIteration:
            pass
        judging = StageJudge(graph, tensors, reference, None)
        for name, values in device.items():
            judging.arrive(name, _stored(graph, name, values))
        return judging.finish()
    return judge(graph, tensors, device, evaluate(graph, tensors))


def _stored(graph, name: str, values: np.ndarray) -> StoredTensor:
    value = next(v for v in graph.values if v.name == name)
    return StoredTensor.of(values, value.type.precision)


def _device_as_reference(graph, tensors) -> dict[str, np.ndarray]:
    reference = evaluate(graph, tensors)
    return {v.name: reference[v.name].copy() for v in graph.values
            if v.role not in ("input", "weight")}


def _bump(values: np.ndarray, at: tuple[int, int], precision: Precision) -> np.ndarray:
    """``values`` with one element one code further from zero (one ulp)."""
    bits = np.uint8 if precision.itemsize == 1 else np.uint16
    code = precision.quantize(np.array([values[at]], np.float32)).view(bits) + bits(1)
    changed = values.copy()
    changed[at] = precision.dequantize(code.view(precision.dtype))[0]
    assert changed[at] != values[at]
    return changed


@pytest.mark.parametrize("stored", [True, False])
def test_a_device_equal_to_the_reference_agrees_everywhere(stored: bool) -> None:
    graph, tensors = _attention()
    verdict = _run_judge(graph, tensors, _device_as_reference(graph, tensors), stored)
    assert [s.stage for s in verdict.stages] == ["q", "k", "scores", "probs", "out"]
    assert all(s.max_ulps == 0 and s.mismatch == 0.0 for s in verdict.stages)


@pytest.mark.parametrize("stored", [True, False])
def test_one_different_input_element_is_rerun_and_a_stale_result_caught(stored: bool) -> None:
    """q differs from the reference in one element, but the device's scores are the
    reference's (as if the device had not used its own q): the scores stage must be rerun
    on the device's q and disagree, though its row count differs from q's (the stage that
    the shortcut newly skips when q is equal)."""
    graph, tensors = _attention()
    device = _device_as_reference(graph, tensors)
    device["q"] = _bump(device["q"], (3, 5), F16)
    verdict = _run_judge(graph, tensors, device, stored)
    by_stage = {s.stage: s for s in verdict.stages}
    assert by_stage["q"].mismatch == 1 / (TOKENS * CHANNELS)  # q itself: one element off
    assert by_stage["scores"].mismatch > 0  # rerun on the device's q: the stale row differs
    assert by_stage["k"].mismatch == 0.0


@pytest.mark.parametrize("stored", [True, False])
def test_a_row_local_stage_reruns_the_differing_row(stored: bool) -> None:
    """The device's scores differ in one element and its probabilities are the reference's:
    the softmax row of that element is rerun (only that row) and disagrees; every other row
    is the reference's and agrees."""
    graph, tensors = _attention()
    device = _device_as_reference(graph, tensors)
    device["scores"] = _bump(device["scores"], (5, 2), F16)
    bumped = _run_judge(graph, tensors, device, stored)
    probs = next(s for s in bumped.stages if s.stage == "probs")
    assert 0 < probs.mismatch <= TOKENS / (2 * TOKENS * TOKENS)  # within the one row
    # the right probabilities for the bumped scores agree exactly
    fixed = dict(device)
    op = next(o for o in graph.operations if o.kind == "softmax")
    scores_id = op.inputs[0]
    fixed["probs"] = evaluate_operations(graph, [op.id], {scores_id: device["scores"]})[
        op.outputs[0]]
    again = _run_judge(graph, tensors, fixed, stored)
    assert next(s for s in again.stages if s.stage == "probs").mismatch == 0.0


@pytest.mark.parametrize("precision", [F16, f143(-3), f143(5), f152(-7), f152(0)])
def test_a_stored_weight_is_its_round_trip(precision: Precision) -> None:
    """Every code: decoding it is what rounding its value again gives, bit for bit."""
    bits = np.uint8 if precision.itemsize == 1 else np.uint16
    codes = np.arange(1 << (8 * precision.itemsize), dtype=np.int64).astype(bits)
    stored = StoredTensor(precision, codes.view(precision.dtype))
    fast = as_precision(stored, precision)
    slow = precision.round_trip(np.asarray(stored))
    assert np.array_equal(fast.view(np.uint32), slow.view(np.uint32))


@pytest.mark.parametrize("precision", [F16, F32, f143(-4), f152(3)])
def test_stored_round_trip_is_the_round_trip_and_what_put_keeps(precision: Precision) -> None:
    rng = np.random.default_rng(2)
    values = (rng.standard_normal((64, 48)) * 30).astype(np.float32)
    values.flat[::17] = np.nan
    values.flat[5::23] = -0.0
    values.flat[7::31] = 1e6
    rounded, held = stored_round_trip(values, precision)
    expected = precision.round_trip(values)
    assert np.array_equal(rounded.view(np.uint32), expected.view(np.uint32), equal_nan=False)
    kept = CompactValues()
    kept.put("v", expected, precision)
    theirs = kept.held("v")
    if isinstance(theirs, StoredTensor):
        assert isinstance(held, StoredTensor)
        assert np.array_equal(held.stored.view(np.uint8), theirs.stored.view(np.uint8))
    else:
        assert np.array_equal(np.asarray(held).view(np.uint32), theirs.view(np.uint32))


def test_differing_matches_numpy_with_nan_and_signed_zero() -> None:
    rng = np.random.default_rng(4)
    a = F16.round_trip(rng.standard_normal((40, 33)))
    b = a.copy()
    b[3, 4] += 1.0
    a[7, 7], b[7, 7] = 0.0, -0.0  # equal values, different codes
    a[9, 1], b[9, 1] = np.nan, np.nan
    a[11, 2] = np.nan  # NaN against a number differs
    reference = ~((a == b) | (np.isnan(a) & np.isnan(b)))
    count, mask = rounding.differing(a, b)
    assert count == reference.sum() == 2 and np.array_equal(mask, reference)
    code_count, code_mask = rounding.differing_codes(F16.quantize(a), F16.quantize(b), "F16", 0)
    assert code_count == 2 and np.array_equal(code_mask, reference)
    rows = reference.any(axis=1)
    assert np.array_equal(rounding.differing_rows(a, b), rows)
    assert np.array_equal(rounding.differing_rows(F16.quantize(a), F16.quantize(b), "F16", 0),
                          rows)


# ------------------------------------------------------------------ FP16 rounding

_F16_OVERFLOW_BITS = 0x477FF000  # 65520: from here float32 values round to FP16 inf
_F16_MIN_NORMAL_BITS = 0x38800000  # 2^-14


def _f16_by_hand():  # type: ignore[no-untyped-def]
    """The FP16 rounding ``ir/rounding.py`` used before (round to nearest even on the
    float32 bits, a float64 grid below the normal range), compiled here as the oracle."""
    import numba

    bits_of, from_bits = rounding._bits, rounding._from_bits

    @numba.njit(nogil=True, inline="always")
    def round_mantissa(magnitude, drop):  # type: ignore[no-untyped-def]
        # nearest even with the low ``drop`` mantissa bits cleared (a carry moves up)
        half = np.uint32((1 << (drop - 1)) - 1)
        odd = (magnitude >> np.uint32(drop)) & np.uint32(1)
        return (magnitude + half + odd) & ~np.uint32((1 << drop) - 1)

    @numba.njit(nogil=True, inline="always")
    def round_quantum(magnitude, quantum_exponent):  # type: ignore[no-untyped-def]
        # nearest even on the grid of 2^quantum_exponent (float64's mantissa keeps it)
        magic = 2.0 ** (quantum_exponent + 52)
        return (magnitude + magic) - magic

    @numba.njit(nogil=True, inline="always")
    def by_hand(x):  # type: ignore[no-untyped-def]
        bits = bits_of(x)
        sign = bits & np.uint32(0x80000000)
        magnitude = bits & np.uint32(0x7FFFFFFF)
        if magnitude >= np.uint32(0x7F800000):
            return x
        if magnitude >= np.uint32(_F16_OVERFLOW_BITS):
            return from_bits(sign | np.uint32(0x7F800000))
        if magnitude < np.uint32(_F16_MIN_NORMAL_BITS):
            rounded = np.float32(round_quantum(abs(np.float64(x)), -24))
            return from_bits(sign | bits_of(rounded))
        return from_bits(sign | round_mantissa(magnitude, 13))

    fast = rounding._f16

    @numba.njit(nogil=True)
    def mismatches(start, stop, step):  # type: ignore[no-untyped-def]
        bad = 0
        for pattern in range(start, stop, step):
            x = from_bits(np.uint32(pattern))
            if bits_of(fast(x)) != bits_of(by_hand(x)):
                bad += 1
        return bad

    return mismatches


def test_f16_rounding_matches_the_bit_arithmetic() -> None:
    """Every float32 whose exponent reaches FP16's range or its rounding edges (2^-32 to
    2^17, both signs: 805 M values), every 251st of all the others, and NaN payloads."""
    mismatches = _f16_by_hand()
    for sign in (0, 1 << 31):
        assert mismatches(sign | (0x5F << 23), sign | (0x90 << 23), 1) == 0
    assert mismatches(0, 1 << 32, 251) == 0
    assert mismatches(0x7F800000, 0x7F800000 + (1 << 23), 7) == 0  # inf, NaNs (payloads)


@pytest.mark.parametrize("precision", [F16, f143(-3), f152(4)])
def test_float64_decoding_is_the_float32_values_cast_up(precision: Precision) -> None:
    bits = np.uint8 if precision.itemsize == 1 else np.uint16
    codes = np.arange(1 << (8 * precision.itemsize), dtype=np.int64).astype(bits)
    stored = StoredTensor(precision, codes.view(precision.dtype).reshape(-1, 16))
    wide = np.asarray(stored, dtype=np.float64)
    assert wide.dtype == np.float64 and wide.shape == stored.shape
    with np.errstate(invalid="ignore"):
        cast = stored.values().astype(np.float64)
    assert np.array_equal(wide.view(np.uint64), cast.view(np.uint64))
