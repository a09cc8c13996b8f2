"""ONNX operators the encoders' stock exports use, each translation against onnxruntime on
the same single-node graph, and the exported encoders themselves (transformers' BERT and
RoBERTa for question answering through torch.onnx, Swin through the TorchScript exporter)
against onnxruntime, in the cycles of the ``.pt2`` of the same module."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")
transformers = pytest.importorskip("transformers")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from ipu_stack.frontend.onnx_program import fold, read_nodes  # noqa: E402
from tests.frontend.models import QaLogits, drawn_vectors  # noqa: E402
from tests.frontend.test_onnx import bench  # noqa: E402

LAST = 2 ** 63 - 1  # an exporter's "to the end"


def model_of(nodes: list, arrays: dict[str, np.ndarray]) -> onnx.ModelProto:
    """A graph of ``nodes`` over constant ``arrays`` (initializers), its output ``y`` (its
    type set when onnxruntime runs it)."""
    y = helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)
    graph = helper.make_graph(nodes, "g", [], [y], [numpy_helper.from_array(np.asarray(v), k)
                                                     for k, v in arrays.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def translated(model: onnx.ModelProto) -> tuple[np.ndarray, list[str]]:
    """``y`` as the importer's translations compute it (every node folded), and the node
    kinds it read the graph as (an idiom rewritten)."""
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    nodes = read_nodes(model, weights)
    return fold(nodes, weights, {}, {}).constants["y"], [n.op_type for n in nodes]


def onnxruntime(model: onnx.ModelProto, like: np.ndarray) -> np.ndarray:
    """``y`` as onnxruntime computes it, the output declared of ``like``'s type (a wrong
    type of ours fails the session)."""
    model.graph.output[0].type.tensor_type.elem_type = helper.np_dtype_to_tensor_dtype(
        like.dtype)
    return ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(["y"], {})[0]


def node(op: str, inputs: list[str], **attrs) -> onnx.NodeProto:
    return helper.make_node(op, inputs, ["y"], **attrs)


def slice_node(x: str, start: int, end: int, axis: int, out: str) -> list[onnx.NodeProto]:
    names = [f"{out}.{k}" for k in ("starts", "ends", "axes")]
    return [helper.make_node("Constant", [], [n], value=numpy_helper.from_array(
        np.array([v], dtype=np.int64), n)) for n, v in zip(names, (start, end, axis),
                                                           strict=True)] + [
        helper.make_node("Slice", [x, *names], [out])]


X = np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 11.5
IDS = np.array([[5, 1, 1, 7, 1], [1, 3, 3, 3, 9]], dtype=np.int64)
CASES = {
    "gather_elements_negative": (
        [node("GatherElements", ["x", "i"], axis=2)],
        {"x": X, "i": np.array([[[0, -1, 2, 1]] * 3, [[3, 0, -2, -4]] * 3], dtype=np.int64)}),
    "cumsum": ([node("CumSum", ["ids", "axis"])], {"ids": IDS, "axis": np.array(1)}),
    "cumsum_exclusive_reverse": ([node("CumSum", ["x", "axis"], exclusive=1, reverse=1)],
                                 {"x": X, "axis": np.array(-1)}),
    "mod_sign_of_divisor": ([node("Mod", ["a", "b"])],
                            {"a": np.array([-7, 7, -7, 7, 0]), "b": np.array([3, -3, -3, 3, 5])}),
    "mod_fmod": ([node("Mod", ["a", "b"], fmod=1)],
                 {"a": np.array([-7.5, 7.5, -7.5, 7.5], dtype=np.float32),
                  "b": np.array([2.0, -2.0, -2.0, 2.0], dtype=np.float32)}),
    "pad_constant_axes": ([node("Pad", ["x", "pads", "value", "axes"])],
                          {"x": X, "pads": np.array([1, 0, 2, -1]),
                           "value": np.array(1.5, dtype=np.float32), "axes": np.array([1, -1])}),
    "pad_reflect": ([node("Pad", ["x", "pads"], mode="reflect")],
                    {"x": X, "pads": np.array([0, 1, 2, 0, 1, 1])}),
    "pad_edge": ([node("Pad", ["x", "pads"], mode="edge")],
                 {"x": X, "pads": np.array([0, 2, 0, 0, 0, 3])}),
    "pad_edge_one_dimension": ([node("Pad", ["x", "pads"], mode="edge")],
                               {"x": np.arange(5, dtype=np.float32), "pads": np.array([2, 1])}),
    "pad_reflect_every_axis": ([node("Pad", ["x", "pads"], mode="reflect")],
                               {"x": X, "pads": np.array([1, 1, 1, 1, 2, 3])}),
    "pad_grown_then_cropped": ([node("Pad", ["x", "pads", "value"])],
                               {"x": X, "pads": np.array([0, 2, -1, 0, -3, 2]),
                                "value": np.array(1.5, dtype=np.float32)}),
    "pad_edge_cropped": ([node("Pad", ["x", "pads"], mode="edge")],
                         {"x": X, "pads": np.array([-1, 3, 0, 0, -1, 2])}),
    "slice_backward": (slice_node("x", -1, -LAST, 2, "y"), {"x": X}),
    "slice_backward_step": (
        [helper.make_node("Slice", ["x", "s", "e", "a", "k"], ["y"])],
        {"x": np.arange(10, dtype=np.float32), "s": np.array([8]), "e": np.array([1]),
         "a": np.array([0]), "k": np.array([-3])}),
    "greater_or_equal": ([node("GreaterOrEqual", ["x", "t"])],
                         {"x": X, "t": np.array(0.5, dtype=np.float32)}),
    "less_or_equal": ([node("LessOrEqual", ["x", "t"])],
                      {"x": X, "t": np.array(0.5, dtype=np.float32)}),
    "global_average_pool_1d": ([node("GlobalAveragePool", ["x"])], {"x": X}),
    "global_average_pool_2d": ([node("GlobalAveragePool", ["x"])], {"x": X.reshape(1, 2, 3, 4)}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_translation_computes_what_onnxruntime_does(case: str) -> None:
    nodes, arrays = CASES[case]
    model = model_of(nodes, arrays)
    ours, _ = translated(model)
    expected = onnxruntime(model, ours)
    assert ours.shape == expected.shape and ours.dtype.kind == expected.dtype.kind
    np.testing.assert_array_equal(ours, expected)


@pytest.mark.parametrize("shift", [1, -1, 3])
def test_a_concatenation_of_two_slices_is_read_as_a_roll(shift: int) -> None:
    """``Concat(x[s:], x[:s])``: how the TorchScript exporter writes ``torch.roll``."""
    nodes = [*slice_node("x", shift, LAST, 1, "head"), *slice_node("x", 0, shift, 1, "tail"),
             node("Concat", ["head", "tail"], axis=1)]
    model = model_of(nodes, {"x": X})
    ours, kinds = translated(model)
    assert kinds[-1] == "Roll"
    np.testing.assert_array_equal(ours, onnxruntime(model, ours))
    np.testing.assert_array_equal(ours, np.roll(X, -shift, 1))


def test_not_equal_is_read_as_one_comparison() -> None:
    nodes = [helper.make_node("Equal", ["ids", "pad"], ["same"]), node("Not", ["same"])]
    model = model_of(nodes, {"ids": IDS, "pad": np.array(1)})
    ours, kinds = translated(model)
    assert kinds == ["Equal", "NotEqual"]
    np.testing.assert_array_equal(ours, onnxruntime(model, ours))


def test_slices_with_a_step_input_are_read_as_a_roll() -> None:
    """The same with the steps given (torch.onnx's ``rotate_half``): one-element arrays."""
    nodes = []
    for out, (start, end) in {"head": (2, LAST), "tail": (0, 2)}.items():
        bounds = [f"{out}.{k}" for k in ("s", "e", "a", "k")]
        nodes += [helper.make_node("Constant", [], [b], value=numpy_helper.from_array(
            np.array([v], dtype=np.int64), b)) for b, v in zip(bounds, (start, end, 1, 1),
                                                               strict=True)]
        nodes.append(helper.make_node("Slice", ["x", *bounds], [out]))
    model = model_of([*nodes, node("Concat", ["head", "tail"], axis=1)], {"x": X})
    ours, kinds = translated(model)
    assert kinds[-1] == "Roll"
    np.testing.assert_array_equal(ours, np.roll(X, -2, 1))


def test_x_times_its_sigmoid_is_read_as_silu() -> None:
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), node("Mul", ["s", "x"])]
    model = model_of(nodes, {"x": X})
    ours, kinds = translated(model)
    assert kinds == ["Sigmoid", "Silu"]
    np.testing.assert_allclose(ours, onnxruntime(model, ours), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("final", [[2, 4, 5, 3], [-1, 4, 5, 3], [8, 5, 3], [2, 4, 0, -1]])
def test_repeated_key_heads_transposed_through_merged_rows(final: list[int]) -> None:
    """``Reshape(Transpose(Reshape(k, [-1, T, d]), [0, 2, 1]), shape)`` from grouped-query
    attention's repeated keys ``[B, kv, n, T, d]``: the last two axes swapped, the leading
    ones merged as the final shape has them; or, where the final shape is not that (a 0
    copying the transposed rows' axis), the three operations as written."""
    keys = np.arange(2 * 2 * 2 * 3 * 5, dtype=np.float32).reshape(2, 2, 2, 3, 5)
    nodes = [helper.make_node("Reshape", ["k", "flat"], ["rows"]),
             helper.make_node("Transpose", ["rows"], ["turned"], perm=[0, 2, 1]),
             node("Reshape", ["turned", "final"])]
    model = model_of(nodes, {"k": keys, "flat": np.array([-1, 3, 5]),
                             "final": np.array(final)})
    ours, kinds = translated(model)
    assert kinds[-1] == "SwapLast"
    np.testing.assert_array_equal(ours, onnxruntime(model, ours))


def test_a_constant_index_outside_its_axis_is_refused() -> None:
    """onnxruntime refuses it when run; the translation must not wrap it around."""
    from ipu_stack.util.errors import CompileError

    model = model_of([node("Gather", ["x", "i"], axis=1)], {"x": X, "i": np.array(3)})
    with pytest.raises(CompileError, match="index 3 is outside axis 1 of size 3"):
        translated(model)


def test_an_unread_pad_mode_is_named() -> None:
    from ipu_stack.util.errors import CompileError

    model = model_of([node("Pad", ["x", "pads"], mode="wrap")],
                     {"x": X, "pads": np.array([0, 1, 0, 0, 1, 0])})
    with pytest.raises(CompileError, match="Pad with mode 'wrap'"):
        translated(model)


def question_answering(kind: str) -> tuple[torch.nn.Module, torch.Tensor]:
    """transformers' BERT, RoBERTa or ALBERT for SQuAD, 2 layers at width 64, returning the
    start and end logits; RoBERTa's position ids are counted from its ids (``CumSum``)."""
    torch.manual_seed(3)
    common = {"vocab_size": 300, "hidden_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "intermediate_size": 128,
              "max_position_embeddings": 40}
    if kind == "bert":
        model = transformers.BertForQuestionAnswering(transformers.BertConfig(**common))
    elif kind == "albert":  # gelu_new, written out: read back as one gelu(tanh)
        model = transformers.AlbertForQuestionAnswering(
            transformers.AlbertConfig(**common, embedding_size=32))
    else:
        model = transformers.RobertaForQuestionAnswering(
            transformers.RobertaConfig(**common, type_vocab_size=1))

    return drawn_vectors(QaLogits(model).eval()), torch.randint(2, 300, (2, 12))


def swin() -> tuple[torch.nn.Module, torch.Tensor]:
    """transformers' Swin classifier, two stages of two blocks (the second shifted)."""
    torch.manual_seed(3)
    config = transformers.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[2, 2],
                                     num_heads=[2, 4], window_size=4, num_labels=10)

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = transformers.SwinForImageClassification(config)

        def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
            return self.model(pixel_values=pixel_values).logits

    return drawn_vectors(Logits().eval()), torch.randn(1, 3, 32, 32)


def causal_lm(family: str = "llama") -> tuple[torch.nn.Module, torch.Tensor]:
    """transformers' ``LlamaForCausalLM`` with grouped-query attention (4 query heads, 2 key
    and value heads), 2 layers at width 64, its logits out: torch.onnx writes ``repeat_kv``
    and the keys' transpose as an expand, a reshape merging the batch with the heads, a
    transpose and a reshape back, and RoPE's ``rotate_half`` as slices with steps.  Qwen3's
    (``family``) has heads of 32 and an RMS norm of each head of q and k."""
    torch.manual_seed(3)
    shape = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "max_position_embeddings": 64, "tie_word_embeddings": True}
    config = transformers.LlamaConfig(**shape) if family == "llama" else \
        transformers.Qwen3Config(**shape, head_dim=32)

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = (transformers.LlamaForCausalLM if family == "llama" else
                          transformers.Qwen3ForCausalLM)(config)

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            return self.model(input_ids=input_ids, use_cache=False).logits

    return drawn_vectors(Logits().eval()), torch.randint(0, 256, (2, 16))


# RoBERTa and ALBERT are BERT's graph with other position ids and shared layers: -m slow
@pytest.mark.parametrize("kind", ["bert", pytest.param("roberta", marks=pytest.mark.slow),
                                  pytest.param("albert", marks=pytest.mark.slow), "swin",
                                  "llama", "qwen3"])
def test_stock_encoder_exports_pass_in_the_cycles_of_the_pt2(
        kind: str, tmp_path: Path, cache_dir: Path, lock_path: Path, capsys) -> None:
    module, example = {"swin": swin, "llama": causal_lm, "qwen3": lambda: causal_lm("qwen3")
                       }.get(kind, lambda: question_answering(kind))()
    name = "pixel_values" if kind == "swin" else "input_ids"
    pt2 = tmp_path / f"{kind}.pt2"
    torch.export.save(torch.export.export(module, (example,)), str(pt2))
    path = tmp_path / f"{kind}.onnx"
    # Swin's window partition does not decompose in torch.onnx's exporter: TorchScript's
    torch.onnx.export(module, (example,), str(path), dynamo=kind != "swin", opset_version=18,
                      input_names=[name], verbose=False)
    onnx_record = bench(path, tmp_path, cache_dir, lock_path, capsys)
    pt2_record = bench(pt2, tmp_path, cache_dir, lock_path, capsys)
    assert onnx_record["numericalTest"] == "PASS", onnx_record
    assert onnx_record["referenceSource"] == "onnxruntime"
    assert onnx_record["conversionError"] < 1e-5
    if kind in ("llama", "qwen3"):  # the file orders the key heads' repeat after the values': its two
        # RoPEs share a superstep on the same tiles (docs/onnx.md)
        assert pt2_record["cycles"] <= onnx_record["cycles"] <= 1.05 * pt2_record["cycles"]
        assert onnx_record["rmsNormCycles"] == pt2_record["rmsNormCycles"]
        assert onnx_record["activationCycles"] == pt2_record["activationCycles"]  # SwiGLU
    else:
        assert onnx_record["cycles"] == pt2_record["cycles"]
    assert pt2_record["numericalTest"] == "PASS"
    if kind == "albert":  # the chain of products as GELU kernels (a power of 3 is refused)
        assert onnx_record["geluCycles"] > 0 and pt2_record["geluCycles"] > 0


def _absurd(kind: str) -> onnx.ModelProto:
    """x [1, 4, 8] plus a value of billions of elements that a few bytes ask for: folded
    from constants (``ConstantOfShape``, ``Expand``, a broadcast ``Add``, ``Tile``, ``Pad``)
    or computed from the input (``Expand`` of x)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8])
    big = 40_000
    arrays = {"shape": np.array([big, big, 1]), "column": np.ones((big, 1), np.float32),
              "row": np.ones((1, big), np.float32), "reps": np.array([big, big]),
              "pads": np.array([big, big, big, big]), "one": np.ones((1, 1), np.float32),
              "wide": np.array([big, big, 4, 8])}
    made = {"constant_of_shape": [helper.make_node("ConstantOfShape", ["shape"], ["v"])],
            "expand": [helper.make_node("Expand", ["one", "shape"], ["v"])],
            "broadcast": [helper.make_node("Add", ["column", "row"], ["v"])],
            "tile": [helper.make_node("Tile", ["one", "reps"], ["v"])],
            "pad": [helper.make_node("Pad", ["one", "pads"], ["v"])],
            "expand_input": [helper.make_node("Expand", ["x", "wide"], ["v"])]}[kind]
    nodes = [*made, helper.make_node("ReduceSum", ["v"], ["s"], keepdims=0),
             helper.make_node("Add", ["x", "s"], ["y"])]
    graph = helper.make_graph(nodes, "g", [x], [y], [numpy_helper.from_array(v, k)
                                                     for k, v in arrays.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("kind", ["constant_of_shape", "expand", "broadcast", "tile", "pad",
                                  "expand_input"])
def test_a_value_of_billions_is_refused_before_it_is_made(kind: str, tmp_path: Path,
                                                          capsys) -> None:
    """Each is 1.6 billion elements or more (6.4 GB as float32): refused in one line from
    its shape alone, the bound named (1 GiB a value)."""
    from ipu_stack.cli import main

    path = tmp_path / f"{kind}.onnx"
    onnx.save(_absurd(kind), str(path))
    code = main(["--quiet", "compile", str(path), "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert "over the bound of 1.0 GiB for one value" in lines[0], lines[0]


def test_gelu_new_with_its_half_product_first_is_read_as_gelu() -> None:
    """transformers' ``gelu_new`` (ALBERT, GPT-2): ``(x * 0.5) * (1 + tanh(...))``, the
    half product made before the others, as torch.onnx writes it."""
    scalars = {"half": 0.5, "three": 3.0, "cube_factor": 0.044715,
               "root": (2 / np.pi) ** 0.5, "one": 1.0}
    arrays = {"x": X, **{k: np.array(v, dtype=np.float32) for k, v in scalars.items()}}
    nodes = [helper.make_node("Mul", ["x", "half"], ["h"]),
             helper.make_node("Pow", ["x", "three"], ["c"]),
             helper.make_node("Mul", ["c", "cube_factor"], ["d"]),
             helper.make_node("Add", ["x", "d"], ["e"]),
             helper.make_node("Mul", ["e", "root"], ["f"]),
             helper.make_node("Tanh", ["f"], ["g"]),
             helper.make_node("Add", ["g", "one"], ["k"]), node("Mul", ["h", "k"])]
    model = model_of(nodes, arrays)
    ours, kinds = translated(model)
    assert kinds[-1] == "Gelu"
    np.testing.assert_allclose(ours, onnxruntime(model, ours), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(), (1,)])
def test_a_written_out_rms_norm_imports_whatever_its_scalars_shape(shape, tmp_path) -> None:
    """``x * 1/sqrt(mean(x^2) + eps)``, its 2 and eps as ``()`` or ``[1]`` (exporters write
    either): one ``rms_norm`` operation both ways."""
    from ipu_stack.frontend.onnx_file import load_onnx
    from ipu_stack.frontend.onnx_program import export_onnx
    from ipu_stack.frontend.workload import import_program

    scalars = {k: np.array(v, np.float32).reshape(shape) for k, v in (("two", 2.0),
                                                                       ("eps", 1e-6))}
    weights = {**scalars, "w": np.eye(8, dtype=np.float32), "axes": np.array([-1])}
    nodes = [helper.make_node("Pow", ["x", "two"], ["p"]),
             helper.make_node("ReduceMean", ["p", "axes"], ["m"], keepdims=1),
             helper.make_node("Add", ["m", "eps"], ["a"]),
             helper.make_node("Sqrt", ["a"], ["s"]),
             helper.make_node("Reciprocal", ["s"], ["r"]),
             helper.make_node("Mul", ["x", "r"], ["n"]), node("MatMul", ["n", "w"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 8])
    graph = helper.make_graph(nodes, "g", [x], [y], [numpy_helper.from_array(v, k)
                                                     for k, v in weights.items()])
    path = tmp_path / "rms.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    program = export_onnx(load_onnx(path), path, {"x": np.zeros((2, 4, 8), np.float32)})
    rows = np.random.default_rng(1).standard_normal((2, 4, 8)).astype(np.float32)
    imported = import_program(program, precision="f16", inputs=[rows])
    assert [op.kind for op in imported.converted.graph.operations] == ["rms_norm", "matmul"]


def test_two_scalar_constants_fold_to_a_tensor() -> None:
    """``a / b`` of two ``()`` constants is a value with a shape (a number had none)."""
    model = model_of([node("Div", ["a", "b"])], {"a": np.array(3.0, np.float32),
                                                  "b": np.array(2.0, np.float32)})
    ours, _ = translated(model)
    np.testing.assert_array_equal(ours, onnxruntime(model, ours))


def test_an_fp16_files_exact_gelu_is_read_as_gelu() -> None:
    """The same in an FP16 file: its constants are FP16's roundings (sqrt 2 is 1.4140625)."""
    x16 = X.astype(np.float16) / 8
    scalars = {"root2": 2 ** 0.5, "one": 1.0, "half": 0.5}
    arrays = {"x": x16, **{k: np.array(v, dtype=np.float16) for k, v in scalars.items()}}
    nodes = [helper.make_node("Div", ["x", "root2"], ["a"]),
             helper.make_node("Erf", ["a"], ["b"]),
             helper.make_node("Add", ["b", "one"], ["c"]),
             helper.make_node("Mul", ["x", "c"], ["d"]), node("Mul", ["d", "half"])]
    model = model_of(nodes, arrays)
    ours, kinds = translated(model)
    assert kinds[-1] == "Gelu"
    np.testing.assert_allclose(ours, onnxruntime(model, ours), rtol=2e-3, atol=1e-3)


def _counted_positions(exclusive: int, reverse: int, fmod: int) -> onnx.ModelProto:
    """Token ids [1, 12] looked up, plus positions counted from them on the host: the ids
    that are not padding (``Not(Equal)``), their running count (``CumSum``, either way,
    inclusive or not), wrapped (``Mod``), looked up in a position table; then a product."""
    rng = np.random.default_rng(5)
    ids = helper.make_tensor_value_info("x", TensorProto.INT64, [1, 12])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 12, 8])
    arrays = {"E": rng.standard_normal((64, 16)).astype(np.float32) * 0.1,
              "P": rng.standard_normal((64, 16)).astype(np.float32) * 0.1,
              "W": rng.standard_normal((16, 8)).astype(np.float32) * 0.1,
              "pad": np.array(1), "ax": np.array(1), "wrap": np.array(7)}
    nodes = [helper.make_node("Gather", ["E", "x"], ["tokens"]),
             helper.make_node("Equal", ["x", "pad"], ["same"]),
             helper.make_node("Not", ["same"], ["real"]),
             helper.make_node("Cast", ["real"], ["counted"], to=TensorProto.INT64),
             helper.make_node("CumSum", ["counted", "ax"], ["count"], exclusive=exclusive,
                              reverse=reverse),
             helper.make_node("Mod", ["count", "wrap"], ["position"], fmod=fmod),
             helper.make_node("Gather", ["P", "position"], ["positions"]),
             helper.make_node("Add", ["tokens", "positions"], ["summed"]),
             helper.make_node("MatMul", ["summed", "W"], ["y"])]
    graph = helper.make_graph(nodes, "g", [ids], [y], [numpy_helper.from_array(v, k)
                                                       for k, v in arrays.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize(("exclusive", "reverse", "fmod"), [(1, 0, 0), (0, 1, 0), (1, 1, 1)])
def test_positions_counted_from_the_ids_run_on_the_host(
        exclusive: int, reverse: int, fmod: int, tmp_path: Path, cache_dir: Path,
        lock_path: Path, capsys) -> None:
    """An exclusive count is ``cumsum - ids``, a reverse one ``flip(cumsum(flip))``, the
    wrap a remainder: each host arithmetic on the ids, PASS against onnxruntime."""
    path = tmp_path / "counted.onnx"
    onnx.save(_counted_positions(exclusive, reverse, fmod), str(path))
    record = bench(path, tmp_path, cache_dir, lock_path, capsys)
    assert record["numericalTest"] == "PASS" and record["referenceSource"] == "onnxruntime"
    assert record["conversionError"] < 1e-5 and record["multisliceCycles"] > 0
