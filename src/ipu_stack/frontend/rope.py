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

Which channels form pair ``p`` is the value's ``layout``: ``interleaved`` (``2p``, ``2p+1``:
Perception Encoder, the builtin) or ``halves`` (``p``, ``p + d/2``: Llama-style
``rotate_half``, DINOv3), reached by slicing the last dimension in two and concatenating
the halves back.  A per-channel scaling (a diagonal ``m``) reads the same in both, so it
adopts whichever layout it is combined with.  A value may also cover a ``window`` of the
tokens (DINOv3 rotates only the patch tokens: it splits off the CLS and register tokens
and concatenates them back); concatenating consecutive windows of one base rebuilds it.
The tables are constants (folded at import, whatever computed them: meshgrid, cos, sin).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ipu_stack.frontend.forms import Act
from ipu_stack.ir.precision import F16, F32


def _windowed(base: Act, window: tuple[int, int] | None) -> tuple[int, ...]:
    shape = list(base.shape)
    if window is not None:
        shape[token_axis(base)] = window[1] - window[0]  # type: ignore[index]
    return tuple(shape)


@dataclass(frozen=True)
class Pairs:
    """A pairwise-linear function of ``base`` (heads form): see the module doc."""

    base: Act
    m: np.ndarray  # [T (of the window), P, 2, 2]
    split: bool  # logical view (..., P, 2) instead of (..., d)
    layout: str = "interleaved"  # pair p is channels (2p, 2p+1), or (p, p + P): "halves"
    window: tuple[int, int] | None = None  # tokens [a, b) of the base; None: all

    @property
    def shape(self) -> tuple[int, ...]:
        shape = _windowed(self.base, self.window)
        return (*shape[:-1], self.m.shape[1], 2) if self.split else shape


@dataclass(frozen=True)
class PairPart:
    """One component of a :class:`Pairs`: ``sum_c' coeff[t, p, c'] * base[t, p, c']``."""

    base: Act
    coeff: np.ndarray  # [T, P, 2]
    layout: str = "interleaved"
    window: tuple[int, int] | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return (*_windowed(self.base, self.window)[:-1], self.coeff.shape[1])


def token_axis(act: Act) -> int | None:
    """The token axis of a 4-D heads-form value, or None when rope does not apply."""
    if len(act.shape) != 4:
        return None
    if act.form == "rows" and act.shape[1] == 1 and act.shape[0] * act.shape[2] > 1:
        return 2  # one head ``[B, 1, T, d]`` (multi-query attention's key): rows' bytes
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
        return replace(value, m=value.m * factor)
    return replace(value, coeff=value.coeff * factor)


def multiply(value: Pairs | PairPart, constant: np.ndarray) -> Pairs | PairPart | None:
    """``value * constant`` (a table over tokens and channels), or None."""
    if isinstance(value, PairPart):
        table = per_token(constant, value, (value.coeff.shape[1],))
        return None if table is None else replace(value, coeff=value.coeff * table[..., None])
    last = (value.m.shape[1], 2) if value.split else (value.m.shape[1] * 2,)
    table = per_token(constant, value, last)
    if table is None:
        return None
    table = _from_channels(table.reshape(value.m.shape[0], -1), value.layout)
    return replace(value, m=value.m * table[..., None])


def add(x: Any, y: Any, sign: float) -> Pairs | PairPart | None:
    """``x + sign * y`` for two symbolic values of the same base, or None."""
    if type(x) is not type(y) or x.base.value != y.base.value or x.base.shape != y.base.shape:
        return None
    if x.window != y.window:
        return None
    if isinstance(x, Pairs):
        if x.split != y.split:
            return None
        x = _relayout(x, y.layout) or x  # one of them adopts the other's layout
        y = _relayout(y, x.layout) or y
        if x.layout != y.layout:
            return None
        return replace(x, m=x.m + sign * y.m)
    if x.layout != y.layout:
        return None
    return replace(x, coeff=x.coeff + sign * y.coeff)


def view(value: Pairs | PairPart, shape: tuple[int, ...]) -> Pairs | None:
    """A view as ``(..., d)`` or, for interleaved pairs, ``(..., d/2, 2)``."""
    if isinstance(value, Pairs):
        flat = replace(value, split=False)
        if shape == flat.shape:
            return flat
        interleaved = _relayout(value, "interleaved")
        if interleaved is not None and shape == replace(interleaved, split=True).shape:
            return replace(interleaved, split=True)
    return None


def component(value: Pairs, index: int) -> PairPart | None:
    if not value.split:
        return None
    return PairPart(value.base, value.m[:, :, index % 2, :], value.layout, value.window)


def stack(parts: list[Any]) -> Pairs | None:
    if len(parts) != 2 or not all(isinstance(p, PairPart) for p in parts):
        return None
    a, b = parts
    if a.base.value != b.base.value or a.window != b.window or not (
            a.layout == b.layout == "interleaved"):
        return None
    return Pairs(a.base, np.stack([a.coeff, b.coeff], axis=2), True, "interleaved", a.window)


# ---------------------------------------------------------------- split halves, token windows
def _to_channels(pairs: np.ndarray, layout: str) -> np.ndarray:
    """``[T, P, 2]`` per (pair, component) -> ``[T, d]`` per channel."""
    if layout == "halves":
        return pairs.transpose(0, 2, 1).reshape(pairs.shape[0], -1)
    return pairs.reshape(pairs.shape[0], -1)


def _from_channels(channels: np.ndarray, layout: str) -> np.ndarray:
    """``[T, d]`` per channel -> ``[T, P, 2]`` per (pair, component)."""
    t, d = channels.shape
    if layout == "halves":
        return channels.reshape(t, 2, d // 2).transpose(0, 2, 1)
    return channels.reshape(t, d // 2, 2)


def _relayout(value: Pairs, layout: str) -> Pairs | None:
    """``value`` with its pairs read in ``layout``: itself, or a per-channel scaling
    re-expressed; None when it mixes channels in its own layout."""
    if value.layout == layout:
        return value
    m = value.m
    if value.split or np.any(m[..., 0, 1]) or np.any(m[..., 1, 0]):
        return None
    diagonal = _from_channels(_to_channels(np.stack([m[..., 0, 0], m[..., 1, 1]], -1),
                                           value.layout), layout)
    out = np.zeros_like(m)
    out[..., 0, 0], out[..., 1, 1] = diagonal[..., 0], diagonal[..., 1]
    return replace(value, m=out, layout=layout)


def token_windows(act: Act, sizes: list[int]) -> list[Pairs] | None:
    """``act.split(sizes, dim=token axis)`` as identity Pairs over consecutive windows."""
    whole = start(act)
    axis = token_axis(act)
    if whole is None or axis is None or sum(sizes) != act.shape[axis]:
        return None
    parts, first = [], 0
    for size in sizes:
        parts.append(replace(whole, m=whole.m[first:first + size], window=(first, first + size)))
        first += size
    return parts


def half(value: Pairs, index: int) -> PairPart | None:
    """``value[..., :d/2]`` (``index`` 0) or ``value[..., d/2:]`` (1): a component of the
    value read in the ``halves`` layout."""
    halves = None if value.split else _relayout(value, "halves")
    if halves is None:
        return None
    return PairPart(halves.base, halves.m[:, :, index, :], "halves", halves.window)


def concat_halves(parts: list[Any]) -> Pairs | None:
    """``cat([a, b], -1)`` of two halves: the Pairs whose components they are."""
    if len(parts) != 2 or not all(isinstance(p, PairPart) and p.layout == "halves"
                                  for p in parts):
        return None
    a, b = parts
    if a.base.value != b.base.value or a.window != b.window:
        return None
    return Pairs(a.base, np.stack([a.coeff, b.coeff], axis=2), False, "halves", a.window)


def concat_tokens(parts: list[Any]) -> Pairs | None:
    """``cat(windows, token axis)`` of consecutive windows of one base: the whole again."""
    if not parts or not all(isinstance(p, Pairs) and not p.split for p in parts):
        return None
    layouts = {p.layout for p in parts if _relayout(p, "halves" if p.layout == "interleaved"
                                                   else "interleaved") is None}
    if len(layouts) > 1:
        return None
    layout = layouts.pop() if layouts else parts[-1].layout
    parts = [_relayout(p, layout) for p in parts]
    base = parts[0].base
    edge = 0
    for p in parts:
        if p.base.value != base.value or p.base.shape != base.shape or p.window is None or (
                p.window[0] != edge):
            return None
        edge = p.window[1]
    if edge != base.shape[token_axis(base)]:  # type: ignore[index]
        return None
    return Pairs(base, np.concatenate([p.m for p in parts], axis=0), False, layout, None)


def materialize(conv: Any, node: Any, value: Pairs,
                host: Callable[[list[np.ndarray]], Pairs] | None = None) -> Act | None:
    """The IR value of ``value`` used as a whole: the base itself (identity), or one
    ``rope`` operation when every pair is rotated; None when it is neither.  ``host``
    gives the value again for other user inputs when its tables come from the host's
    arithmetic on positions (a decode step's angles): the tables are then per-call inputs."""
    if value.split or value.window is not None:
        return None
    m = value.m
    cos, sin = m[..., 0, 0], m[..., 1, 0]
    if not _rotation(m) or (host is not None and not _rotation(host(conv.probe_user()).m)):
        return None  # at the example's positions, and a call's later ones
    base = value.base
    gain = 1.0 if host is not None else _gain(cos, sin)
    cos, sin = cos / gain, sin / gain
    if np.all(cos == 1.0) and np.all(sin == 0.0) and host is None:
        return base.with_(factor=base.factor * gain)
    batch = base.dims[0]
    tables = []
    for index, label in enumerate(("cos", "sin")):
        if host is not None:
            tables.append(conv.per_call_input(f"rope.{label}", _table_maker(host, index, batch),
                                              F32))
            continue
        rows = np.tile((cos, sin)[index].astype(np.float32), (batch, 1))
        digest = hashlib.sha256(rows.tobytes()).hexdigest()[:8]
        tables.append(conv.weight(f"rope.{label}.{digest}", rows, False, table=True))
    plain = base.with_(factor=1.0)
    name = f"{conv.b.graph.value(plain.value).name}.rope"  # one per query/key, not per user
    layout = {"pairs": "halves"} if value.layout == "halves" else {}  # interleaved: default
    if base.rotary_of:  # the first channels of each head turned, the rest passed through
        layout = {**layout, "rotary": 2 * m.shape[1]}
    out = conv.b.op("rope", [plain.value, *tables], F16, name,
                    head_dim=base.rotary_of or 2 * m.shape[1], **layout)
    conv.rewrites.append(f"{node.name}: rotary embedding recognised as rope ({name})")
    return base.with_(value=out, factor=base.factor * gain)


@dataclass(frozen=True)
class RotaryRest:
    """``q[..., r:]`` of a query or key in heads form: the channels a partial RoPE passes
    through (Phi-2, StableLM), waiting for the concatenation after ``q[..., :r]`` turned."""

    act: Act
    start: int

    @property
    def shape(self) -> tuple[int, ...]:
        return (*self.act.shape[:-1], self.act.shape[-1] - self.start)


def rotary_part(act: Any, first: int, last: int) -> Act | RotaryRest | None:
    """``act[..., first:last]`` of a query or key in heads form as a partial RoPE reads it:
    the leading channels it turns (an :class:`Act` narrowed to them, ``rotary_of`` the
    head's width, which :func:`start` and the pairs' algebra then read as a narrower
    head) or the channels it passes through; None when the slice is neither."""
    if not isinstance(act, Act) or act.rotary_of or start(act) is None:
        return None
    width = act.shape[-1]
    if first == 0 and 0 < last < width and last % 2 == 0:
        return act.with_(shape=(*act.shape[:-1], last), rotary_of=width)
    if 0 < first < width and last == width and first % 2 == 0:
        return RotaryRest(act, first)
    return None


def join_rotary(turned: Act, rest: RotaryRest) -> Act | None:
    """``cat([turned part, passed part], -1)`` of one query or key: the rope's output holds
    every channel of each head (it passes the rest through), so the whole head is it."""
    if not turned.rotary_of or turned.rotary_of != rest.act.shape[-1] or \
            turned.shape[-1] != rest.start or turned.dims != rest.act.dims or \
            turned.shape[:-1] != rest.act.shape[:-1]:
        return None
    return turned.with_(shape=rest.act.shape, rotary_of=0)


def _gain(cos: np.ndarray, sin: np.ndarray) -> float:
    """The one scale of a rotation scaled alike at every pair and token (torch.onnx's
    attention scales the rotated query by the root of its softmax scale), else 1: the
    rotation keeps its tables, and the scale stays a lazy factor a softmax folds."""
    norms = cos.astype(np.float64) ** 2 + sin.astype(np.float64) ** 2
    square = float(norms.mean()) if norms.size else 1.0
    if abs(square - 1.0) < 1e-3 or not np.allclose(norms, square, rtol=1e-5, atol=0.0):
        return 1.0
    return float(np.float32(np.sqrt(square)))  # the float32 constant torch multiplied by


def _rotation(m: np.ndarray) -> bool:
    """Whether every pair's transform is a rotation ``[[cos, -sin], [sin, cos]]``."""
    return bool(np.array_equal(m[..., 1, 1], m[..., 0, 0])
                and np.array_equal(m[..., 0, 1], -m[..., 1, 0]))


def _table_maker(host: Callable[[list[np.ndarray]], Pairs], index: int, batch: int
                 ) -> Callable[[list[np.ndarray]], np.ndarray]:
    """The cos (``index`` 0) or sin table of the value ``host`` gives for a call's inputs."""
    def make(arrays: list[np.ndarray]) -> np.ndarray:
        m = host(arrays).m
        return np.tile(m[..., index, 0].astype(np.float32), (batch, 1))
    return make
