"""The least memory an imported program needs, read from its exported graph before any of it
is imported or run.

An imported model's size is known only once its file is sized (``--batch``, ``--tokens``):
a builtin's footprint comes from its parameters, an import's from the shapes torch.export
recorded on every node.  Without this bound a batch of a million is imported, checked in
float64 against torch or onnxruntime and planned (minutes and tens of gigabytes of host
arrays) before the planner finds that no tiling fits; with it the compile refuses in one
line at once.

The bound is a floor, never an estimate: each used weight at one byte an element in FP8
(two in F16), and the largest product's activation operands (the same size) and its result
(F16: every product the importer builds writes F16, ``frontend/linear.py``) alive together.
Views, broadcasts and element-wise results are not counted (the lowering may never hold them
whole), so a program refused here cannot fit however it is planned.
"""

from __future__ import annotations

import math
from typing import Any

from ipu_stack.frontend.convert import op_name
from ipu_stack.util.errors import CompileError
from ipu_stack.workloads.footprint import MADE_BYTES, VALUE_BYTES, Footprint, gib

PRODUCTS = frozenset({"aten.linear", "aten.addmm", "aten.mm", "aten.matmul", "aten.bmm",
                      "aten.baddbmm", "aten.conv2d", "aten.convolution"})
"""The operations the importer lowers to GEMMs: their operands and result are materialised."""
RESULT_BYTES = 2
"""A product's result element: F16 at every precision."""


def recorded_bytes(node: Any, views: bool = True) -> int:
    """The bytes of the tensors ``node`` produces at their own types, from the shapes and
    types the export recorded (0 where it recorded none, or symbolic sizes; and for a view
    of its input, which makes nothing, unless ``views``)."""
    schema = getattr(node.target, "_schema", None) if hasattr(node, "target") else None
    if not views and schema is not None and any(r.alias_info is not None
                                                for r in schema.returns):
        return 0
    value = node.meta.get("val") if hasattr(node, "meta") else None
    tensors = value if isinstance(value, (tuple, list)) else (value,)
    return sum(math.prod(t.shape) * t.element_size() for t in tensors if all(
        isinstance(s, int) for s in getattr(t, "shape", (None,))) and hasattr(
        t, "element_size"))


def check_made(what: str, made: int, total: int) -> None:
    """Refuse, in one line naming ``what``, a value of ``made`` bytes over ``VALUE_BYTES``
    or one that takes what an import has made on the host (``total``, with it) over
    ``MADE_BYTES``, before it is made."""
    if made > VALUE_BYTES:
        raise CompileError(f"{what} makes a value of {gib(made)}, over the bound of "
                           f"{gib(VALUE_BYTES)} for one value")
    if total > MADE_BYTES:
        raise CompileError(f"{what} takes the values made from the program's constants to "
                           f"{gib(total)}, over the bound of {gib(MADE_BYTES)}")


def _elements(node: Any) -> int | None:
    """Elements of the tensor ``node`` produces, or None where the export recorded no static
    tensor shape (a tuple result, a symbolic size)."""
    value = node.meta.get("val") if hasattr(node, "meta") else None
    shape = getattr(value, "shape", None)
    if shape is None or not all(isinstance(s, int) for s in shape):
        return None
    return math.prod(shape)


def program_footprint(program: Any, precision: str) -> Footprint:
    """A floor on the bytes ``program`` (an ``ExportedProgram`` at static shapes) needs on
    the device at ``precision``: its used weights, state buffers and constants, and the
    largest product's activation operands with its result; and its largest value."""
    size = 1 if precision == "fp8" else 2
    held = {spec.arg.name for spec in program.graph_signature.input_specs
            if spec.kind.name != "USER_INPUT"}
    weight_bytes, largest, what = 0, 0, "no product's operands"
    value, value_what = 0, ""
    for node in program.graph.nodes:
        if node.op == "call_function" and (produced := recorded_bytes(node)) > value:
            value = produced
            value_what = f"{op_name(node.target)} {node.name}'s result"
        if node.op == "placeholder" and node.name in held and node.users:
            weight_bytes += (_elements(node) or 0) * size
        elif node.op == "call_function" and op_name(node.target) in PRODUCTS:
            operands = {a.name: _elements(a) for a in node.args
                        if hasattr(a, "op") and a.name not in held}
            together = sum(n or 0 for n in operands.values()) * size \
                + (_elements(node) or 0) * RESULT_BYTES
            if together > largest:
                largest = together
                shape = "x".join(str(s) for s in getattr(node.meta.get("val"), "shape", ()))
                what = f"{op_name(node.target)} {node.name}'s operands and {shape} result"
    return Footprint(weight_bytes, largest, what, 1, "", weight_bytes, value, value_what)
