"""The GEMM shape of a planned stage, for the memory tests' own lowering (as
``pipeline.stage_shape`` gives it, kept here so these tests import no later stage than
memory)."""

from __future__ import annotations

from typing import Any

from ipu_stack.planning.gemm import GemmShape


def stage_shape(graph: Any, stage: Any) -> GemmShape:
    a, b = graph.value(stage.a).type, graph.value(stage.b).type
    return GemmShape(op=stage.index, rows=a.rows, depth=a.cols, cols=b.shape[1],
                     a_itemsize=a.precision.itemsize,
                     fp8=a.precision.is_fp8 and b.precision.is_fp8,
                     chain=stage.chain, has_bias=stage.bias is not None)
