"""An imported program's least memory, read from the exported graph: checked against the
model's own sizes by hand, and an absurd batch refused in one line before any import."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from ipu_stack.cli import main  # noqa: E402
from ipu_stack.frontend.sizing import program_footprint  # noqa: E402


class TwoLinear(torch.nn.Module):
    """x -> fc2(gelu(fc1(x))) with an unused parameter, which holds no memory."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)
        self.fc2 = torch.nn.Linear(64, 16, bias=False)
        self.unused = torch.nn.Parameter(torch.zeros(1000))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


def test_the_footprint_counts_used_weights_and_the_largest_product():
    program = torch.export.export(TwoLinear().eval(), (torch.randn(3, 5, 32),))
    weights = 32 * 64 + 64 + 64 * 16  # fc1's weight and bias, fc2's weight
    fp8, f16 = program_footprint(program, "fp8"), program_footprint(program, "f16")
    assert (fp8.weight_bytes, f16.weight_bytes) == (weights, 2 * weights)
    rows = 3 * 5
    # fc1: its input (32 wide) and its F16 result (64 wide) against fc2: 64 in, 16 out
    assert fp8.activation_bytes == max(rows * 32 + 2 * rows * 64, rows * 64 + 2 * rows * 16)
    assert f16.activation_bytes == 2 * rows * (32 + 64)
    assert fp8.activation_what == "aten.linear linear's operands and 3x5x64 result"


def test_an_absurd_batch_is_refused_before_the_import(tmp_path: Path, capsys):
    model = tmp_path / "mlp.onnx"
    torch.onnx.export(TwoLinear().eval(), (torch.randn(2, 8, 32),), str(model), dynamo=False,
                      input_names=["x"], dynamic_axes={"x": {0: "batch"}})
    code = main(["--quiet", "compile", str(model), "--batch", "1000000",
                 "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    # 8e6 rows: 32 FP8 inputs and 64 F16 results each, 1.28 GB against a chip's 0.94 GB
    assert code == 2 and err == (
        "error: mlp.onnx does not fit: its weights (0.0 MB) and aten.linear linear's "
        "operands and 1000000x8x64 result (1.28 GB) take at least 1.28 GB and one chip of "
        "ipu21 holds 0.94 GB")
    assert not (tmp_path / "out").exists()


def test_sizes_a_model_file_cannot_take_are_refused_in_one_line(tmp_path: Path, capsys):
    model = tmp_path / "feat.onnx"
    torch.onnx.export(TwoLinear().eval(), (torch.randn(2, 8, 32),), str(model), dynamo=False,
                      input_names=["x"], dynamic_axes={"x": {0: "batch", 2: "features"}})
    out = str(tmp_path / "out")
    for argv, message in (
            (["--batch", "0", "--tokens", "32"], "error: --batch must be at least 1, got 0"),
            (["--tokens", "0"], "error: --tokens must be at least 1, got 0"),
            # the product's weight takes 32 features: torch's trace at 40 fails
            (["--tokens", "40"], "error: feat.onnx does not run at x [1, 8, 40]: "),
            (["--batch", "1048576", "--tokens", "1048576"],
             "error: graph input x would be [1048576, 8, 1048576]: more elements than a "
             "chip's memory holds (940,572,672 bytes)")):
        code = main(["--quiet", "compile", str(model), *argv, "-o", out])
        err = capsys.readouterr().err.strip()
        assert code == 2 and err.startswith(message) and "\n" not in err, (argv, err)


class Ones(torch.nn.Module):
    """A product plus the sum of a ``torch.ones`` of 1.6 billion elements: a file of a few
    kilobytes whose fold would take 6.4 GB of the host's memory."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) + torch.ones(40_000, 40_000).sum()


def test_a_constant_of_billions_is_refused_before_it_is_folded(tmp_path: Path, capsys):
    path = tmp_path / "ones.pt2"
    torch.export.save(torch.export.export(Ones().eval(), (torch.randn(1, 4, 8),)), str(path))
    assert path.stat().st_size < 100_000
    code = main(["--quiet", "compile", str(path), "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err, err
    assert err == ("error: ones.pt2: aten.ones ones's result takes 6.0 GiB, over the bound "
                   "of 1.0 GiB for one value")
