"""The tolerance policy: when does a device output agree with the host reference?

Both sides compute at device precision, so they differ only by float32 summation order
inside matmuls.  Such a difference can move a value across a rounding boundary of a stored
precision: one ulp of F16 at the output, or one ulp of an FP8 intermediate (a GELU output
stored as F143 has 3 mantissa bits, so a flip there changes that element by 1/8 of its
value and moves each output it feeds by at most ``|h| / 8 x |w|``).

Policy (per output tensor): an element passes when

    |device - reference| <= ATOL_FRACTION x max|reference| + RTOL x |reference|

with ``RTOL = 2^-9`` (two F16 ulps) and ``ATOL_FRACTION = 2^-6`` (about 1.6 % of the
tensor's largest magnitude, room for a handful of FP8 flips feeding one output).  A wrong
address, a lost partial sum or a missed bias moves elements by a sizeable fraction of the
tensor's range, far outside this band.  The figures measured on the builtin workloads are in
``docs/benchmarks.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

RTOL = 2.0**-9
ATOL_FRACTION = 2.0**-6


@dataclass(frozen=True)
class Comparison:
    passed: bool
    max_abs_error: float
    atol: float
    failing: int
    elements: int


def compare(device: np.ndarray, reference: np.ndarray, scale: float | None = None) -> Comparison:
    """Apply the policy; ``scale`` overrides max|reference| (for samples of a tensor)."""
    device = np.asarray(device, dtype=np.float64)
    reference = np.asarray(reference, dtype=np.float64)
    if device.shape != reference.shape:
        return Comparison(False, float("inf"), 0.0, reference.size, reference.size)
    error = np.abs(device - reference)
    finite = np.isfinite(device)
    if scale is None:
        scale = float(np.max(np.abs(reference))) if reference.size else 0.0
    atol = ATOL_FRACTION * scale
    bad = (~finite) | (error > atol + RTOL * np.abs(reference))
    max_error = float(np.max(np.where(finite, error, np.inf))) if error.size else 0.0
    return Comparison(not bad.any(), max_error, atol, int(bad.sum()), int(reference.size))
