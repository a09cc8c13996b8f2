"""The graph interpreter: the host reference at device precision, or ideal float64.

Written independently of the device kernels.  ``evaluate`` computes every operation in
float32 from the exactly dequantised inputs and rounds to its output precision, as the graph
says.  A matmul (and a head matmul) follows the GEMM mode the compiler chose for it
(``gemm_modes``): in the native FP8 mode the hardware keeps FP16 partials, so each 32-deep
pass of each depth block is added to an FP16 partial and rounded there, and the blocks'
partials are summed in float32; in the F16 mode (and by default) partials are float32.  A
depth-split GEMM's block partials are made tile by tile and added in the order the device's
reduce adds them (``depth_owners``).  What is left to the device is how BLAS rounds a
float32 product, which the tolerance policy (``docs/tolerance.md``) accounts for.
``evaluate_float64`` runs the same graph in float64 with no intermediate rounding (the ideal
answer, for reports).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Collection, Generator, Iterator, Mapping
from typing import Any, Protocol

import numpy as np
from scipy import special

from ipu_stack.ir.graph import Graph, Operation, head_geometry, table_maps, table_row_index
from ipu_stack.ir.one_pass import by_groups, one_pass_layer_norm, one_pass_rms_norm, runs_normce
from ipu_stack.ir.precision import F32, Precision, fit_scale_exponent
from ipu_stack.ir.rounding import add_in_owner_order, f32_matmul, fp16_blocked_matmul
from ipu_stack.ir.types import TensorType
from ipu_stack.ir.values import CompactValues, StoredTensor, as_precision, stored_round_trip


class ValueSink(Protocol):
    """Where an evaluation hands each value as it is made (``CompactValues`` keeps them)."""

    def put(self, name: str, values: np.ndarray, precision: Precision) -> None: ...


@functools.cache
def _half_tanh() -> np.ndarray:
    """tanh of every F16 value (by its 16-bit code), rounded to F16: the scalar libm's, so
    that the same half always gives the same half."""
    values = np.arange(65536, dtype=np.uint16).view(np.float16).tolist()
    return np.array([math.tanh(v) for v in values], dtype=np.float64).astype(np.float16)


def _half_steps_gelu(x: np.ndarray) -> np.ndarray:
    """The tanh GELU at the device's precision: the vendor's F16 loop, which rounds every
    instruction's exact result to F16 (saturating) with the model's constants rounded to
    F16: ``0.5 (1 + tanh(a x + a b x^3)) x`` evaluated as x*x, x*(x*x), the mix of the two
    terms, tanh (an F16 function of an F16), + 1, * 0.5, * x."""
    limit = float(np.finfo(np.float16).max)

    def half(v: np.ndarray) -> np.ndarray:
        return np.clip(v, -limit, limit).astype(np.float16)

    a = float(np.float16(np.sqrt(2.0 / np.pi)))
    ab = float(np.float16(np.sqrt(2.0 / np.pi) * 0.044715))
    x = half(np.asarray(x, dtype=np.float64)).astype(np.float64)
    square = half(x * x).astype(np.float64)
    cube = half(x * square).astype(np.float64)
    inner = half(a * x + ab * cube)
    tanh = _half_tanh()[inner.view(np.uint16)].astype(np.float64)
    scale = half(half(tanh + 1.0).astype(np.float64) * 0.5).astype(np.float64)
    return half(scale * x).astype(np.float32)


def _gelu(x: np.ndarray, approximate: str, dtype: type) -> np.ndarray:
    if approximate == "tanh" and dtype is np.float32:
        return _half_steps_gelu(x)
    x = x.astype(dtype, copy=False)
    if approximate == "tanh":
        c = dtype(np.sqrt(2.0 / np.pi))
        return dtype(0.5) * x * (dtype(1) + np.tanh(c * (x + dtype(0.044715) * (x * x * x))))
    erf = special.erf(x.astype(np.float64) / np.sqrt(2.0))
    return (0.5 * x * (1.0 + erf)).astype(dtype, copy=False)


def _activation(x: np.ndarray, function: str, dtype: type) -> np.ndarray:
    """The ``activation`` functions at ``dtype``, written from their definitions (the device
    kernels' forms are in ``kernels/elementwise.py``; the two are tested against each other
    and against torch)."""
    x = x.astype(dtype, copy=False)
    if function == "tanh":
        return np.tanh(x)
    beta = {"sigmoid": 1.0, "silu": 1.0, "quick_gelu": 1.702}[function]
    # sigma(z) = (1 + tanh(z / 2)) / 2: no overflow for large |z| (the kernels use expit)
    sig = dtype(0.5) * (dtype(1) + np.tanh(dtype(0.5 * beta) * x))
    return sig if function == "sigmoid" else x * sig


def depth_owners(rows: int, split: dict) -> np.ndarray | None:
    """Each row's depth tile in a depth-split GEMM's reduce (``None``: no split).

    ``split`` is the plan's record: ``depth_splits`` and its row chunks ``[first row, rows,
    row block]``.  The reduce gives the rows of sub-slice ``s`` of a row block (``row block
    / depth splits`` rows each) to depth tile ``s``, which adds its own block's partial
    first, then the others in depth order (``lowering._gemm_reduce_scatter``); float32 sums
    depend on that order, so the reference adds in it too."""
    splits = int(split.get("depth_splits", 1))
    chunks = split.get("row_chunks", [])
    # a record made for other rows than these (it happens) keeps the plain depth order
    if splits <= 1 or sum(int(count) for _, count, _ in chunks) != rows:
        return None
    owners = np.zeros(rows, dtype=np.int64)
    for first, count, row_block in chunks:
        sub = max(1, int(row_block) // splits)
        owners[first : first + count] = (np.arange(count) % int(row_block)) // sub
    return owners


def split_depth_matmul(a: np.ndarray, b: np.ndarray, split: dict | None) -> np.ndarray:
    """``a @ b`` with float32 partials, summed as a depth-split F16-mode GEMM sums them:
    each depth block's float32 products (``f32_matmul``: the same bits whatever tile's
    block holds a row), added in the reduce's order (:func:`depth_owners`); without a
    split, one product at full depth."""
    owners = None if split is None or a.shape[0] == 0 else depth_owners(a.shape[0], split)
    if owners is None:
        return f32_matmul(a, b)
    assert split is not None
    depth, block = a.shape[1], int(split["depth_block"])
    parts = [f32_matmul(a[:, k:k + block], b[k:k + block]) for k in range(0, depth, block)]
    return add_in_owner_order(parts, owners)


def _product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A float32 product as the device's F16-mode GEMM sums it (``f32_matmul``); a float64
    one as it is."""
    return f32_matmul(a, b) if a.dtype == np.float32 else np.matmul(a, b)


def _head_matmul(op: Operation, a: np.ndarray, b: np.ndarray,
                 split: dict | None = None) -> np.ndarray:
    """Every image's and head's product (``split``, the plan's record: in the FP8 mode with
    FP16 partials, :func:`fp16_partial_matmul`; in the F16 mode summed as the device's depth
    tiles sum it, :func:`split_depth_matmul`; each image and head is a GEMM of its own
    there).  Query head ``h`` reads key/value head ``geo.kv_head(h)``."""
    geo = head_geometry(op.attrs, TensorType(b.shape, F32))
    batch, tokens, span, heads, head_dim = (geo.batch, geo.tokens, geo.kv_tokens, geo.heads,
                                            geo.head_dim)
    # contiguous per-head operands: a batched matmul over strided views is several times slower
    bh = np.ascontiguousarray(b.reshape(batch, span, geo.kv_heads, head_dim).transpose(
        0, 2, 1, 3))
    if geo.kv_heads != heads:
        bh = np.repeat(bh, heads // geo.kv_heads, axis=1)
    fp8 = split is not None and split.get("mode") == "fp8"
    if split is not None and not fp8 and depth_owners(tokens, split) is None:
        split = None  # no depth split: every image and head in one batched product

    def product(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        assert split is not None
        if fp8:
            return fp16_partial_matmul(x, y, int(split["depth_block"]), split)
        return split_depth_matmul(x, y, split)

    if op.attrs["mode"] == "qk":
        ah = np.ascontiguousarray(a.reshape(batch, tokens, heads, head_dim).transpose(0, 2, 1, 3))
        if split is None:
            return _product(ah, bh.transpose(0, 1, 3, 2)).reshape(batch * heads * tokens, span)
        return np.stack([product(ah[i, h], bh[i, h].T)
                         for i in range(batch) for h in range(heads)]).reshape(
                             batch * heads * tokens, span)
    p = a.reshape(batch, heads, tokens, span)
    if split is None:
        o = _product(p, bh)  # [B, H, T, d]
    else:
        o = np.stack([np.stack([product(p[i, h], bh[i, h])
                                for h in range(heads)]) for i in range(batch)])
    return o.transpose(0, 2, 1, 3).reshape(batch * tokens, heads * head_dim)


def write_rows(state: np.ndarray, rows: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """``state`` with row ``slots[i]`` replaced by ``rows[i]`` (a copy: the reference keeps
    every value).  A slot outside the state is refused: the device's vertex would skip it."""
    index = np.asarray(slots).reshape(-1).astype(np.int64)
    out = np.array(state, copy=True).reshape(-1, np.shape(state)[-1])
    bad = (index < 0) | (index >= out.shape[0])
    if bad.any():
        raise ValueError(f"cache slot {int(index[bad][0])} is outside the state's "
                         f"{out.shape[0]} rows")
    out[index] = np.asarray(rows).reshape(len(index), -1)
    return out


def _rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, head_dim: int,
          halves: bool = False, rotary: int | None = None) -> np.ndarray:
    """Rotate channel pairs of every head: ``(2i, 2i+1)``, or ``(i, i + d/2)`` (halves);
    with ``rotary`` below the head's width, only its first ``rotary`` channels (Phi-2's,
    StableLM's partial RoPE), the rest passed through."""
    rows, cols = x.shape
    if rotary is not None and rotary < head_dim:
        heads = x.reshape(rows, cols // head_dim, head_dim).copy()
        turned = heads[..., :rotary].reshape(rows, -1)
        heads[..., :rotary] = _rope(turned, cos, sin, rotary, halves).reshape(
            rows, cols // head_dim, rotary)
        return heads.reshape(rows, cols)
    heads = x.reshape(rows, cols // head_dim, head_dim)
    c, s = cos[:, None, :], sin[:, None, :]
    if halves:
        first, second = heads[..., : head_dim // 2], heads[..., head_dim // 2 :]
        return np.concatenate([first * c - second * s, first * s + second * c],
                              axis=-1).reshape(rows, cols)
    pairs = heads.reshape(rows, cols // head_dim, head_dim // 2, 2)
    even, odd = pairs[..., 0], pairs[..., 1]
    return np.stack([even * c - odd * s, even * s + odd * c], axis=-1).reshape(rows, cols)


BLOCK_BYTES = 1 << 19  # a block of rows of a softmax's temporaries: kept within L2


def periodic(table: np.ndarray, rows: int, block: int = 1, repeat: int = 1) -> np.ndarray:
    """A biased softmax's table as many rows as its scores (:func:`table_row_index`; a view
    where it already is)."""
    table = table.reshape(-1, table.shape[-1])
    return table if len(table) == rows else table[table_row_index(rows, len(table), block,
                                                                  repeat)]


def additive_table(op: Operation, ins: list[np.ndarray], dtype: type) -> np.ndarray:
    """What a ``biased_softmax`` adds to its scaled scores: its one table, or its two
    tables' sum (the bias and the mask, summed before they are added, as the kernel
    does)."""
    rows = len(ins[0])
    tables = [periodic(table, rows, *where) for table, where in
              zip(ins[1:], table_maps(op.attrs, len(ins) - 1), strict=True)]
    if len(tables) == 1:
        return tables[0]
    return tables[0].astype(dtype) + tables[1].astype(dtype)


def _softmax(x: np.ndarray, bias: np.ndarray | None, scale: Any, dtype: type) -> np.ndarray:
    """Softmax over the last axis of ``scale * x (+ bias)``, block of rows by block of rows
    into one result.  Each row goes through the same operations as over the whole matrix
    (elementwise ones, and that row's own max and sum), so the values are the same; but a
    tower's attention scores are 34 MB (68 MB in float64) a temporary, above the heap's
    reuse threshold, and five fresh temporaries of that size cost more in page faults than
    the arithmetic does."""
    if x.ndim != 2 or (bias is not None and bias.shape != x.shape):
        return _softmax_rows(x, bias, scale, dtype)
    out = np.empty(x.shape, dtype=dtype)
    step = max(1, BLOCK_BYTES // max(1, x.shape[1] * np.dtype(dtype).itemsize))
    for lo in range(0, x.shape[0], step):
        rows = slice(lo, lo + step)
        out[rows] = _softmax_rows(x[rows], None if bias is None else bias[rows], scale, dtype)
    return out


def _softmax_rows(x: np.ndarray, bias: np.ndarray | None, scale: Any, dtype: type
                  ) -> np.ndarray:
    x = x.astype(dtype, copy=False) * scale
    if bias is not None:
        x = x + bias.astype(dtype, copy=False)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


FP8_PASS_DEPTH = 32  # FP8 channels one AMP pass adds to the FP16 partial


def fp16_partial_matmul(a: np.ndarray, b: np.ndarray, depth_block: int,
                        split: dict | None = None) -> np.ndarray:
    """``a @ b`` as the FP8 AMP computes it: per depth block, 32-deep passes added to an FP16
    partial (rounded after each pass); the blocks' FP16 partials summed in float32, in the
    order the device's reduce adds them where ``split`` (the plan's record) says it."""
    owners = None if split is None else depth_owners(np.shape(a)[0], split)
    return fp16_blocked_matmul(np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32),
                               depth_block, FP8_PASS_DEPTH, owners)


def lookup_rows(ids: np.ndarray, table: np.ndarray) -> np.ndarray:
    """``table[ids]`` for ids ``[..., 1]`` held as whole numbers: one table row each, an exact
    copy (the device's MultiSlice copies the row's bytes).  An id outside the table is
    refused: the device's vertex would skip it and leave its row unwritten."""
    index = np.asarray(ids).reshape(-1).astype(np.int64)
    table = np.asarray(table).reshape(-1, np.shape(table)[-1])
    vocab = table.shape[0]
    bad = (index < 0) | (index >= vocab)
    if bad.any():
        raise ValueError(f"id {int(index[bad][0])} is outside the table's {vocab} rows")
    return np.asarray(table)[index].reshape(*np.shape(ids)[:-1], table.shape[1])


def fill_rows(state: np.ndarray, rows: np.ndarray, positions: int) -> np.ndarray:
    """``state`` (``[batch x positions, width]``) with each sequence's first rows replaced by
    its rows of ``rows`` (``[batch x n, width]``); a copy."""
    out = np.array(state, copy=True).reshape(-1, np.shape(state)[-1])
    batch = out.shape[0] // positions
    given = np.asarray(rows).reshape(batch, -1, out.shape[1])
    out.reshape(batch, positions, -1)[:, :given.shape[1]] = given
    return out


def swapped_split(split: dict, cols: int) -> dict:
    """A swapped plan's record as the plain record of ``out^T = W^T x^T``: its depth tiles
    finish column slices (``planning.gemm``), so the transposed product's rows are cut
    as a plain plan's rows are, ``col_block`` a block."""
    return {**split, "swapped": False, "row_chunks": [[0, cols, int(split["col_block"])]]}


def _apply(op: Operation, ins: list[np.ndarray], dtype: type,
           mode: dict | None = None, normce: bool = False) -> np.ndarray:
    if op.kind == "matmul":
        a = ins[0].reshape(-1, ins[0].shape[-1]).astype(dtype, copy=False)
        if mode is not None and mode.get("swapped") and dtype is np.float32:
            b = ins[1].reshape(-1, ins[1].shape[-1])
            product = _apply(op, [b.T, a.T], dtype, swapped_split(mode, b.shape[1]))
            return np.ascontiguousarray(product.T)
        if mode is not None and mode.get("mode") == "fp8" and dtype is np.float32:
            return fp16_partial_matmul(a, ins[1], int(mode["depth_block"]), mode)
        if mode is not None and dtype is np.float32:
            return split_depth_matmul(a, ins[1].astype(dtype, copy=False), mode)
        return a @ ins[1].astype(dtype, copy=False)
    if op.kind == "head_matmul":
        return _head_matmul(op, ins[0].astype(dtype, copy=False), ins[1].astype(dtype, copy=False),
                            mode if dtype is np.float32 else None)
    if op.kind in ("bias_add", "add"):
        return ins[0].astype(dtype, copy=False) + ins[1].astype(dtype, copy=False)
    if op.kind == "gelu":
        return _gelu(ins[0], op.attrs.get("approximate", "tanh"), dtype)
    if op.kind == "activation":
        return _activation(ins[0], op.attrs["function"], dtype)
    if op.kind == "mul":
        return ins[0].astype(dtype, copy=False) * ins[1].astype(dtype, copy=False)
    if op.kind == "swiglu":
        return _activation(ins[0], "silu", dtype) * ins[1].astype(dtype, copy=False)
    if op.kind == "scale":
        return ins[0].astype(dtype, copy=False) * dtype(op.attrs["factor"])
    if op.kind == "cast":
        return ins[0].astype(dtype, copy=False)
    if op.kind in ("softmax", "biased_softmax"):
        # an additive mask or bias (-inf masks a key)
        return _softmax(ins[0], additive_table(op, ins, dtype) if op.kind == "biased_softmax"
                        else None,
                        dtype(op.attrs.get("scale", 1.0)), dtype)
    if op.kind == "layer_norm" and normce and dtype is np.float32:
        return one_pass_layer_norm(ins[0], ins[1], ins[2], float(op.attrs["eps"]))
    if op.kind == "layer_norm":
        x = ins[0].astype(dtype, copy=False)
        mean = x.mean(axis=-1, keepdims=True)
        var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
        return (x - mean) / np.sqrt(var + dtype(op.attrs["eps"])) * ins[1] + ins[2]
    if op.kind == "rms_norm":
        group = int(op.attrs.get("group", ins[0].shape[-1]))
        norm = one_pass_rms_norm if normce and dtype is np.float32 else _rms_norm
        return by_groups(norm, ins[0].astype(dtype, copy=False), ins[1], group,
                         float(op.attrs["eps"]))
    if op.kind == "rope":
        x, cos, sin = (v.astype(dtype, copy=False) for v in ins)
        return _rope(x, cos, sin, int(op.attrs["head_dim"]), op.attrs.get("pairs") == "halves",
                     op.attrs.get("rotary"))
    if op.kind == "embedding":
        return lookup_rows(ins[0], ins[1]).astype(dtype, copy=False)
    if op.kind == "gather_rows":
        x = ins[0].reshape(-1, ins[0].shape[-1])
        group = int(op.attrs.get("group", 1))
        return x[op.attrs["index"].rows].reshape(-1, group * x.shape[1]).astype(dtype,
                                                                                copy=False)
    if op.kind == "cache_write":
        return write_rows(ins[0], ins[1], ins[2]).astype(dtype, copy=False)
    if op.kind == "cache_fill":
        return fill_rows(ins[0], ins[1], int(op.attrs["positions"])).astype(dtype, copy=False)
    if op.kind == "argmax":  # the first largest value's column, as the device keeps it
        return np.argmax(ins[0], axis=-1)[..., None].astype(dtype)
    raise ValueError(f"reference has no rule for {op.kind}")


def _rms_norm(x: np.ndarray, gamma: np.ndarray, eps: float) -> np.ndarray:
    """An RMS norm at ``x``'s precision in the device's form: the row's inverse root, then
    two products (``kernels/rowwise.py``)."""
    mean_square = (x * x).mean(axis=-1, keepdims=True)
    inverse = (1.0 / np.sqrt(mean_square + x.dtype.type(eps))).astype(x.dtype)
    return x * inverse * gamma


def evaluate_operations(graph: Graph, operations: list[int], known: dict[int, np.ndarray],
                        gemm_modes: dict[str, dict] | None = None) -> dict[int, np.ndarray]:
    """Run ``operations`` (ids, in order) at device precision from the ``known`` values (by
    value id, float32 ``[rows, cols]``) and return every value they produce.  The verdict
    uses it to judge one stage of a run on the device's own inputs to that stage (for
    row-local operations, on a subset of the rows: results keep the rows they were given)."""
    modes = gemm_modes or {}
    values = dict(known)
    produced: dict[int, np.ndarray] = {}
    for op_id in operations:
        op = graph.operations[op_id]
        out = graph.value(op.outputs[0])
        result = _apply(op, [values[i] for i in op.inputs], np.float32, modes.get(str(op.id)),
                        runs_normce(graph, op))
        stored = out.type.precision.round_trip(result.reshape(-1, out.type.cols))
        values[out.id] = produced[out.id] = stored
    return produced


def _device_precision(data: Any, precision: Precision) -> np.ndarray:
    """A value as the device holds it (float32); a tensor already stored in ``precision``
    is only decoded (:func:`~ipu_stack.ir.values.as_precision`)."""
    return as_precision(data, precision)


def _reshaped(held: StoredTensor | np.ndarray, shape: tuple[int, ...]
              ) -> StoredTensor | np.ndarray:
    if isinstance(held, StoredTensor):
        return StoredTensor(held.precision, held.stored.reshape(shape))
    return held.reshape(shape)


def _run(graph: Graph, tensors: dict[str, np.ndarray], dtype: type,
         store: Callable[[np.ndarray, object], np.ndarray],
         gemm_modes: dict[str, dict] | None = None,
         keep_weights: bool = True, keep: Collection[str] | None = None
         ) -> dict[str, np.ndarray]:
    """:func:`_run_steps` run to the end."""
    return drain(_run_steps(graph, tensors, dtype, store, gemm_modes, keep_weights, keep))


def drain(steps: Generator[None, None, Any]) -> Any:
    """Run a step generator to its end and return its value."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def _run_steps(graph: Graph, tensors: dict[str, np.ndarray], dtype: type,
               store: Callable[[np.ndarray, object], np.ndarray],
               gemm_modes: dict[str, dict] | None = None,
               keep_weights: bool = True, keep: Collection[str] | None = None,
               into: CompactValues | ValueSink | None = None
               ) -> Generator[None, None, Mapping[str, np.ndarray]]:
    """Every value of ``graph``; without ``keep_weights`` a weight is converted when an
    operation reads it and neither kept nor returned (a 27-layer tower's weights in float64
    would be 3 GB held for nothing); with ``keep``, only those values are returned and every
    other one is dropped after its last reader.  With ``into``, every value is stored there
    in its stored precision (:class:`~ipu_stack.ir.values.CompactValues`, float32 when read)
    as soon as it is made (a caller may read each at once), that is what is returned, and
    the float32 working copies are dropped after their last reader (any other
    :class:`ValueSink` is handed each value instead, to keep what it needs of it)."""
    modes = gemm_modes or {}
    values: dict[int, np.ndarray] = {}
    last_use = {i: op.id for op in graph.operations for i in op.inputs}
    kept = None if keep is None else {v.id for v in graph.values if v.name in keep}
    results = into
    if results is not None:
        kept = set()

    def load(value_id: int) -> np.ndarray:
        value = graph.value(value_id)
        data = store(tensors[value.name], value.type.precision)
        return data.reshape(value.type.rows, -1) if len(value.type.shape) > 1 else data

    for value in graph.values:
        if value.role == "input" or (value.role == "weight" and keep_weights):
            values[value.id] = load(value.id)
            if results is not None:
                results.put(value.name, values[value.id].reshape(value.type.shape),
                            value.type.precision)
    for op in graph.operations:
        out = graph.value(op.outputs[0])
        ins = [values[i] if i in values else load(i) for i in op.inputs]
        result = _apply(op, ins, dtype, modes.get(str(op.id)), runs_normce(graph, op))
        if isinstance(results, CompactValues) and store is _device_precision:
            # rounded and encoded once: the codes kept are those the rounding made
            values[out.id], held = stored_round_trip(result.reshape(out.type.rows, -1),
                                                     out.type.precision)
            results.hold(out.name, _reshaped(held, out.type.shape))
        else:
            values[out.id] = store(result.reshape(out.type.rows, -1), out.type.precision)
            if results is not None:
                results.put(out.name, values[out.id].reshape(out.type.shape),
                            out.type.precision)
        yield  # one operation done: a caller may do other work between operations
        if kept is not None:
            for i in set(op.inputs):
                if last_use[i] == op.id and i not in kept:
                    values.pop(i, None)
    if results is not None:
        return results
    return {
        graph.value(i).name: v.reshape(graph.value(i).type.shape) for i, v in values.items()
        if kept is None or i in kept
    }


class HostValues(Mapping):
    """Inputs and weights as the device holds them (float32, matrices ``[rows, cols]``),
    rounded when asked for and not kept: a tower's weights would be gigabytes twice over."""

    def __init__(self, graph: Graph, tensors: dict[str, np.ndarray]) -> None:
        self.graph, self.tensors = graph, tensors
        self.ids = [v.id for v in graph.values if v.role in ("input", "weight")]
        self._members = set(self.ids)

    def __getitem__(self, value_id: int) -> np.ndarray:
        value = self.graph.value(value_id)
        if value.role not in ("input", "weight"):
            raise KeyError(value_id)
        data = as_precision(self.tensors[value.name], value.type.precision)
        return data.reshape(value.type.rows, -1) if len(value.type.shape) > 1 else data

    def __contains__(self, value_id: object) -> bool:
        return value_id in self._members  # without rounding the value (Mapping's default)

    def __iter__(self) -> Iterator[int]:
        return iter(self.ids)

    def __len__(self) -> int:
        return len(self.ids)


def evaluate(graph: Graph, tensors: dict[str, np.ndarray],
             gemm_modes: dict[str, dict] | None = None,
             keep_weights: bool = True, keep: Collection[str] | None = None
             ) -> dict[str, np.ndarray]:
    """All values of ``graph`` at device precision (float32 arrays), keyed by value name
    (``keep``: only those named, each dropped after its last reader otherwise).

    ``gemm_modes`` maps a matmul's operation id (as a string) to the mode the package runs it
    in: ``{"mode": "fp8" | "f16", "depth_block": ...}`` (the package manifest's record)."""
    return _run(graph, tensors, np.float32, _device_precision, gemm_modes,
                keep_weights=keep_weights, keep=keep)


def evaluate_steps(graph: Graph, tensors: dict[str, np.ndarray],
                   gemm_modes: dict[str, dict] | None, into: CompactValues
                   ) -> Generator[None, None, Mapping[str, np.ndarray]]:
    """:func:`evaluate` without the weights, one operation per ``next``, each value stored
    into ``into`` as soon as it is made."""
    return _run_steps(graph, tensors, np.float32, _device_precision, gemm_modes,
                      keep_weights=False, into=into)


def evaluate_unrounded(graph: Graph, tensors: dict[str, np.ndarray],
                       dtype: type = np.float32) -> dict[str, np.ndarray]:
    """The graph with no intermediate rounding at ``dtype``: what fitting FP8 scale
    exponents needs (a power of two per tensor), at half the float64 model's cost; every
    input and computed value (:func:`fit_scales` keeps only the exponents)."""
    return _run(graph, tensors, dtype, lambda data, precision: np.asarray(data, dtype=dtype),
                keep_weights=False)


class ScaleFitter:
    """FP8 exponents fitted per role (``role(name)``; the largest over a role's values),
    with 2x headroom, on the values named in ``names`` as an evaluation hands them over
    (:func:`watch_unrounded`): only the exponents are kept, never the values."""

    def __init__(self, names: Collection[str], role: Callable[[str], str]) -> None:
        self.names = set(names)
        self.role = role
        self.scales: dict[str, int] = {}

    def put(self, name: str, values: np.ndarray, precision: Precision) -> None:
        if name in self.names:
            fitted = fit_scale_exponent(values, headroom=2.0)
            key = self.role(name)
            self.scales[key] = max(self.scales.get(key, fitted), fitted)


def fit_scales(graph: Graph, tensors: Mapping[str, Any], names: Collection[str],
               role: Callable[[str], str]) -> dict[str, int]:
    """The FP8 exponents of the values ``names`` per role, fitted on an unrounded float32
    run of ``graph``, each value fitted as it is made and then dropped after its last
    reader (a giant tower's activations, all kept, would be gigabytes)."""
    fitter = ScaleFitter(names, role)
    watch_unrounded(graph, tensors, fitter)
    return fitter.scales


def watch_unrounded(graph: Graph, tensors: Mapping[str, Any], sink: ValueSink,
                    dtype: type = np.float32) -> None:
    """:func:`evaluate_unrounded` with each input and computed value handed to
    ``sink.put`` as soon as it is made, and dropped after its last reader: a caller that
    needs only something of each value (a calibration's largest magnitude) holds one
    layer's values at a time, not the tower's."""
    drain(_run_steps(graph, tensors, dtype,
                     lambda data, precision: np.asarray(data, dtype=dtype),
                     keep_weights=False, into=sink))


def evaluate_float64_steps(graph: Graph, tensors: dict[str, np.ndarray],
                           keep: Collection[str] | None = None
                           ) -> Generator[None, None, Mapping[str, np.ndarray]]:
    """:func:`evaluate_float64` one operation per ``next``; the values are the generator's
    return value (the host side interleaves it with other work)."""
    return _run_steps(graph, tensors, np.float64,
                      lambda data, precision: np.asarray(data, dtype=np.float64),
                      keep_weights=False, keep=keep)


def evaluate_float64(graph: Graph, tensors: dict[str, np.ndarray],
                     keep: Collection[str] | None = None) -> dict[str, np.ndarray]:
    """The same graph in float64 with no intermediate rounding (the ideal answer); inputs
    and every computed value, not the weights."""
    return _run(graph, tensors, np.float64,
                lambda data, precision: np.asarray(data, dtype=np.float64), keep_weights=False,
                keep=keep)
