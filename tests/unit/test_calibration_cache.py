"""The calibration cache: a second build reuses the fitted FP8 exponents and builds the same
graph; a damaged entry is dropped (with a warning) and rewritten (``util/cache.py``, whose
own rules ``tests/unit/test_cache.py`` pins)."""

from __future__ import annotations

import json
import logging

from tests.helpers import cache_entries

from ipu_stack.cli import parse_workload
from ipu_stack.workloads.calibration import cache_folder

ARGS = ["--image", "28", "--patch", "7", "--dim", "64", "--heads", "4", "--hidden", "96",
        "--layers", "2"]


def _build(folder):
    workload, params = parse_workload("pe-vision", ARGS)
    with cache_folder(folder):
        return workload.build(params)


def _precisions(graph) -> dict:
    return {v.name: v.type.precision.to_json() for v in graph.values}


def test_second_build_reuses_the_calibration(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="ipu_stack.workloads")
    first, tensors = _build(tmp_path)
    entries = cache_entries(tmp_path, "calibration")
    assert len(entries) == 1
    assert "reused cached calibration" not in caplog.text
    second, again = _build(tmp_path)
    assert "reused cached calibration" in caplog.text
    assert _precisions(first) == _precisions(second)
    assert all((tensors[k] == again[k]).all() for k in tensors)
    scales = json.loads(entries[0].read_text())["payload"]["scales"]
    assert scales["activations"]["ln1.out"] == first.values[
        [v.name for v in first.values].index("layer1.ln1.out")].type.precision.scale_exponent


def test_a_damaged_entry_is_ignored_and_rewritten(tmp_path, caplog):
    first, _ = _build(tmp_path)
    (entry,) = cache_entries(tmp_path, "calibration")
    data = json.loads(entry.read_text())
    scales = data["payload"]["scales"]["activations"]
    scales["ln1.out"] += 3  # the checksum no longer matches
    entry.write_text(json.dumps(data))
    caplog.set_level(logging.INFO, logger="ipu_stack")
    second, _ = _build(tmp_path)
    assert "dropped a damaged cache entry, rebuilding cache=calibration" in caplog.text
    assert "checksum mismatch" in caplog.text
    assert "reused cached calibration" not in caplog.text
    assert _precisions(first) == _precisions(second)
    rewritten = json.loads(entry.read_text())["payload"]["scales"]["activations"]
    assert rewritten["ln1.out"] == scales["ln1.out"] - 3


def test_no_folder_no_cache(tmp_path):
    _build(None)
    assert not (tmp_path / "calibration").exists()


def test_a_cold_build_holds_no_weight_the_calibration_made(tmp_path, caplog, monkeypatch):
    """The calibration pass runs in a forked child: this process builds as from the cache,
    every weight still to be made, and the child's exponents are those of the same pass run
    in this process, which makes every weight a build defers."""
    from ipu_stack.util.forked import Forked
    from ipu_stack.workloads import transformer

    caplog.set_level(logging.INFO, logger="ipu_stack.workloads")
    graph, tensors = _build(tmp_path / "apart")
    assert "calibration fitted in a child process workload=pe-vision" in caplog.text
    weights = [v.name for v in graph.by_role("weight")]
    _, again = _build(tmp_path / "apart")  # from the cache
    pending = again.pending
    assert tensors.pending == pending > len(weights) // 2
    assert all((tensors[k] == again[k]).all() for k in tensors)
    # the pass in this process: what its builder made once its weights were all made
    made: list[int] = []
    make_weights = transformer.LayerBuilder.make_weights

    def counting(builder):
        made_now = make_weights(builder)
        made.append(len(builder.made))
        return made_now

    monkeypatch.setattr(transformer.LayerBuilder, "make_weights", counting)
    monkeypatch.setattr(transformer, "call_forked", lambda work: Forked(failure="no child"))
    _build(tmp_path / "here")
    assert "calibration fitted in this process workload=pe-vision" in caplog.text
    (apart_entry,) = cache_entries(tmp_path / "apart", "calibration")
    (here_entry,) = cache_entries(tmp_path / "here", "calibration")
    payload = json.loads(apart_entry.read_text())["payload"]
    assert payload == json.loads(here_entry.read_text())["payload"]
    assert made == [pending]  # the in-process pass made every weight a build defers


def test_the_pass_runs_here_when_the_child_fails(tmp_path, caplog, monkeypatch):
    from ipu_stack.util.forked import Forked
    from ipu_stack.workloads import transformer

    monkeypatch.setattr(transformer, "call_forked",
                        lambda work: Forked(failure="MemoryError: no room"))
    caplog.set_level(logging.INFO, logger="ipu_stack.workloads")
    graph, tensors = _build(tmp_path)
    assert "calibration fitted in this process workload=pe-vision reason=" in caplog.text
    assert "MemoryError: no room" in caplog.text
    monkeypatch.undo()
    apart, again = _build(tmp_path / "apart")
    assert tensors.pending < again.pending // 2  # the real build took the pass's weights
    assert _precisions(graph) == _precisions(apart)
    assert all((tensors[k] == again[k]).all() for k in tensors)
