"""transformers' SmolVLM imported: its vision tower and connector (the pixel shuffle's
views and permutes kept as one row gather) PASS against torch in the builtin
``smolvlm-256m --part vision``'s cycles."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from ipu_stack.cli import main  # noqa: E402
from ipu_stack.testing.models import smolvlm, smolvlm_image_part  # noqa: E402


@pytest.mark.parametrize("precision", ["f16", "fp8"])
def test_smolvlm_image_part_passes_in_the_builtins_cycles(tmp_path, capsys, precision: str
                                                          ) -> None:
    torch.manual_seed(0)
    model = smolvlm({"num_hidden_layers": 1, "image_size": 64},
                    {"num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 128,
                     "num_attention_heads": 4, "num_key_value_heads": 2}, scale_factor=2)
    program = torch.export.export(smolvlm_image_part(model), (torch.randn(1, 3, 64, 64),),
                                  strict=False)
    path = tmp_path / "image.pt2"
    torch.export.save(program, str(path))
    code = main(["--quiet", "bench", str(path), "--precision", precision, "--json", "--out",
                 str(tmp_path / "import")])
    record = json.loads(capsys.readouterr().out)
    assert code == 0 and record["numericalTest"] == "PASS", record
    assert record["referenceSource"] == "torch" and record["conversionError"] < 1e-5
    code = main(["--quiet", "bench", "smolvlm-256m", "--part", "vision", "--image", "64",
                 "--vision-layers", "1", "--shuffle", "2", "--dim", "64", "--precision",
                 precision, "--json", "--out", str(tmp_path / "builtin")])
    twin = json.loads(capsys.readouterr().out)
    assert code == 0 and twin["numericalTest"] == "PASS"
    assert twin["cycles"] == record["cycles"] and twin["weightBytes"] == record["weightBytes"]


def test_the_pixel_shuffle_is_one_gather_of_the_smolvlm_order() -> None:
    """The connector's views and permutes move no data until its product reads the rows:
    one ``gather_rows`` of 16 rows a row, in the order SmolVLM's ``pixel_shuffle`` makes."""
    from ipu_stack.frontend import import_program
    from ipu_stack.workloads.vlm import shuffle_sources

    torch.manual_seed(1)
    connector = smolvlm().model.connector
    program = torch.export.export(connector, (torch.randn(1, 1024, 768),), strict=False)
    imported = import_program(program, precision="f16")
    assert imported.conversion_error < 1e-5
    gathers = [op for op in imported.graph.operations if op.kind == "gather_rows"]
    assert len(gathers) == 1 and gathers[0].attrs["group"] == 16
    assert (gathers[0].attrs["index"].rows == shuffle_sources(32, 4).reshape(-1)).all()


class _Merged(torch.nn.Module):
    """Rows merged side by side, permuted, then read by row-local operations and added to
    another order of the same rows."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        side = x.view(b, n // 4, 4 * d).view(b, 2, n // 8, 4 * d).permute(0, 2, 1, 3)
        side = side.reshape(b, n // 4, 4 * d)
        normed = torch.nn.functional.layer_norm(side, (4 * d,))
        return normed + x.reshape(b, n // 4, 4 * d)


def test_merged_rows_read_by_row_operations_import_exactly() -> None:
    from ipu_stack.frontend import import_program

    program = torch.export.export(_Merged(), (torch.randn(2, 32, 16),))
    imported = import_program(program, precision="f16")
    assert imported.conversion_error < 1e-5
    groups = sorted(op.attrs.get("group", 1) for op in imported.graph.operations
                    if op.kind == "gather_rows")
    assert groups == [4, 4]
