"""Graph builder and verifier: shape inference and the errors that name the problem."""

from __future__ import annotations

import pytest

from ipu_stack.ir.graph import Graph, GraphBuilder, Operation, Value, verify_graph
from ipu_stack.ir.precision import F16, F32, f143
from ipu_stack.ir.types import TensorType
from ipu_stack.util.errors import CompileError, UsageError


def mlp(batch: tuple[int, ...] = (2, 3), d: int = 8, h: int = 12) -> tuple[GraphBuilder, int]:
    b = GraphBuilder("mlp")
    x = b.input("x", TensorType((*batch, d), f143(-1)))
    w1 = b.weight("w1", TensorType((d, h), f143(-4)))
    bias = b.weight("b1", TensorType((h,), F16))
    w2 = b.weight("w2", TensorType((h, d), f143(-4)))
    y = b.op("matmul", [x, w1], F16, "fc1")
    y = b.op("bias_add", [y, bias], F16, "fc1.bias")
    y = b.op("gelu", [y], F16, "act", approximate="tanh")
    y = b.op("cast", [y], f143(0), "act.fp8")
    out = b.op("matmul", [y, w2], F32, "fc2")
    return b, out


def test_shape_inference_through_a_two_layer_mlp() -> None:
    b, out = mlp(batch=(2, 3), d=8, h=12)
    b.output(out)
    g = b.build()
    shapes = {v.name: v.type.shape for v in g.values}
    assert shapes["fc1"] == (2, 3, 12)
    assert shapes["fc1.bias"] == (2, 3, 12)
    assert shapes["act.fp8"] == (2, 3, 12)
    assert shapes["fc2"] == (2, 3, 8)
    assert g.value(out).role == "output"
    assert g.value(out).type.precision == F32
    assert g.value(out).type.rows == 6 and g.value(out).type.cols == 8
    assert [v.name for v in g.by_role("weight")] == ["w1", "b1", "w2"]
    fc1 = g.producer(g.values[4].id)
    assert fc1 is not None and fc1.kind == "matmul" and fc1.inputs == (0, 1)
    assert [op.kind for op in g.consumers(4)] == ["bias_add"]
    assert g.operations[2].attrs == {"approximate": "tanh"}


def test_dump_lists_values_and_operations() -> None:
    b, out = mlp()
    b.output(out)
    text = b.build().dump()
    lines = text.splitlines()
    assert lines[0] == "graph mlp"
    assert "  %0 x: input TensorType { shape: [2, 3, 8], precision: F8F143 " in text
    assert "  %6 = gelu(%5) approximate=tanh" in lines


def test_matmul_depth_mismatch_names_both_shapes() -> None:
    b = GraphBuilder("g")
    x = b.input("x", TensorType((4, 8), F16))
    w = b.weight("w", TensorType((9, 3), F16))
    with pytest.raises(CompileError, match=r"matmul depth mismatch: \[4, 8\] x \[9, 3\]"):
        b.op("matmul", [x, w], F16, "y")


def test_matmul_right_operand_must_be_a_matrix() -> None:
    b = GraphBuilder("g")
    x = b.input("x", TensorType((4, 8), F16))
    w = b.weight("w", TensorType((2, 8, 3), F16))
    with pytest.raises(CompileError, match=r"matmul depth mismatch: \[4, 8\] x \[2, 8, 3\]"):
        b.op("matmul", [x, w], F16, "y")


def test_bias_shape_mismatch() -> None:
    b = GraphBuilder("g")
    x = b.input("x", TensorType((4, 8), F16))
    bias = b.weight("b", TensorType((7,), F16))
    with pytest.raises(CompileError, match=r"bias shape \[7\] does not match columns 8"):
        b.op("bias_add", [x, bias], F16, "y")


def test_unknown_kind_and_wrong_arity() -> None:
    b = GraphBuilder("g")
    x = b.input("x", TensorType((4, 8), F16))
    with pytest.raises(CompileError, match="unknown operation kind 'frobnicate'"):
        b.op("frobnicate", [x], F16, "y")
    with pytest.raises(CompileError, match="gelu takes 1 inputs, got 2"):
        b.op("gelu", [x, x], F16, "y")


def test_graph_without_outputs_is_refused() -> None:
    b, _ = mlp()
    with pytest.raises(CompileError, match="graph mlp has no outputs"):
        b.build()


def test_tensor_type_needs_positive_sizes() -> None:
    with pytest.raises(UsageError, match=r"tensor shape \[4, 0\] must have positive sizes"):
        TensorType((4, 0), F16)
    assert TensorType((3, 5), F16).nbytes == 30
    assert TensorType((7,), F32).rows == 1


def _values() -> list[Value]:
    t = TensorType((2, 4), F16)
    w = TensorType((4, 4), F16)
    return [
        Value(0, "x", t, "input"),
        Value(1, "w", w, "weight"),
        Value(2, "y", t, "intermediate"),
        Value(3, "z", t, "output"),
    ]


def test_use_before_define() -> None:
    g = Graph(
        "g",
        _values(),
        [
            Operation(0, "gelu", (2,), (3,)),  # reads %2 before the matmul defines it
            Operation(1, "matmul", (0, 1), (2,)),
        ],
    )
    with pytest.raises(CompileError, match=r"operation 0 \(gelu\) reads %2 before it is defined"):
        verify_graph(g)


def test_defined_twice_and_shape_mismatch_and_bad_ids() -> None:
    twice = Graph(
        "g",
        _values(),
        [Operation(0, "matmul", (0, 1), (3,)), Operation(1, "gelu", (0,), (3,))],
    )
    with pytest.raises(CompileError, match="value %3 is defined twice"):
        verify_graph(twice)

    values = _values()
    values[3] = Value(3, "z", TensorType((2, 5), F16), "output")
    bad_shape = Graph("g", values, [Operation(0, "matmul", (0, 1), (3,))])
    with pytest.raises(CompileError, match=r"operation 0 \(matmul\) output shape mismatch"):
        verify_graph(bad_shape)

    values = _values()
    values[2] = Value(5, "y", values[2].type, "intermediate")
    with pytest.raises(CompileError, match="value y has id 5 at position 2"):
        verify_graph(Graph("g", values, []))

    values = _values()
    values[2] = Value(2, "y", values[2].type, "scratch")
    with pytest.raises(CompileError, match="value y has unknown role 'scratch'"):
        verify_graph(Graph("g", values, []))

    with pytest.raises(CompileError, match=r"operation 0 \(gelu\) takes 1 inputs"):
        verify_graph(Graph("g", _values(), [Operation(0, "gelu", (0, 1), (3,))]))


def test_valid_hand_built_graph_passes() -> None:
    g = Graph(
        "g",
        _values(),
        [Operation(0, "matmul", (0, 1), (2,)), Operation(1, "gelu", (2,), (3,))],
    )
    verify_graph(g)  # no exception
