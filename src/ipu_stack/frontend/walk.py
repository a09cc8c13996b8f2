"""The walk over a ``torch.export`` program's FX graph: each node to a constant (folded by
running it in torch), an activation (through its ATen rule) or nothing.

:class:`Importer` is the :class:`~ipu_stack.frontend.convert.Converter` with the walk; it
sits above every rule family (``frontend/ops.py``), so the families reach the walk only
through the converter they are handed (``conv.settle``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ipu_stack.frontend import fused, rope
from ipu_stack.frontend.attention import attention_operands_in_fp8
from ipu_stack.frontend.convert import (
    GROUP_AWARE,
    ORDER_AWARE,
    PAIR_AWARE,
    SIDE_EFFECTS,
    Converted,
    Converter,
    OutputSpec,
    op_name,
    unsupported,
    where,
)
from ipu_stack.frontend.forms import Act, UserInput
from ipu_stack.frontend.linear import emit_linear
from ipu_stack.frontend.ops import HANDLERS
from ipu_stack.frontend.ops_cache import CACHE_WRITES, position_inputs
from ipu_stack.frontend.ops_lookup import position_lookup, reads_positions
from ipu_stack.frontend.sizing import check_made, recorded_bytes
from ipu_stack.util.errors import CompileError

# device operations that may read the host's arithmetic on positions (``_check_host_use``)
HOST_READERS = {*CACHE_WRITES, "aten.scaled_dot_product_attention", "aten.mul", "aten.add"}


class Importer(Converter):
    """Walks an ``ExportedProgram``'s graph in order and builds the IR graph."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.host_touched: set[Any] = set()  # device nodes reading the host's arithmetic
        self.pair_nodes: dict[int, Any] = {}  # id of a symbolic RoPE value -> its node
        self.chains: dict[Any, list[Any]] = {}
        self.host_cache: tuple[Any, dict[Any, Any]] = ((), {})

    def run(self) -> Converted:
        torch = self.torch
        signature = self.program.graph_signature
        specs = {spec.arg.name: spec for spec in signature.input_specs}
        user_index, made = 0, 0  # made: bytes folded from constants
        live = self.live_nodes()
        positions = set(position_inputs(self.program))
        for node in self.program.graph.nodes:
            self.node = node
            if node.op == "placeholder":
                spec = specs[node.name]
                if spec.kind.name == "USER_INPUT":
                    value = node.meta.get("val")
                    if not isinstance(value, torch.Tensor):
                        # a constant the export fixed (``use_cache=False``): specialised
                        self.env[node] = value
                        continue
                    if user_index >= len(self.user):
                        raise CompileError(f"the program takes more inputs than the "
                                           f"{len(self.user)} given")
                    if node.name in positions:  # the host's arithmetic starts here
                        self.env[node] = torch.as_tensor(
                            self.user[user_index].astype(np.int64)).to(value.dtype)
                        self.host_nodes.add(node)
                        self.positions[user_index] = node
                    else:
                        self.env[node] = UserInput(user_index, node.name, tuple(value.shape))
                        self.dynamic.add(node)
                    user_index += 1
                else:
                    self.env[node] = self._state(spec)
            elif node.op == "call_function":
                if node not in live and op_name(node.target) not in SIDE_EFFECTS:
                    continue  # dead: no output depends on it (e.g. unused attention weights)
                args = _map(node.args, self.env)
                kwargs = _map(node.kwargs, self.env)
                if reads_positions(node, self.host_nodes):  # ids from the host, table here
                    self.env[node] = position_lookup(self, node, args[0])
                    continue
                if not any(self._is_dynamic(a) for a in node.all_input_nodes):
                    size = recorded_bytes(node, views=False)  # folded here: bounded first
                    made += size
                    module, source = where(node)
                    check_made(f"{op_name(node.target)} in module {module} at {source}", size,
                               made)
                    with torch.no_grad():
                        self.env[node] = node.target(*args, **kwargs)
                    if any(a in self.host_nodes for a in node.all_input_nodes):
                        self.host_nodes.add(node)
                    continue
                self.dynamic.add(node)
                kind = op_name(node.target)
                self._check_host_use(node, kind)
                handler = HANDLERS.get(kind)
                if handler is None:
                    raise unsupported(node)
                if kind not in PAIR_AWARE:
                    args, kwargs = self.settle(node, args), self.settle(node, kwargs)
                if kind not in GROUP_AWARE:
                    only_grouped = kind in ORDER_AWARE
                    args = self.ordered(node, args, only_grouped)
                    kwargs = self.ordered(node, kwargs, only_grouped)
                try:
                    self.env[node] = handler(self, node, *args, **kwargs)
                except TypeError as exc:  # a signature this rule was not written for
                    raise unsupported(node, f"arguments not understood ({exc})") from exc
                if node in self.host_touched:
                    self._keep_symbolic(node)
            elif node.op == "get_attr":
                self.env[node] = getattr(self.program.graph_module, node.target)
            elif node.op == "output":
                self._outputs(node)
        if user_index != len(self.user):
            raise CompileError(f"the program takes {user_index} inputs, {len(self.user)} given")
        if self.attention_fp8:
            attention_operands_in_fp8(self)
        converted = self.finish()
        if self.host_nodes:  # the per-call inputs keep this converter for ``replay``, which
            self.weights.clear()  # never reads the weights' float32 copies: let them go
        return converted

    def settle(self, node: Any, value: Any) -> Any:
        """Arguments with symbolic channel-pair values (``frontend/rope.py``) made concrete:
        a rotation becomes one ``rope`` operation; anything else is unsupported."""
        if isinstance(value, fused.Fused):  # used whole: the full GEMM after all
            if id(value) not in self.fused_done:
                self.fused_done[id(value)] = (value, emit_linear(
                    self, value.node, value.x, value.weight, value.key, value.bias,
                    value.bias_key))
            return self.fused_done[id(value)][1]
        if isinstance(value, fused.Split):
            raise unsupported(node, "a fused projection's output used without selecting a part")
        if isinstance(value, rope.Pairs):
            if id(value) not in self.pairs_done:  # one rope per value, however many readers
                source = self.pair_nodes.get(id(value))
                host = None if source is None else (
                    lambda arrays, source=source: self.replay(source, arrays))
                done = rope.materialize(self, node, value, host)
                if done is None:
                    raise unsupported(node, "a per-channel-pair mix that is not a rotation "
                                      "(RoPE)")
                self.pairs_done[id(value)] = (value, done)
            return self.pairs_done[id(value)][1]
        if isinstance(value, rope.PairPart):
            raise unsupported(node, "one component of a (..., d/2, 2) view used on its own")
        if isinstance(value, (list, tuple)):
            return type(value)(self.settle(node, v) for v in value)
        if isinstance(value, dict):
            return {k: self.settle(node, v) for k, v in value.items()}
        return value

    def ordered(self, node: Any, value: Any, only_grouped: bool = False) -> Any:
        """Arguments with every activation's rows in logical order (``Converter.in_order``):
        what a rule that does not track row orders (``ORDER_AWARE``) reads; with
        ``only_grouped``, only those whose rows are merged side by side (``Act.group``),
        which only ``GROUP_AWARE`` rules keep so."""
        if isinstance(value, Act) and (value.group > 1 or (
                value.order is not None and not only_grouped)):
            return self.in_order(value, node)
        if isinstance(value, (list, tuple)):
            return type(value)(self.ordered(node, v, only_grouped) for v in value)
        if isinstance(value, dict):
            return {k: self.ordered(node, v, only_grouped) for k, v in value.items()}
        return value

    def live_nodes(self) -> set[Any]:
        """Nodes some output depends on, and in-place operations with what they read: an
        index table built by ``t[:, :, 0] += k`` (BEiT's relative positions) is written
        through views by calls whose own results nothing reads."""
        roots = [n for n in self.program.graph.nodes if n.op == "output" or mutates(n)]
        live, stack = set(roots), list(roots)
        while stack:
            for source in stack.pop().all_input_nodes:
                if source not in live:
                    live.add(source)
                    stack.append(source)
        return live

    def _check_host_use(self, node: Any, kind: str) -> None:
        """A device operation may read the host's position arithmetic only as a cache
        write's positions, an attention mask, RoPE tables (a product on a query or key
        whose result stays symbolic until it is one ``rope``), or a lookup's ids (the walk
        makes those before this check: ``position_lookup``)."""
        reads = [a for a in node.all_input_nodes if a in self.host_nodes]
        if reads and kind not in HOST_READERS:
            raise unsupported(node, f"a value computed from the position input "
                              f"({reads[0].name}) used on the device other than as cache "
                              "positions, an attention mask, RoPE tables or a table's ids")
        symbolic = kind in PAIR_AWARE and any(
            a in self.host_touched and isinstance(self.env.get(a), (rope.Pairs, rope.PairPart))
            for a in node.all_input_nodes)
        if reads or symbolic:
            self.host_touched.add(node)

    def _keep_symbolic(self, node: Any) -> None:
        """A product with the host's tables must stay a RoPE in the making (replayed at each
        call, ``replay``); the readers of whole tables record their own per-call inputs."""
        value = self.env[node]
        if isinstance(value, (rope.Pairs, rope.PairPart)):
            self.pair_nodes[id(value)] = node
            return
        if op_name(node.target) == "aten.mul" and any(
                a in self.host_nodes for a in node.all_input_nodes):
            raise unsupported(node, "a product with a table computed from the position input "
                              "that is not a rotary embedding")
        self.host_touched.discard(node)  # concrete now: its rule made its per-call inputs

    def replay(self, node: Any, arrays: list[np.ndarray]) -> Any:
        """``node``'s value for the user inputs ``arrays``: the host's arithmetic on the
        positions evaluated again (``_host_values``), then the symbolic RoPE products
        between it and ``node`` (no IR operation may be made here)."""
        env = self._host_values(arrays)
        made = len(self.b.graph.operations)
        for step in self._replay_chain(node):
            args, kwargs = _map(step.args, env), _map(step.kwargs, env)
            env[step] = HANDLERS[op_name(step.target)](self, step, *args, **kwargs)
        if len(self.b.graph.operations) != made:
            raise CompileError(f"importer bug: replaying {node.name} made device operations")
        return env[node]

    def _host_values(self, arrays: list[np.ndarray]) -> dict[Any, Any]:
        """The converter's values with the host's nodes evaluated for ``arrays`` (the last
        evaluation is kept: every per-call input of a call asks for the same; during the
        walk, only until the walk adds a value)."""
        key = (len(self.env),  # the walk may still be adding values
               *(np.asarray(arrays[i]).tobytes() for i in sorted(self.positions)))
        if self.host_cache[0] == key:
            return self.host_cache[1]
        torch = self.torch
        env = dict(self.env)
        for node in self.program.graph.nodes:
            if node not in self.host_nodes:
                continue
            if node.op == "placeholder":
                index = next(i for i, n in self.positions.items() if n is node)
                env[node] = torch.as_tensor(np.asarray(arrays[index]).astype(np.int64)).to(
                    node.meta["val"].dtype)
                continue
            args, kwargs = _map(node.args, env), _map(node.kwargs, env)
            if mutates(node):  # a bookkeeping buffer written in place: write a copy
                args = (args[0].clone(), *args[1:])
            with torch.no_grad():
                env[node] = node.target(*args, **kwargs)
        self.host_cache = (key, env)
        return env

    def _replay_chain(self, node: Any) -> list[Any]:
        """The device nodes between the host's arithmetic and ``node``, in order."""
        if node not in self.chains:
            ancestors, stack = {node}, [node]
            while stack:
                for source in stack.pop().all_input_nodes:
                    if source not in ancestors:
                        ancestors.add(source)
                        stack.append(source)
            self.chains[node] = [n for n in self.program.graph.nodes
                                 if n in ancestors and n in self.host_touched]
        return self.chains[node]

    def _is_dynamic(self, node: Any) -> bool:
        return node in self.dynamic

    def _state(self, spec: Any) -> Any:
        """A parameter, buffer or constant tensor of the program, by its state-dict name."""
        target = spec.target
        program = self.program
        if target in program.state_dict:
            tensor = program.state_dict[target]
        elif target in program.constants:
            tensor = program.constants[target]
        else:
            raise CompileError(f"program input {spec.arg.name} ({spec.kind.name}) has no value")
        tensor = tensor.detach()
        if spec.kind.name == "BUFFER":  # the walk may write a buffer: never the program's own
            tensor = tensor.clone()
        self.const_names[id(tensor)] = target
        return tensor

    def _outputs(self, node: Any) -> None:
        specs = self.program.graph_signature.output_specs
        results = node.args[0]
        index = 0
        for spec, arg in zip(specs, results, strict=True):
            if spec.kind.name != "USER_OUTPUT":
                continue
            value = self.env.get(arg) if hasattr(arg, "op") else arg
            if hasattr(arg, "op"):
                value = self.settle(arg, value)
            if value is None:
                continue  # None outputs are dropped by torch's pytree too
            if not isinstance(value, Act):
                raise unsupported(arg if hasattr(arg, "op") else node,
                                  "an output that is a constant or an unmodified input")
            act = self.in_order(self.plain(value, arg), arg)
            ir = self.b.graph.value(act.value)
            if ir.role != "intermediate":
                raise unsupported(arg, "an output that is an input, or returned twice")
            self.b.output(act.value)
            self.outputs.append(OutputSpec(ir.name, index, _to_ir(act)))
            index += 1


def mutates(node: Any) -> bool:
    """Whether an FX call writes one of its arguments in place (``add_``, ``copy_``, ...)."""
    schema = getattr(node.target, "_schema", None)
    return node.op == "call_function" and bool(getattr(schema, "is_mutable", False))


def _map(value: Any, env: dict[Any, Any]) -> Any:
    """FX arguments with nodes replaced by what the converter made of them."""
    if hasattr(value, "op") and hasattr(value, "users"):
        return env[value]
    if isinstance(value, (list, tuple)):
        return type(value)(_map(v, env) for v in value)
    if isinstance(value, dict):
        return {k: _map(v, env) for k, v in value.items()}
    return value


def _to_ir(act: Act) -> Callable[[np.ndarray], np.ndarray]:
    """How a torch output of ``act``'s logical shape is laid out as its IR value."""
    if act.form == "rows":
        return lambda t: np.asarray(t).reshape(-1, act.shape[-1])
    if act.form == "column":
        return lambda t: np.asarray(t).reshape(-1, 1)
    if act.form in ("heads", "heads_major", "keys_t"):
        b, t_, h, d = act.dims
        order = {"heads": (0, 1, 2, 3), "heads_major": (0, 2, 1, 3), "keys_t": (0, 3, 1, 2)}
        shapes = {"heads": (b, t_, h, d), "heads_major": (b, h, t_, d), "keys_t": (b, h, d, t_)}

        def heads(t: np.ndarray) -> np.ndarray:
            full = np.asarray(t).reshape(shapes[act.form]).transpose(order[act.form])
            return full.reshape(b * t_, h * d)
        return heads
    if act.form == "channels":
        b, dim, n = act.dims
        return lambda t: np.asarray(t).reshape(b, dim, n).transpose(0, 2, 1).reshape(b * n, dim)
    if act.form == "tmajor":
        b, tokens = act.dims
        return lambda t: np.asarray(t).reshape(tokens, b, -1).transpose(1, 0, 2).reshape(
            b * tokens, -1)
    if act.form == "replicated":
        b, tokens = act.dims
        return lambda t: np.repeat(np.asarray(t).reshape(b, 1, -1), tokens, axis=1).reshape(
            b * tokens, -1)
    raise CompileError(f"no output layout for form {act.form}")
