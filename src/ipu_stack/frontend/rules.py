"""The rule registry every ATen rule family registers into, and the argument helpers the
families share.

A rule gets the converter, the FX node and its arguments with nodes replaced by what the
converter made of them (constants, :class:`Act`, :class:`UserInput`); it returns the node's
value.  Operations whose inputs are all constants never reach a rule: the converter runs
them in torch (constant folding: ``embedding(weight, arange)``, ``cls.expand(...)``, masks).

This module sits below every family (``ops_view``, ``ops_math``, ``ops_gemm``,
``ops_act``), and ``frontend/ops.py`` imports the families, so no family imports another's
private helpers and nothing is registered by a late import.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ipu_stack.frontend.convert import TRANSPARENT, Converter, op_name, unsupported
from ipu_stack.frontend.forms import Act, UserInput
from ipu_stack.ir.precision import F16, Precision

Handler = Callable[..., Any]
HANDLERS: dict[str, Handler] = {}


def rule(*names: str) -> Callable[[Handler], Handler]:
    """Register ``function`` as the rule of the ATen overload packets ``names``."""
    def register(function: Handler) -> Handler:
        for name in names:
            HANDLERS[name] = function
        return function
    return register


def to_numpy(tensor: Any) -> np.ndarray:
    """A constant torch tensor as float32 numpy: read-only, and where the tensor is float32
    already a view of its memory, so an imported model's weights are held once (by the
    loaded program) and no rule can change them in place."""
    import torch

    array = tensor.detach().to(dtype=torch.float32).numpy()
    array.flags.writeable = False
    return array


def is_tensor(value: Any) -> bool:
    return hasattr(value, "detach") and hasattr(value, "shape")


def constant_array(value: Any) -> np.ndarray:
    """A constant operand (tensor or Python number) as numpy."""
    return to_numpy(value) if is_tensor(value) else np.asarray(float(value))


def activation(conv: Converter, node: Any, value: Any) -> Act:
    """An activation argument (a user input used as-is becomes one here)."""
    if isinstance(value, UserInput):
        return conv.user_act(value, node)
    if not isinstance(value, Act):
        raise unsupported(node, "expected an activation")
    if value.rotary_of:
        raise unsupported(node, "the turned channels of a query or key used other than by "
                          "its partial RoPE")
    if value.form == "column" and op_name(node.target) not in TRANSPARENT:
        raise unsupported(node, f"a squeezed {list(value.shape)} value used other than as an "
                                "output or viewed back")
    return value


def row_activation(conv: Converter, node: Any, x: Any) -> Act:
    """An activation with its lazy factor/addend applied, in a form whose IR rows are the
    logical rows in some order (``rows``, ``replicated``, ``tmajor``): what a row-local
    operation needs."""
    act = conv.plain(activation(conv, node, x), node)
    if act.form not in ("rows", "replicated", "tmajor"):
        raise unsupported(node, f"a row operation on a {act.form}-form value")
    return act


def norm_activation(conv: Converter, node: Any, x: Any) -> tuple[Act, int | None]:
    """An RMS norm's input and the width it normalises: ``None`` for whole rows, or the head
    width of a heads-form value (``[B, T, H, d]`` or ``[B, H, T, d]``, its heads side by side
    in each row: Qwen3's and Gemma 3's norm of each head of q and k)."""
    act = conv.plain(activation(conv, node, x), node)
    if act.form in ("heads", "heads_major") and act.shape[-1] == act.dims[3]:
        return act, act.dims[3]
    return row_activation(conv, node, act), None


def out_precision(conv: Converter, node: Any, name: str) -> Precision:
    """FP8 when every use is a GEMM's A operand (the builtins' policy), else F16."""
    return conv.act_precision(name) if conv.fp8 and conv.gemm_only(node) and \
        not conv.feeds_kept(node) else F16
