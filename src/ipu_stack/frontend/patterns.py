"""Multi-node patterns completed across several ATen rules: RMS norm written out
(``x * rsqrt(mean(x^2, -1) + eps)``), layer norm written out as the same on ``x - mean(x)``
(Cohere's, and user-written ones), gated activations (``x * sigmoid(1.702 x)``,
``silu(a) * b``) and products of two activations.

A rule that starts a pattern checks the FX graph ahead of it (every step has one user and
the shape the pattern needs) and returns a :class:`Pending` instead of an IR value; the
rules of the following nodes (``mean``, ``add``, ``rsqrt``, ``mul``) advance it, and the
last one emits one IR operation (``rms_norm``, ``activation``, ``swiglu``).  Because the
look-ahead is checked first, a ``Pending`` never reaches any other rule, and a graph that
deviates from the pattern is converted node by node instead (``mul`` of two activations).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ipu_stack.frontend.convert import Converter, op_name, unsupported
from ipu_stack.frontend.forms import Act
from ipu_stack.frontend.rules import norm_activation, out_precision, row_activation
from ipu_stack.ir.precision import F16

QUICK_GELU_BETA = 1.702  # quick_gelu(x) = x * sigmoid(1.702 x) (OpenAI CLIP)
PASS_THROUGH = ("aten.to", "aten._to_copy", "aten.type_as", "aten.contiguous", "aten.clone",
                "aten.alias", "aten.detach")


@dataclass(frozen=True)
class Pending:
    """A partly matched pattern.  ``stage``: ``square`` (x^2), ``mean_square``,
    ``mean_square_eps`` (with ``eps``), ``inverse_rms`` (rsqrt of that), or ``gate`` (an
    activation ``function`` of ``act`` waiting for its product).  ``source`` is the FX node
    whose value the pattern must be multiplied with at the end."""

    stage: str
    act: Act
    source: Any
    eps: float = 0.0
    function: str = ""
    last: Any = None  # the node that ends the pattern (``gelu``: its final product)
    centred: bool = False  # the statistics of ``x - mean(x)``: a layer norm's


@dataclass(frozen=True)
class Centring:
    """``mean(x, -1, keepdim=True)`` whose every use is ``x - mean`` of a layer norm
    written out (:func:`centring` checked it): the subtractions are ``centred`` pendings."""

    act: Act


def only_user(node: Any) -> Any | None:
    """The single FX user of ``node`` (assertion calls aside), or None."""
    users = [u for u in node.users if op_name(u.target) != "aten._assert_tensor_metadata"]
    return users[0] if len(users) == 1 else None


def _scalar(value: Any) -> float | None:
    if isinstance(value, (int, float)):
        return float(value)
    return None


def _through(node: Any) -> Any:
    """``node`` with dtype conversions and copies skipped backwards (an RMS norm upcasts)."""
    while op_name(node.target) in PASS_THROUGH and node.args:
        node = node.args[0]
    return node


def rms_chain(square: Any) -> tuple[float, Any] | None:
    """``(eps, final product)`` when ``square`` (``x^2``) starts ``x * rsqrt(mean(x^2, -1,
    keepdim) + eps)`` (or ``x / sqrt(...)``), else None."""
    mean = only_user(square)
    if mean is None or op_name(mean.target) != "aten.mean":
        return None
    dims = mean.args[1] if len(mean.args) > 1 else mean.kwargs.get("dim")
    keep = mean.args[2] if len(mean.args) > 2 else mean.kwargs.get("keepdim", False)
    if list(dims or []) not in ([-1], [len(square.meta["val"].shape) - 1]) or not keep:
        return None
    add = only_user(mean)
    if add is None or op_name(add.target) != "aten.add" or len(add.args) < 2:
        return None
    eps = _scalar(add.args[1])
    rsqrt = only_user(add)
    root = None if rsqrt is None else op_name(rsqrt.target)
    if eps is None or eps <= 0 or root not in ("aten.rsqrt", "aten.sqrt"):
        return None
    mul = only_user(rsqrt)
    source = _through(square.args[0])
    if mul is None or op_name(mul.target) != ("aten.mul" if root == "aten.rsqrt" else
                                              "aten.div") or (
            root == "aten.sqrt" and mul.args[1] is not rsqrt):
        return None
    other = mul.args[0] if mul.args[1] is rsqrt else mul.args[1]
    if not hasattr(other, "target") or not _same_value(_through(other), source):
        return None
    return eps, mul


def _same_value(a: Any, b: Any) -> bool:
    """Whether FX nodes ``a`` and ``b`` compute the same value: one node, or ``x - m``
    written twice (a layer norm that centres its input once for the variance and once for
    the result)."""
    return a is b or (op_name(a.target) == op_name(b.target) == "aten.sub" and
                      a.args[:2] == b.args[:2])


def centring(mean: Any) -> bool:
    """Whether FX ``mean`` (of ``x`` over its last axis, kept) starts a layer norm written
    out: its every use ``x - mean``, made once or twice, read only by one square that starts
    :func:`rms_chain` and by that chain's final product."""
    x = mean.args[0]
    dims = mean.args[1] if len(mean.args) > 1 else mean.kwargs.get("dim")
    keep = mean.args[2] if len(mean.args) > 2 else mean.kwargs.get("keepdim", False)
    rank = len(getattr(x, "meta", {}).get("val", ()).shape) if hasattr(x, "meta") else 0
    if not keep or list(dims or []) not in ([-1], [rank - 1]):
        return False
    subs = list(mean.users)
    if not subs or any(op_name(u.target) != "aten.sub" or u.args[:2] != (x, mean)
                       for u in subs):
        return False
    readers = {r for u in subs for r in u.users}
    squares = [r for r in readers if op_name(r.target) == "aten.pow" and r.args[1] == 2]
    chain = rms_chain(squares[0]) if len(squares) == 1 else None
    # the centred value read by the square and the final product alone, once or twice made
    return chain is not None and readers == {squares[0], chain[1]}


GELU_TANH = (("aten.mul", 0.044715), ("aten.add", None), ("aten.mul", (2 / np.pi) ** 0.5),
             ("aten.tanh", None), ("aten.add", 1.0))
"""The steps from ``x^3`` of ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``, each with
its constant operand (``None``: the add of ``x``, or the tanh)."""


def gelu_tanh_chain(cube: Any) -> Any | None:
    """The final product when ``cube`` (``x^3``) starts GELU's tanh form written out
    (transformers' ``gelu_new``: ALBERT, GPT-2), ``(x * 0.5) * (1 + tanh(...))``, else None."""
    x, node = _through(cube.args[0]), cube
    for target, constant in GELU_TANH:
        user = only_user(node)
        if user is None or op_name(user.target) != target:
            return None
        others = [a for a in user.args if a is not node]
        if constant is None and target == "aten.add":
            if len(others) != 1 or not hasattr(others[0], "target") or \
                    _through(others[0]) is not x:
                return None
        elif constant is not None and (len(others) != 1 or _scalar(others[0]) is None or
                                       abs(_scalar(others[0]) - constant) > 1e-6):
            return None
        node = user
    final = only_user(node)
    if final is None or op_name(final.target) != "aten.mul" or len(final.args) != 2:
        return None
    half = final.args[0] if final.args[1] is node else final.args[1]
    if not hasattr(half, "target") or op_name(half.target) != "aten.mul":
        return None
    nodes = [a for a in half.args if hasattr(a, "target")]
    if len(half.args) != 2 or len(nodes) != 1 or _through(nodes[0]) is not x or \
            0.5 not in [_scalar(a) for a in half.args]:
        return None
    return final


def gelu_step(conv: Converter, node: Any, pending: Pending) -> Any:
    """A node of a matched GELU tanh chain: the same :class:`Pending` until its final
    product, which emits one ``gelu`` (tanh) of ``x``."""
    if node is not pending.last:
        return pending
    act = row_activation(conv, node, pending.act)
    name = conv.name(node)
    value = conv.b.op("gelu", [act.value], out_precision(conv, node, name), name,
                      approximate="tanh")
    conv.rewrites.append(f"{node.name}: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) as one "
                         "gelu(tanh)")
    return act.with_(value=value, linear=None, norm_scale=None)


def gelu_pending(*args: Any) -> Pending | None:
    """The GELU chain's :class:`Pending` among a rule's arguments, if any."""
    return next((a for a in args if isinstance(a, Pending) and a.stage == "gelu"), None)


def gate_of(node: Any, function: str) -> Any | None:
    """For ``sigmoid`` node ``node``: the FX node ``x`` when the graph computes
    ``x * sigmoid(1.702 x)`` (quick GELU) around it.  For ``silu``: the product's other
    operand when ``silu(a)``'s only use is ``silu(a) * b`` with ``b`` an activation."""
    user = only_user(node)
    if user is None or op_name(user.target) != "aten.mul" or len(user.args) != 2:
        return None
    other = user.args[0] if user.args[1] is node else user.args[1]
    if not hasattr(other, "target"):
        return None
    if function == "silu":
        return other
    scaled = node.args[0]
    if op_name(scaled.target) != "aten.mul" or len(scaled.args) != 2:
        return None
    a, b = scaled.args
    x, beta = (a, _scalar(b)) if hasattr(a, "target") else (b, _scalar(a))
    if beta is None or abs(beta - QUICK_GELU_BETA) > 1e-6 or x is not other:
        return None
    return other


def emit_activation(conv: Converter, node: Any, act: Act, function: str) -> Act:
    """One ``activation`` operation on a row-form activation; FP8 when it feeds only GEMMs."""
    act = row_activation(conv, node, act)
    name = conv.name(node)
    value = conv.b.op("activation", [act.value], out_precision(conv, node, name), name,
                      function=function)
    return act.with_(value=value, linear=None, norm_scale=None)


def multiply(conv: Converter, node: Any, x: Any, y: Any) -> Act:
    """``x * y`` where one operand is a :class:`Pending` or both are activations."""
    if isinstance(y, Pending) and (not isinstance(x, Pending) or y.stage == "inverse_rms"):
        x, y = y, x
    if isinstance(x, Pending) and x.stage == "gate":
        if x.function == "quick_gelu":
            return emit_activation(conv, node, x.act, "quick_gelu")
        gate = row_activation(conv, node, x.act)
        up = row_activation(conv, node, y)
        _same_layout(node, gate, up)
        name = conv.name(node)
        value = conv.b.op("swiglu", [gate.value, up.value], out_precision(conv, node, name), name)
        conv.rewrites.append(f"{node.name}: silu(a) * b as one swiglu operation")
        return gate.with_(value=value, linear=None, norm_scale=None)
    if isinstance(x, Pending) and x.stage == "inverse_rms" and x.centred:
        return _layer_norm(conv, node, x, y)
    if isinstance(x, Pending) and x.stage == "inverse_rms":
        act, group = norm_activation(conv, node, y)
        name = conv.name(node)
        cols = conv.b.graph.value(act.value).type.cols
        key = f"{name}.weight"
        gamma = conv.weight(key, np.ones(cols, np.float32), False)
        value = conv.b.op("rms_norm", [act.value, gamma], out_precision(conv, node, name), name,
                          eps=float(x.eps), **({} if group is None else {"group": group}))
        conv.rewrites.append(f"{node.name}: x * rsqrt(mean(x^2) + eps) as one rms_norm")
        return act.with_(value=value, linear=None, norm_scale=conv.b.graph.value(gamma).name)
    if isinstance(x, Pending) or isinstance(y, Pending):
        raise unsupported(node, "a partly matched RMS norm or gated activation")
    a, b = row_activation(conv, node, x), row_activation(conv, node, y)
    _same_layout(node, a, b)
    value = conv.b.op("mul", [a.value, b.value], F16, conv.name(node))
    return a.with_(value=value, linear=None, norm_scale=None)


def _layer_norm(conv: Converter, node: Any, stats: Pending, centred: Any) -> Act:
    """``(x - mean) * rsqrt(mean((x - mean)^2) + eps)``: one ``layer_norm``, scale ones and
    shift zeros, its scale foldable as an RMS norm's is."""
    if not isinstance(centred, Pending) or centred.stage != "centred" or \
            centred.act.value != stats.act.value:
        raise unsupported(node, "a partly matched layer norm")
    act = row_activation(conv, node, centred.act)
    name = conv.name(node)
    cols = act.shape[-1]
    gamma = conv.weight(f"{name}.weight", np.ones(cols, np.float32), False)
    beta = conv.weight(f"{name}.bias", np.zeros(cols, np.float32), False)
    value = conv.b.op("layer_norm", [act.value, gamma, beta], out_precision(conv, node, name),
                      name, eps=float(stats.eps))
    conv.rewrites.append(f"{node.name}: (x - mean) * rsqrt(var + eps) as one layer_norm")
    return act.with_(value=value, linear=None, norm_scale=conv.b.graph.value(gamma).name)


def _same_layout(node: Any, a: Act, b: Act) -> None:
    if a.shape != b.shape or a.form != b.form or a.dims != b.dims:
        raise unsupported(node, f"product of {a.form} {list(a.shape)} and {b.form} "
                          f"{list(b.shape)} (only equal shapes)")


def advance(node: Any, pending: Pending, stage: str, eps: float = 0.0) -> Pending:
    """The next step of an RMS norm's statistics (``mean``, ``+ eps``, ``rsqrt``)."""
    order = {"mean_square": "square", "mean_square_eps": "mean_square",
             "inverse_rms": "mean_square_eps"}
    if order[stage] != pending.stage:
        raise unsupported(node, f"an RMS norm's statistics out of order ({pending.stage} "
                          f"then {stage})")
    return replace(pending, stage=stage, eps=eps or pending.eps)


def fold_norm_scale(conv: Converter, node: Any, act: Act, scale: np.ndarray) -> Act:
    """``rms_norm(x) * gamma`` with ``gamma`` per channel: folded into the norm's scale."""
    key = act.norm_scale
    value_id, raw, kind = conv.weights[key]  # type: ignore[index]
    scale = np.tile(scale.astype(np.float32), raw.size // scale.size)  # a head's, every head
    conv.weights[key] = (value_id, raw * scale, kind)  # type: ignore[index]
    conv.rewrites.append(f"{node.name}: per-channel scale folded into {key}")
    return act.with_(norm_scale=None)
