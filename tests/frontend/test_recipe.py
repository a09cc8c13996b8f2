"""``ipu-stack fp8-recipe``: a model with one layer made fragile in FP8 gets exactly that
layer kept F16, and the three runs are measured on the device."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from ipu_stack.cli import main  # noqa: E402
from ipu_stack.ir.names import fp8_allowed, layer_set, name_layer  # noqa: E402
from ipu_stack.util.errors import UsageError  # noqa: E402
from tests.frontend.models import TinyVit, export  # noqa: E402


def fragile_vit(layer: int, factor: float = 60.0, step: float = 0.03) -> torch.nn.Module:
    """A 3-layer ViT whose MLP in ``layer`` is a difference of two nearly equal halves,
    scaled up: ``factor * U (gelu(1.03 z) - gelu(z))``.  Exact, or in F16, the halves differ
    as they should; rounded to FP8 (3 mantissa bits) the difference is mostly rounding, and
    ``factor`` carries it into the output.  Every other layer is an ordinary one."""
    torch.manual_seed(5)
    model = TinyVit(dim=32, heads=2, layers=3, hidden=64, image=16).eval()
    block = model.blocks[layer]
    with torch.no_grad():
        w1, b1, w2 = block["fc1"].weight, block["fc1"].bias, block["fc2"].weight
        half = w1.shape[0] // 2
        w1[half:] = w1[:half] * (1 + step)
        b1[half:] = b1[:half] * (1 + step)
        u = w2[:, :half].clone()
        w2[:, :half], w2[:, half:] = -factor * u, factor * u
    return model


@pytest.mark.parametrize("layer", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_the_recipe_keeps_exactly_the_fragile_layer(layer: int, tmp_path: Path, cache_dir: Path,
                                                     lock_path: Path, capsys) -> None:
    path = tmp_path / "fragile.pt2"
    torch.export.save(export(fragile_vit(layer), torch.randn(1, 3, 16, 16)), str(path))
    code = main(["--quiet", "fp8-recipe", str(path), "--json", "--out", str(tmp_path / "r"),
                 "--cache-dir", str(cache_dir), "--lock", str(lock_path)])
    record = json.loads(capsys.readouterr().out)
    assert code == 0, record
    assert record["keepF16"] == str(layer) and record["found"], record
    assert record["allFp8HostError"] > 0.1 >= record["hostError"]
    runs = [record[k] for k in ("allF16", "allFp8", "recipe")]
    assert all(r["numericalTest"] == "PASS" for r in runs)
    # the device agrees with the host's search: FP8 outside the bound, the recipe inside
    assert record["allFp8"]["deviceError"] > 0.1 >= record["recipe"]["deviceError"]
    assert record["allF16"]["deviceError"] < record["recipe"]["deviceError"]
    assert record["deviceWithinBound"] is True
    assert record["recipe"]["gemmModes"] == "f16,fp8"
    assert f"--num_of_layers_keep_fp16 1 --fp8_skip_op_names layer{layer}." in \
        record["poprtOptions"]


def test_a_recipe_the_device_finds_over_the_bound_says_so() -> None:
    from ipu_stack.recipe.measure import format_recipe

    run = {"numericalTest": "PASS", "cycles": 10, "qpsWithHost": 1.0, "gemmModes": "fp8"}
    record = {"workload": "m", "keepF16": "0", "keptLayers": 1, "layers": 2, "found": True,
              "allFp8HostError": 0.05, "hostError": 0.0266, "maxError": 0.03,
              "evaluations": 2, "searchSeconds": 1.0, "deviceWithinBound": False,
              "poprtOptions": "--precision fp8",
              "allF16": {**run, "deviceError": 0.001}, "allFp8": {**run, "deviceError": 0.05},
              "recipe": {**run, "deviceError": 0.03028}}
    assert "  the recipe's device error 0.03028 is over the bound 0.03 (the host's search " \
        "read 0.0266): tighten --max-error or keep more layers" in format_recipe(record)


def test_an_accurate_model_keeps_nothing(tmp_path: Path, cache_dir: Path, lock_path: Path,
                                         capsys) -> None:
    code = main(["--quiet", "fp8-recipe", "siglip-layer", "--blocks", "2", "--tokens", "64",
                 "--dim", "128", "--heads", "2", "--hidden", "256", "--out",
                 str(tmp_path / "r"), "--cache-dir", str(cache_dir), "--lock", str(lock_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "keep no layer in F16 (0 of 2)" in out and "PopRT: --precision fp8 " \
        "--num_of_layers_keep_fp16 0" in out


def test_keep_f16_makes_the_named_layers_f16(tmp_path: Path, cache_dir: Path,
                                             capsys) -> None:
    from ipu_stack.cli import parse_workload

    workload, params = parse_workload("siglip-layer", ["--blocks", "3", "--tokens", "16",
                                                       "--dim", "64", "--heads", "2",
                                                       "--hidden", "128", "--keep-f16", "1"])
    graph, _ = workload.build(params)
    matrices = {v.name: v.type.precision.is_fp8 for v in graph.values
                if v.role == "weight" and len(v.type.shape) == 2}
    assert matrices and all(fp8 == (name_layer(n) != 1) for n, fp8 in matrices.items())
    assert "keepf16-1" in workload.identifier(params)


def test_layer_sets() -> None:
    assert layer_set("3,7") == {3, 7} and layer_set("0-2,9") == {0, 1, 2, 9}
    assert layer_set("") == frozenset()
    for bad in ("x", "3-1", "-2", "1,,a"):
        with pytest.raises(UsageError, match="give layer numbers"):
            layer_set(bad)
    with pytest.raises(UsageError, match="layer numbers go up to 9999"):
        layer_set("0-99999999")  # refused before a range of 10^8 numbers is made
    assert name_layer("layer3.fc1.out") == 3
    assert name_layer("model.encoder.layers.12.mlp.fc1.weight") == 12
    assert name_layer("blocks.2.fc1.MatMul_1") == 2 and name_layer("embed.weight") is None
    assert not fp8_allowed("layer3.fc1.w", frozenset({3})) and fp8_allowed("head.w",
                                                                              frozenset({3}))


def test_an_onnx_recipe_names_the_files_nodes(tmp_path: Path, cache_dir: Path,
                                              lock_path: Path, capsys) -> None:
    pytest.importorskip("onnxscript")
    onnx = pytest.importorskip("onnx")
    from ipu_stack.frontend.onnx_program import node_scope

    path = tmp_path / "fragile.onnx"
    torch.onnx.export(fragile_vit(1), (torch.randn(1, 3, 16, 16),), str(path), dynamo=True,
                      opset_version=18, input_names=["pixels"], verbose=False)
    code = main(["--quiet", "fp8-recipe", str(path), "--json", "--out", str(tmp_path / "r"),
                 "--cache-dir", str(cache_dir), "--lock", str(lock_path)])
    record = json.loads(capsys.readouterr().out)
    assert code == 0 and record["keepF16"] == "1", record
    layer1 = [n.name for n in onnx.load(str(path)).graph.node
              if n.op_type in ("MatMul", "Gemm") and name_layer(node_scope(n)) == 1]
    assert layer1 and record["poprtOptions"].endswith(
        f"--fp8_skip_op_names {','.join(layer1)}")


@pytest.mark.parametrize(("extra", "message"), [
    (["--keep-f16", "0-5"], "error: --keep-f16 0-5: the model has no layer 2 (its layers are "
                            "0-1)"),
    (["--keep-f16", "1", "--precision", "f16"],
     "error: --keep-f16 1: every layer is F16 at --precision f16; it keeps layers of an FP8 "
     "model F16"),
])
def test_keep_f16_that_would_change_nothing_is_one_line(tmp_path: Path, capsys,
                                                        extra: list[str], message: str) -> None:
    code = main(["--quiet", "compile", "siglip-layer", "--blocks", "2", "--tokens", "16",
                 "--dim", "64", "--heads", "2", "--hidden", "128", "-o", str(tmp_path / "o"),
                 *extra])
    assert code == 2 and capsys.readouterr().err.strip() == message


@pytest.mark.parametrize("extra", [["--chips", "2"], ["--precision", "f16"],
                                   ["--keep-f16", "1"]])
def test_a_recipe_refuses_what_it_chooses_itself(tmp_path: Path, capsys,
                                                 extra: list[str]) -> None:
    code = main(["--quiet", "fp8-recipe", "siglip-layer", "--blocks", "2", "--tokens", "16",
                 "--dim", "64", "--heads", "2", "--hidden", "128", "--out",
                 str(tmp_path / "r"), *extra])
    assert code == 2 and capsys.readouterr().err.strip() == (
        f"error: fp8-recipe takes no {extra[0]}: it chooses the kept layers and measures "
        "all-F16, all-FP8 and the recipe on one chip itself")
    assert not (tmp_path / "r").exists()


def test_a_recipe_offers_no_tensors_or_profile(capsys) -> None:
    for option in ("--save-tensors", "--profile"):
        assert main(["--quiet", "fp8-recipe", "siglip-layer", option, "t"]) == 2
        assert capsys.readouterr().err.strip() == (f"error: fp8-recipe: unrecognised option "
                                                   f"'{option}'")
