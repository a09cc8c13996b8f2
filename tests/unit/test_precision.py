"""Precision: FP8 formats with scale exponents, quantise/dequantise, scale fitting."""

from __future__ import annotations

import numpy as np
import pytest

from ipu_stack.ir.precision import (
    F16,
    F32,
    Precision,
    f143,
    f152,
    fit_scale_exponent,
)
from ipu_stack.util.errors import UsageError


@pytest.mark.parametrize(
    ("precision", "expected"),
    [
        (f143(), 240.0),
        (f152(), 57344.0),
        (f143(3), 240.0 * 8),
        (f152(-2), 57344.0 / 4),
        (f143(-32), 240.0 * 2.0**-32),
    ],
)
def test_fp8_max_finite_includes_scale(precision: Precision, expected: float) -> None:
    assert precision.max_finite == expected


def test_itemsizes_and_dtypes() -> None:
    assert (F32.itemsize, F16.itemsize, f143().itemsize, f152().itemsize) == (4, 2, 1, 1)
    assert F16.dtype == np.float16 and F32.dtype == np.float32
    assert f143().is_fp8 and f152(5).is_fp8 and not F16.is_fp8


@pytest.mark.parametrize("kind", ["F8F143", "F8F152"])
@pytest.mark.parametrize("scale", [0, 3, -5])
def test_dequantize_every_code_matches_bit_field_decoding(fp8, kind: str, scale: int) -> None:
    precision = Precision(kind, scale)
    codes = np.arange(256, dtype=np.uint8).view(precision.dtype)
    got = precision.dequantize(codes).astype(np.float64)
    want = fp8.decode(kind) * 2.0**scale
    assert got.dtype == np.float64  # astype above; the stored result is float32
    assert np.isnan(got[0x80])
    finite = np.arange(256) != 0x80
    np.testing.assert_array_equal(got[finite], want[finite])


@pytest.mark.parametrize(
    ("precision", "value", "byte"),
    [
        (f143(), 1.0, 0x40),  # exponent 8 (bias 8), mantissa 0
        (f143(), 240.0, 0x7F),  # the largest finite F143
        (f143(2), 4.0, 0x40),  # 4 = 1.0 x 2^2
        (f143(-3), 0.125, 0x40),
        (f143(), -1.5, 0xC4),
        (f152(), 1.0, 0x40),  # exponent 16 (bias 16)
        (f152(), 57344.0, 0x7F),
        (f152(4), 16.0, 0x40),
    ],
)
def test_quantize_known_bytes(precision: Precision, value: float, byte: int) -> None:
    stored = precision.quantize(np.array([value]))
    assert stored.dtype == precision.dtype
    assert int(stored.view(np.uint8)[0]) == byte
    assert precision.dequantize(stored)[0] == value


@pytest.mark.parametrize("kind", ["F8F143", "F8F152"])
@pytest.mark.parametrize("scale", [0, 4, -6])
def test_quantize_is_nearest_even_and_saturating(fp8, kind: str, scale: int) -> None:
    precision = Precision(kind, scale)
    rng = np.random.default_rng(11)
    top = precision.max_finite
    values = np.concatenate(
        [
            rng.uniform(-1.2 * top, 1.2 * top, 400),
            rng.standard_normal(400) * top * 2.0**-8,
            [10 * top, -10 * top, 1e30, -1e30, 0.0],
        ]
    ).astype(np.float32)
    got = precision.quantize(values).view(np.uint8)
    want = fp8.nearest(kind, values, scale)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("precision", [f143(), f143(7), f152(), f152(-9)])
def test_saturation_to_max(precision: Precision) -> None:
    big = np.array([precision.max_finite * 4, -precision.max_finite * 1000], dtype=np.float32)
    back = precision.round_trip(big)
    np.testing.assert_array_equal(back, [precision.max_finite, -precision.max_finite])


@pytest.mark.parametrize("kind", ["F8F143", "F8F152"])
@pytest.mark.parametrize("scale", [-12, 0, 9])
def test_round_trip_of_representable_values_is_exact(fp8, kind: str, scale: int) -> None:
    table = fp8.decode(kind)
    reps = table[np.isfinite(table)] * 2.0**scale
    back = Precision(kind, scale).round_trip(reps.astype(np.float32))
    np.testing.assert_array_equal(back.astype(np.float64), reps)


def test_f16_and_f32_round_trip() -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal(64).astype(np.float32) * 100
    np.testing.assert_array_equal(F32.round_trip(x), x)
    np.testing.assert_array_equal(F16.round_trip(x), x.astype(np.float16).astype(np.float32))
    assert F16.quantize(x).dtype == np.float16


@pytest.mark.parametrize(
    ("kind", "scale", "message"),
    [
        ("F8F143", 32, r"FP8 scale exponent 32 outside \[-32, 31\]"),
        ("F8F152", -33, r"FP8 scale exponent -33 outside \[-32, 31\]"),
        ("F16", 1, "precision F16 takes no scale exponent"),
        ("F32", -1, "precision F32 takes no scale exponent"),
        ("BF16", 0, "unknown precision 'BF16'; known: F32, F16, F8F143, F8F152"),
    ],
)
def test_invalid_precisions_are_refused(kind: str, scale: int, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        Precision(kind, scale)


def test_json_round_trip_and_str() -> None:
    for precision in (F32, F16, f143(-3), f152(12)):
        assert Precision.from_json(precision.to_json()) == precision
    assert str(f143(-3)) == "F8F143 { scale_exponent: -3 }"
    assert str(F16) == "F16"


@pytest.mark.parametrize(
    ("peak", "kind", "expected"),
    [
        (240.0, "F8F143", 0),
        (241.0, "F8F143", 1),
        (480.0, "F8F143", 1),
        (120.0, "F8F143", -1),
        (119.0, "F8F143", -1),
        (57344.0, "F8F152", 0),
        (57345.0, "F8F152", 1),
        (1.0, "F8F152", -15),  # 57344 / 2^16 = 0.875 < 1 <= 1.75
    ],
)
def test_fit_scale_exponent_hand_values(peak: float, kind: str, expected: int) -> None:
    values = np.array([0.5, -peak, 0.25])
    assert fit_scale_exponent(values, kind) == expected


@pytest.mark.parametrize("kind", ["F8F143", "F8F152"])
def test_fit_scale_exponent_puts_peak_just_inside_range(kind: str) -> None:
    rng = np.random.default_rng(5)
    limit = 240.0 if kind == "F8F143" else 57344.0
    for magnitude in rng.uniform(-10, 20, 50):  # no clipping at SCALE_MIN/MAX here
        values = rng.standard_normal(32) * 2.0**magnitude
        peak = np.abs(values).max()
        e = fit_scale_exponent(values, kind)
        assert peak <= limit * 2.0**e
        assert peak > limit * 2.0 ** (e - 1)  # the smallest exponent that fits
        # quantising with it does not saturate: the peak survives to within FP8 rounding
        back = Precision(kind, e).round_trip(values.astype(np.float32))
        assert np.abs(back).max() <= limit * 2.0**e
        assert np.abs(back).max() >= peak * 0.85


def test_fit_scale_exponent_headroom_and_edges() -> None:
    assert fit_scale_exponent(np.array([240.0]), headroom=2.0) == 1
    assert fit_scale_exponent(np.zeros(4)) == 0
    assert fit_scale_exponent(np.array([])) == 0
    assert fit_scale_exponent(np.array([1e-30])) == -32  # clipped to the smallest exponent
    assert fit_scale_exponent(np.array([1e30])) == 31
