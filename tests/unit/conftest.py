"""Shared helpers for the unit tests, exposed as fixtures (see tests/package/conftest.py).

``fp8_table`` decodes every byte of an FP8 "fnuz" format from its bit fields (sign, exponent,
mantissa, bias) with plain arithmetic, so tests have an oracle independent of ml_dtypes and
of ``ipu_stack.ir.precision``.
"""

from __future__ import annotations

import numpy as np
import pytest

# kind -> (exponent bits, mantissa bits, bias)
FNUZ = {"F8F143": (4, 3, 8), "F8F152": (5, 2, 16)}


def decode_fnuz(kind: str) -> np.ndarray:
    """float64 value of each byte 0..255 (NaN for 0x80, the only non-finite code)."""
    ebits, mbits, bias = FNUZ[kind]
    codes = np.arange(256)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp = (codes >> mbits) & ((1 << ebits) - 1)
    man = codes & ((1 << mbits) - 1)
    normal = (1.0 + man / 2.0**mbits) * 2.0 ** (exp - bias)
    subnormal = (man / 2.0**mbits) * 2.0 ** (1 - bias)
    values = sign * np.where(exp > 0, normal, subnormal)
    values[0x80] = np.nan
    return values


def nearest_fnuz(kind: str, values: np.ndarray, scale_exponent: int = 0) -> np.ndarray:
    """Bytes of round-to-nearest-even, saturating quantisation of ``values / 2^scale``."""
    table = decode_fnuz(kind)
    codes = np.flatnonzero(np.isfinite(table))
    reps = table[codes]
    x = np.asarray(values, dtype=np.float64).ravel() / 2.0**scale_exponent
    top = reps.max()
    x = np.clip(x, -top, top)
    dist = np.abs(x[:, None] - reps[None, :])
    best = dist.min(axis=1, keepdims=True)
    tie = dist == best
    # several codes at the same distance: a tie between two neighbours (even mantissa wins),
    # or +0 and -0 (0x00 wins; 0x80 is NaN here and not a candidate anyway)
    even = tie & (codes[None, :] % 2 == 0)
    pick = np.where(even.any(axis=1), np.argmax(even, axis=1), np.argmax(tie, axis=1))
    return codes[pick].astype(np.uint8).reshape(np.shape(values))


@pytest.fixture
def fp8():
    class Fp8:
        decode = staticmethod(decode_fnuz)
        nearest = staticmethod(nearest_fnuz)

    return Fp8
