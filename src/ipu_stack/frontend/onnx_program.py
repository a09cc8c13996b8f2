"""An ONNX graph as a ``torch.export`` program, so the torch importer compiles it unchanged.

``export_onnx`` builds a module whose forward runs the graph's nodes with the torch calls
of ``onnx_ops`` and traces it at the input shapes asked for:

* **Constants first.**  The graph is run once eagerly on zeros of those shapes: a node whose
  inputs are all constants (initializers, ``Constant`` nodes, the ``Shape`` of any value,
  since every shape is static here) is folded to its value; every other node is traced.  A
  constant a traced node reads becomes a buffer of the module, named after the initializer
  where the exporter kept a module path (``model.encoder.layers.0.mlp.fc1.bias``), else after
  the node that reads it: weights keep the same name in every layer, so FP8 exponents are
  shared by role and identical layers stay one loop body, as for a ``.pt2``.
* **Scopes.**  Each node runs inside a submodule at its module path (from the exporter's
  ``pkg.torch.onnx.name_scopes`` metadata, else the node name's ``/`` path), so value names,
  layer loops and the report's model parts are the ones a ``.pt2`` of the model gets.  Each
  traced ATen node is annotated with its ONNX node, and its source reads
  ``model.onnx:12 (MatMul /encoder/layers.0/mlp/fc1/MatMul)``: an unsupported operation
  names the ONNX node it came from.
* **ONNX idioms back to torch's.**  ``Where(IsNaN(Softmax(x)), 0, Softmax(x))`` is torch's
  ``_safe_softmax``; ``GatherND(x, Concat(arange, ArgMax(ids)))`` is ``x[arange(B),
  argmax(ids)]`` (CLIP's pooled row); ``Add(MatMul(x, W), b)`` is ``linear``; the erf and
  tanh spellings of GELU are ``gelu``; ``Reciprocal(Sqrt(x))`` is ``rsqrt``; a
  reshape-transpose-reshape of the keys is ``transpose(-2, -1)``; ``Not(Equal(a, b))`` is
  ``a != b`` (RoBERTa's padding test); ``Concat(x[s:], x[:s])`` is ``roll(x, -s)`` (Swin's
  shifted windows).  All exact.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ipu_stack.frontend.loader import require_torch
from ipu_stack.frontend.onnx_file import OnnxModel, require_onnx
from ipu_stack.frontend.onnx_ops import IDIOMS, TRANSLATIONS, NodeCall, constant_of
from ipu_stack.frontend.sizing import check_made
from ipu_stack.util.errors import CompileError, first_line

MODULE_PATH = re.compile(r"^[A-Za-z_]\w*(\.\w+)*$")


@dataclass
class Node:
    """One ONNX node as the module runs it."""

    index: int
    name: str
    op_type: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any]
    scope: str


@dataclass
class Folded:
    """The graph split into constants (by value name) and the nodes to trace."""

    constants: dict[str, np.ndarray] = field(default_factory=dict)
    traced: list[Node] = field(default_factory=list)


def node_scope(node: Any) -> str:
    """The module path of an ONNX node: torch.onnx's recorded name scopes, else the
    TorchScript exporter's ``/model/encoder/layers.0/mlp/fc1/MatMul`` node name."""
    for prop in node.metadata_props:
        if prop.key == "pkg.torch.onnx.name_scopes":
            scopes = [s.strip(" '\"") for s in prop.value.strip("[]").split(",")]
            paths = [s for s in scopes[:-1] if s]
            return paths[-1] if paths else ""
    parts = [p for p in node.name.split("/") if p][:-1]
    path = ".".join(parts)
    return path if MODULE_PATH.match(path) else ""


def attributes(node: Any) -> dict[str, Any]:
    onnx = require_onnx()
    out: dict[str, Any] = {}
    for attribute in node.attribute:
        value = onnx.helper.get_attribute_value(attribute)
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        elif isinstance(value, onnx.TensorProto):
            value = onnx.numpy_helper.to_array(value)
        out[attribute.name] = value
    out["_outputs"] = list(node.output)
    return out


def operator_kind(proto: Any) -> str:
    """``MatMul``; ``domain.Op`` for an operator outside the default domain."""
    return proto.op_type if proto.domain in ("", "ai.onnx") else f"{proto.domain}.{proto.op_type}"


def read_nodes(model: Any, weights: dict[str, np.ndarray]) -> list[Node]:
    """The graph's nodes, with unknown operators refused in one line (the first of them)."""
    nodes = []
    for index, proto in enumerate(model.graph.node):
        kind = operator_kind(proto)
        if kind not in TRANSLATIONS:
            raise CompileError(f"unsupported ONNX operator {kind} (node "
                               f"{proto.name or index}, scope {node_scope(proto) or '<top>'}): "
                               "no translation")
        nodes.append(Node(index + 1, proto.name or f"{proto.op_type}_{index}", proto.op_type,
                          list(proto.input), list(proto.output), attributes(proto),
                          node_scope(proto)))
    small = {t.name: weights[t.name] for t in model.graph.initializer
             if int(np.prod(t.dims)) <= 16}
    small.update({n.outputs[0]: constant_of(n.attrs) for n in nodes if n.op_type == "Constant"})
    return rewrite_idioms(nodes, {t.name: tuple(t.dims) for t in model.graph.initializer},
                          small)


def rewrite_idioms(nodes: list[Node], initializers: dict[str, tuple[int, ...]],
                   small: dict[str, np.ndarray]) -> list[Node]:
    """ONNX spellings of torch operations put back as the operation itself."""
    producer = {o: n for n in nodes for o in n.outputs}
    readers: dict[str, list[Node]] = {}
    for node in nodes:
        for name in node.inputs:
            readers.setdefault(name, []).append(node)
    for node in nodes:
        if node.op_type == "Erf":
            _erf_gelu(node, producer, readers, small)
        elif node.op_type == "Tanh":
            _tanh_gelu(node, producer, readers, small)
        elif node.op_type == "Reciprocal":
            _rsqrt(node, producer)
        elif node.op_type == "Mul":
            _silu(node, producer)
        elif node.op_type == "Reshape":
            _swap_last(node, producer, readers)
            _packed_split(node, readers)
    counts = {name: len(users) for name, users in readers.items()}
    constant = constant_values(nodes, set(initializers))
    for node in nodes:
        if node.op_type == "Add":
            _linear(node, producer, counts, constant)
        elif node.op_type == "Where" and len(node.inputs) == 3:
            test = producer.get(node.inputs[0])
            soft = producer.get(node.inputs[2])
            if test is not None and test.op_type == "IsNaN" and soft is not None and \
                    soft.op_type == "Softmax" and test.inputs[0] == node.inputs[2] and \
                    _is_constant(small, node.inputs[1], 0.0):
                node.op_type, node.inputs = "SafeSoftmax", [soft.inputs[0]]
                node.attrs = {**soft.attrs, "_outputs": node.outputs}
        elif node.op_type == "GatherND":
            source = producer.get(node.inputs[1])
            picked = _argmax_source(producer, source.inputs[1]) if source is not None and \
                source.op_type == "Concat" and len(source.inputs) == 2 else None
            if picked is not None:
                node.op_type = "PickRows"
                node.inputs = [node.inputs[0], source.inputs[0], picked]
        elif node.op_type == "Gather" and int(node.attrs.get("axis", 0)) == 0:
            _flat_rows(node, producer)
        elif node.op_type == "Concat" and len(node.inputs) == 2:
            _roll(node, producer, small)
        elif node.op_type == "Not" and getattr(producer.get(node.inputs[0]), "op_type",
                                               "") == "Equal":
            node.op_type, node.inputs = "NotEqual", list(producer[node.inputs[0]].inputs)
    return nodes


def _is_constant(small: dict[str, np.ndarray], name: str, value: float) -> bool:
    """Whether ``name`` is the one constant ``value``, as its own type rounds it (an FP16
    file's sqrt 2 is 1.4140625)."""
    found = small.get(name)
    if found is None or found.size != 1:
        return False
    rounding = float(np.finfo(found.dtype).eps) if found.dtype.kind == "f" else 0.0
    return abs(float(found.reshape(-1)[0]) - value) <= max(1e-6, rounding) * abs(value)


def _other(node: Node, value: str) -> str:
    """The input of a two-input node that is not ``value`` ("" when both are)."""
    return next((i for i in node.inputs if i != value), "")


def _constant_factor(node: Node | None, small: dict[str, np.ndarray], value: float
                     ) -> str | None:
    """The other operand of ``Mul(v, value)`` (either order), else None."""
    if node is None or node.op_type != "Mul" or len(node.inputs) != 2:
        return None
    for mine, theirs in (node.inputs, reversed(node.inputs)):
        if _is_constant(small, theirs, value):
            return mine
    return None


def _gelu_tail(value: str, x: str, readers: dict[str, list[Node]], small: dict[str, np.ndarray],
               producer: dict[str, Node]) -> Node | None:
    """From ``erf(...)`` or ``tanh(...)``: ``(1 + value) * x * 0.5`` in any order of its
    products, ``x * 0.5`` made first too (transformers' ``gelu_new``); the node ending it."""
    chain = readers.get(value, [])
    if len(chain) != 1 or chain[0].op_type != "Add" or not _is_constant(
            small, _other(chain[0], value), 1.0):
        return None
    value, seen, last = chain[0].outputs[0], set(), None
    while seen != {"x", "half"}:
        users = readers.get(value, [])
        if len(users) != 1 or users[0].op_type != "Mul":
            return None
        other = _other(users[0], value)
        if other == x:
            seen.add("x")
        elif _is_constant(small, other, 0.5):
            seen.add("half")
        elif _constant_factor(producer.get(other), small, 0.5) == x:
            seen |= {"x", "half"}
        else:
            return None
        last, value = users[0], users[0].outputs[0]
    return last


def _as_gelu(last: Node | None, x: str, approximate: str) -> None:
    if last is not None:
        last.op_type, last.inputs = "Gelu", [x]
        last.attrs = {"approximate": approximate, "_outputs": last.outputs}


def _erf_gelu(erf: Node, producer: dict[str, Node], readers: dict[str, list[Node]],
              small: dict[str, np.ndarray]) -> None:
    """``x * 0.5 * (1 + erf(x / sqrt 2))``: torch's exact ``gelu`` (an exporter below
    opset 20 has no Gelu operator)."""
    scaled = producer.get(erf.inputs[0])
    if scaled is None:
        return
    if scaled.op_type == "Div" and _is_constant(small, scaled.inputs[1], 2 ** 0.5):
        x = scaled.inputs[0]
    else:
        x = _constant_factor(scaled, small, 0.5 ** 0.5)
    if x is not None:
        _as_gelu(_gelu_tail(erf.outputs[0], x, readers, small, producer), x, "none")


def _tanh_gelu(tanh: Node, producer: dict[str, Node], readers: dict[str, list[Node]],
               small: dict[str, np.ndarray]) -> None:
    """``x * 0.5 * (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``: ``gelu(approximate=tanh)``."""
    inner = _constant_factor(producer.get(tanh.inputs[0]), small, (2 / math.pi) ** 0.5)
    total = producer.get(inner or "")
    if total is None or total.op_type != "Add":
        return
    for x, cubic in (total.inputs, reversed(total.inputs)):
        power = producer.get(_constant_factor(producer.get(cubic), small, 0.044715) or "")
        if power is not None and power.op_type == "Pow" and power.inputs[0] == x and \
                _is_constant(small, power.inputs[1], 3.0):
            _as_gelu(_gelu_tail(tanh.outputs[0], x, readers, small, producer), x, "tanh")
            return


def _swap_last(node: Node, producer: dict[str, Node], readers: dict[str, list[Node]]) -> None:
    """``Reshape(Transpose(Reshape(k, [-1, T, d]), [0, 2, 1]), [B, H, d, T])``: torch.onnx's
    spelling of ``k.transpose(-2, -1)`` in attention (checked against the shapes when
    traced)."""
    turn = producer.get(node.inputs[0])
    if turn is None or turn.op_type != "Transpose" or list(turn.attrs.get("perm") or []) != \
            [0, 2, 1] or len(readers.get(turn.outputs[0], [])) != 1:
        return
    flat = producer.get(turn.inputs[0])
    if flat is not None and flat.op_type == "Reshape" and \
            len(readers.get(flat.outputs[0], [])) == 1:
        node.op_type, node.inputs = "SwapLast", [flat.inputs[0], flat.inputs[1],
                                                 node.inputs[1]]


def _packed_split(node: Node, readers: dict[str, list[Node]]) -> None:
    """``Unsqueeze(Reshape(x, [..., k, E]), 0)``: ``nn.MultiheadAttention``'s packed key and
    value projection, ``unflatten(-1, (k, E)).unsqueeze(0)`` in torch (checked when traced:
    the reshape must split the last axis only)."""
    users = readers.get(node.outputs[0], [])
    if node.op_type == "Reshape" and len(users) == 1 and users[0].op_type == "Unsqueeze":
        node.op_type = "Unflatten"


def _silu(node: Node, producer: dict[str, Node]) -> None:
    """``Mul(x, Sigmoid(x))``: torch.onnx's spelling of ``silu`` (opset 18 has no SiLU), so
    SwiGLU's ``silu(gate) * up`` reads as the one operation it is."""
    for x, other in (node.inputs, reversed(node.inputs)):
        sigmoid = producer.get(other)
        if sigmoid is not None and sigmoid.op_type == "Sigmoid" and sigmoid.inputs == [x]:
            node.op_type, node.inputs = "Silu", [x]
            return


def _rsqrt(node: Node, producer: dict[str, Node]) -> None:
    """``Reciprocal(Sqrt(x))``: torch's ``rsqrt`` (an RMS norm's statistics)."""
    root = producer.get(node.inputs[0])
    if root is not None and root.op_type == "Sqrt":
        node.op_type, node.inputs = "Rsqrt", [root.inputs[0]]


def _linear(node: Node, producer: dict[str, Node], readers: dict[str, int],
            constant: set[str]) -> None:
    """``Add(MatMul(x, W), b)`` with constant ``W`` and ``b`` (initializers, or computed from
    them: a packed projection's ``Split``): torch's ``linear``, so the bias is the product's
    epilogue, not a table added to every row (shapes checked when traced)."""
    for product_name, bias in (node.inputs, reversed(node.inputs)):
        product = producer.get(product_name)
        if product is None or product.op_type != "MatMul" or readers.get(product_name) != 1:
            continue
        if product.inputs[1] in constant and bias in constant:
            node.op_type, node.inputs = "Linear", [product.inputs[0], product.inputs[1], bias]
            node.scope = product.scope or node.scope
            return


def constant_values(nodes: list[Node], initializers: set[str]) -> set[str]:
    """The values that depend on no graph input: initializers, and what nodes compute from
    them alone (every shape is static here, so a ``Shape`` is one too)."""
    constant = set(initializers)
    for node in nodes:
        if node.op_type in ("Constant", "Shape") or all(i in constant for i in node.inputs if i):
            constant.update(node.outputs)
    return constant


def _flat_rows(node: Node, producer: dict[str, Node]) -> None:
    """``Gather(Flatten(x), ArgMax(ids) + arange(B) * T)``: the TorchScript exporter's
    spelling of ``x[arange(B), argmax(ids)]`` (checked when the offsets are known)."""
    flat, offsets = producer.get(node.inputs[0]), producer.get(node.inputs[1])
    if flat is None or flat.op_type not in ("Flatten", "Reshape") or offsets is None or \
            offsets.op_type != "Add":
        return
    for first, second in (offsets.inputs, reversed(offsets.inputs)):
        picked = _argmax_source(producer, first)
        if picked is not None:
            node.op_type = "PickRows"
            node.inputs = [flat.inputs[0], second, picked]
            node.attrs = {**node.attrs, "flat": True}
            return


def _slice_bounds(node: Node | None, small: dict[str, np.ndarray]
                  ) -> tuple[str, int, int, int] | None:
    """(input, start, end, axis) of a one-axis, unit-step ``Slice`` with constant bounds."""
    if node is None or node.op_type != "Slice" or len(node.inputs) < 4:
        return None
    found = [small.get(name) for name in node.inputs[1:]]
    if any(f is None or f.size != 1 for f in found) or (
            len(found) > 3 and int(found[3].reshape(-1)[0]) != 1):
        return None
    start, end, axis = (int(f.reshape(-1)[0]) for f in found[:3])
    return node.inputs[0], start, end, axis


def _roll(node: Node, producer: dict[str, Node], small: dict[str, np.ndarray]) -> None:
    """``Concat(x[s:], x[:s])`` along one axis (``s`` of either sign): the TorchScript
    exporter's spelling of ``torch.roll(x, -s, axis)`` (Swin's shifted windows and their
    return), checked against the size when traced."""
    first = _slice_bounds(producer.get(node.inputs[0]), small)
    second = _slice_bounds(producer.get(node.inputs[1]), small)
    if first is None or second is None or first[0] != second[0] or first[3] != second[3] or \
            int(node.attrs.get("axis", 0)) != first[3] or second[1] != 0 or \
            first[1] != second[2] or first[1] == 0 or first[2] < 2 ** 31:
        return
    node.op_type, node.inputs = "Roll", [first[0]]
    node.attrs = {"shift": first[1], "axis": first[3]}


def _argmax_source(producer: dict[str, Node], name: str) -> str | None:
    """The ids an ``ArgMax`` over the last axis reads, through Unsqueeze and Cast."""
    node = producer.get(name)
    while node is not None and node.op_type in ("Unsqueeze", "Cast"):
        node = producer.get(node.inputs[0])
    if node is None or node.op_type != "ArgMax" or int(node.attrs.get("axis", 0)) != -1 or \
            node.attrs.get("select_last_index", 0):
        return None
    return node.inputs[0]


class NodeFailed(CompileError):
    """A translation that raised while computing a node: an attribute or a value the
    operator cannot take (a Range of step 0, an index out of its table)."""


def run_node(torch: Any, node: Node, values: dict[str, Any], consts: dict[str, np.ndarray]
             ) -> tuple[Any, ...]:
    """One node's outputs, computed by its translation (a failure: one line naming the
    node, :class:`NodeFailed`)."""
    fn = IDIOMS.get(node.op_type) or TRANSLATIONS[node.op_type]
    call = NodeCall(torch, node.op_type, [values.get(i) if i else None for i in node.inputs],
                    [consts.get(i) for i in node.inputs], node.attrs)
    try:
        result = fn(call)
    except CompileError as exc:
        raise CompileError(f"ONNX node {node.name} ({node.op_type}): {exc}") from None
    except (RuntimeError, IndexError, TypeError, ValueError, ZeroDivisionError) as exc:
        detail = first_line(exc)
        raise NodeFailed(f"ONNX node {node.name} ({node.op_type}) cannot be computed: "
                         f"{detail[:160]}") from None
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def fold(nodes: list[Node], weights: dict[str, np.ndarray], shapes: dict[str, tuple[int, ...]],
         dtypes: dict[str, Any], keep: set[str] | None = None) -> Folded:
    """Run the graph once: constants folded on the CPU (bounded before they are made, let go
    once only folds read them; ``keep`` too), every value an input reaches computed on the
    ``meta`` device (shapes only: any batch costs nothing here) and listed to trace."""
    torch = require_torch()
    folded = Folded(dict(weights))
    values: dict[str, Any] = {n: torch.empty(s, dtype=_torch_dtype(torch, dtypes[n]),
                                             device="meta") for n, s in shapes.items()}
    last_use = {name: i for i, n in enumerate(nodes) for name in n.inputs}
    made: dict[str, int] = {}  # constants the fold made, still held: their bytes
    keep, total = set(keep or ()), 0  # the outputs and what traced nodes read; bytes made
    with torch.no_grad():
        for position, node in enumerate(nodes):  # a Constant node has no inputs: folded
            constant = node.op_type == "Shape" or all(
                i in folded.constants for i in node.inputs if i)
            if constant and node.op_type != "Shape":
                size = sum(math.prod(o.shape) * o.element_size()
                           for o in _meta_outputs(torch, node, folded.constants))
                total += size  # all of it: onnxruntime's reference folds them all at once
                check_made(f"ONNX node {node.name} ({node.op_type})", size, total)
            live = {i: values[i] if i in values else
                    _constant_tensor(torch, folded.constants[i], meta=not constant)
                    for i in node.inputs if i}
            outputs = run_node(torch, node, live, folded.constants)
            for name, out in zip(node.outputs, outputs, strict=False):
                if constant:
                    held = out.numpy()  # torch's own array where contiguous: no copy
                    folded.constants[name] = held if held.flags.c_contiguous else held.copy()
                    made[name] = folded.constants[name].nbytes
                else:
                    values[name] = out
            if not constant:
                folded.traced.append(node)
                keep.update(node.inputs)  # the traced module's buffers
            for name in [n for n in node.inputs if last_use.get(n) == position]:
                values.pop(name, None)
                if name in made and name not in keep:  # read by folds alone: done with
                    del made[name], folded.constants[name]
    return folded


def _meta_outputs(torch: Any, node: Node, constants: dict[str, np.ndarray]) -> tuple:
    """A folded node's outputs on torch's ``meta`` device, shapes only (none where the
    translation reads values on the way: its own bounds hold)."""
    meta = {i: _constant_tensor(torch, constants[i], meta=True) for i in node.inputs if i}
    try:
        with torch.device("meta"):  # what the translation makes (torch.full) too
            return run_node(torch, node, meta, constants)
    except NodeFailed:
        return ()


def _constant_tensor(torch: Any, array: np.ndarray, meta: bool) -> Any:
    """A constant as a tensor: its values, or (beside a value that depends on an input)
    only its shape and dtype."""
    if meta:
        return torch.empty(array.shape, dtype=torch.from_numpy(np.zeros(0, array.dtype)).dtype,
                           device="meta")
    return torch.from_numpy(array if array.flags.writeable else np.array(array))


def _torch_dtype(torch: Any, dtype: Any) -> Any:
    return torch.int64 if np.issubdtype(dtype, np.integer) else \
        torch.bool if dtype == np.bool_ else torch.float32


def live_nodes(traced: list[Node], outputs: list[str]) -> list[Node]:
    """The traced nodes some graph output depends on, in order."""
    needed, keep = set(outputs), []
    for node in reversed(traced):
        if needed.intersection(node.outputs):
            keep.append(node)
            needed.update(i for i in node.inputs if i)
    return list(reversed(keep))


def buffer_names(nodes: list[Node], constants: dict[str, np.ndarray],
                 initializers: set[str]) -> dict[str, str]:
    """A module path for each constant a traced node reads: the initializer's own name when
    it is a module path, else ``<scope of its first reader>.<operator>_<input slot>``."""
    names: dict[str, str] = {}
    taken: set[str] = set()
    for node in nodes:
        for slot, value in enumerate(node.inputs):
            if value not in constants or value in names:
                continue
            keep = value in initializers and MODULE_PATH.match(value) and "." in value
            name = value if keep else ".".join(p for p in (node.scope, f"{node.op_type}_{slot}")
                                               if p)
            base, count = name, 1
            while name in taken:
                name, count = f"{base}_{count}", count + 1
            taken.add(name)
            names[value] = name
    return names


def source_path(path: Path | str) -> str:
    return Path(path).name


def export_onnx(model: OnnxModel, path: Path | str, feeds: dict[str, np.ndarray]) -> Any:
    """The model traced by ``torch.export`` at the shapes of ``feeds`` (the user inputs)."""
    torch = require_torch()
    weights = model.weights
    nodes = read_nodes(model.proto, weights)
    outputs = [o.name for o in model.graph.output]
    folded = fold(nodes, weights, {k: v.shape for k, v in feeds.items()},
                  {k: v.dtype for k, v in feeds.items()}, set(outputs))
    traced = live_nodes(folded.traced, outputs)
    for name in outputs:
        if name in folded.constants:
            raise CompileError(f"graph output {name} does not depend on any input")
    names = buffer_names(traced, folded.constants, {t.name for t in model.graph.initializer})
    module = build_module(torch, traced, folded.constants, names, outputs)
    kwargs = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in feeds.items()}
    with torch.fx.traceback.preserve_node_meta():  # the program's inputs keep the file's names
        program = torch.export.export(module, (), kwargs=kwargs)
    label_sources(program, traced, source_path(path))
    return program


def build_module(torch: Any, nodes: list[Node], constants: dict[str, np.ndarray],
                 names: dict[str, str], outputs: list[str]) -> Any:
    class Scope(torch.nn.Module):
        """A module path of the ONNX graph: its nodes run inside it."""

        def forward(self, node: Node, values: dict[str, Any]) -> tuple[Any, ...]:
            with torch.fx.traceback.annotate({"onnx_node": node.index}):
                return run_node(torch, node, values, constants)

    class OnnxGraph(torch.nn.Module):
        """The ONNX graph's traced nodes in order, each in its scope."""

        def forward(self, **feeds: Any) -> tuple[Any, ...]:
            values = dict(feeds)
            for value, name in names.items():
                values[value] = self.get_buffer(name)
            for node in nodes:
                scope = self.get_submodule(node.scope) if node.scope else self.top
                values.update(zip(node.outputs, scope(node, values), strict=False))
            return tuple(values[o] for o in outputs)

    root = OnnxGraph()
    root.top = Scope()
    for path in sorted({n.scope for n in nodes if n.scope} | {n.rsplit(".", 1)[0]
                                                               for n in names.values()
                                                               if "." in n}):
        parent = root
        for part in path.split("."):
            if part not in parent._modules:
                parent.add_module(part, Scope())
            parent = parent._modules[part]
    for value, name in names.items():
        owner, _, attr = name.rpartition(".")
        holder = root.get_submodule(owner) if owner else root
        array = constants[value]
        if array.dtype.kind == "f":
            array = array.astype(np.float32, copy=False)
        if not (array.flags.writeable and array.flags.c_contiguous):
            array = np.array(array)  # torch shares only a writable, contiguous array
        tensor = torch.from_numpy(array)
        holder.register_buffer(attr, tensor)
    return root


def label_sources(program: Any, nodes: list[Node], file: str) -> None:
    """Each ATen node's source: the ONNX node it was traced from."""
    by_index = {n.index: n for n in nodes}
    for fx_node in program.graph.nodes:
        index = (fx_node.meta.get("custom") or {}).get("onnx_node")
        node = by_index.get(index)
        if node is not None:
            fx_node.meta["onnx_node"] = node.name
            fx_node.meta["stack_trace"] = (f'File "{file}", line {node.index}, in graph\n'
                                           f"    {node.op_type} {node.name}")
