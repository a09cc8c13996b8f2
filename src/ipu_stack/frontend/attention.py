"""Attention helpers two rule families share (eager attention in ``ops_math``, SDPA in
``ops_gemm``): constant masks and biases as the additive table a ``biased_softmax`` adds;
and the ``--attention fp8`` pass the walk runs on the finished graph."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import numpy as np

from ipu_stack.frontend.convert import Converter, unsupported
from ipu_stack.frontend.forms import Act
from ipu_stack.frontend.rules import to_numpy
from ipu_stack.ir.graph import Graph
from ipu_stack.ir.precision import F16
from ipu_stack.ir.types import TensorType
from ipu_stack.util.log import event
from ipu_stack.workloads.swin import split_tables

LOG = logging.getLogger("ipu_stack.frontend")


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
    with the bias as an F16 table laid out as the scores are (``[B*H*T, T]``).  A bias of
    zeros (a padding mask of sequences without padding, as an ONNX export folds it) adds
    nothing: a plain softmax."""
    if bias is None or not bias.any():
        return conv.b.op("softmax", [scores.value], F16, name, scale=float(factor))
    rows = bias.reshape(-1, bias.shape[-1])
    # a bias that differs between heads (a relative position bias) is held as the rows
    # that repeat; a mask the heads share (causal, padding) keeps its whole table
    per_head = bias.ndim == 4 and bias.shape[1] > 1 and not np.array_equal(
        bias, np.broadcast_to(bias[:, :1], bias.shape))
    period = table_period(rows, bias.shape[0]) if per_head else len(rows)
    # split where the builtin Swin splits them by default
    split = per_head and split_tables("fp8" if conv.fp8 else "f16")
    parts = head_and_sequence_parts(bias) if split else None
    if parts is not None and len(parts[0]) + len(parts[1]) < period:
        heads_part, mask = parts
        table = conv.weight(f"{name}.bias", heads_part, False)
        rows_mask = conv.weight(f"{name}.mask", mask, False)
        conv.rewrites.append(f"{name}: additive attention bias as the table {name}.bias "
                             f"(every {len(heads_part)} rows) and mask {name}.mask (a block "
                             f"a sequence, each for its {bias.shape[1]} heads)")
        tokens = bias.shape[-1]
        return conv.b.op("biased_softmax", [scores.value, table, rows_mask], F16, name,
                         scale=float(factor), table_maps=[[1, 1], [tokens, bias.shape[1]]])
    table = conv.weight(f"{name}.bias", rows[:period], False) if per_head else \
        conv.shared_weight(f"{name}.bias", rows)
    conv.rewrites.append(f"{name}: additive attention bias/mask as the table "
                         f"{conv.b.graph.values[table].name}"
                         + (f", repeated every {period} rows" if period < len(rows) else ""))
    return conv.b.op("biased_softmax", [scores.value, table], F16, name, scale=float(factor))


SUM_TOLERANCE = 1e-4  # float32 rounding of the folded sum's largest terms (about 100)


def head_and_sequence_parts(bias: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """A ``[S, H, T, T]`` bias as a head part (``[H T, T]`` rows, each sequence's) plus a
    sequence part the heads share (``[S' T, T]`` rows, its period over the sequences), or
    None where it is not such a sum, or the sequence part is zero.  torch folds a shifted
    Swin block's relative position bias and shift mask into one constant: held whole it is
    ``windows`` times the bias's bytes a layer."""
    sequences, heads, tokens, _ = bias.shape
    heads_part = bias[0]
    sequence_part = bias[:, 0] - heads_part[0]
    # the sum torch made, again in float32 (a mask's -100 beside a bias of about 0.02
    # carries float32 rounding)
    again = sequence_part[:, None] + heads_part[None]
    if not np.allclose(again, bias, rtol=0.0, atol=SUM_TOLERANCE) or not sequence_part.any():
        return None
    mask = sequence_part.reshape(-1, tokens)
    return (heads_part.reshape(heads * tokens, tokens),
            mask[:table_period(mask, sequences)])


def table_period(rows: np.ndarray, sequences: int) -> int:
    """The fewest rows of a ``[B H T, T]`` bias table that repeat to make it, a whole number
    of sequences' rows (``biased_softmax`` holds one period: a Swin layer's relative
    position bias is the same for every image, its shift mask for every head)."""
    per_sequence = len(rows) // sequences
    for count in range(1, sequences + 1):
        if sequences % count:
            continue
        period = count * per_sequence
        if np.array_equal(rows.reshape(-1, period, rows.shape[-1]),
                          np.broadcast_to(rows[:period], (len(rows) // period, period,
                                                          rows.shape[-1]))):
            return period
    return len(rows)


# the ops whose output a tile can store in FP8 itself (a GEMM epilogue's last step, or a row
# kernel's store), as the builtins' --attention fp8 has the projections, RoPE and the softmax do
WRITES_FP8 = ("matmul", "bias_add", "rope", "softmax", "biased_softmax")


def attention_operands_in_fp8(conv: Converter) -> int:
    """``--attention fp8`` on an imported graph: give both operands of each ``head_matmul``
    FP8 storage at their role's calibrated exponent, so that Q.K^T and P.V run in the AMP's
    native FP8 mode with FP16 partials, as the builtin towers' do.

    An operand changes only where its producer can write FP8 itself (``WRITES_FP8``) and
    nothing but attention products reads it, so no cast is added and no other consumer sees
    a rounding it did not ask for; a product whose two operands cannot both change (a
    constant pooling query, a value read elsewhere) keeps F16 and is named in the rewrites.
    Returns how many products now run in FP8."""
    graph = conv.b.graph
    converted = 0
    for op in graph.operations:
        if op.kind != "head_matmul":
            continue
        operands = [graph.value(i) for i in op.inputs]
        if all(v.type.precision.is_fp8 for v in operands):
            converted += 1
            continue
        movable = [v for v in operands if not v.type.precision.is_fp8]
        if not all(_writes_fp8_for_attention_only(graph, v.id) for v in movable):
            conv.rewrites.append(f"{graph.value(op.outputs[0]).name}: attention product kept "
                                 "in F16 (an operand is not an FP8-storable value read only "
                                 "by attention)")
            continue
        for value in movable:
            precision = conv.act_precision(value.name)
            graph.values[value.id] = replace(value, type=TensorType(value.type.shape,
                                                                    precision))
        conv.rewrites.append(f"{graph.value(op.outputs[0]).name}: attention operands "
                             f"{', '.join(v.name for v in movable)} stored in FP8")
        converted += 1
    products = sum(op.kind == "head_matmul" for op in graph.operations)
    if converted < products:
        event(LOG, "--attention fp8 keeps attention products in F16", level=logging.WARNING,
              kept=products - converted, products=products,
              why="an operand is not an FP8-storable value read only by attention (an F16 "
              "KV cache, a constant query, a value read elsewhere)")
    return converted


def attention_ran_in(graph: Graph) -> str:
    """What the attention products of an imported graph run in, for its record: ``f16``,
    ``fp8``, or ``fp8 (k of n products)`` where ``--attention fp8`` could move only some."""
    products = [op for op in graph.operations if op.kind == "head_matmul"]
    fp8 = sum(all(graph.value(i).type.precision.is_fp8 for i in op.inputs) for op in products)
    if fp8 == 0 or not products:
        return "f16"
    return "fp8" if fp8 == len(products) else f"fp8 ({fp8} of {len(products)} products)"


def _writes_fp8_for_attention_only(graph: Graph, value_id: int) -> bool:
    value = graph.value(value_id)
    producer = graph.producer(value_id)
    if value.role != "intermediate" or producer is None or producer.kind not in WRITES_FP8:
        return False
    return all(user.kind == "head_matmul" for user in graph.consumers(value_id))
