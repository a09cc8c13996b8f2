"""Tensor types: a shape and a precision."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from math import prod

import numpy as np

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


class RowIndex:
    """A fixed row order known when compiling (the source row of each row a gather makes),
    compared, hashed and printed by its digest: a Swin stage's window order holds tens of
    thousands of rows, and graph dumps and stage signatures print every attribute."""

    __slots__ = ("rows", "digest")

    def __init__(self, rows: object) -> None:
        values = np.ascontiguousarray(np.asarray(rows, dtype=np.int64).reshape(-1))
        values.setflags(write=False)
        self.rows = values
        self.digest = hashlib.sha256(values.tobytes()).hexdigest()[:16]

    def __len__(self) -> int:
        return len(self.rows)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RowIndex) and other.digest == self.digest

    def __hash__(self) -> int:
        return hash(self.digest)

    def __str__(self) -> str:
        return f"rows[{len(self.rows)}]#{self.digest}"

    __repr__ = __str__
