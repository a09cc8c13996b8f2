"""The intermediate representation: precisions, tensor types, block layouts and the graph."""

from ipu_stack.ir.graph import Graph, GraphBuilder, Operation, Value, verify_graph
from ipu_stack.ir.layout import BlockLayout
from ipu_stack.ir.precision import F16, F32, Precision, f143, f152, fit_scale_exponent
from ipu_stack.ir.types import TensorType

__all__ = [
    "BlockLayout",
    "F16",
    "F32",
    "Graph",
    "GraphBuilder",
    "Operation",
    "Precision",
    "TensorType",
    "Value",
    "f143",
    "f152",
    "fit_scale_exponent",
    "verify_graph",
]
