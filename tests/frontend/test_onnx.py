"""ONNX models: read as hostile input, traced into the torch importer, checked against
onnxruntime, and compiled to the same cycles as the ``.pt2`` of the same module."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")
transformers = pytest.importorskip("transformers")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from ipu_stack.cli import main  # noqa: E402
from ipu_stack.frontend.onnx_file import load_onnx  # noqa: E402
from ipu_stack.util.errors import UsageError  # noqa: E402
from tests.frontend.models import TinyVit, drawn_vectors  # noqa: E402


class Outputs(torch.nn.Module):
    """A transformers model called with ``input_ids``, returning plain tensors."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.model(input_ids=input_ids)
        return out.last_hidden_state, out.pooler_output


def tiny_clip() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.CLIPTextConfig(
        vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=16, hidden_act="quick_gelu",
        layer_norm_eps=1e-5, bos_token_id=998, eos_token_id=999)
    return drawn_vectors(Outputs(transformers.CLIPTextModel(config)).eval())


def write_onnx(module: torch.nn.Module, example: torch.Tensor, path: Path, dynamo: bool,
               name: str, **options) -> Path:
    """The module as ONNX, its input named as its forward's argument (so that random inputs,
    drawn by name, are the same as the ``.pt2``'s)."""
    torch.onnx.export(module, (example,), str(path), dynamo=dynamo, opset_version=18,
                      input_names=[name], verbose=False, **options)
    return path


def bench(model: Path, tmp_path: Path, cache_dir: Path, lock_path: Path, capsys,
          *extra: str) -> dict:
    """The record of ``bench MODEL --json`` (F16 unless ``extra`` says otherwise)."""
    if "--precision" not in extra:
        extra = ("--precision", "f16", *extra)
    code = main(["--quiet", "bench", str(model), "--json", "--out",
                 str(tmp_path / f"out-{model.stem}"), "--cache-dir", str(cache_dir), "--lock",
                 str(lock_path), *extra])
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out)


@pytest.fixture(scope="module")
def clip_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("clip")
    module = tiny_clip()
    ids = torch.randint(0, 998, (2, 16))
    files = {"dynamo": write_onnx(module, ids, folder / "clip_dynamo.onnx", True, "input_ids"),
             "torchscript": write_onnx(module, ids, folder / "clip_ts.onnx", False, "input_ids"),
             "pt2": folder / "clip.pt2"}
    torch.export.save(torch.export.export(module, (ids,)), str(files["pt2"]))
    return files


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_clip_text_through_onnx_passes_with_the_cycles_of_the_pt2(
        clip_files: dict[str, Path], exporter: str, tmp_path: Path, cache_dir: Path,
        lock_path: Path, capsys) -> None:
    onnx_record = bench(clip_files[exporter], tmp_path, cache_dir, lock_path, capsys)
    pt2_record = bench(clip_files["pt2"], tmp_path, cache_dir, lock_path, capsys)
    assert onnx_record["numericalTest"] == "PASS", onnx_record
    assert onnx_record["referenceSource"] == "onnxruntime"
    assert pt2_record["referenceSource"] == "torch"
    assert onnx_record["conversionError"] < 1e-5
    assert onnx_record["cycles"] == pt2_record["cycles"]
    assert onnx_record["multisliceCycles"] > 0  # the token lookup ran on the device


def test_a_vision_tower_with_a_dynamic_batch(tmp_path: Path, cache_dir: Path, lock_path: Path,
                                             capsys) -> None:
    torch.manual_seed(3)
    module = drawn_vectors(TinyVit(dim=32, heads=2, layers=2, hidden=64, image=16).eval())
    pixels = torch.randn(2, 3, 16, 16)
    model = write_onnx(module, pixels, tmp_path / "vit.onnx", True, "pixels",
                       dynamic_shapes=({0: torch.export.Dim("batch")},))
    assert onnx.load(str(model)).graph.input[0].type.tensor_type.shape.dim[0].dim_param
    record = bench(model, tmp_path, cache_dir, lock_path, capsys, "--batch", "3",
                   "--precision", "fp8")
    assert record["numericalTest"] == "PASS" and record["batch"] == 3, record
    assert record["inputShapes"] == "3x3x16x16" and record["gemmModes"] == "f16,fp8"
    path = tmp_path / "vit.pt2"
    torch.export.save(torch.export.export(module, (torch.randn(3, 3, 16, 16),)), str(path))
    twin = bench(path, tmp_path, cache_dir, lock_path, capsys, "--precision", "fp8")
    assert twin["cycles"] == record["cycles"]
    # the same inputs (drawn by the input's name) give the same outputs, bit for bit
    assert twin["noiseRatio"] == record["noiseRatio"]
    # an inputs file sets the symbolic batch; capacity re-traces the file at each batch
    np.savez(tmp_path / "in.npz", pixels=np.ones((2, 3, 16, 16), np.float32))
    from_file = bench(model, tmp_path, cache_dir, lock_path, capsys, "--inputs",
                      str(tmp_path / "in.npz"))
    assert from_file["numericalTest"] == "PASS" and from_file["inputShapes"] == "2x3x16x16"
    assert main(["--quiet", "capacity", str(model), "--max-batch", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["maximumBatch"] == 4


def test_ops_lists_each_node_with_its_name(clip_files: dict[str, Path], capsys) -> None:
    assert main(["ops", str(clip_files["torchscript"]), "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == len(onnx.load(str(clip_files["torchscript"])).graph.node)
    matmul = next(r for r in rows if r["target"] == "MatMul")
    assert matmul["supported"] and matmul["module"].startswith("model.encoder.layers.0")
    assert matmul["node"].startswith("/model/encoder/layers.0/")
    assert all(r["supported"] for r in rows)


def graph_model(nodes: list, inputs: list, outputs: list, initializers: list | None = None,
                opset: int = 18) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializers or [])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def linear_relu(weight_rows: int = 8) -> onnx.ModelProto:
    """x [1, 4, 8] @ W, then an operator the torch importer has no rule for (Relu)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8])
    w = numpy_helper.from_array(np.eye(weight_rows, 8, dtype=np.float32), "fc.weight")
    nodes = [helper.make_node("MatMul", ["x", "fc.weight"], ["h"], name="/fc/MatMul"),
             helper.make_node("Relu", ["h"], ["y"], name="/act/Relu")]
    return graph_model(nodes, [x], [y], [w])


def test_an_unsupported_node_is_one_line_naming_it(tmp_path: Path, capsys) -> None:
    path = tmp_path / "relu.onnx"
    onnx.save(linear_relu(), str(path))
    code = main(["--quiet", "compile", str(path), "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "aten.relu" in lines[0] and "/act/Relu" in lines[0], err
    assert main(["ops", str(path)]) == 1  # an unsupported node: exit 1 after the listing
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("yes MatMul") and out[1].startswith("NO  Relu")
    assert out[-1] == "operations=2 supported=1 unsupported=1"


def test_an_operator_without_translation_is_named(tmp_path: Path, capsys) -> None:
    model = linear_relu()
    model.graph.node[1].op_type, model.graph.node[1].domain = "Twist", "com.example"
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    path = tmp_path / "twist.onnx"
    onnx.save(model, str(path))
    assert main(["ops", str(path)]) == 1
    out = capsys.readouterr().out
    assert "NO  com.example.Twist" in out and "no translation of this ONNX operator" in out
    code = main(["--quiet", "compile", str(path), "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "unsupported ONNX operator com.example.Twist (node /act/Relu" in err


def external(model: onnx.ModelProto, location: str, offset: int, length: int) -> None:
    tensor = model.graph.initializer[0]
    tensor.ClearField("raw_data")
    tensor.ClearField("float_data")
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)),
                       ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value


HOSTILE = {
    "truncated": "not an ONNX model",
    "text": "not an ONNX model",
    "outside-folder": "outside the model's folder",
    "past-end": "reads past the end",
    "data-a-folder": "external data 'weights' of tensor 'fc.weight' is not a regular file",
    "negative-offset": "has a negative external offset -8",
    "huge-tensor": "over the bound of 2^32",
    "cycle": "defined by a later node",
    "old-opset": "opset 13; the importer reads opset 17",
}


@pytest.mark.parametrize("damage", sorted(HOSTILE))
def test_hostile_files_are_refused_in_one_line(tmp_path: Path, capsys, damage: str) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    path = folder / "bad.onnx"
    model = linear_relu()
    (tmp_path / "secret.bin").write_bytes(bytes(256))
    (folder / "weights.bin").write_bytes(bytes(100))
    if damage == "outside-folder":
        external(model, "../secret.bin", 0, 256)
    elif damage == "past-end":
        external(model, "weights.bin", 0, 256)
    elif damage == "data-a-folder":
        (folder / "weights").mkdir()
        external(model, "weights", 0, 256)
    elif damage == "negative-offset":
        external(model, "weights.bin", -8, 256)
    elif damage == "huge-tensor":
        tensor = model.graph.initializer[0]
        tensor.ClearField("raw_data")
        del tensor.dims[:]
        tensor.dims.extend([2**20, 2**20])
    elif damage == "cycle":
        nodes = list(model.graph.node)
        nodes[0].input[0] = "y"  # the product reads the Relu's output, which reads it
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    elif damage == "old-opset":
        model.opset_import[0].version = 13
    data = model.SerializeToString()
    if damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "text":
        data = b"not a model\n"
    path.write_bytes(data)
    with pytest.raises(UsageError, match=HOSTILE[damage].replace("^", r"\^")):
        load_onnx(path)
    code = main(["--quiet", "compile", str(path), "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert len([line for line in err.splitlines() if line.strip()]) == 1, err


def test_external_data_inside_the_folder_is_read(tmp_path: Path) -> None:
    model = linear_relu()
    weight = np.arange(64, dtype=np.float32).reshape(8, 8)
    (tmp_path / "weights.bin").write_bytes(bytes(16) + weight.tobytes())
    external(model, "weights.bin", 16, weight.nbytes)
    path = tmp_path / "ok.onnx"
    path.write_bytes(model.SerializeToString())
    loaded = load_onnx(path)
    assert np.array_equal(loaded.weights["fc.weight"], weight)
    assert not loaded.graph.initializer[0].raw_data  # held once: as the array


def test_a_package_is_refused_once_its_external_weights_change(tmp_path: Path) -> None:
    """The recorded digest covers the external-data files as well as the ``.onnx``."""
    from ipu_stack.frontend.onnx_file import onnx_sha256
    from ipu_stack.frontend.workload import recorded_file

    model = linear_relu()
    weight = np.arange(64, dtype=np.float32).reshape(8, 8)
    (tmp_path / "weights.bin").write_bytes(weight.tobytes())
    external(model, "weights.bin", 0, weight.nbytes)
    path = tmp_path / "ok.onnx"
    path.write_bytes(model.SerializeToString())
    recorded = {"model": str(path), "sha256": onnx_sha256(path)}
    assert onnx_sha256(path, load_onnx(path).proto) == recorded["sha256"]  # as compiled
    assert recorded_file(recorded) == path
    (tmp_path / "weights.bin").write_bytes((2 * weight).tobytes())
    with pytest.raises(UsageError, match=f"{path} changed since the package was compiled"):
        recorded_file(recorded)
    gone = {**recorded, "sha256": onnx_sha256(path), "inputs": str(tmp_path / "in.npz")}
    with pytest.raises(UsageError, match="compiled with the inputs .*in.npz, which are no "
                                         "longer there"):
        recorded_file(gone)


def test_mutated_files_compile_or_are_refused_in_one_line(tmp_path: Path, capsys) -> None:
    """Random byte mutations (flips, overwrites, truncations, insertions) of a supported
    model: each compiles, or is one error line with exit 2, never a traceback."""
    from ipu_stack.testing.mutations import mutate_bytes

    model = linear_relu()
    model.graph.node[1].op_type = "Sigmoid"  # supported end to end
    original = model.SerializeToString()
    rng = np.random.default_rng(7)
    outcomes = []
    for index in range(25):
        case, body = mutate_bytes(original, rng)
        path = tmp_path / f"m{index}.onnx"
        path.write_bytes(body)
        code = main(["--quiet", "compile", str(path), "-o", str(tmp_path / f"o{index}")])
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.strip()]
        assert (code == 0 and not lines) or (code == 2 and len(lines) == 1 and lines[0]
                                             .startswith("error: ")), (case, code, err)
        outcomes.append(code)
    assert 0 in outcomes and 2 in outcomes  # both kinds happened


def test_a_fixed_batch_refuses_another(clip_files: dict[str, Path], tmp_path: Path,
                                       capsys) -> None:
    code = main(["--quiet", "compile", str(clip_files["dynamo"]), "--batch", "3", "-o",
                 str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err == ("error: --batch 3: graph input input_ids has a fixed batch "
                                 "of 2 (export it with a symbolic first dimension)")


def test_the_same_file_gives_a_byte_identical_package(clip_files: dict[str, Path],
                                                      tmp_path: Path, cache_dir: Path) -> None:
    packages = []
    for name in ("a", "b"):
        assert main(["--quiet", "compile", str(clip_files["torchscript"]), "--precision", "fp8",
                     "-o", str(tmp_path / name), "--cache-dir", str(cache_dir)]) == 0
        packages.append((tmp_path / name / "model.ipuexe").read_bytes())
    assert packages[0] == packages[1]


def test_a_symbolic_sequence_length_is_sized_by_tokens(tmp_path: Path, cache_dir: Path,
                                                       lock_path: Path, capsys) -> None:
    torch.manual_seed(5)
    module = drawn_vectors(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                                               torch.nn.Linear(64, 32)).eval())
    example = torch.randn(2, 8, 32)
    model = write_onnx(module, example, tmp_path / "mlp.onnx", False, "x",
                       dynamic_axes={"x": {0: "batch", 1: "seq"}})
    record = bench(model, tmp_path, cache_dir, lock_path, capsys, "--tokens", "12",
                   "--batch", "3")
    assert record["numericalTest"] == "PASS" and record["inputShapes"] == "3x12x32", record
    # ops lists it at the length asked for, every node supported or folded
    assert main(["--quiet", "ops", str(model)]) == 2
    assert "give its size with --tokens N" in capsys.readouterr().err
    assert main(["--quiet", "ops", str(model), "--tokens", "12", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert "mapped" in {row["status"] for row in rows}, rows
    assert not [row for row in rows if "unsupported" in row["status"]], rows
    # a file whose shapes are all fixed has nothing for --tokens to size
    fixed = write_onnx(module, example, tmp_path / "fixed.onnx", False, "x")
    code = main(["--quiet", "compile", str(fixed), "--tokens", "12", "-o",
                 str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err == ("error: --tokens 12: the model's inputs have no symbolic "
                                 "dimension to size (x [2, 8, 32])")
    # an inputs file sizes the symbolic dimensions, but may not contradict --batch/--tokens
    np.savez(tmp_path / "x.npz", x=np.zeros((4, 12, 32), np.float32))
    for option, value, axis in (("--batch", "3", "batch"), ("--tokens", "16", "seq")):
        code = main(["--quiet", "compile", str(model), "--inputs", str(tmp_path / "x.npz"),
                     option, value, "-o", str(tmp_path / "out")])
        assert code == 2 and capsys.readouterr().err.strip() == (
            f"error: --inputs: x is [4, 12, 32], not {value} along '{axis}' as {option} "
            f"{value} asks")


def _reshape_model(shape: list[int]) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 16])
    target = numpy_helper.from_array(np.array(shape, np.int64), "shape")
    return graph_model([helper.make_node("Reshape", ["x", "shape"], ["y"], name="/r")], [x], [y],
                       [target])


def _gather_model(index: int) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16])
    table = numpy_helper.from_array(np.ones((16, 16), np.float32), "table")
    at = numpy_helper.from_array(np.array([index], np.int64), "at")
    nodes = [helper.make_node("Gather", ["table", "at"], ["row"], name="/g", axis=0),
             helper.make_node("Add", ["x", "row"], ["y"], name="/add")]
    return graph_model(nodes, [x], [y], [table, at])


NODE_FAILURES = {
    "two-inferred-dims": (lambda: _reshape_model([-1, -1]),
                          "error: two-inferred-dims.onnx does not run at x [1, 8, 16]: ONNX "
                          "node /r (Reshape) cannot be computed: only one dimension can be "
                          "inferred"),
    "index-past-the-table": (lambda: _gather_model(2**40),
                             "error: ONNX node /g (Gather): index 1099511627776 is outside "
                             "axis 0 of size 16 (ONNX allows -16 to 15)"),
    "negative-input-dim": (lambda: linear_relu_with_input([-1, 4, 8]),
                           "error: graph input x has a negative dimension -1 ([-1, 4, 8])"),
    "string-weight": (lambda: string_weight(),
                      "holds object values, not numbers"),
    "string-input": (lambda: graph_model(
        [helper.make_node("Identity", ["x"], ["y"], name="/i")],
        [helper.make_tensor_value_info("x", TensorProto.STRING, [2])],
        [helper.make_tensor_value_info("y", TensorProto.STRING, [2])]),
        "error: graph input 'x' has element type STRING, not a float, integer or bool tensor"),
}


def linear_relu_with_input(dims: list[int]) -> onnx.ModelProto:
    model = linear_relu()
    shape = model.graph.input[0].type.tensor_type.shape
    for dim, size in zip(shape.dim, dims, strict=True):
        dim.dim_value = size
    return model


def string_weight() -> onnx.ModelProto:
    model = linear_relu()
    model.graph.initializer[0].CopyFrom(helper.make_tensor("fc.weight", TensorProto.STRING,
                                                           [1], [b"text"]))
    return model


@pytest.mark.parametrize("case", sorted(NODE_FAILURES))
def test_a_node_or_input_the_model_cannot_compute_is_one_line(tmp_path: Path, capsys,
                                                              case: str) -> None:
    """Values no operator can take (a Reshape inferring two dimensions, an index past its
    table), a negative input dimension or a weight of strings: one line naming the node or
    the tensor, before anything is allocated from them."""
    make, expected = NODE_FAILURES[case]
    path = tmp_path / f"{case}.onnx"
    onnx.save(make(), str(path))
    code = main(["--quiet", "ops", str(path)])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert expected in lines[0], lines[0]



def test_what_onnxruntime_refuses_is_one_line(tmp_path: Path, capsys) -> None:
    """A file the ONNX checker passes but its reference refuses (a double input feeding a
    float output): onnxruntime's report in one line, no traceback, no red log line."""
    x = helper.make_tensor_value_info("x", TensorProto.DOUBLE, [2, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    path = tmp_path / "double.onnx"
    onnx.save(graph_model([helper.make_node("Sigmoid", ["x"], ["y"], name="/s")], [x], [y]),
              str(path))
    code = main(["--quiet", "bench", str(path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("error: double.onnx: onnxruntime, the reference, cannot load "
                               "it: [ONNXRuntimeError]"), lines[0]


def test_an_fp16_file_is_checked_at_its_own_precision(tmp_path: Path, cache_dir: Path,
                                                      lock_path: Path, capsys) -> None:
    """onnxruntime runs an FP16 file in FP16: its rounding (here 2.9e-4 relative RMS) is
    over float32's bound of 1e-4, not an import error."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT16, [2, 4])
    path = tmp_path / "half.onnx"
    onnx.save(graph_model([helper.make_node("Sigmoid", ["x"], ["y"], name="/s")], [x], [y]),
              str(path))
    record = bench(path, tmp_path, cache_dir, lock_path, capsys)
    assert record["numericalTest"] == "PASS"
    assert 1e-4 < record["conversionError"] < 1e-2


def test_a_value_past_the_bound_is_refused_before_it_is_made(tmp_path: Path, capsys) -> None:
    """An ONNX MatMul whose result takes 2 GiB (a 0.5 MB input, a 4 MB weight): ``ops``
    refuses it from the traced shapes in one line, before the listing makes it."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1 << 13, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1 << 13, 1 << 16])
    weight = numpy_helper.from_array(np.zeros((16, 1 << 16), np.float32), "w")
    path = tmp_path / "wide.onnx"
    onnx.save(graph_model([helper.make_node("MatMul", ["x", "w"], ["y"], name="/mm")],
                          [x], [y], [weight]), str(path))
    code = main(["--quiet", "ops", str(path)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: wide.onnx: ") and err.endswith(
        "takes 2.0 GiB, over the bound of 1.0 GiB for one value"), err


def test_nodes_without_a_call_say_whether_they_folded_or_which_node_took_them(
        tmp_path: Path, capsys) -> None:
    """A weight scaled by a constant folds; SiLU written as ``x * sigmoid(x)`` is one call,
    held by its Mul, so the Sigmoid names the Mul that absorbed it."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8])
    w = numpy_helper.from_array(np.eye(8, dtype=np.float32), "w")
    two = numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two")
    nodes = [helper.make_node("Mul", ["w", "two"], ["w2"], name="/scale"),
             helper.make_node("MatMul", ["x", "w2"], ["h"], name="/fc"),
             helper.make_node("Sigmoid", ["h"], ["s"], name="/act/Sigmoid"),
             helper.make_node("Mul", ["h", "s"], ["y"], name="/act/Mul")]
    path = tmp_path / "silu.onnx"
    onnx.save(graph_model(nodes, [x], [y], [w, two]), str(path))
    assert main(["ops", str(path), "--json"]) == 0
    rows = {r["node"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    assert rows["/scale"]["status"] == "folded (constant)"
    assert rows["/act/Sigmoid"]["status"] == "absorbed into /act/Mul (Mul)"
    assert rows["/fc"]["status"] == rows["/act/Mul"]["status"] == "mapped"
