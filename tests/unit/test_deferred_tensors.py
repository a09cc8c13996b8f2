"""Weights made when first read: a compile makes none, a run makes them all, and the values
do not depend on when or in what order they were made."""

from __future__ import annotations

import numpy as np

from ipu_stack.ir.values import DeferredTensors
from ipu_stack.pipeline import CompileOptions, compile_workload
from ipu_stack.workloads import get_workload


def test_values_are_made_once_on_first_read_in_the_given_order():
    made: list[str] = []
    tensors = DeferredTensors()
    tensors["x"] = np.ones(2)
    for name in ("b", "a"):
        tensors.defer(name, lambda name=name: made.append(name) or np.full(3, ord(name)))
    assert list(tensors) == ["x", "b", "a"] and tensors.pending == 2 and made == []
    assert tensors["a"].tolist() == [97, 97, 97] and made == ["a"]
    assert tensors["a"] is tensors["a"] and made == ["a"]  # made once
    assert tensors.make_all(threads=2) == 1 and made == ["a", "b"] and tensors.pending == 0
    assert list(tensors) == ["x", "b", "a"]


def _compiles(tmp_path, cache_dir, layers: int, count: int):
    """``count`` compiles of a small tower after the one that fills the calibration cache."""
    workload = get_workload("siglip-vision")
    params = workload.resolve({"layers": layers, "image": 28, "patch": 7, "dim": 64,
                               "heads": 4, "hidden": 96})
    options = CompileOptions(cache_dir=str(cache_dir))
    compile_workload(workload, params, tmp_path / "a", options)  # fills the calibration cache
    return params, [compile_workload(workload, params, tmp_path / f"b{k}", options)
                    for k in range(count)]


def test_a_compile_makes_no_weight_and_the_values_do_not_depend_on_order(tmp_path, cache_dir):
    params, done = _compiles(tmp_path, cache_dir, 2, 2)
    first, second = done[0].tensors, done[1].tensors
    assert isinstance(first, DeferredTensors) and first.pending > 0
    weights = [v.name for v in get_workload("siglip-vision").build(params)[0].by_role("weight")]
    forward = {name: np.array(first[name]) for name in weights}  # one by one, in order
    second.make_all(threads=2)  # all at once, on threads
    for name in reversed(weights):
        np.testing.assert_array_equal(np.asarray(second[name]), forward[name])


def test_weights_kept_as_their_codes_as_soon_as_they_are_made(tmp_path, cache_dir):
    from ipu_stack.ir.values import StoredTensor, weight_storer

    _, done = _compiles(tmp_path, cache_dir, 1, 2)
    graph, plain, stored = done[0].graph, done[0].tensors, done[1].tensors
    stored.make_all(threads=2, store=weight_storer(graph))
    plain.make_all(threads=2)
    fp8 = [v for v in graph.by_role("weight") if v.type.precision.is_fp8]
    assert fp8
    for value in fp8:
        assert isinstance(stored[value.name], StoredTensor)
        assert stored[value.name].stored.dtype.itemsize == 1  # one byte a weight, not four
        np.testing.assert_array_equal(np.asarray(stored[value.name]), plain[value.name])
