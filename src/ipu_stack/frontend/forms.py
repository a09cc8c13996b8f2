"""Layout forms: how a torch value of some logical shape sits in one IR value ``[rows, cols]``.

The IR holds every activation as a row-major matrix (``TensorType.rows x cols``).  A torch
program moves between views of the same bytes (``view``, ``transpose``, ``permute``) that
the IR has no operations for, so the importer tracks, for each torch value, the IR value it
lives in plus a *form* that says how the logical tensor maps onto that matrix:

* ``rows``: the logical shape flattened row-major, last dimension = the IR's columns
  (``[B, T, D]`` -> ``[B*T, D]``); scores ``[B, H, T, T]`` are ``rows`` too (they are laid
  out that way by ``head_matmul qk``) and carry ``attention=(B, H, T)``;
* ``heads``: ``[B, T, H, d]`` (a ``view`` of rows ``[B, T, H*d]``), same bytes as rows;
* ``heads_major``: ``[B, H, T, d]`` (heads transposed; also the layout ``head_matmul pv``
  returns, so attention output needs no data movement);
* ``keys_t``: ``[B, H, d, T]`` (keys transposed for ``q @ k^T``);
* ``channels``: a patch-embedding result ``[B, D, gh, gw]`` or ``[B, D, N]`` held as rows
  ``[B*N, D]`` (the GEMM computes it token-major; the transpose back is free);
* ``replicated``: a per-image vector ``[B, D]`` (mean or one token) held as ``[B*T, D]``
  with every token row equal (computed by ``head_matmul pv`` with a constant mixing matrix);
* ``tmajor``: ``[T, B, D]`` (``x.transpose(0, 1)`` of rows ``[B, T, D]``, the layout
  ``nn.MultiheadAttention`` works in) still held image-major as ``[B*T, D]``: row-local
  operations do not care in which order the rows sit; ``dims`` = (B, T);
* ``column``: a ``[..., 1]`` rows value with its last axis squeezed away (a question
  answering head's ``start_logits``, ``[B, T]``), still held as ``[B*T, 1]``; only an
  output (and views back to ``[..., 1]``) may take it;
* ``theads``: a ``tmajor`` value viewed as ``[T, B*H, d]`` (MHA's head split; its
  ``transpose(0, 1)`` is ``heads_major`` ``[B*H, T, d]``), or ``heads`` permuted to
  ``[T, B, H, d]``: no data movement either way.

Views and permutes are pattern-matched against these forms; anything else is reported as
unsupported rather than guessed.  ``factor`` and ``addend`` are lazy: ``x * s`` and
``x + constant`` are folded into the next consumer (a softmax scale, an add) when possible
and materialised as IR operations otherwise.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from math import prod
from typing import Any

import numpy as np

from ipu_stack.ir.types import RowIndex
from ipu_stack.util.errors import CompileError


@dataclass(frozen=True)
class Act:
    """A torch activation held by IR value ``value`` in ``form`` (see the module doc)."""

    value: int
    shape: tuple[int, ...]
    form: str = "rows"
    dims: tuple[int, ...] = ()  # heads forms: (B, T, H, d); channels: (B, D, N); replicated: (B, T)
    factor: float = 1.0
    addend: np.ndarray | None = field(default=None, compare=False)
    attention: tuple[int, int, int] | None = None  # scores: (B, H, T)
    prefix: int = 0  # channels: zero patch rows per image hidden ahead of the patches
    suffix: int = 0  # channels: zero patch rows per image hidden behind them
    gap: tuple[int, int] = (0, 0)  # (k, R): R reserved rows after logical token k (registers)
    bias: np.ndarray | None = field(default=None, compare=False)  # what those rows hold
    linear: tuple[str, str | None] | None = None  # fresh linear output: (weight, bias) keys
    origin: str = ""  # the node whose lazy factor/addend this is (names the materialisation)
    one_query: bool = False  # scores/probs of a single query replicated over the token rows
    norm_scale: str | None = None  # fresh RMS norm output: its scale weight's key (foldable)
    cached: int = 0  # a KV cache read whole: the key/value heads its IR value holds
    over_cache: int = 0  # scores or probabilities over a KV cache: its key/value heads
    mask: int | None = None  # scores over a KV cache: the per-call additive mask's value
    # heads forms: the first ``shape[-1]`` channels of each head of a value whose heads
    # are this wide (a partial RoPE's turned part, ``frontend/rope.py``); 0: whole heads
    rotary_of: int = 0
    # rows form with its rows out of order: logical row ``l`` (leading axes flattened) sits
    # in IR row ``order.rows[l]``; ``None`` is the IR's own order (``frontend/order.py``)
    order: RowIndex | None = field(default=None, compare=False)
    # rows form: each logical row is this many IR rows side by side, consecutive in
    # ``order`` (a view that merges rows into wider ones, SmolVLM's pixel shuffle)
    group: int = 1

    @property
    def lazy(self) -> bool:
        return self.factor != 1.0 or self.addend is not None

    def with_(self, **changes: Any) -> Act:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class HeadRepeat:
    """``x[:, :, None]`` of a ``heads_major`` value ``[B, kv, T, d]`` (or RoPE pairs over
    one) on its way to ``expand(B, kv, n, T, d).reshape(B, kv n, T, d)``: grouped-query
    attention's key and value heads repeated for the query heads (transformers'
    ``repeat_kv``); ``repeats`` is ``n`` once the expand is seen."""

    source: Any
    repeats: int = 1

    @property
    def shape(self) -> tuple[int, ...]:
        b, kv, t, d = self.source.shape
        return (b, kv, self.repeats, t, d)


@dataclass(frozen=True)
class UserInput:
    """A user input not yet given an IR value: its first consumer decides the host layout."""

    index: int
    name: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class HostIds:
    """Integer arithmetic on a program input's ids, done by the host before the run (host
    preprocessing, as a serving stack does it): ``steps`` (``HOST_STEPS``: comparisons with
    a number, ``argmax`` over the last axis, ``cumsum``, sums and products with a number or
    with other arithmetic on the same ids, a constant table read at the ids) applied to
    input ``index`` in order: CLIP's end-of-text position, RoBERTa's position ids."""

    index: int
    name: str
    source_shape: tuple[int, ...]  # the ids viewed as the arithmetic reads them
    shape: tuple[int, ...] = ()  # the result's
    steps: tuple[tuple[str, Any], ...] = ()

    def evaluate(self, ids: np.ndarray) -> np.ndarray:
        values = np.asarray(ids, dtype=np.float64).reshape(self.source_shape)
        for step, argument in self.steps:
            values = HOST_STEPS[step](values, argument, ids)
        return values

    def then(self, step: str, argument: Any, shape: tuple[int, ...] | None = None) -> HostIds:
        return dataclasses.replace(self, steps=(*self.steps, (step, argument)),
                                   shape=self.shape if shape is None else shape)


def _take(values: np.ndarray, table_axis: tuple[np.ndarray, int]) -> np.ndarray:
    table, axis = table_axis
    table = np.broadcast_to(table, (*values.shape[:axis], table.shape[axis],
                                    *values.shape[axis + 1:]))
    return np.take_along_axis(table, values.astype(np.int64), axis=axis).astype(np.float64)


HOST_STEPS: dict[str, Any] = {
    "eq": lambda v, a, ids: (v == a).astype(np.float64),
    "ne": lambda v, a, ids: (v != a).astype(np.float64),
    "argmax": lambda v, a, ids: np.argmax(v, axis=-1).astype(np.float64),
    "cumsum": lambda v, a, ids: np.cumsum(v, axis=a),
    "add": lambda v, a, ids: v + a,
    "mul": lambda v, a, ids: v * a,
    "plus": lambda v, a, ids: v + a.evaluate(ids),
    "minus": lambda v, a, ids: v - a.evaluate(ids),
    "remainder": lambda v, a, ids: np.remainder(v, a),
    "fmod": lambda v, a, ids: np.fmod(v, a),
    "flip": lambda v, a, ids: np.flip(v, axis=a),
    "times": lambda v, a, ids: v * a.evaluate(ids),
    "take": lambda v, a, ids: _take(v, a),
}


def resolve_shape(shape: list[int] | tuple[int, ...], total: int) -> tuple[int, ...]:
    """``shape`` with a ``-1`` filled in so that it has ``total`` elements."""
    dims = [int(d) for d in shape]
    if dims.count(-1) > 1:
        raise CompileError(f"view shape {dims} has more than one -1")
    if -1 in dims:
        known = prod(d for d in dims if d != -1)
        dims[dims.index(-1)] = total // known if known else 0
    if prod(dims) != total:
        raise CompileError(f"view shape {dims} does not hold {total} elements")
    return tuple(dims)


def _heads_shapes(dims: tuple[int, ...]) -> dict[str, list[tuple[int, ...]]]:
    b, t, h, d = dims
    return {
        "heads": [(b, t, h, d), (b * t, h, d)],
        "heads_major": [(b, h, t, d), (b * h, t, d)],
        "keys_t": [(b, h, d, t), (b * h, d, t)],
    }


def reshape(act: Act, shape: tuple[int, ...]) -> Act | None:
    """``act`` viewed as ``shape`` (already resolved), or ``None`` when no form holds it."""
    if shape == act.shape:
        return act
    if act.form == "rows":
        cols = act.shape[-1]
        if cols == 1 and shape == act.shape[:-1] and act.attention is None:
            return act.with_(shape=shape, form="column", linear=None)
        if shape[-1] == cols and act.attention is None:
            return act.with_(shape=shape, linear=None)
        rows = prod(act.shape[:-1])
        if len(shape) == 4 and shape[2] * shape[3] == cols and shape[0] * shape[1] == rows:
            return act.with_(shape=shape, form="heads", dims=shape, linear=None)
        if len(shape) == 3 and shape[1] * shape[2] == cols and shape[0] == rows and (
                act.attention is None):
            batch, tokens = _batch_tokens(act)
            return act.with_(shape=shape, form="heads", dims=(batch, tokens, *shape[1:]),
                             linear=None)
        if act.attention is not None:
            b, h, t = act.attention
            if shape in ((b, h, t, t), (b * h, t, t)):
                return act.with_(shape=shape)
        return None
    if act.form in ("heads", "heads_major", "keys_t"):
        if act.form == "heads":
            b, t, h, d = act.dims
            if shape[-1] == h * d and prod(shape[:-1]) == b * t:
                return act.with_(shape=shape, form="rows", dims=(), linear=None)
        if shape in _heads_shapes(act.dims)[act.form]:
            return act.with_(shape=shape)
        return None
    if act.form == "channels":
        b, dim, n = act.dims
        if len(shape) >= 3 and shape[0] == b and shape[1] == dim and prod(shape[2:]) == n:
            return act.with_(shape=shape)
        return None
    if act.form == "replicated":
        if shape[-1] == act.shape[-1] and prod(shape[:-1]) == prod(act.shape[:-1]):
            return act.with_(shape=shape)
        return None
    if act.form == "column":
        return act.with_(shape=shape, form="rows") if shape == (*act.shape, 1) else None
    if act.form in ("tmajor", "theads"):
        return _reshape_token_major(act, shape)
    if act.form == "rep_heads":  # one query's attention output, (B*H, 1, d) in some grouping
        b, t, h, d = act.dims
        if shape[-1] == h * d and prod(shape[:-1]) == b:
            return act.with_(shape=shape, form="replicated", dims=(b, t))
        if shape[-1] == d and prod(shape[:-1]) == b * h:
            return act.with_(shape=shape)
        return None
    return None


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(s for s in shape if s != 1)


def _reshape_token_major(act: Act, shape: tuple[int, ...]) -> Act | None:
    """Views of ``tmajor`` ``[T, B, D]``: size-1 axes in or out, or the head split
    ``[T, B*H, d]`` (``theads``); views of ``theads`` back to ``[T, B, D]``."""
    b, t = act.dims[:2]
    dim = act.shape[-1] if act.form == "tmajor" else act.dims[2] * act.dims[3]
    if _squeezed(shape) == _squeezed((t, b, dim)) and shape[-1] == dim:
        return act.with_(shape=shape, form="tmajor", dims=(b, t), linear=None)
    if len(shape) == 3 and shape[0] == t and shape[1] % b == 0 and shape[1] * shape[2] == b * dim:
        heads = shape[1] // b
        return act.with_(shape=shape, form="theads", dims=(b, t, heads, shape[2]), linear=None)
    return None


def _batch_tokens(act: Act) -> tuple[int, int]:
    """(images, tokens) of a rows value ``[B, T, D]``; ``[T, 1, D]`` is read as one image's
    tokens first (``nn.MultiheadAttention``'s layout), anything else as one image.  A wrong
    reading cannot pass: the conversion check compares the whole graph with torch."""
    rows = prod(act.shape[:-1])
    if len(act.shape) == 3 and not (act.shape[1] == 1 and act.shape[0] > 1):
        return act.shape[0], act.shape[1]
    return 1, rows


def permute(act: Act, perm: tuple[int, ...]) -> Act | None:
    """``act.permute(perm)`` when it only relabels a form, else ``None``."""
    n = len(act.shape)
    perm = tuple(p % n for p in perm)
    if perm == tuple(range(n)):
        return act
    new_shape = tuple(act.shape[p] for p in perm)
    if n == 3 and perm == (1, 0, 2):  # batch-first <-> token-first (MultiheadAttention)
        if act.form == "rows" and act.attention is None and act.shape[0] > 1 and (
                act.shape[1] > 1):
            return act.with_(shape=new_shape, form="tmajor", dims=act.shape[:2], linear=None)
        if act.form == "tmajor" and act.shape == (act.dims[1], act.dims[0], act.shape[-1]):
            return act.with_(shape=new_shape, form="rows", dims=(), linear=None)
        if act.form == "theads":
            b, t, h, d = act.dims
            return act.with_(shape=new_shape, form="heads_major", dims=(b, t, h, d))
    if n == 4 and perm == (1, 0, 2, 3):  # [B, T, H, d] <-> [T, B, H, d] (MLCD's attention)
        if act.form == "heads":
            return act.with_(shape=new_shape, form="theads")
        if act.form == "theads" and act.shape == (act.dims[1], act.dims[0], *act.dims[2:]):
            return act.with_(shape=new_shape, form="heads")
    if act.form == "heads" and n == 3 and perm == (1, 0, 2) and act.dims[0] == 1:
        return act.with_(shape=new_shape, form="heads_major")  # one image: (T,H,d) -> (H,T,d)
    if act.form in ("heads", "heads_major", "keys_t") and n in (3, 4):
        if n == 4:
            moves = {
                ("heads", (0, 2, 1, 3)): "heads_major",
                ("heads", (0, 2, 3, 1)): "keys_t",
                ("heads_major", (0, 2, 1, 3)): "heads",
                ("heads_major", (0, 1, 3, 2)): "keys_t",
                ("keys_t", (0, 1, 3, 2)): "heads_major",
                ("keys_t", (0, 3, 1, 2)): "heads",
            }
        else:
            moves = {("heads_major", (0, 2, 1)): "keys_t", ("keys_t", (0, 2, 1)): "heads_major"}
        form = moves.get((act.form, perm))
        if form is None:
            return None
        if new_shape not in _heads_shapes(act.dims)[form]:
            return None
        return act.with_(shape=new_shape, form=form)
    if act.form == "channels":
        b, dim, n_tokens = act.dims
        if n == 3 and perm == (0, 2, 1) or n == 4 and perm == (0, 2, 3, 1):
            return act.with_(shape=new_shape, form="rows", dims=())
        return None
    # a permutation that only moves size-1 dimensions keeps row-major order
    if act.form in ("rows", "replicated", "rep_heads", "tmajor"):
        moved = [p for p in perm if act.shape[p] != 1]
        if moved == sorted(moved) and new_shape[-1] == act.shape[-1]:
            return act.with_(shape=new_shape)
    return None


def transpose_perm(ndim: int, a: int, b: int) -> tuple[int, ...]:
    perm = list(range(ndim))
    a, b = a % ndim, b % ndim
    perm[a], perm[b] = perm[b], perm[a]
    return tuple(perm)


def open_gap(tokens: np.ndarray, gap: tuple[int, int]) -> np.ndarray:
    """``[B, T, D]`` with ``gap[1]`` zero rows inserted after token ``gap[0]``."""
    k, count = gap
    if not count:
        return tokens
    zeros = np.zeros((tokens.shape[0], count, tokens.shape[2]), tokens.dtype)
    return np.concatenate([tokens[:, :k], zeros, tokens[:, k:]], axis=1)


def broadcast_rows(constant: np.ndarray, act: Act) -> np.ndarray:
    """A constant broadcast to ``act``'s logical shape as IR rows ``[rows, cols]``."""
    full = np.broadcast_to(np.asarray(constant, dtype=np.float64), act.shape)
    if act.form == "replicated":
        b, t = act.dims
        per_image = full.reshape(b, 1, -1)
        return np.broadcast_to(per_image, (b, t, per_image.shape[-1])).reshape(b * t, -1)
    if act.form != "rows":
        raise CompileError(f"a constant added to a {act.form}-form value")
    if act.gap[1]:  # rows reserved for tokens a later concatenation inserts
        return open_gap(full.reshape(act.shape), act.gap).reshape(-1, act.shape[-1])
    return full.reshape(-1, act.shape[-1])
