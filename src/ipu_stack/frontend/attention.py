"""Attention helpers two rule families share (eager attention in ``ops_math``, SDPA in
``ops_gemm``): constant masks and biases as the additive table a ``biased_softmax`` adds."""

from __future__ import annotations

from typing import Any

import numpy as np

from ipu_stack.frontend.convert import Converter, unsupported
from ipu_stack.frontend.forms import Act
from ipu_stack.frontend.rules import to_numpy
from ipu_stack.ir.precision import F16


def additive_mask(conv: Converter, node: Any, mask: Any, dims: tuple[int, ...]
                  ) -> np.ndarray | None:
    """A constant attention mask as the additive bias SDPA applies, broadcast to
    ``[B, H, T, T]`` (a boolean mask: 0 where it attends, -inf where not), or None when it
    masks nothing.  A relative position bias (BEiT) arrives here already gathered from its
    index table: torch folded that, since it depends on parameters only."""
    b, t, h, _ = dims
    tensor = mask.detach()
    if tensor.dtype == conv.torch.bool:
        values = np.where(tensor.numpy(), 0.0, -np.inf).astype(np.float32)
    else:
        values = to_numpy(tensor)
    try:
        full = np.broadcast_to(values, (b, h, t, t))
    except ValueError:
        raise unsupported(node, f"an attention mask {list(values.shape)} that does not "
                          f"broadcast to [{b}, {h}, {t}, {t}]") from None
    if not full.any():
        return None
    if np.isneginf(full).all(axis=-1).any():
        raise unsupported(node, "an attention mask that masks every key of a query")
    return np.ascontiguousarray(full)


def softmax_op(conv: Converter, scores: Act, factor: float, bias: np.ndarray | None,
               name: str) -> int:
    """``softmax(factor * scores + bias)``: a plain ``softmax``, or a ``biased_softmax``
    with the bias as an F16 table laid out as the scores are (``[B*H*T, T]``)."""
    if bias is None:
        return conv.b.op("softmax", [scores.value], F16, name, scale=float(factor))
    table = conv.weight(f"{name}.bias", bias.reshape(-1, bias.shape[-1]), False)
    conv.rewrites.append(f"{name}: additive attention bias/mask as the table {name}.bias")
    return conv.b.op("biased_softmax", [scores.value, table], F16, name, scale=float(factor))
