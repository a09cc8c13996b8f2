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
    PAIR_AWARE,
    SIDE_EFFECTS,
    Converted,
    Converter,
    OutputSpec,
    op_name,
    unsupported,
)
from ipu_stack.frontend.forms import Act, UserInput
from ipu_stack.frontend.linear import emit_linear
from ipu_stack.frontend.ops import HANDLERS
from ipu_stack.util.errors import CompileError


class Importer(Converter):
    """Walks an ``ExportedProgram``'s graph in order and builds the IR graph."""

    def run(self) -> Converted:
        torch = self.torch
        signature = self.program.graph_signature
        specs = {spec.arg.name: spec for spec in signature.input_specs}
        user_index = 0
        live = self.live_nodes()
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
                if not any(self._is_dynamic(a) for a in node.all_input_nodes):
                    with torch.no_grad():
                        self.env[node] = node.target(*args, **kwargs)
                    continue
                self.dynamic.add(node)
                kind = op_name(node.target)
                handler = HANDLERS.get(kind)
                if handler is None:
                    raise unsupported(node)
                if kind not in PAIR_AWARE:
                    args, kwargs = self.settle(node, args), self.settle(node, kwargs)
                try:
                    self.env[node] = handler(self, node, *args, **kwargs)
                except TypeError as exc:  # a signature this rule was not written for
                    raise unsupported(node, f"arguments not understood ({exc})") from exc
            elif node.op == "get_attr":
                self.env[node] = getattr(self.program.graph_module, node.target)
            elif node.op == "output":
                self._outputs(node)
        if user_index != len(self.user):
            raise CompileError(f"the program takes {user_index} inputs, {len(self.user)} given")
        if self.attention_fp8:
            attention_operands_in_fp8(self)
        return self.finish()

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
                done = rope.materialize(self, node, value)
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
            act = self.plain(value, arg)
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
