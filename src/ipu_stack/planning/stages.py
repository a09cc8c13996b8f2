"""Fusion into stages: a matmul and the elementwise operations that follow it.

A GEMM stage is ``matmul`` followed by a chain of single-consumer elementwise operations
(``bias_add`` with a weight bias, ``gelu``, ``cast``) that the reduce kernel applies while it
finishes the partial sums.  Each fused operation keeps its own output precision: the chain
rounds to it exactly where the graph does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ipu_stack.ir.graph import Graph, Operation
from ipu_stack.util.errors import CompileError

ELEMENTWISE = ("bias_add", "gelu", "cast")


@dataclass(frozen=True)
class GemmStage:
    """``out = chain(a @ b)``; ``operations`` are the graph operations it covers."""

    index: int
    a: int
    b: int
    bias: int | None
    out: int
    chain: tuple[tuple[str, dict[str, Any]], ...]
    operations: tuple[int, ...] = field(default=())


def _chain_step(graph: Graph, op: Operation) -> tuple[str, dict[str, Any]]:
    precision = graph.value(op.outputs[0]).type.precision.to_json()
    if op.kind == "bias_add":
        return ("bias", precision)
    if op.kind == "gelu":
        approximate = op.attrs.get("approximate", "tanh")
        if approximate not in ("tanh", "none"):
            raise CompileError(f"gelu approximate={approximate!r} is not tanh or none")
        return ("gelu_tanh" if approximate == "tanh" else "gelu_erf", precision)
    return ("cast", precision)


def find_stages(graph: Graph) -> list[GemmStage]:
    """Group every operation into a GEMM stage, or say which one cannot be."""
    covered: set[int] = set()
    stages: list[GemmStage] = []
    for op in graph.operations:
        if op.id in covered:
            continue
        if op.kind != "matmul":
            raise CompileError(
                f"operation {op.id} ({op.kind}) does not follow a matmul; "
                "standalone elementwise operations are not supported yet"
            )
        a, b = op.inputs
        if graph.value(b).role != "weight":
            raise CompileError(f"matmul {op.id}: right operand must be a weight")
        chain = [("round", graph.value(op.outputs[0]).type.precision.to_json())]
        ops = [op.id]
        bias = None
        current = op.outputs[0]
        while graph.value(current).role != "output":
            users = graph.consumers(current)
            if len(users) != 1 or users[0].kind not in ELEMENTWISE:
                break
            user = users[0]
            if user.kind == "bias_add":
                if bias is not None or graph.value(user.inputs[1]).role != "weight":
                    break
                bias = user.inputs[1]
            chain.append(_chain_step(graph, user))
            ops.append(user.id)
            current = user.outputs[0]
        covered.update(ops)
        stages.append(GemmStage(len(stages), a, b, bias, current, tuple(chain), tuple(ops)))
    return stages
