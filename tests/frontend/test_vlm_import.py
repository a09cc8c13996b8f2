"""transformers' SmolVLM imported: its vision tower and connector (the pixel shuffle's
views and permutes kept as one row gather) PASS against torch in the builtin
``smolvlm-256m --part vision``'s cycles, and with its decoder step (exported to take
embeddings) it generates from an image: ``generate DECODER.pt2 --image-program
IMAGE.pt2``."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("transformers.integrations.executorch")

from ipu_stack.cli import main  # noqa: E402
from ipu_stack.testing.models import (  # noqa: E402
    smolvlm,
    smolvlm_decoder_step,
    smolvlm_image_part,
    static_cache_step,
)
from tests.helpers import cli, one_error_line  # noqa: E402


@pytest.mark.parametrize("precision", [pytest.param("f16", marks=pytest.mark.slow), "fp8"])
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


class _Unmerged(torch.nn.Module):
    """Rows merged four a row, reordered, then split back two a row."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        side = x.view(b, n // 4, 4 * d).view(b, 2, n // 8, 4 * d).permute(0, 2, 1, 3)
        return torch.nn.functional.layer_norm(side.reshape(b, n // 2, 2 * d), (2 * d,))


def test_a_merge_split_back_moves_rows_once() -> None:
    """A view that splits merged rows back keeps them where they lie: one gather of the
    rows still side by side (two a row), none where every merge is undone."""
    from ipu_stack.frontend import import_program

    program = torch.export.export(_Unmerged(), (torch.randn(2, 32, 16),))
    imported = import_program(program, precision="f16")
    assert imported.conversion_error < 1e-5
    groups = [op.attrs.get("group", 1) for op in imported.graph.operations
              if op.kind == "gather_rows"]
    assert groups == [2]


@pytest.fixture(scope="module")
def smolvlm_files(tmp_path_factory):
    """A small SmolVLM's image program and its decoder step taking embeddings (a cache of
    32 positions), exported as ``benchmarks/export_smolvlm.py`` exports the full one."""
    from ipu_stack.testing.models import export_smolvlm_parts

    torch.manual_seed(0)
    model = smolvlm({"num_hidden_layers": 1, "image_size": 64},
                    {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
                     "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256},
                    scale_factor=2)
    folder = tmp_path_factory.mktemp("smolvlm")
    for name, program in zip(("image", "decoder"), export_smolvlm_parts(model, 32),
                             strict=True):
        torch.export.save(program, str(folder / f"{name}.pt2"))
    return folder


def test_an_imported_smolvlm_generates_from_an_image(smolvlm_files, tmp_path, capsys) -> None:
    """The image program runs first; its rows, as the device wrote them, open the prompt's
    pass; every call PASSes, the tokens are the host reference's and PyTorch's own (its
    prompt opening with PyTorch's image rows)."""
    code = main(["--quiet", "generate", str(smolvlm_files / "decoder.pt2"), "--image-program",
                 str(smolvlm_files / "image.pt2"), "--prompt-tokens", "4", "--new-tokens", "3",
                 "--json", "--out", str(tmp_path)])
    record = json.loads(capsys.readouterr().out)
    assert code == 0 and record["numericalTest"] == "PASS", record
    assert record["imageTokens"] == 4 and record["promptTokens"] == 8
    assert record["tokensMatch"] and record["torchTokenMatch"] and record["imageCycles"] > 0
    assert record["prefill"] == "one pass" and len(record["generated"]) == 3


def test_an_imported_vlm_reads_the_users_pixels(smolvlm_files, tmp_path) -> None:
    """``--inputs`` with ``--image-program`` are the image program's pixels: checked against
    its export's shape, then the run PASSes on them."""
    pixels = np.random.default_rng(5).uniform(-1, 1, (1, 3, 64, 64)).astype(np.float32)
    np.savez(tmp_path / "pixels.npz", pixel_values=pixels)
    np.savez(tmp_path / "small.npz", pixel_values=pixels[:, :, :32, :32])
    command = ["generate", str(smolvlm_files / "decoder.pt2"), "--image-program",
               str(smolvlm_files / "image.pt2"), "--prompt-tokens", "4", "--new-tokens", "2",
               "--out", str(tmp_path / "o"), "--json", "--inputs"]
    code, _, err = cli([*command, str(tmp_path / "small.npz")])
    assert "pixel_values is [1, 3, 32, 32], the program was exported for [1, 3, 64, 64]" in \
        one_error_line(code, err)
    code, out, err = cli([*command, str(tmp_path / "pixels.npz")])
    record = json.loads(out)
    assert code == 0 and record["numericalTest"] == "PASS", (record, err)
    assert record["tokensMatch"] and record["imageTokens"] == 4


def test_a_step_taking_embeddings_puts_the_image_rows_first(smolvlm_files) -> None:
    """The host's embeddings for a prompt: the image's rows, then the text's table rows."""
    from ipu_stack.frontend import imported_workload
    from ipu_stack.frontend.step import user_arrays

    workload, _ = imported_workload(smolvlm_files / "decoder.pt2")
    step = workload.step
    assert step is not None and step.table is not None and step.table.shape == (256, 64)
    ids = np.array([[0, 0, 5, 9]])
    rows = np.random.default_rng(0).standard_normal((1, 2, 64)).astype(np.float32)
    arrays = user_arrays(replace(step, tokens=4), ids, 0, rows)
    embeds = arrays[1 - step.position_index]
    np.testing.assert_array_equal(embeds[:, :2], rows)
    np.testing.assert_array_equal(embeds[0, 2:], step.table[[5, 9]])
    np.testing.assert_array_equal(arrays[step.position_index], np.arange(4))


@pytest.mark.slow  # an error path that needs the exported files: -m slow
def test_an_image_program_needs_a_step_taking_embeddings(smolvlm_files, tmp_path) -> None:
    code, _, err = cli(["generate", "smollm2-135m", "--image-program",
                        str(smolvlm_files / "image.pt2")])
    assert "--image-program goes with a decoder step's model file" in one_error_line(code, err)
    torch.manual_seed(0)
    tokens = torch.export.Dim("tokens", min=1, max=31)
    ids_step = smolvlm_decoder_step(smolvlm(text={"num_hidden_layers": 1, "hidden_size": 64,
                                                  "intermediate_size": 128,
                                                  "num_attention_heads": 4,
                                                  "num_key_value_heads": 2, "vocab_size": 256}),
                                    32).export(
        input_ids=torch.zeros((1, 4), dtype=torch.long), cache_position=torch.arange(4),
        strict=False, dynamic_shapes={"input_ids": {1: tokens}, "cache_position": {0: tokens}})
    torch.export.save(ids_step, str(tmp_path / "ids.pt2"))
    code, _, err = cli(["generate", str(tmp_path / "ids.pt2"), "--image-program",
                        str(smolvlm_files / "image.pt2")])
    assert "must take inputs_embeds with a dynamic sequence length" in \
        one_error_line(code, err)
    decoder = str(smolvlm_files / "decoder.pt2")  # logits are no image's rows
    code, _, err = cli(["generate", decoder, "--image-program", decoder, "--prompt-tokens",
                        "4", "--new-tokens", "2", "--out", str(tmp_path / "o")])
    assert "rows are 256 wide; the decoder's embeddings are 64" in one_error_line(code, err)
    # transformers' TorchExportableModuleForVLM exports the text model without its LM head
    tiny = smolvlm(text={"num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 128,
                         "num_attention_heads": 4, "num_key_value_heads": 2,
                         "vocab_size": 256})
    hidden = static_cache_step(tiny.model.text_model, 32).export(
        input_ids=torch.zeros((1, 1), dtype=torch.long), cache_position=torch.tensor([0]))
    torch.export.save(hidden, str(tmp_path / "hidden.pt2"))
    code, _, err = cli(["generate", str(tmp_path / "hidden.pt2"), "--out", str(tmp_path / "h")])
    assert "returns 64 values a position, not logits over its 256-token table" in \
        one_error_line(code, err)
    two = torch.export.export(_TwoOutputs(), (torch.randn(1, 4, 64),))
    torch.export.save(two, str(tmp_path / "two.pt2"))
    code, _, err = cli(["generate", decoder, "--image-program", str(tmp_path / "two.pt2"),
                        "--prompt-tokens", "4", "--new-tokens", "2", "--out",
                        str(tmp_path / "t")])
    assert "returns 2 tensors; an image program returns its image's rows alone" in \
        one_error_line(code, err)


class _TwoOutputs(torch.nn.Module):
    """Rows and something else: not an image program."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.proj(x), x * 2.0
