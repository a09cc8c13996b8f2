"""The dataflow graph: values (inputs, weights, intermediates) and operations.

A graph is built with :class:`GraphBuilder`, checked by :func:`verify_graph` and printed by
:meth:`Graph.dump`.  Operation kinds and their typing rules live in ``OPERATION_RULES`` so
the verifier and the builder agree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ipu_stack.ir.precision import I32, Precision
from ipu_stack.ir.types import RowIndex, TensorType
from ipu_stack.util.errors import CompileError

ROLES = ("input", "weight", "intermediate", "output")


@dataclass(frozen=True)
class Value:
    """A tensor in the graph; ``role`` says where its bytes come from or go."""

    id: int
    name: str
    type: TensorType
    role: str


@dataclass(frozen=True)
class Operation:
    """One operation: ``kind`` applied to ``inputs`` producing ``outputs`` (value ids)."""

    id: int
    kind: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    attrs: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


def _matmul_rule(inputs: list[TensorType], attrs: dict[str, Any]) -> tuple[int, ...]:
    a, b = inputs
    if len(b.shape) != 2 or a.cols != b.shape[0]:
        raise CompileError(f"matmul depth mismatch: {list(a.shape)} x {list(b.shape)}")
    return (*a.shape[:-1], b.shape[1])


def _same_shape_rule(inputs: list[TensorType], attrs: dict[str, Any]) -> tuple[int, ...]:
    return inputs[0].shape


def _bias_rule(inputs: list[TensorType], attrs: dict[str, Any]) -> tuple[int, ...]:
    x, bias = inputs
    if bias.shape != (x.cols,):
        raise CompileError(f"bias shape {list(bias.shape)} does not match columns {x.cols}")
    return x.shape


def _layer_norm_rule(inputs: list[TensorType], attrs: dict[str, Any]) -> tuple[int, ...]:
    x, gamma, beta = inputs
    if gamma.shape != (x.cols,) or beta.shape != (x.cols,):
        raise CompileError(f"layer_norm scale/shift must be [{x.cols}]")
    if float(attrs.get("eps", 0)) <= 0:
        raise CompileError("layer_norm needs a positive eps")
    return x.shape


ACTIVATIONS = ("sigmoid", "tanh", "silu", "quick_gelu")
"""The ``activation`` operation's functions: sigma(x), tanh(x), x sigma(x), x sigma(1.702 x)."""


def _activation_rule(inputs: list[TensorType], attrs: dict[str, Any]) -> tuple[int, ...]:
    if attrs.get("function") not in ACTIVATIONS:
        raise CompileError(f"activation function {attrs.get('function')!r} is not one of "
                           f"{', '.join(ACTIVATIONS)}")
    return inputs[0].shape


def _rms_norm_rule(inputs: list[TensorType], attrs: dict[str, Any]) -> tuple[int, ...]:
    x, gamma = inputs
    if gamma.shape != (x.cols,):
        raise CompileError(f"rms_norm scale must be [{x.cols}]")
    if float(attrs.get("eps", 0)) <= 0:
        raise CompileError("rms_norm needs a positive eps")
    group = attrs.get("group", x.cols)
    if not isinstance(group, int) or group <= 0 or x.cols % group:
        raise CompileError(f"rms_norm group {group!r} does not divide its {x.cols} columns")
    return x.shape


def _add_rule(inputs: list[TensorType], attrs: dict[str, Any]) -> tuple[int, ...]:
    x, y = inputs
    if (x.rows, x.cols) != (y.rows, y.cols):
        raise CompileError(f"elementwise operation on {list(x.shape)} and {list(y.shape)}")
    return x.shape


def table_maps(attrs: dict[str, Any], tables: int) -> list[tuple[int, int]]:
    """Each additive table's ``(block, repeat)`` of a ``biased_softmax``
    (``attrs["table_maps"]``; ``(1, 1)``, a plain period, where absent)."""
    maps = attrs.get("table_maps") or [(1, 1)] * tables
    return [(int(block), int(repeat)) for block, repeat in maps]


def table_row_index(rows: int, table_rows: int, block: int = 1, repeat: int = 1) -> np.ndarray:
    """The table row each of ``rows`` score rows adds: the table's ``block``-row blocks
    each serve ``repeat`` blocks of rows in turn, and the whole repeats over the rows. With
    ``(1, 1)`` row ``r`` adds table row ``r mod P`` (a Swin layer's relative position
    bias, the same for every image); with ``(T, H)`` a ``[W T, T]`` shift mask serves each
    window's ``H`` heads (``[W, H, T, T]`` scores) without being held ``H`` times."""
    expanded = np.arange(rows, dtype=np.int64) % (table_rows * repeat)
    return expanded // (block * repeat) * block + expanded % block


def _biased_softmax_rule(inputs: list[TensorType], attrs: dict[str, Any]) -> tuple[int, ...]:
    """``softmax(scale x + t1 [+ t2])``: each table is as many rows as the scores, or rows
    that repeat (:func:`table_row_index`): a Swin layer's relative position bias is the
    same for every image, and its shift mask for every head."""
    x, *tables = inputs
    maps = table_maps(attrs, len(tables))
    if len(maps) != len(tables):
        raise CompileError(f"biased_softmax has {len(tables)} tables and {len(maps)} "
                           "table maps")
    for table, (block, repeat) in zip(tables, maps, strict=True):
        if table.cols != x.cols or table.rows == 0 or block < 1 or repeat < 1 or \
                table.rows % block or x.rows % (table.rows * repeat):
            raise CompileError(f"biased_softmax table {list(table.shape)} (blocks of "
                               f"{block} rows, each {repeat} times) does not repeat into the "
                               f"scores {list(x.shape)}")
    return x.shape


def _gather_rows_rule(inputs: list[TensorType], attrs: dict[str, Any]) -> tuple[int, ...]:
    """``x[index]`` with each ``group`` picked rows side by side in one row: a fixed
    permutation of the rows (a Swin window partition and its shift) or, with ``group`` 4,
    the 2 x 2 neighbours a patch merging concatenates. Known when compiling: the device
    moves the rows in one exchange, with no compute."""
    (x,) = inputs
    index, group = attrs.get("index"), int(attrs.get("group", 1))
    if not isinstance(index, RowIndex) or len(index) == 0:
        raise CompileError("gather_rows needs a RowIndex of the rows it picks")
    if group <= 0 or len(index) % group:
        raise CompileError(f"gather_rows picks {len(index)} rows, not whole groups of {group}")
    if index.rows.min() < 0 or index.rows.max() >= x.rows:
        raise CompileError(f"gather_rows picks a row outside its input's {x.rows}")
    return (len(index) // group, group * x.cols)


def _rope_rule(inputs: list[TensorType], attrs: dict[str, Any]) -> tuple[int, ...]:
    x, cos, sin = inputs
    head_dim = int(attrs.get("head_dim", 0))
    if head_dim <= 0 or head_dim % 2 or x.cols % head_dim:
        raise CompileError(f"rope head_dim {head_dim} does not divide {x.cols} into pairs")
    if attrs.get("pairs", "interleaved") not in ("interleaved", "halves"):
        raise CompileError(f"rope pairs {attrs.get('pairs')!r} is not interleaved or halves")
    rotary = attrs.get("rotary", head_dim)  # the leading channels of each head turned
    if not isinstance(rotary, int) or rotary <= 0 or rotary % 2 or rotary > head_dim:
        raise CompileError(f"rope rotary {rotary!r} is not an even width within a head of "
                           f"{head_dim}")
    if cos.shape != (x.rows, rotary // 2) or sin.shape != cos.shape:
        raise CompileError(f"rope tables must be [{x.rows}, {rotary // 2}]")
    return x.shape


def _embedding_rule(inputs: list[TensorType], attrs: dict[str, Any]) -> tuple[int, ...]:
    """``table[ids]``: ids ``[..., 1]`` (I32) into a table of ``rows`` rows (a weight, or an
    activation whose leading dimensions are flattened); one row each."""
    ids, table = inputs
    if not ids.precision.is_integer or ids.cols != 1:
        raise CompileError(f"embedding ids must be I32 [..., 1], not {ids}")
    if len(table.shape) < 2:
        raise CompileError(f"embedding table must be [rows, width], not {list(table.shape)}")
    return (*ids.shape[:-1], table.cols)


@dataclass(frozen=True)
class HeadGeometry:
    """An attention product's shape: ``batch`` sequences of ``tokens`` query rows, ``heads``
    query heads reading ``kv_heads`` key/value heads (grouped-query attention: query head
    ``h`` reads head ``h // (heads / kv_heads)``) of ``kv_tokens`` rows each (a decode step
    reads a cache longer than its one query row)."""

    batch: int
    tokens: int
    kv_tokens: int
    heads: int
    kv_heads: int
    head_dim: int

    def kv_head(self, head: int) -> int:
        return head // (self.heads // self.kv_heads)

    def product(self, mode: str) -> tuple[int, int, int]:
        """``(rows, depth, cols)`` of one image's and head's product: ``qk`` the queries
        by the keys over the head's width, ``pv`` the probabilities by the values over the
        keys."""
        if mode == "qk":
            return self.tokens, self.head_dim, self.kv_tokens
        return self.tokens, self.kv_tokens, self.head_dim


def head_geometry(attrs: dict[str, Any], keys: TensorType) -> HeadGeometry:
    """The geometry of a ``head_matmul`` whose key/value operand is ``keys``
    (``[batch x kv_tokens, kv_heads x head_dim]``)."""
    heads, tokens = int(attrs.get("heads", 0)), int(attrs.get("tokens", 0))
    kv_heads = int(attrs.get("kv_heads", heads))
    kv_tokens = int(attrs.get("kv_tokens", tokens))
    if min(heads, tokens, kv_heads, kv_tokens) <= 0 or heads % kv_heads \
            or keys.rows % kv_tokens or keys.cols % kv_heads:
        raise CompileError("head_matmul needs heads and tokens that divide its operands")
    return HeadGeometry(keys.rows // kv_tokens, tokens, kv_tokens, heads, kv_heads,
                        keys.cols // kv_heads)


def _head_matmul_rule(inputs: list[TensorType], attrs: dict[str, Any]) -> tuple[int, ...]:
    """``qk``: [B*T, H*d] x [B*S, KV*d] -> [B*H*T, S]; ``pv``: [B*H*T, S] x [B*S, KV*d] ->
    [B*T, H*d] (``S``: ``kv_tokens``, default ``tokens``; ``KV``: ``kv_heads``, default
    ``heads``)."""
    a, b = inputs
    geo = head_geometry(attrs, b)
    mode = attrs.get("mode")
    queries = geo.batch * geo.tokens
    if mode == "qk":
        if a.rows != queries or a.cols != geo.heads * geo.head_dim:
            raise CompileError("head_matmul qk queries and keys do not match")
        return (geo.batch * geo.heads * geo.tokens, geo.kv_tokens)
    if mode == "pv":
        if a.rows != geo.batch * geo.heads * geo.tokens or a.cols != geo.kv_tokens:
            raise CompileError("head_matmul pv probabilities have the wrong shape")
        return (queries, geo.heads * geo.head_dim)
    raise CompileError(f"head_matmul mode {mode!r} is not qk or pv")


# a KV cache's positions are a multiple of this: its holders keep whole blocks of it
# (``lowering.cache``), so the workloads round a cache's length up to it
POSITION_GRAIN = 32


def _cache_positions(name: str, state: TensorType, rows: TensorType,
                     attrs: dict[str, Any]) -> int:
    """A cache write's positions a sequence, once its state and rows are checked to agree:
    whole blocks of ``POSITION_GRAIN`` dividing the state's rows, ``kv_heads`` dividing its
    columns, and whole rows a sequence written."""
    if len(state.shape) != 2 or rows.cols != state.cols or rows.precision != state.precision:
        raise CompileError(f"{name} rows {rows} do not fit state {state}")
    positions, heads = int(attrs.get("positions", 0)), int(attrs.get("kv_heads", 1))
    if positions <= 0 or positions % POSITION_GRAIN or state.rows % positions:
        raise CompileError(f"a cache of {positions} positions must be a whole number of "
                           f"blocks of {POSITION_GRAIN} dividing the state's {state.rows} rows")
    if heads <= 0 or state.cols % heads:
        raise CompileError(f"a cache's {heads} key/value heads must divide its {state.cols} "
                           "columns")
    if rows.rows % (state.rows // positions):
        raise CompileError(f"{name} rows {rows} are not a whole number a sequence of "
                           f"{state.rows // positions}")
    return positions


def _cache_write_rule(inputs: list[TensorType], attrs: dict[str, Any]) -> tuple[int, ...]:
    """``state`` with row ``slots[i]`` replaced by ``rows[i]``: a KV cache written in place
    at runtime positions (popops ``MultiUpdate``).  The state is a resident weight whose
    bytes carry from call to call; the result is the same bytes (``state_writes``)."""
    state, rows, slots = inputs
    _cache_positions("cache_write", state, rows, attrs)
    if not slots.precision.is_integer or slots.cols != 1 or slots.rows != rows.rows:
        raise CompileError(f"cache_write slots must be I32 [{rows.rows}, 1], not {slots}")
    return state.shape


def _cache_fill_rule(inputs: list[TensorType], attrs: dict[str, Any]) -> tuple[int, ...]:
    """``state`` with each sequence's first ``N`` positions replaced by its ``N`` rows: a
    prompt's keys or values written into a KV cache at positions the compiler knows (a
    static copy, no runtime index)."""
    state, rows = inputs
    positions = _cache_positions("cache_fill", state, rows, attrs)
    batch = state.rows // positions
    if rows.rows // batch > positions:
        raise CompileError(f"cache_fill rows {rows} are not at most {positions} a sequence "
                           f"of {batch}")
    return state.shape


def _argmax_rule(inputs: list[TensorType], attrs: dict[str, Any]) -> tuple[int, ...]:
    """Each row's first largest value's column: ``[..., 1]`` (its output is ``I32``)."""
    (x,) = inputs
    if x.precision.is_integer:
        raise CompileError(f"argmax takes values, not {x.precision.kind} ids")
    return (*x.shape[:-1], 1)


ShapeRule = Callable[[list[TensorType], dict[str, Any]], tuple]
# each kind: how many inputs it takes (one count, or the counts it accepts) and its shape rule
OPERATION_RULES: dict[str, tuple[int | tuple[int, ...], ShapeRule]] = {
    "matmul": (2, _matmul_rule),
    "head_matmul": (2, _head_matmul_rule),
    "bias_add": (2, _bias_rule),
    "gelu": (1, _same_shape_rule),
    "cast": (1, _same_shape_rule),
    "scale": (1, _same_shape_rule),
    "softmax": (1, _same_shape_rule),
    "layer_norm": (3, _layer_norm_rule),
    "add": (2, _add_rule),
    "mul": (2, _add_rule),
    "biased_softmax": ((2, 3), _biased_softmax_rule),
    "swiglu": (2, _add_rule),
    "activation": (1, _activation_rule),
    "rms_norm": (2, _rms_norm_rule),
    "rope": (3, _rope_rule),
    "embedding": (2, _embedding_rule),
    "gather_rows": (1, _gather_rows_rule),
    "cache_write": (3, _cache_write_rule),
    "cache_fill": (2, _cache_fill_rule),
    "argmax": (1, _argmax_rule),
}


def _counts(arity: int | tuple[int, ...]) -> tuple[int, ...]:
    """The input counts an operation kind takes (``biased_softmax``: one or two tables)."""
    return arity if isinstance(arity, tuple) else (arity,)


@dataclass
class Graph:
    """Values and operations in topological order."""

    name: str
    values: list[Value] = field(default_factory=list)
    operations: list[Operation] = field(default_factory=list)

    def value(self, value_id: int) -> Value:
        return self.values[value_id]

    def by_role(self, role: str) -> list[Value]:
        return [v for v in self.values if v.role == role]

    def producer(self, value_id: int) -> Operation | None:
        for op in self.operations:
            if value_id in op.outputs:
                return op
        return None

    def consumers(self, value_id: int) -> list[Operation]:
        return [op for op in self.operations if value_id in op.inputs]

    def dump(self) -> str:
        """A readable text form: one line per value and operation."""
        lines = [f"graph {self.name}"]
        for v in self.values:
            lines.append(f"  %{v.id} {v.name}: {v.role} {v.type}")
        for op in self.operations:
            ins = ", ".join(f"%{i}" for i in op.inputs)
            outs = ", ".join(f"%{o}" for o in op.outputs)
            attrs = "".join(f" {k}={v}" for k, v in sorted(op.attrs.items()))
            lines.append(f"  {outs} = {op.kind}({ins}){attrs}")
        return "\n".join(lines)


def operation_macs(graph: Graph, op: Operation) -> int:
    """Multiply-accumulates of one GEMM operation (0 for any other): a matmul, or a head
    matmul's ``batch x heads`` products of ``tokens x kv_tokens`` over the head width, in either
    order."""
    if op.kind not in ("matmul", "head_matmul"):
        return 0
    a = graph.value(op.inputs[0]).type
    b = graph.value(op.inputs[1]).type
    if op.kind == "matmul":
        return a.rows * a.cols * b.shape[1]
    geo = head_geometry(op.attrs, b)
    return geo.batch * geo.heads * geo.tokens * geo.kv_tokens * geo.head_dim


def gemm_macs(graph: Graph) -> int:
    """Multiply-accumulates of every GEMM: the matmuls and the attention products, which the
    roofline and the TFLOPS figures count."""
    return sum(operation_macs(graph, op) for op in graph.operations)


CHOSEN = "next_token"  # the columns an argmax appended by :func:`choose_on_device` chose


def choose_on_device(graph: Graph) -> None:
    """Follow the graph's one output (logits, a row a position) by an argmax, in place: the
    output becomes each row's largest value's column (``CHOSEN``, I32), the device sends
    4 bytes a row instead of the row, and the logits stay the float64 model's to judge
    (:func:`fidelity_values`) under their own name."""
    outputs = graph.by_role("output")
    if len(outputs) != 1:
        raise CompileError(f"the token is chosen on the device from one output (logits), not "
                           f"from {len(outputs)} outputs")
    if any(v.name == CHOSEN for v in graph.values):
        raise CompileError(f"the graph already has a value named {CHOSEN}")
    logits = outputs[0]
    graph.values[logits.id] = Value(logits.id, logits.name, logits.type, "intermediate")
    shape = _argmax_rule([logits.type], {})
    chosen = Value(len(graph.values), CHOSEN, TensorType(shape, I32), "output")
    graph.values.append(chosen)
    graph.operations.append(Operation(len(graph.operations), "argmax", (logits.id,),
                                      (chosen.id,)))
    verify_graph(graph)


def fidelity_values(graph: Graph) -> dict[str, str]:
    """Each output's name, and the value whose numbers the float64 model judges for it: its
    own, or for an argmax's columns the values it chose from (a column is right or not;
    how near the values it chose between were is what rounding can change)."""
    judged = {}
    for value in graph.by_role("output"):
        producer = graph.producer(value.id)
        chosen_from = producer is not None and producer.kind == "argmax"
        judged[value.name] = graph.value(producer.inputs[0]).name if chosen_from else value.name
    return judged


def state_writes(graph: Graph) -> dict[int, int]:
    """Each state (a KV cache: a weight that ``cache_write`` or ``cache_fill`` updates in
    place) and the value its write produces, which is its contents for the rest of the call
    and the next call's state."""
    return {op.inputs[0]: op.outputs[0] for op in graph.operations
            if op.kind in ("cache_write", "cache_fill")}


def _verify_states(graph: Graph) -> None:
    """A state is a weight written once, and read only by that write (everything after it
    reads the written value, so the order of reads and the write is the graph's)."""
    for state, written in state_writes(graph).items():
        value = graph.value(state)
        if value.role != "weight":
            raise CompileError(f"cache state {value.name} must be a weight (resident across "
                               f"calls), not {value.role}")
        readers = graph.consumers(state)
        if len(readers) != 1:
            raise CompileError(f"state {value.name} must be read only by its one write")
        if graph.value(written).role == "output":
            raise CompileError(f"state {value.name}'s write is a graph output: read the "
                               "attention's result, not the cache")


class GraphBuilder:
    """Builds a graph op by op, inferring output shapes from ``OPERATION_RULES``."""

    def __init__(self, name: str) -> None:
        self.graph = Graph(name)

    def _add_value(self, name: str, ttype: TensorType, role: str) -> int:
        value = Value(len(self.graph.values), name, ttype, role)
        self.graph.values.append(value)
        return value.id

    def input(self, name: str, ttype: TensorType) -> int:
        return self._add_value(name, ttype, "input")

    def weight(self, name: str, ttype: TensorType) -> int:
        return self._add_value(name, ttype, "weight")

    def op(self, kind: str, inputs: list[int], precision: Precision, name: str, **attrs: Any) -> int:
        if kind not in OPERATION_RULES:
            raise CompileError(f"unknown operation kind {kind!r}")
        arity, rule = OPERATION_RULES[kind]
        if len(inputs) not in _counts(arity):
            raise CompileError(f"{kind} takes {arity} inputs, got {len(inputs)}")
        shape = rule([self.graph.values[i].type for i in inputs], attrs)
        out = self._add_value(name, TensorType(tuple(shape), precision), "intermediate")
        self.graph.operations.append(
            Operation(len(self.graph.operations), kind, tuple(inputs), (out,), dict(attrs))
        )
        return out

    def output(self, value_id: int) -> None:
        v = self.graph.values[value_id]
        self.graph.values[value_id] = Value(v.id, v.name, v.type, "output")

    def build(self) -> Graph:
        verify_graph(self.graph)
        return self.graph


def verify_graph(graph: Graph) -> None:
    """Check ids, topological order, single definition, arities and shapes."""
    defined = {v.id for v in graph.values if v.role in ("input", "weight")}
    for index, v in enumerate(graph.values):
        if v.id != index:
            raise CompileError(f"value {v.name} has id {v.id} at position {index}")
        if v.role not in ROLES:
            raise CompileError(f"value {v.name} has unknown role {v.role!r}")
    for op in graph.operations:
        arity, rule = OPERATION_RULES.get(op.kind, (None, None))
        if rule is None:
            raise CompileError(f"operation {op.id} has unknown kind {op.kind!r}")
        if len(op.inputs) not in _counts(arity):
            raise CompileError(f"operation {op.id} ({op.kind}) takes {arity} inputs")
        for i in op.inputs:
            if i not in defined:
                raise CompileError(f"operation {op.id} ({op.kind}) reads %{i} before it is defined")
        shape = rule([graph.values[i].type for i in op.inputs], op.attrs)
        for o in op.outputs:
            if o in defined:
                raise CompileError(f"value %{o} is defined twice")
            if graph.values[o].type.shape != tuple(shape):
                raise CompileError(f"operation {op.id} ({op.kind}) output shape mismatch")
            defined.add(o)
    if not graph.by_role("output"):
        raise CompileError(f"graph {graph.name} has no outputs")
    _verify_states(graph)
