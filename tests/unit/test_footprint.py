"""Sizes refused before any work (``workloads.footprint``): the closed-form least memory of
every builtin workload is a true lower bound of what its graph holds, and absurd sizes are
refused in one line by the command before a graph, a calibration or a plan is made."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from tests.helpers import one_error_line

from ipu_stack.cli import main
from ipu_stack.util.errors import CompileError
from ipu_stack.workloads import REGISTRY, get_workload
from ipu_stack.workloads.base import LARGEST_SIZE
from ipu_stack.workloads.timings import MEASURED, timing_line

SMALL = {
    "siglip-mlp": {"tokens": 16, "dim": 64, "hidden": 96, "blocks": 2},
    "siglip-layer": {"tokens": 17, "dim": 64, "heads": 4, "hidden": 96, "blocks": 2},
    "pe-block": {"tokens": 17, "dim": 64, "heads": 4, "hidden": 96},
    "siglip-attention": {"tokens": 17, "dim": 64, "heads": 4},
    "attention": {"tokens": 17, "dim": 64, "heads": 4},
    "vit-layer": {"tokens": 17, "dim": 64, "heads": 4, "hidden": 96},
    "siglip-vision": {"image": 28, "patch": 7, "layers": 3, "dim": 64, "heads": 4,
                      "hidden": 96},
    "pe-vision": {"image": 28, "patch": 7, "layers": 2, "dim": 64, "heads": 4, "hidden": 96},
    "siglip2-giant": {"image": 32, "patch": 16, "layers": 2, "dim": 64, "heads": 4,
                      "hidden": 96},
    "pe-giant": {"image": 28, "patch": 14, "layers": 2, "dim": 64, "heads": 4, "hidden": 96},
    "clip-text": {"tokens": 16, "vocab": 500, "layers": 2, "dim": 64, "heads": 4, "hidden": 96},
    "bert-base": {"tokens": 16, "vocab": 500, "layers": 2, "dim": 64, "heads": 4, "hidden": 96},
    "roberta-base": {"tokens": 16, "vocab": 500, "layers": 2, "dim": 64, "heads": 4,
                     "hidden": 96},
    "smollm2-135m": {"tokens": 16, "vocab": 500, "layers": 2, "dim": 64, "heads": 4,
                     "kv_heads": 2, "hidden": 96},
    "tinyllama-1.1b": {"tokens": 16, "vocab": 500, "layers": 2, "dim": 64, "heads": 4,
                       "kv_heads": 2, "hidden": 96},
    "qwen3-0.6b": {"tokens": 16, "vocab": 500, "layers": 2, "dim": 64, "heads": 4,
                   "kv_heads": 2, "head_dim": 32, "hidden": 96},  # q twice the width
    "smolvlm-256m": {"tokens": 16, "vocab": 500, "layers": 2, "dim": 64, "heads": 4,
                     "kv_heads": 2, "hidden": 96, "image": 64},
    "swin-l": {"batch": 2, "image": 32, "window": 4, "dim": 16, "depths": "2,2",
               "stage_heads": "2,4"},
}


def test_every_builtin_states_its_least_memory() -> None:
    assert set(SMALL) == set(REGISTRY)
    assert all(workload.footprint is not None for workload in REGISTRY.values())


@pytest.mark.parametrize("precision", ["fp8", "f16"])
@pytest.mark.parametrize("name", list(SMALL))
def test_the_footprint_is_a_lower_bound_of_the_built_graph(name: str, precision: str) -> None:
    """The weights it states are at most the graph's (norms and biases come on top) and at
    least nine tenths of them; its activations are two values the graph really holds."""
    workload = get_workload(name)
    params = workload.resolve({**SMALL[name], "precision": precision})
    footprint = workload.footprint(params)
    graph, _ = workload.build(params)
    weights = sum(v.type.nbytes for v in graph.by_role("weight") if len(v.type.shape) == 2)
    assert 0.9 * weights <= footprint.weight_bytes <= weights
    sizes = sorted((v.type.nbytes for v in graph.values if v.role != "weight"), reverse=True)
    assert footprint.activation_bytes <= sizes[0] + sizes[1]
    assert footprint.activation_bytes >= sizes[0] // 2


def test_a_size_above_the_ceiling_names_it(capsys) -> None:
    code = main(["bench", "siglip-vision", "--layers", str(LARGEST_SIZE + 1)])
    line = one_error_line(code, capsys.readouterr().err)
    assert line == (f"error: --layers must be at most {LARGEST_SIZE} (no size on a tile of "
                    f"624 KiB can be larger), got {LARGEST_SIZE + 1}")


@pytest.mark.parametrize("argv, expected", [
    (["siglip-vision", "--layers", "100000"],
     "error: siglip-vision does not fit: its weights alone take at least 1522.48 GB and one "
     "chip of ipu21 holds 0.94 GB; more than the 8 cards a C600 cluster links; or --layers 60 "
     "at most on one chip"),
    (["siglip-vision", "--batch", "100000"],
     "error: siglip-vision does not fit: its weights (0.41 GB) and one layer's attention "
     "scores (1700.61 GB) take at least 1701.02 GB and one chip of ipu21 holds 0.94 GB"),
    (["pe-giant", "--chips", "1"],
     "error: pe-giant does not fit: its weights alone take at least 1.85 GB and one chip of "
     "ipu21 holds 0.94 GB; it needs at least 3 chips (--chips 3); or --layers 24 at most on "
     "one chip"),
    # more chips cannot help where one layer, or the token table, is more than a chip holds
    (["smollm2-135m", "--vocab", "1048576", "--chips", "2", "--context", "16", "--tokens", "1"],
     "error: smollm2-135m does not fit: its token table (F16) takes at least 1.21 GB alone "
     "and one chip of ipu21 holds 0.94 GB (a pipeline over chips keeps each layer and table "
     "on one chip)"),
    (["siglip-mlp", "--dim", "30000", "--hidden", "30000", "--chips", "4", "--blocks", "2"],
     "error: siglip-mlp does not fit: one block's weights take at least 1.80 GB alone and "
     "one chip of ipu21 holds 0.94 GB (a pipeline over chips keeps each block and table on "
     "one chip)"),
    (["siglip-mlp", "--batch", "100000", "--strategy", "pipeline"],
     "error: siglip-mlp does not fit: its weights (9.9 MB) and fc1's input and output "
     "(397.74 GB) take at least 397.75 GB and one chip of ipu21 holds 0.94 GB"),
])
def test_a_model_that_cannot_fit_is_refused_before_it_is_built(argv, expected, capsys,
                                                                monkeypatch) -> None:
    """No graph is built (its build would raise), so no calibration, plan or allocation."""
    def never(params):
        raise AssertionError("the workload was built")

    monkeypatch.setitem(REGISTRY, argv[0], dataclasses.replace(get_workload(argv[0]),
                                                               build=never))
    code = main(["bench", *argv])
    assert one_error_line(code, capsys.readouterr().err) == expected


def test_a_model_that_fits_its_least_memory_is_not_refused() -> None:
    from ipu_stack.workloads.footprint import check_fits

    for name in ("siglip-vision", "pe-vision", "siglip-mlp", "siglip-layer"):
        workload = get_workload(name)
        check_fits(workload, workload.defaults(), "ipu21", 1)
    for name, chips in (("siglip2-giant", 2), ("pe-giant", 4)):
        workload = get_workload(name)
        check_fits(workload, workload.defaults(), "ipu21", chips)


def test_an_imported_programs_weights_are_not_taken_for_one_layer() -> None:
    """An import's footprint knows no layers: 1.5 GB over two chips may still be cut."""
    from ipu_stack.workloads.footprint import Footprint, check_footprint

    whole = Footprint(1_500_000_000, 10, "a product's operands", 1, "", 1_500_000_000)
    check_footprint("model.pt2", whole, "ipu21", 2)
    with pytest.raises(CompileError, match="one layer's weights take at least 1.50 GB alone"):
        check_footprint("tower", dataclasses.replace(whole, layer_parameter="layers"),
                        "ipu21", 2)


def test_the_listing_names_each_workloads_weights_and_least_chips(capsys) -> None:
    assert main(["workloads"]) == 0
    out = capsys.readouterr().out
    assert "siglip-vision: SigLIP so400m/14-384 vision tower" in out
    assert "  GEMM weights 0.41 GB at the defaults; fits one chip's memory" in out
    assert "  GEMM weights 1.13 GB at the defaults; needs --chips 2 or more" in out
    assert "  GEMM weights 1.85 GB at the defaults; needs --chips 3 or more" in out


def _benchmark_rows() -> dict[str, dict[str, str]]:
    """docs/benchmarks.md's table rows by command, each cell under its column's header."""
    rows, header = {}, []
    text = (Path(__file__).parents[2] / "docs" / "benchmarks.md").read_text()
    for line in text.splitlines():
        if not line.startswith("|") or line.startswith("|---"):
            header = [] if not line.startswith("|") else header
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] == "command":
            header = cells
        elif header:
            command = re.match(r"`([^`]*)`", cells[0])
            if command:
                rows.setdefault(command.group(1), dict(zip(header, cells, strict=False)))
    return rows


def test_the_listing_gives_each_workloads_measured_times_from_the_benchmarks(capsys) -> None:
    assert main(["workloads"]) == 0
    out = capsys.readouterr().out
    rows = _benchmark_rows()
    for name in REGISTRY:
        flags, compile_s, simulate_s, wall_s = MEASURED[name]
        row = rows[f"bench {name}{flags}"]
        assert float(row["compile s"]) == compile_s and float(row["simulate s"]) == simulate_s
        wall = row.get("wall") or row.get("in all")
        assert (wall is None) == (wall_s is None), name
        if wall is not None:
            minutes, seconds = re.fullmatch(r"(\d+) min (\d+) s", wall).groups()
            assert 60 * int(minutes) + int(seconds) == wall_s, name
        assert f"  {timing_line(name)}" in out
    assert ("  bench siglip-vision on 2 cores: compile 38 s, simulate 80 s, 3 min 5 s in all "
            "(docs/benchmarks.md)") in out
