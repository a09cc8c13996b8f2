"""transformers' Swin imports: shifted windows, patch merging and the pooler as rows moved
by gathers, checked against torch, and the builtin ``swin-l`` of the same shape runs the
same program."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from ipu_stack.cli import main  # noqa: E402
from ipu_stack.frontend import import_program  # noqa: E402
from ipu_stack.frontend.forms import Act  # noqa: E402
from ipu_stack.frontend.order import rows_of  # noqa: E402
from ipu_stack.ir.types import RowIndex  # noqa: E402
from ipu_stack.testing.models import swin  # noqa: E402

BUILTIN = ["swin-l", "--batch", "2", "--image", "32", "--window", "4", "--dim", "16",
           "--depths", "2,2", "--stage-heads", "2,4"]


def _swin(classify: bool = False):
    """A small Swin (a 8 x 8 grid of windows of 4: one plain and one shifted block, a merge,
    a stage of one window), its relative position biases random."""
    torch.manual_seed(3)
    model = swin(classify, image_size=32, patch_size=4, embed_dim=16, depths=[2, 2],
                 num_heads=[2, 4], window_size=4, num_labels=5)
    return model, torch.randn(2, 3, 32, 32)


def test_swin_imports_exactly_with_one_gather_a_move() -> None:
    model, pixels = _swin()
    program = torch.export.export(model, (pixels,))
    imported = import_program(program, precision="f16")
    assert imported.conversion_error < 1e-5
    graph = imported.graph
    kinds = [op.kind for op in graph.operations]
    # two a block whose windows move the rows (the plain and the shifted block of stage 1:
    # the norm's output and the stream), one a merge; stage 2 is one window, in raster order
    assert kinds.count("gather_rows") == 5 and kinds.count("biased_softmax") == 4
    tables = [[graph.value(i).type.rows for i in op.inputs[1:]] for op in graph.operations
              if op.kind == "biased_softmax"]
    # heads x T rows of bias; a shifted block's mask: windows x T, each block for its heads
    assert tables == [[2 * 16], [2 * 16, 4 * 16], [4 * 16], [4 * 16]]
    shifted = [op for op in graph.operations if op.kind == "biased_softmax" and len(op.inputs) == 3]
    assert [op.attrs["table_maps"] for op in shifted] == [[[1, 1], [16, 2]]]


def test_swin_for_classification_passes_against_torch(tmp_path, capsys) -> None:
    model, pixels = _swin(classify=True)
    path = tmp_path / "swin_cls.pt2"
    torch.export.save(torch.export.export(model, (pixels,)), str(path))
    assert main(["--quiet", "bench", str(path), "--precision", "f16", "--json", "--out",
                 str(tmp_path / "pkg")]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["numericalTest"] == "PASS" and record["referenceSource"] == "torch"


# the other precision of each model runs the same import path: with -m slow
@pytest.mark.parametrize("precision, labels", [
    pytest.param("f16", 0, marks=pytest.mark.slow), ("fp8", 0), ("f16", 5),
    pytest.param("fp8", 5, marks=pytest.mark.slow)])
def test_the_builtin_runs_the_imported_program(tmp_path, capsys, precision: str, labels: int
                                               ) -> None:
    """SwinModel, and with ``--labels`` SwinForImageClassification (ByteMLPerf's model)."""
    model, pixels = _swin(classify=bool(labels))
    path = tmp_path / "swin.pt2"
    torch.export.save(torch.export.export(model, (pixels,)), str(path))
    extra = ["--attention", "fp8"] if precision == "fp8" else []
    assert main(["--quiet", "bench", str(path), "--precision", precision, *extra, "--json",
                 "--out", str(tmp_path / "imported")]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["numericalTest"] == "PASS" and record["conversionError"] < 1e-5
    assert main(["--quiet", "bench", *BUILTIN, "--labels", str(labels), "--precision",
                 precision, "--json", "--out", str(tmp_path / "builtin")]) == 0
    twin = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert twin["numericalTest"] == "PASS"
    assert (twin["cycles"], twin["weightBytes"]) == (record["cycles"], record["weightBytes"])


def test_an_order_follows_a_roll_and_a_window_partition() -> None:
    """The order the importer keeps after ``roll`` and transformers' partition views is
    numpy's roll and reshape of the row numbers."""
    act = Act(0, (1, 4, 4, 3))
    raster = np.arange(16).reshape(1, 4, 4)
    rolled = np.roll(raster, (-1, -1), (1, 2))
    held = act.with_(order=RowIndex(rolled.reshape(-1)))
    windows = rolled.reshape(1, 2, 2, 2, 2).transpose(0, 1, 3, 2, 4).reshape(-1)
    viewed = rows_of(held.with_(shape=(1, 2, 2, 2, 2, 3))).transpose(0, 1, 3, 2, 4)
    np.testing.assert_array_equal(viewed.reshape(-1), windows)


def test_padding_that_adds_rows_is_refused(tmp_path, capsys) -> None:
    """A grid that windows do not tile is padded by transformers: one line, no traceback."""
    torch.manual_seed(4)
    config = transformers.SwinConfig(image_size=24, patch_size=4, embed_dim=16, depths=[2],
                                     num_heads=[2], window_size=4)
    model = transformers.SwinModel(config).eval()
    path = tmp_path / "padded.pt2"
    torch.export.save(torch.export.export(model, (torch.randn(1, 3, 24, 24),)), str(path))
    assert main(["bench", str(path), "--precision", "f16"]) == 2
    err = capsys.readouterr().err
    assert "padding that adds rows or columns" in err and "Traceback" not in err
