"""Rotary position embeddings written in ATen, recognised algebraically and mapped to ``rope``.

RoPE in torch is a handful of elementwise operations on a query or key in heads form:
``t * cos + rotate_half(t) * sin`` (Perception Encoder, interleaved pairs), or
``stack([x0*cos - x1*sin, x0*sin + x1*cos], -1)`` on a ``(..., d/2, 2)`` view.  Rather than
match each spelling, the importer tracks such values symbolically: a :class:`Pairs` is
``out[t, p, c] = sum_c' m[t, p, c, c'] * base[t, p, c']`` for each token ``t`` and channel
pair ``p`` (the same for every image and head), a :class:`PairPart` one component of it.
Products with constant tables, sums, negation, ``view (..., d/2, 2)``, ``unbind``/``select``
and ``stack`` update ``m``; any other use materialises it, and that is legal only when every
``m[t, p]`` is a rotation ``[[cos, -sin], [sin, cos]]``: one ``rope`` operation with those
tables (F32, one row per image and token, as the builtin pe-block's).  The identity needs
no operation.  Anything else is reported as unsupported.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from ipu_stack.frontend.forms import Act
from ipu_stack.ir.precision import F16


@dataclass(frozen=True)
class Pairs:
    """A pairwise-linear function of ``base`` (heads form): see the module doc."""

    base: Act
    m: np.ndarray  # [T, P, 2, 2]
    split: bool  # logical view (..., P, 2) instead of (..., d)

    @property
    def shape(self) -> tuple[int, ...]:
        return (*self.base.shape[:-1], self.m.shape[1], 2) if self.split else self.base.shape


@dataclass(frozen=True)
class PairPart:
    """One component of a :class:`Pairs`: ``sum_c' coeff[t, p, c'] * base[t, p, c']``."""

    base: Act
    coeff: np.ndarray  # [T, P, 2]

    @property
    def shape(self) -> tuple[int, ...]:
        return (*self.base.shape[:-1], self.coeff.shape[1])


def token_axis(act: Act) -> int | None:
    """The token axis of a 4-D heads-form value, or None when rope does not apply."""
    if len(act.shape) != 4:
        return None
    return {"heads": 1, "heads_major": 2}.get(act.form)


def start(act: Act) -> Pairs | None:
    """``act`` as the identity Pairs, when it is a 4-D query/key in heads form."""
    if token_axis(act) is None or act.shape[-1] % 2:
        return None
    tokens, pairs = act.shape[token_axis(act)], act.shape[-1] // 2
    m = np.zeros((tokens, pairs, 2, 2))
    m[..., 0, 0] = m[..., 1, 1] = 1.0
    return Pairs(act, m, split=False)


def per_token(constant: np.ndarray, value: Pairs | PairPart, last: tuple[int, ...]) -> np.ndarray | None:
    """``constant`` as ``[T, *last]`` when it broadcasts to the value and is the same for
    every image and head, else None."""
    base = value.base
    shape = value.shape
    try:
        full = np.broadcast_to(np.asarray(constant, np.float64), shape)
    except ValueError:
        return None
    if np.broadcast_shapes(np.shape(constant), shape) != shape:
        return None
    axis = token_axis(base)
    moved = np.moveaxis(full, axis, 0)  # [T, other leading..., *last]
    flat = moved.reshape(moved.shape[0], -1, *last)
    if not np.all(flat == flat[:, :1]):
        return None
    return flat[:, 0]


def scale(value: Pairs | PairPart, factor: np.ndarray | float) -> Pairs | PairPart:
    if isinstance(value, Pairs):
        return Pairs(value.base, value.m * factor, value.split)
    return PairPart(value.base, value.coeff * factor)


def multiply(value: Pairs | PairPart, constant: np.ndarray) -> Pairs | PairPart | None:
    """``value * constant`` (a table over tokens and channels), or None."""
    if isinstance(value, PairPart):
        table = per_token(constant, value, (value.coeff.shape[1],))
        return None if table is None else PairPart(value.base, value.coeff * table[..., None])
    last = (value.m.shape[1], 2) if value.split else (value.m.shape[1] * 2,)
    table = per_token(constant, value, last)
    if table is None:
        return None
    table = table.reshape(value.m.shape[0], value.m.shape[1], 2)
    return Pairs(value.base, value.m * table[..., None], value.split)


def add(x: Any, y: Any, sign: float) -> Pairs | PairPart | None:
    """``x + sign * y`` for two symbolic values of the same base, or None."""
    if type(x) is not type(y) or x.base.value != y.base.value or x.base.shape != y.base.shape:
        return None
    if isinstance(x, Pairs):
        if x.split != y.split:
            return None
        return Pairs(x.base, x.m + sign * y.m, x.split)
    return PairPart(x.base, x.coeff + sign * y.coeff)


def view(value: Pairs | PairPart, shape: tuple[int, ...]) -> Pairs | None:
    if isinstance(value, Pairs):
        if shape == value.base.shape:
            return Pairs(value.base, value.m, False)
        if shape == (*value.base.shape[:-1], value.m.shape[1], 2):
            return Pairs(value.base, value.m, True)
    return None


def component(value: Pairs, index: int) -> PairPart | None:
    if not value.split:
        return None
    return PairPart(value.base, value.m[:, :, index % 2, :])


def stack(parts: list[Any]) -> Pairs | None:
    if len(parts) != 2 or not all(isinstance(p, PairPart) for p in parts):
        return None
    a, b = parts
    if a.base.value != b.base.value:
        return None
    return Pairs(a.base, np.stack([a.coeff, b.coeff], axis=2), split=True)


def materialize(conv: Any, node: Any, value: Pairs) -> Act | None:
    """The IR value of ``value`` used as a whole: the base itself (identity), or one
    ``rope`` operation when every pair is rotated; None when it is neither."""
    if value.split:
        return None
    m = value.m
    cos, sin = m[..., 0, 0], m[..., 1, 0]
    if not (np.array_equal(m[..., 1, 1], cos) and np.array_equal(m[..., 0, 1], -sin)):
        return None
    base = value.base
    if np.all(cos == 1.0) and np.all(sin == 0.0):
        return base
    batch = base.dims[0]
    tables = []
    for label, table in (("cos", cos), ("sin", sin)):
        rows = np.tile(table.astype(np.float32), (batch, 1))
        digest = hashlib.sha256(rows.tobytes()).hexdigest()[:8]
        tables.append(conv.weight(f"rope.{label}.{digest}", rows, False, table=True))
    plain = base.with_(factor=1.0)
    name = f"{conv.b.graph.value(plain.value).name}.rope"  # one per query/key, not per user
    out = conv.b.op("rope", [plain.value, *tables], F16, name, head_dim=2 * m.shape[1])
    conv.rewrites.append(f"{node.name}: rotary embedding recognised as rope ({name})")
    return base.with_(value=out)
