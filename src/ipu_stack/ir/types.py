"""Tensor types: a shape and a precision."""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from ipu_stack.ir.precision import Precision
from ipu_stack.util.errors import UsageError


@dataclass(frozen=True)
class TensorType:
    """A logical tensor: shape (row major) and element precision."""

    shape: tuple[int, ...]
    precision: Precision

    def __post_init__(self) -> None:
        if any((not isinstance(d, int)) or d <= 0 for d in self.shape):
            raise UsageError(f"tensor shape {list(self.shape)} must have positive sizes")

    @property
    def elements(self) -> int:
        return prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.elements * self.precision.itemsize

    @property
    def rows(self) -> int:
        """Leading dimensions flattened: the GEMM row count."""
        return prod(self.shape[:-1]) if len(self.shape) > 1 else 1

    @property
    def cols(self) -> int:
        return self.shape[-1]

    def __str__(self) -> str:
        return f"TensorType {{ shape: {list(self.shape)}, precision: {self.precision} }}"

    def to_json(self) -> dict:
        return {"shape": list(self.shape), "precision": self.precision.to_json()}

    @staticmethod
    def from_json(data: dict) -> TensorType:
        return TensorType(tuple(int(d) for d in data["shape"]), Precision.from_json(data["precision"]))
