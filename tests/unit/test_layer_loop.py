"""Finding identical layers (``planning.repeat``): the loop found on stacked workloads, its
value maps, shared against per-layer weights, and the graphs that must not loop."""

from __future__ import annotations

import numpy as np
import pytest

from ipu_stack.cli import parse_workload
from ipu_stack.ir.graph import GraphBuilder
from ipu_stack.ir.precision import F16
from ipu_stack.ir.types import TensorType
from ipu_stack.planning.repeat import find_layer_loop
from ipu_stack.planning.stages import find_stages

SMALL = ["--tokens", "17", "--dim", "64", "--heads", "4", "--hidden", "96"]


def _loop(workload: str, *argv: str):
    w, params = parse_workload(workload, [*argv])
    graph, _ = w.build(params)
    stages = find_stages(graph)
    return graph, stages, find_layer_loop(graph, stages)


def test_stacked_siglip_layers_loop_with_per_layer_weights():
    graph, stages, loop = _loop("siglip-layer", *SMALL, "--blocks", "3")
    assert loop is not None
    assert (loop.start, loop.length, loop.count) == (0, 13, 3)
    assert len(loop.compact(stages)) == 13
    assert graph.value(loop.carried_in).name == "x"
    assert graph.value(loop.carried_out).name == "layer0.residual2"
    names = {graph.value(v).name for v in loop.slot_weights}
    assert len(names) == 16 and all(n.startswith("layer0.") for n in names)
    assert {"layer0.attn.q.w", "layer0.fc2.b", "layer0.ln2.gamma"} <= names
    for k in range(3):
        for v0 in loop.slot_weights:
            assert graph.value(loop.value(k, v0)).name == graph.value(v0).name.replace(
                "layer0.", f"layer{k}.")
    # iteration k reads the previous iteration's result where iteration 0 read the input
    assert graph.value(loop.value(2, loop.carried_in)).name == "layer1.residual2"
    assert [loop.multiplicity(i) for i in range(13)] == [3] * 13


def test_tower_loops_between_stem_and_head_and_shares_rope_tables():
    graph, stages, loop = _loop("pe-vision", "--image", "28", "--patch", "7", "--dim", "64",
                                "--heads", "4", "--hidden", "96", "--layers", "3")
    assert loop is not None and loop.count == 3
    names = [graph.value(s.out).name for s in loop.compact(stages)]
    assert names[: loop.start] == ["patch.mm", "embed", "ln_pre.out"]
    assert names[-1] == "post_ln.out"
    assert graph.value(loop.carried_in).name == "ln_pre.out"
    slot_names = {graph.value(v).name for v in loop.slot_weights}
    assert not {"rope.cos", "rope.sin"} & slot_names  # one table for every layer
    assert [loop.multiplicity(i) for i in range(len(names))] == (
        [1] * loop.start + [3] * loop.length + [1])


def test_one_layer_has_no_loop():
    assert _loop("siglip-layer", *SMALL)[2] is None


def _residual_stack(widths: list[int], skip_from_input: int | None = None):
    """``x <- x + (layer_norm(x) @ w_k) @ v_k`` per layer; ``widths`` the hidden sizes;
    ``skip_from_input``: that layer adds the original input instead of its own input."""
    b = GraphBuilder("stack")
    x0 = b.input("x", TensorType((8, 16), F16))
    x = x0
    for k, width in enumerate(widths):
        gamma = b.weight(f"layer{k}.g", TensorType((16,), F16))
        beta = b.weight(f"layer{k}.b", TensorType((16,), F16))
        h = b.op("layer_norm", [x, gamma, beta], F16, f"layer{k}.ln", eps=1e-5)
        w = b.weight(f"layer{k}.w", TensorType((16, width), F16))
        v = b.weight(f"layer{k}.v", TensorType((width, 16), F16))
        y = b.op("matmul", [b.op("matmul", [h, w], F16, f"layer{k}.up"), v], F16,
                 f"layer{k}.down")
        x = b.op("add", [x0 if k == skip_from_input else x, y], F16, f"layer{k}.res")
    b.output(x)
    graph = b.build()
    return graph, find_layer_loop(graph, find_stages(graph))


def test_identical_hand_built_layers_loop():
    graph, loop = _residual_stack([32, 32, 32, 32])
    assert loop is not None and (loop.start, loop.length, loop.count) == (0, 4, 4)


def test_layers_of_different_shapes_do_not_loop_together():
    _, loop = _residual_stack([32, 48, 32, 48])
    # the repeating unit is two layers, not one
    assert loop is not None and (loop.length, loop.count) == (8, 2)
    _, loop = _residual_stack([32, 48, 64])
    assert loop is None


@pytest.mark.parametrize("layer", [1, 2])
def test_a_layer_that_reads_another_layers_value_breaks_the_loop(layer):
    """A skip connection from outside the carried value is not the loop's wiring: layer
    ``layer`` adds the stack's input rather than its own input."""
    _, loop = _residual_stack([32, 32, 32, 32], skip_from_input=layer)
    if loop is not None:  # only a loop that leaves the odd layer out
        assert not (loop.start <= 4 * layer < loop.start + loop.length * loop.count)


def test_loop_value_maps_are_consistent_with_the_graph():
    graph, stages, loop = _loop("siglip-layer", *SMALL, "--blocks", "2")
    assert loop is not None
    for k in range(loop.count):
        for v0, vk in loop.values[k].items():
            assert graph.value(v0).type == graph.value(vk).type
        for o0, ok in loop.operations[k].items():
            assert graph.operations[o0].kind == graph.operations[ok].kind
    ops = np.array(sorted(loop.operations[1].values()))
    assert len(set(ops.tolist())) == len(ops)  # one-to-one
