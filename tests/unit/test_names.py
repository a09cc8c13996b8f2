"""Model-part names (``ir/names.py``): value names of builtin towers and imported models read
as parts, stage steps and buffers named by their stage's part, the layer shift of a loop's
passes, and the package record refused entry by entry."""

from __future__ import annotations

import pytest

from ipu_stack.ir.names import Part, parts_from_json, step_label, value_part
from ipu_stack.planning.stages import find_stages, stage_parts
from ipu_stack.workloads import get_workload


@pytest.mark.parametrize(("name", "layer", "what"), [
    ("layer0.attn.q.out", 0, "attn q"),
    ("layer12.fc1.mm", 12, "fc1"),
    ("layer3.mlp.fc1.linear#1", 3, "mlp fc1"),  # an imported model's module path
    ("layer3.self_attn.softmax", 3, "self_attn softmax"),
    ("layer0.attn.q.w", 0, "attn q weights"),
    ("layer0.fc2.b", 0, "fc2 bias"),
    ("layer0.attn.scores.1", 0, "attn scores 1"),  # a piece of a value
    ("layer1.qkv.0.linear", 1, "qkv 0"),  # an nn.ModuleList's first module
    ("post_layernorm.layer_norm", None, "post_layernorm layer_norm"),
    ("x", None, "x"),
])
def test_value_names_read_as_model_parts(name, layer, what) -> None:
    assert value_part(name) == Part(layer, what)


def test_steps_and_buffers_take_their_stages_part_and_a_loops_layer() -> None:
    parts = {1: Part(0, "attn q"), 5: Part(0, "attn probs softmax"), 28: Part(None, "post_ln")}
    assert step_label("stage1.gemm", parts) == "layer 0 attn q gemm"
    assert step_label("stage1.a", parts) == "layer 0 attn q A operand"
    assert step_label("stage1.b", parts) == "layer 0 attn q B operand"
    assert step_label("stage1.received", parts) == "layer 0 attn q received partials"
    assert step_label("stage5.softmax", parts) == "layer 0 attn probs softmax"  # said once
    assert step_label("stage5.rows.copy", parts) == "layer 0 attn probs softmax rows copy"
    assert step_label("stage1.gemm", parts, passes=7) == "layer 7 attn q gemm"
    assert step_label("stage28.layer_norm", parts, passes=7) == "post_ln layer_norm"
    assert step_label("layer0.attn.q.out", parts, passes=2) == "layer 2 attn q"
    assert step_label("stage9.gemm", parts) == "stage9.gemm"  # no part: the name stays


def test_stage_parts_of_a_builtin_layer() -> None:
    workload = get_workload("pe-block")
    graph, _ = workload.build(workload.resolve({}))
    labels = [part.label() for part in stage_parts(graph, find_stages(graph)).values()]
    assert labels == ["layer 0 ln1 layer norm", "layer 0 attn q", "layer 0 attn k",
                      "layer 0 attn v", "layer 0 attn q rope", "layer 0 attn k rope",
                      "layer 0 attn scores", "layer 0 attn probs softmax",
                      "layer 0 attn context", "layer 0 attn o", "layer 0 residual1 add",
                      "layer 0 ln2 layer norm", "layer 0 fc1", "layer 0 fc2",
                      "layer 0 residual2 add"]  # fc1, not the GELU its chain ends in


def test_the_package_record_round_trips_and_refuses_anything_else() -> None:
    parts = {0: Part(None, "patch"), 3: Part(2, "mlp fc1")}
    record = [[k, *p.to_json()] for k, p in parts.items()]
    assert record == [[0, -1, "patch"], [3, 2, "mlp fc1"]]
    assert parts_from_json(record) == parts
    for bad in ({"0": 1}, [[0, 1]], [[0, True, "x"]], [[-1, 0, "x"]], [[0, -2, "x"]],
                [[0, 0, "x" * 201]], [["0", 0, "x"]], list(range(5))):
        with pytest.raises(ValueError):
            parts_from_json(bad)
    with pytest.raises(ValueError, match="at most"):
        parts_from_json([[0, 0, "x"]] * 4, limit=3)
