"""Fusion into stages: GEMM stages (a matmul and the elementwise chain after it) and row stages.

A GEMM stage is ``matmul`` or ``head_matmul`` followed by single-consumer elementwise
operations (``bias_add`` with a weight bias, ``gelu``, ``activation``, ``cast``, ``scale``)
that the reduce kernel applies while it finishes the partial sums; each keeps its own output
precision, so the chain rounds exactly where the graph does.  Every other operation
(``layer_norm``, ``rms_norm``, ``softmax``, ``add``, ``mul``, ``swiglu``, ``rope`` and
unfused elementwise operations) is a row stage: it needs whole rows, so its inputs are
exchanged into a row layout first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ipu_stack.ir.graph import Graph, Operation
from ipu_stack.ir.names import Part, value_part
from ipu_stack.util.errors import CompileError

ELEMENTWISE = ("bias_add", "gelu", "activation", "cast", "scale")
ROW_OPS = ("layer_norm", "rms_norm", "softmax", "biased_softmax", "add", "mul", "swiglu", "rope",
           "embedding", "gather_rows", "cache_write", "cache_fill", "argmax",
           *ELEMENTWISE)


@dataclass(frozen=True)
class GemmStage:
    """``out = chain(a @ b)``; ``operations`` are the graph operations it covers."""

    index: int
    a: int
    b: int
    bias: int | None
    out: int
    chain: tuple[tuple[Any, ...], ...]
    operations: tuple[int, ...] = field(default=())
    kind: str = "matmul"
    attrs: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


@dataclass(frozen=True)
class RowStage:
    """One row-local operation on whole rows."""

    index: int
    op: int
    kind: str
    inputs: tuple[int, ...]
    out: int
    attrs: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


Stage = GemmStage | RowStage


def stage_operations(stage: Stage) -> tuple[int, ...]:
    """The graph operations a stage covers, in order."""
    return stage.operations if isinstance(stage, GemmStage) else (stage.op,)


def chain_step(graph: Graph, op: Operation) -> tuple[Any, ...]:
    """The epilogue/row-kernel step for one elementwise operation."""
    precision = graph.value(op.outputs[0]).type.precision.to_json()
    if op.kind == "bias_add":
        return ("bias", precision)
    if op.kind == "gelu":
        approximate = op.attrs.get("approximate", "tanh")
        if approximate not in ("tanh", "none"):
            raise CompileError(f"gelu approximate={approximate!r} is not tanh or none")
        return ("gelu_tanh" if approximate == "tanh" else "gelu_erf", precision)
    if op.kind == "activation":
        return (str(op.attrs["function"]), precision)
    if op.kind == "scale":
        return ("scale", precision, float(op.attrs["factor"]))
    return ("cast", precision)


def _fuse_chain(graph: Graph, op: Operation, allow_bias: bool) -> tuple[list, list[int], int | None, int]:
    chain: list[tuple[Any, ...]] = [("round", graph.value(op.outputs[0]).type.precision.to_json())]
    ops = [op.id]
    bias = None
    current = op.outputs[0]
    while graph.value(current).role != "output":
        users = graph.consumers(current)
        if len(users) != 1 or users[0].kind not in ELEMENTWISE:
            break
        user = users[0]
        if user.kind == "bias_add":
            if not allow_bias or bias is not None or graph.value(user.inputs[1]).role != "weight":
                break
            bias = user.inputs[1]
        chain.append(chain_step(graph, user))
        ops.append(user.id)
        current = user.outputs[0]
    return chain, ops, bias, current


def find_stages(graph: Graph) -> list[Stage]:
    """Group every operation into a stage, or say which one cannot be."""
    covered: set[int] = set()
    stages: list[Stage] = []
    for op in graph.operations:
        if op.id in covered:
            continue
        if op.kind in ("matmul", "head_matmul"):
            a, b = op.inputs
            if op.kind == "matmul" and graph.value(b).role != "weight":
                raise CompileError(f"matmul {op.id}: right operand must be a weight")
            chain, ops, bias, out = _fuse_chain(graph, op, allow_bias=op.kind == "matmul")
            covered.update(ops)
            stages.append(GemmStage(len(stages), a, b, bias, out, tuple(chain), tuple(ops),
                                    op.kind, dict(op.attrs)))
        elif op.kind in ROW_OPS:
            covered.add(op.id)
            stages.append(RowStage(len(stages), op.id, op.kind, op.inputs, op.outputs[0],
                                   dict(op.attrs)))
        else:
            raise CompileError(f"operation {op.id} ({op.kind}) has no lowering")
    return stages


def sibling_runs(stages: list[Stage]) -> list[list[int]]:
    """Runs of consecutive GEMM stages that multiply the same A operand (a layer's q, k
    and v; its gate and up projections), by stage index; runs of one left out."""
    runs: list[list[int]] = []
    for index, stage in enumerate(stages):
        if not isinstance(stage, GemmStage):
            continue
        previous = stages[runs[-1][-1]] if runs else None
        if isinstance(previous, GemmStage) and runs[-1][-1] == index - 1 and \
                previous.a == stage.a:
            runs[-1].append(index)
        else:
            runs.append([index])
    return [run for run in runs if len(run) > 1]


def stage_parts(graph: Graph, stages: list[Stage]) -> dict[int, Part]:
    """Each stage's model part (``ir.names``): a GEMM stage's is its product's (``fc1``,
    not the GELU its chain ends in); a row stage's is its output's, with the operation
    named when the value's name does not say it (``ln1 layer norm``)."""
    parts: dict[int, Part] = {}
    for stage in stages:
        if isinstance(stage, GemmStage):
            first = graph.operations[stage.operations[0]] if stage.operations else None
            parts[stage.index] = value_part(graph.value(
                first.outputs[0] if first is not None else stage.out).name)
            continue
        part = value_part(graph.value(stage.out).name)
        word = stage.kind.replace("_", " ")
        if word not in part.what and stage.kind not in part.what:
            part = Part(part.layer, f"{part.what} {word}")
        parts[stage.index] = part
    return parts
