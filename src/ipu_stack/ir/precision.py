"""Element precisions: F32, F16 and the two FP8 formats with a power-of-two scale exponent.

FP8 values follow Poplar's ``QuarterMetadata``: the stored byte ``q`` means ``q x 2^scale``.
F143 is ml_dtypes ``float8_e4m3fnuz`` (bias 8, max 240, NaN 0x80, no inf) and F152 is
``float8_e5m2fnuz`` (bias 16, max 57344).  Quantisation saturates to the format's maximum, as
the hardware's saturating conversion does, and rounds to nearest even (ml_dtypes).
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from ipu_stack.ir import rounding
from ipu_stack.util.errors import UsageError

_FORMATS: dict[str, tuple[np.dtype, int]] = {
    "F32": (np.dtype(np.float32), 4),
    "F16": (np.dtype(np.float16), 2),
    "F8F143": (np.dtype(ml_dtypes.float8_e4m3fnuz), 1),
    "F8F152": (np.dtype(ml_dtypes.float8_e5m2fnuz), 1),
    # token ids and positions: what a lookup (popops MultiSlice's offsets) reads
    "I32": (np.dtype(np.int32), 4),
}

SCALE_MIN, SCALE_MAX = -32, 31


@dataclass(frozen=True, order=True)
class Precision:
    """An element format; FP8 formats carry a scale exponent in ``[-32, 31]``."""

    kind: str
    scale_exponent: int = 0

    def __post_init__(self) -> None:
        if self.kind not in _FORMATS:
            raise UsageError(f"unknown precision {self.kind!r}; known: {', '.join(_FORMATS)}")
        if not self.is_fp8 and self.scale_exponent != 0:
            raise UsageError(f"precision {self.kind} takes no scale exponent")
        if not SCALE_MIN <= self.scale_exponent <= SCALE_MAX:
            raise UsageError(
                f"FP8 scale exponent {self.scale_exponent} outside [{SCALE_MIN}, {SCALE_MAX}]"
            )

    @property
    def is_fp8(self) -> bool:
        return self.kind.startswith("F8")

    @property
    def is_integer(self) -> bool:
        return self.kind == "I32"

    @property
    def dtype(self) -> np.dtype:
        """The numpy storage dtype of one element."""
        return _FORMATS[self.kind][0]

    @property
    def itemsize(self) -> int:
        return _FORMATS[self.kind][1]

    @property
    def max_finite(self) -> float:
        if self.is_integer:
            return float(np.iinfo(self.dtype).max)
        return float(ml_dtypes.finfo(self.dtype).max) * 2.0**self.scale_exponent if self.is_fp8 \
            else float(np.finfo(self.dtype).max)

    def quantize(self, values: np.ndarray) -> np.ndarray:
        """Round float values to this format's storage dtype (FP8: divide by the scale,
        saturate, round to nearest even; a compiled loop bit-identical to ml_dtypes' cast)."""
        if self.is_fp8:
            return rounding.encode_fp8(values, self.kind, self.scale_exponent)
        if self.kind == "F16":
            return rounding.encode_f16(values)
        if self.is_integer:  # ids: whole numbers, exact in float32 up to 2^24
            return np.rint(np.asarray(values, dtype=np.float64)).astype(self.dtype)
        return np.asarray(values, dtype=np.float32).astype(self.dtype)

    def dequantize(self, stored: np.ndarray) -> np.ndarray:
        """Exact float32 values of stored elements (FP8 and F16: a table of every code)."""
        if self.is_fp8:
            return rounding.decode_fp8(stored, self.kind, self.scale_exponent)
        if self.kind == "F16":
            return rounding.decode_f16(stored)
        return np.asarray(stored).astype(np.float32)

    def round_trip(self, values: np.ndarray) -> np.ndarray:
        """What the device holds after storing ``values`` in this format, as float32."""
        if self.kind == "F16":
            return rounding.round_f16(values)
        if self.kind == "F32":
            return np.array(values, dtype=np.float32)
        return self.dequantize(self.quantize(values))

    def __str__(self) -> str:
        if self.is_fp8:
            return f"{self.kind} {{ scale_exponent: {self.scale_exponent} }}"
        return self.kind

    def to_json(self) -> dict[str, int | str]:
        return {"kind": self.kind, "scale_exponent": self.scale_exponent}

    @staticmethod
    def from_json(data: dict[str, int | str]) -> Precision:
        return Precision(str(data["kind"]), int(data.get("scale_exponent", 0)))


F32 = Precision("F32")
F16 = Precision("F16")
I32 = Precision("I32")  # token ids, positions, an argmax's columns


def f143(scale_exponent: int = 0) -> Precision:
    return Precision("F8F143", scale_exponent)


def f152(scale_exponent: int = 0) -> Precision:
    return Precision("F8F152", scale_exponent)


def fit_scale_exponent(values: np.ndarray, kind: str = "F8F143", headroom: float = 1.0) -> int:
    """The scale exponent that puts ``max|values| * headroom`` just inside the FP8 range.

    Chosen from a calibration tensor; a power of two keeps dequantisation exact.
    """
    values = np.asarray(values)
    # max |v| without an |v| temporary (a tower's calibration reads gigabytes); NaN stays NaN
    peak = float(np.maximum(values.max(), -values.min())) * headroom if values.size else 0.0
    limit = float(ml_dtypes.finfo(_FORMATS[kind][0]).max)
    if peak == 0.0 or not np.isfinite(peak):
        return 0
    exponent = int(np.ceil(np.log2(peak / limit)))
    return int(np.clip(exponent, SCALE_MIN, SCALE_MAX))
