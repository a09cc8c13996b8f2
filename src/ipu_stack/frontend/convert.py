"""torch.export program -> ``ir.Graph``: the walk over the FX graph and its bookkeeping.

Each FX node becomes one of: a constant (a ``torch.Tensor`` or Python value: parameters,
buffers and everything computed only from them, folded by running the op), an
:class:`~ipu_stack.frontend.forms.Act` (an IR value in a layout form), a
:class:`~ipu_stack.frontend.forms.UserInput` (an input whose host layout its first consumer
decides), or ``None`` (assertions).  This module holds the converter's bookkeeping (names,
weights, inputs, lazy values); the walk itself is ``frontend/walk.py`` and the
per-operation rules are the families ``frontend/ops.py`` gathers, both above this module.

Precision policy (the builtins'): with ``fp8``, GEMM weights are FP8 F143 with one scale
exponent per weight role (fitted to the data, the largest over the role's layers), GEMM
A-operands are FP8 (a layer norm or GELU that feeds only GEMMs writes FP8 itself; anything
else gets a ``cast``), and attention and the residual stream stay F16 (with ``attention``
"fp8", attention's operands are FP8 too: ``frontend/attention.py``); FP8 activation
exponents come from ``scales``, by role (fitted by the caller on a calibration input).  With
``f16`` everything is F16 but RoPE tables (F32).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ipu_stack.frontend.forms import Act, UserInput
from ipu_stack.ir.graph import Graph, GraphBuilder, Value
from ipu_stack.ir.names import MODULE_LAYER, fp8_allowed
from ipu_stack.ir.precision import F16, F32, I32, Precision, fit_scale_exponent
from ipu_stack.ir.types import RowIndex, TensorType
from ipu_stack.ir.values import weight_storer
from ipu_stack.util.errors import CompileError, UsageError
from ipu_stack.workloads.transformer import role  # FP8 activation exponents are per role

# ops that pass a value through unchanged (as the device sees it) or only relabel its shape
TRANSPARENT = {"aten.view", "aten.reshape", "aten._unsafe_view", "aten.contiguous", "aten.clone",
               "aten.dropout", "aten.alias", "aten.detach", "aten.to", "aten._to_copy",
               "aten.flatten", "aten.unsqueeze", "aten.squeeze", "aten.type_as"}
# calls kept even when nothing reads their result (checks that must still hold)
SIDE_EFFECTS = {"aten._assert_tensor_metadata", "aten._assert_scalar",
                "aten.sym_constrain_range_for_size"}
# rules that accept symbolic values: channel pairs (RoPE, ``frontend/rope.py``) and fused
# projections (``frontend/fused.py``); every other rule gets them made concrete first
PAIR_AWARE = {"aten.view", "aten.reshape", "aten._unsafe_view", "aten.contiguous", "aten.clone",
              "aten.mul", "aten.add", "aten.sub", "aten.neg", "aten.unbind", "aten.select",
              "aten.stack", "<built-in function getitem>", "aten.flatten", "aten.unflatten",
              "aten.alias", "aten.to", "aten._to_copy", "aten.detach", "aten.unsqueeze",
              "aten.squeeze", "aten.transpose", "aten.permute", "aten.chunk", "aten.split",
              "aten.split_with_sizes", "aten.slice", "aten.cat"}
# rules that take rows out of order and keep them so (``frontend/order.py``): row-local
# operations, views and permutes that keep the last axis, rolls, strided slices and the
# concatenation that gathers them; every other rule gets its rows in order first
ORDER_AWARE = {"aten.view", "aten.reshape", "aten._unsafe_view", "aten.contiguous",
               "aten.clone", "aten.alias", "aten.detach", "aten.dropout", "aten.flatten",
               "aten.unflatten", "aten.transpose", "aten.permute", "aten.roll", "aten.pad",
               "aten.constant_pad_nd", "aten.slice", "aten.cat", "aten.layer_norm",
               "aten.gelu", "aten.linear", "aten.add", "<built-in function getitem>"}
# rules that keep a value's rows merged side by side (``Act.group``) without moving them
GROUP_AWARE = {"aten.view", "aten.reshape", "aten._unsafe_view", "aten.contiguous",
               "aten.clone", "aten.alias", "aten.detach", "aten.dropout", "aten.flatten",
               "aten.unflatten", "aten.transpose", "aten.permute"}
# one stack index of a module path, not consuming the dot after it (nested stacks)
STACKED = re.compile(r"(?:^|\.)(?:layers|layer|blocks|resblocks|h)\.(\d+)(?=\.|$)")
PROBE_SHIFT = 7  # a second set of positions that tells per-call inputs apart
GEMM_A = {"aten.linear": 0, "aten.addmm": 1, "aten.mm": 0, "aten.matmul": 0}


def user_input_nodes(program: Any) -> list[Any]:
    """The placeholders of a program's user inputs, in the order it takes them."""
    nodes = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    return [nodes[spec.arg.name] for spec in program.graph_signature.input_specs
            if spec.kind.name == "USER_INPUT"]


def user_inputs_read(program: Any, node: Any) -> set[str]:
    """The program's user inputs ``node``'s value depends on, by name."""
    inputs = {n.name for n in user_input_nodes(program)}
    seen, stack, found = set(), [node], set()
    while stack:
        current = stack.pop()
        if current.op == "placeholder" and current.name in inputs:
            found.add(current.name)
        for source in current.all_input_nodes:
            if source not in seen:
                seen.add(source)
                stack.append(source)
    return found


def weight_role(name: str) -> str:
    """A parameter's name with its layer index starred (``encoder.layers.*.mlp.fc1.weight``),
    and without a slice suffix: one FP8 exponent per role, so identical layers stay
    identical (the compiler then runs them as one loop body, ``planning.repeat``)."""
    return MODULE_LAYER.sub(lambda m: m.group(0).replace(m.group(1), "*"), name).split("[")[0]


def op_name(target: Any) -> str:
    """``aten.linear`` for ``torch.ops.aten.linear.default`` (the overload packet)."""
    text = str(target)
    parts = text.split(".")
    return ".".join(parts[:2]) if len(parts) >= 3 and parts[0] == "aten" else text


def where(node: Any) -> tuple[str, str]:
    """(module path, ``file:line (code)``) of an FX node, from the metadata export keeps."""
    stack = node.meta.get("nn_module_stack") or {}
    module = "<top>"
    if stack:
        path, kind = list(stack.values())[-1]
        module = module_label(path, getattr(kind, "__name__", str(kind)))
    return module, source_label(node.meta.get("stack_trace"))


def module_label(path: str, kind: str) -> str:
    """``encoder.layers.0.mlp (SiglipMLP)``: the innermost module and its class."""
    return f"{path or '<top>'} ({kind.split('.')[-1]})"


def source_label(stack_trace: str | None) -> str:
    """``file.py:12 (code)``: the last frame of a node's recorded stack trace."""
    frames = re.findall(r'File "([^"]+)", line (\d+), in \S+\n\s*(.*)', stack_trace or "")
    if not frames:
        return "<no source>"
    file, line, code = frames[-1]
    return f"{file.rsplit('/', 1)[-1]}:{line} ({code.strip()[:80]})"


def unsupported_message(target: str, module: str, source: str, why: str = "") -> str:
    """The one line every unsupported operation is reported with."""
    reason = f": {why}" if why else ""
    return f"unsupported operation {target} in module {module} at {source}{reason}"


def unsupported(node: Any, why: str = "") -> CompileError:
    """The standard one-line error for an operation the importer cannot map."""
    module, source = where(node)
    return CompileError(unsupported_message(str(node.target), module, source, why))


@dataclass
class InputSpec:
    """A graph input and how the host makes it from the user's tensors."""

    name: str
    value: int
    make: Callable[[list[np.ndarray]], np.ndarray]


@dataclass
class OutputSpec:
    """A graph output and how a torch output (by index) is laid out as that IR value."""

    name: str
    index: int
    to_ir: Callable[[np.ndarray], np.ndarray]


@dataclass
class Converted:
    """The importer's result: the graph, device tensors, exact float32 tensors (for the
    conversion check) and the input/output maps."""

    graph: Graph
    tensors: dict[str, np.ndarray]
    exact: dict[str, np.ndarray]
    inputs: list[InputSpec]
    outputs: list[OutputSpec]
    rewrites: list[str] = field(default_factory=list)


class Converter:
    """Walks an ``ExportedProgram``'s graph in order and builds the IR graph."""

    def __init__(self, program: Any, user_inputs: list[np.ndarray], precision: str,
                 scales: dict[str, int], name: str, attention: str = "f16",
                 kept: frozenset[int] = frozenset(), device_tensors: bool = True) -> None:
        import torch

        self.torch = torch
        self.program = program
        self.user = [np.asarray(u, dtype=np.float32) for u in user_inputs]
        self.fp8 = precision == "fp8"
        self.attention_fp8 = self.fp8 and attention == "fp8"  # --attention fp8
        self.kept = kept  # layers an FP8 recipe keeps F16 (--keep-f16)
        # False: the exact tensors stand for the device's (a calibration pass reads only them)
        self.device_tensors = device_tensors
        self.scales = scales
        self.b = GraphBuilder(name)
        self.env: dict[Any, Any] = {}
        self.const_names: dict[int, str] = {}
        self.weights: dict[str, tuple[int, np.ndarray, str]] = {}  # name -> (id, raw, kind)
        self.shared: dict[tuple, int] = {}  # (shape, sha256) of a computed table -> its id
        self.inputs: list[InputSpec] = []
        self.input_values: dict[str, np.ndarray] = {}
        self.outputs: list[OutputSpec] = []
        self.user_acts: dict[int, Act] = {}
        self.id_values: dict[int, int] = {}  # user input index -> its I32 ids value
        self.materialized: dict[tuple, Act] = {}
        self.nested_layers: dict[str, int] = {}  # a nested block's path -> its layer number
        self.row_orders: dict[tuple, int] = {}  # (value, order) -> its rows gathered in order
        self.fused_done: dict[int, tuple[Any, Act]] = {}
        self.pairs_done: dict[int, tuple[Any, Act]] = {}
        self.rewrites: list[str] = []
        self.dynamic: set[Any] = set()
        # the host's arithmetic on position inputs (``frontend/ops_cache.py``): its nodes, the
        # user inputs it starts from (index -> placeholder), the per-call inputs it makes
        self.host_nodes: set[Any] = set()
        self.positions: dict[int, Any] = {}
        self.per_call: dict[tuple, int] = {}
        self.node: Any = None
        self.node_names: dict[Any, str] = {}
        self.name_counts: dict[str, int] = {}

    # ------------------------------------------------------------------ naming, precision
    def name(self, node: Any, suffix: str = "") -> str:
        """A value name from the node's module and operation, ``layer3.self_attn.q_proj.linear``
        inside layer 3 of a stack (``#k`` for the k-th repeat within one module): the same
        position in every layer has the same name after the ``layerN.`` prefix (its *role*,
        which FP8 exponents are shared by), and the verdict groups stages by ``layerN``.
        Stacks inside stacks (``layers.2.blocks.5``) number their innermost layers in the
        order the program reaches them, so every block of every stage shares its roles."""
        if node not in self.node_names:
            stack = node.meta.get("nn_module_stack") or {}
            path = (list(stack.values())[-1][0] if stack else "") or ""
            match = MODULE_LAYER.search(path)
            op = op_name(node.target).split(".")[-1].strip("<>_ ").replace(" ", "_")
            nested = list(STACKED.finditer(path))
            if len(nested) > 1:  # blocks inside stages (Swin): numbered in order of use
                end = nested[-1].end()
                number = self.nested_layers.setdefault(path[:end], len(self.nested_layers))
                rest = path[end:].lstrip(".")
                base = f"layer{number}." + (f"{rest}.{op}" if rest else op)
            elif match:
                rest = path[match.end():]
                base = f"layer{match.group(1)}." + (f"{rest}.{op}" if rest else op)
            else:
                base = f"{path}.{op}" if path else f"model.{op}"
            count = self.name_counts.get(base, 0)
            self.name_counts[base] = count + 1
            self.node_names[node] = base if count == 0 else f"{base}#{count}"
        return f"{self.node_names[node]}{suffix}"

    def act_precision(self, name: str) -> Precision:
        """FP8 with the exponent calibrated for the value's role (fp8), else F16: for values
        that feed GEMMs."""
        return Precision("F8F143", self.scales.get(role(name), 0)) if self.fp8_at(name) \
            else F16

    def fp8_at(self, name: str) -> bool:
        """FP8 in fp8 mode, outside the layers ``--keep-f16`` names."""
        return self.fp8 and fp8_allowed(name, self.kept)

    def gemm_only(self, node: Any) -> bool:
        """Whether every use of ``node`` (through shape-only ops) is a GEMM's A operand."""
        users = [u for u in node.users if op_name(u.target) != "aten._assert_tensor_metadata"]
        if not users:
            return False
        for user in users:
            kind = op_name(user.target)
            if kind in TRANSPARENT:
                if not self.gemm_only(user):
                    return False
                continue
            position = GEMM_A.get(kind)
            if position is None or len(user.args) <= position or user.args[position] is not node:
                return False
            other = user.args[position + 1] if len(user.args) > position + 1 else None
            if other is None or other in self.dynamic:
                return False
        return True

    def feeds_kept(self, node: Any) -> bool:
        """Whether a use of ``node`` (through shape-only ops) sits in a layer an FP8 recipe
        keeps F16: its value must then stay F16, whatever module computed it."""
        if not self.kept:
            return False
        for user in node.users:
            if op_name(user.target) in TRANSPARENT:
                if self.feeds_kept(user):
                    return True
            elif not fp8_allowed(self.name(user), self.kept):
                return True
        return False

    # ------------------------------------------------------------------ weights and inputs
    def weight(self, key: str, raw: np.ndarray, matrix: bool, table: bool = False) -> int:
        """An IR weight (precision fixed in :meth:`finish`, after any folding into ``raw``):
        a GEMM ``matrix`` (FP8 in fp8 mode), a vector (F16) or a RoPE ``table`` (F32)."""
        if key in self.weights:
            value_id, held, _ = self.weights[key]
            if held.shape == raw.shape and np.array_equal(held, raw):
                return value_id
            key = f"{key}#{len(self.weights)}"
        value_id = self.b.weight(key, TensorType(tuple(raw.shape), F16))
        kind = "table" if table else ("matrix" if matrix else "vector")
        # not copied (a constant is a view of the program's tensor): folds replace a weight
        self.weights[key] = (value_id, np.asarray(raw, dtype=np.float32), kind)
        return value_id

    def shared_weight(self, key: str, raw: np.ndarray) -> int:
        """An F16 vector weight that the program computes rather than holds (an attention
        mask's table), held once however many layers build the same one: a builtin's layers
        share one mask, and so do an import's, in the same memory and the same cycles."""
        held = np.ascontiguousarray(raw, dtype=np.float32)
        digest = (held.shape, hashlib.sha256(held.tobytes()).hexdigest())
        if digest not in self.shared:
            self.shared[digest] = self.weight(key, held, False)
        return self.shared[digest]

    def const_key(self, tensor: Any, fallback: str) -> str:
        return self.const_names.get(id(tensor), fallback)

    def add_input(self, name: str, shape: tuple[int, ...], data: np.ndarray, gemm: bool,
                  make: Callable[[list[np.ndarray]], np.ndarray],
                  precision: Precision | None = None) -> int:
        """A graph input; FP8 (exponent fitted on the data) when it only feeds GEMMs, else
        F16, unless ``precision`` is given (ids: I32)."""
        if precision is None:
            precision = Precision("F8F143", fit_scale_exponent(data)) if gemm and self.fp8 \
                else F16
        value_id = self.b.input(name, TensorType(tuple(shape), precision))
        self.inputs.append(InputSpec(name, value_id, make))
        self.input_values[name] = np.asarray(data, dtype=np.float32).reshape(shape)
        return value_id

    def id_input(self, user: UserInput, node: Any, rows: int) -> int:
        """A program input of ids (``[..., 1]`` I32) for a lookup of a ``rows``-row table;
        ids outside the table are refused (the device's vertex would skip them)."""
        data = np.asarray(self.user[user.index], dtype=np.float64)
        if data.size and (data.min() < 0 or data.max() >= rows or (data % 1).any()):
            raise UsageError(f"input {user.name}: ids must be whole numbers in [0, {rows}), "
                             f"found {data.min():g} to {data.max():g}")
        if user.index in self.id_values:  # checked against this table too, then shared
            return self.id_values[user.index]
        shape, index = (*user.shape, 1), user.index
        value_id = self.add_input(user.name, shape, data, False,
                                  lambda arrays: arrays[index].reshape(shape), I32)
        self.id_values[index] = value_id
        return value_id

    def host_input(self, name: str, shape: tuple[int, ...],
                   make: Callable[[list[np.ndarray]], np.ndarray]) -> int:
        """An I32 input the host computes from the program's inputs (host preprocessing:
        a pooled row's position)."""
        return self.add_input(name, shape, make(self.user), False, make, I32)

    def per_call_input(self, label: str, make: Callable[[list[np.ndarray]], np.ndarray],
                       precision: Precision) -> int:
        """An input the host computes before each call from the position inputs (a cache
        slot, a mask row, RoPE tables).  Inputs computed alike are one input: the same
        values at the example positions and at positions moved on by ``PROBE_SHIFT``."""
        data = np.asarray(make(self.user), np.float32)
        probe = np.asarray(make(self.probe_user()), np.float32)
        key = (label, data.shape, data.tobytes(), probe.tobytes())
        if key not in self.per_call:
            taken = {spec.name for spec in self.inputs}
            name = next(f"{label}{suffix}" for suffix in ("", *(f".{n}" for n in range(1, 9999)))
                        if f"{label}{suffix}" not in taken)
            self.per_call[key] = self.add_input(name, data.shape, data, False, make, precision)
        return self.per_call[key]

    def probe_user(self) -> list[np.ndarray]:
        """The user inputs with the position inputs moved on by ``PROBE_SHIFT``: a second
        call's, to check what the host's arithmetic gives beyond the example's positions."""
        return [u + PROBE_SHIFT if index in self.positions else u
                for index, u in enumerate(self.user)]

    def replay(self, node: Any, arrays: list[np.ndarray]) -> Any:
        """``node``'s value again, the host's arithmetic redone for the user inputs
        ``arrays`` (``frontend/walk.py`` implements it)."""
        raise NotImplementedError("the walk (frontend/walk.py) replays the host's arithmetic")

    def constant_input(self, name: str, rows: np.ndarray, shape: tuple[int, ...]) -> int:
        """A host-made constant streamed as an input (addends, token-mixing matrices): the
        IR has no elementwise op with a weight of the activation's own shape."""
        data = np.asarray(rows, dtype=np.float32)
        return self.add_input(name, shape, data, False, lambda user, data=data: data)

    def user_act(self, user: UserInput, node: Any) -> Act:
        """A user input used as-is (rows ``[..., D]``); FP8 when it only feeds GEMMs."""
        if user.index not in self.user_acts:
            if len(user.shape) < 2:
                raise unsupported(node, f"input {user.name} must have at least 2 dimensions")
            index = user.index
            value = self.add_input(user.name, user.shape, self.user[index],
                                   self.gemm_only(self.placeholder_of(user)),
                                   lambda arrays, index=index: arrays[index])
            self.user_acts[index] = Act(value, user.shape)
        return self.user_acts[user.index]

    def placeholder_of(self, user: UserInput) -> Any:
        return next(n for n, v in self.env.items() if v is user)

    # ------------------------------------------------------------------ lazy values
    def plain(self, act: Act, node: Any) -> Act:
        """``act`` with its lazy factor and addend applied by IR operations."""
        if act.cached and act.dims[2] != act.cached:
            raise unsupported(node, "a KV cache's shared key/value heads used other than by "
                              "attention")
        if act.prefix or act.suffix or act.gap[1]:
            raise unsupported(node, "patch tokens used before the concatenation that completes "
                              "the token sequence")
        if not act.lazy:
            return act
        key = (act.value, act.factor, id(act.addend))
        if key in self.materialized:  # the same lazy value seen through another view
            return act.with_(value=self.materialized[key].value, factor=1.0, addend=None,
                             linear=None)
        value = act.value
        base = act.origin or self.name(node)
        if act.factor != 1.0:
            value = self.b.op("scale", [value], F16, f"{base}.scaled", factor=float(act.factor))
        if act.addend is not None:  # a table as a weight (F16), written once with the others
            ttype = self.b.graph.value(value).type
            addend = self.weight(f"{base}.addend", act.addend.reshape(ttype.rows, ttype.cols),
                                 False)
            value = self.b.op("add", [value, addend], F16, f"{base}.plus")
            self.rewrites.append(f"{node.name}: constant addend as an F16 weight {base}.addend")
        done = act.with_(value=value, factor=1.0, addend=None, linear=None)
        self.materialized[key] = done
        return done

    def a_operand(self, act: Act, node: Any) -> int:
        """The IR value a GEMM reads as A: FP8 in fp8 mode (a cast when it is not)."""
        act = self.plain(act, node)
        value = self.b.graph.value(act.value)
        if self.fp8_at(self.name(node)) and not value.type.precision.is_fp8:
            name = f"{value.name}.fp8"
            cached = next((v.id for v in self.b.graph.values if v.name == name), None)
            if cached is not None:
                return cached
            return self.b.op("cast", [act.value], self.act_precision(name), name)
        return act.value

    def in_order(self, act: Act, node: Any) -> Act:
        """``act`` with its rows in logical order: one ``gather_rows`` (made once for a
        value and an order, however many readers)."""
        if act.order is None and act.group == 1:
            return act
        act = self.plain(act, node)
        source = self.b.graph.value(act.value)
        index = act.order if act.order is not None else RowIndex(np.arange(source.type.rows))
        key = (act.value, index, act.group)
        if key not in self.row_orders:
            side_by_side = {"group": act.group} if act.group > 1 else {}
            self.row_orders[key] = self.b.op("gather_rows", [act.value], source.type.precision,
                                             f"{self.name(node)}.rows", index=index,
                                             **side_by_side)
            side = f", {act.group} side by side a row" if act.group > 1 else ""
            self.rewrites.append(f"{node.name}: rows moved into order by one gather "
                                 f"({len(index)} rows{side})")
        return act.with_(value=self.row_orders[key], order=None, group=1)

    def settle(self, node: Any, value: Any) -> Any:
        """Arguments with symbolic values made concrete (``frontend/walk.py`` implements it:
        it needs the fused-projection and RoPE rules, which sit above this module)."""
        raise NotImplementedError("the walk (frontend/walk.py) settles symbolic values")

    def finish(self) -> Converted:
        """Fix every weight's precision (now that folds are done) and build the graph."""
        graph = self.b.graph
        tensors: dict[str, np.ndarray] = {}
        exact: dict[str, np.ndarray] = {}
        exponents: dict[str, int] = {}  # one FP8 exponent per weight role (as the builtins)
        for name, (_, raw, kind) in self.weights.items():
            if kind == "matrix":
                key = weight_role(name)
                exponents[key] = max(exponents.get(key, -99), fit_scale_exponent(raw))
        for name, (value_id, _, kind) in self.weights.items():
            precision = Precision("F8F143", exponents[weight_role(name)]) if (
                self.fp8_at(name) and kind == "matrix") else (F32 if kind == "table" else F16)
            old = graph.values[value_id]
            graph.values[value_id] = Value(value_id, name, TensorType(old.type.shape, precision),
                                           "weight")
        # each weight held as its storage codes as soon as it is rounded: the device's copy
        # of a model takes its stored bytes, not float32's, beside the exact weights
        store = weight_storer(graph)
        for name, (value_id, raw, _) in self.weights.items():
            precision = graph.values[value_id].type.precision
            tensors[name] = store(name, precision.round_trip(raw)) if self.device_tensors \
                else raw
            exact[name] = raw
        for spec in self.inputs:
            data = self.input_values[spec.name]
            precision = graph.value(spec.value).type.precision
            tensors[spec.name] = precision.round_trip(data)
            exact[spec.name] = data
        names = [v.name for v in graph.values]
        if len(set(names)) != len(names):  # the package and the verdict key values by name
            twice = sorted({n for n in names if names.count(n) > 1})
            raise CompileError(f"importer bug: value names used twice: {', '.join(twice[:3])}")
        return Converted(self.b.build(), tensors, exact, self.inputs, self.outputs,
                         self.rewrites)
