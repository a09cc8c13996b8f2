"""Units of the verdict: ulp distances in every stored precision, and the scaled ulps that
keep a cancelling sum from looking like a bug."""

from __future__ import annotations

import numpy as np

from ipu_stack.ir.precision import F16, F32, f143, f152
from ipu_stack.runtime.verdict import scaled_ulps, ulp_distance


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
