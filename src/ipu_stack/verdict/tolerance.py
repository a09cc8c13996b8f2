"""The tolerance policy: when does a device output agree with the host reference?

Both sides compute at device precision, so they differ only by float32 summation order
inside matmuls.  Such a difference can move a value across a rounding boundary of a stored
precision: one ulp of F16 at an output, or one ulp of an FP8 intermediate (F143 has 3
mantissa bits, so a flip changes that element by up to 1/8 of its value, and every value
computed from it moves a little; through a stack of layers such flips compound).

Policy (per tensor), with ``band = ATOL_FRACTION x max|reference| + rtol x |reference|``
where ``rtol`` is ``RTOL`` (two F16 ulps) or, for a tensor stored in FP8, one ulp of that
format (2^-3 for F143, 2^-2 for F152):

* every element is finite and within ``SPREAD x band``;
* at most a ``OUTSIDE_FRACTION`` share of the elements lies outside ``band``.

Rounding flips are rare and isolated, so they pass; a wrong address, a lost partial sum, a
corrupted weight block or a missed bias moves many elements (whole rows or column blocks) by
a sizeable fraction of the range and fails.  Measured figures: ``docs/tolerance.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ipu_stack.ir.precision import Precision

RTOL = 2.0**-9
ATOL_FRACTION = 2.0**-6
OUTSIDE_FRACTION = 2.0**-10
SPREAD = 8.0
FP8_RTOL = {"F8F143": 2.0**-3, "F8F152": 2.0**-2}


@dataclass(frozen=True)
class Comparison:
    passed: bool
    max_abs_error: float
    atol: float
    failing: int
    elements: int


def compare(
    device: np.ndarray,
    reference: np.ndarray,
    scale: float | None = None,
    precision: Precision | None = None,
) -> Comparison:
    """Apply the policy; ``scale`` overrides max|reference| (for samples of a tensor) and
    ``precision`` is the tensor's stored precision (FP8 widens the relative band)."""
    device = np.asarray(device, dtype=np.float64)
    reference = np.asarray(reference, dtype=np.float64)
    if device.shape != reference.shape:
        return Comparison(False, float("inf"), 0.0, reference.size, reference.size)
    error = np.abs(device - reference)
    finite = np.isfinite(device)
    if scale is None:
        scale = float(np.max(np.abs(reference))) if reference.size else 0.0
    atol = ATOL_FRACTION * scale
    rtol = FP8_RTOL.get(precision.kind, RTOL) if precision is not None else RTOL
    band = atol + rtol * np.abs(reference)
    outside = (~finite) | (error > band)
    wild = (~finite) | (error > SPREAD * band)
    allowed = OUTSIDE_FRACTION * reference.size
    passed = bool(not wild.any() and outside.sum() <= allowed)
    max_error = float(np.max(np.where(finite, error, np.inf))) if error.size else 0.0
    return Comparison(passed, max_error, atol, int(outside.sum()), int(reference.size))
