"""Commands a user might mistype: each gets exit 2 and one ``error:`` line that names what is
wrong (and, where one is close, what was meant), never argparse's usage dump or a
traceback.  None of them compiles or simulates anything."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from tests.helpers import one_error_line

from ipu_stack.cli import main


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "folder").mkdir()
    (tmp_path / "m.onnx").mkdir()
    (tmp_path / "text.txt").write_text("not a package\n")
    return {"folder": str(tmp_path / "folder"), "text": str(tmp_path / "text.txt"),
            "onnx_folder": str(tmp_path / "m.onnx"),
            "missing": str(tmp_path / "missing" / "model.ipuexe")}


BAD = [
    (["bnch", "siglip-mlp"], "unknown command 'bnch'; did you mean 'bench'?"),
    (["bench", "siglip-mlpp"], "unknown workload 'siglip-mlpp'; did you mean 'siglip-mlp'?"),
    (["bench"], "bench: missing workload"),
    (["bench", "siglip-mlp", "--batch", "1.5"], "bench: --batch '1.5' is not a whole number"),
    (["bench", "siglip-mlp", "--batch", "x"], "bench: --batch 'x' is not a whole number"),
    (["bench", "siglip-mlp", "--batch", "0"], "--batch must be at least 1, got 0"),
    (["bench", "siglip-mlp", "--bach", "2"], "unrecognised option '--bach'; did you mean "
                                             "'--batch'?"),
    (["bench", "siglip-mlp", "--precision", "fp16"], "--precision 'fp16' is not one of fp8, f16"),
    (["bench", "siglip-mlp", "--strategy", "pipe"], "unknown --strategy 'pipe'; did you mean "
                                                    "'pipeline'?"),
    (["bench", "siglip-mlp", "--engine", "rey"], "unknown --engine 'rey'; did you mean 'ray'?"),
    (["bench", "siglip-mlp", "--chips", "x"], "--chips 'x' is not a whole number"),
    (["bench", "siglip-mlp", "--chips", "99"], "--chips 99: a C600 cluster holds 1 to 8 cards"),
    (["compile", "siglip-mlp"], "compile: missing -o/--out (`ipu-stack compile --help` shows "
                                "usage)"),
    ([], "error: missing command (`ipu-stack --help` shows usage)"),
    (["run", "{missing}"], "not found"),
    (["profile", "{missing}"], "not found (profile takes a profile's folder, its profile.json, "
                               "or a package to run)"),
    (["run", "{folder}"], "is a folder with no model.ipuexe in it"),
    (["profile", "{folder}"], "is a folder with neither a profile.json (`bench --profile DIR` "
                              "writes one) nor a package (model.ipuexe)"),
    (["inspect", "{text}"], "is corrupt: not a ZIP archive"),
    (["capacity", "siglip-mlp"], "one of the arguments --max-batch --max-blocks --max-layers "
                                 "--max-context --max-chips is required"),
    (["capacity", "siglip-mlp", "--max-batch", "0"], "--max-batch must be at least 1"),
    (["capacity", "siglip-mlp", "--max-chips", "9"], "--max-chips 9: a C600 cluster holds 1 "
                                                     "to 8 cards"),
    (["capacity", "siglip-mlp", "--max-chips", "2", "--chips", "2"],
     "give --max-chips or --chips, not both"),
    (["capacity", "siglip-mlp", "--tokens", "16", "--max-context", "64"],
     "--max-context searches a builtin decoder's KV cache; siglip-mlp has none to search"),
    (["capacity", "step.pt2", "--max-context", "64"], "step.pt2's cache is the length it was "
     "exported with (export it again with another max_cache_len)"),
    (["bench", "siglip-mlp", "--images", "0"], "--images must be at least 1"),
    (["bench", "siglip-mlp", "--memory-proportion", "2"], "--memory-proportion must be in (0, 1]"),
    (["bench", "siglip-mlp", "--finalists", "0"], "--finalists must be at least 1"),
    (["ops", "{text}"], "ops takes a torch.export program (MODEL.pt2)"),
    (["bench", "siglip-mlp", "--inputs", "x.npz"], "--inputs is for torch programs"),
    (["workloads", "--bogus"], "workloads: unrecognised option '--bogus'"),
    (["compile", "siglip-mlp", "-o", "{text}"], "exists and is not a folder"),
    (["bench", "siglip-mlp", "--save-tensors", "{text}"], "exists and is not a folder"),
    (["exchange", "schedul", "x"], "unknown command 'schedul'; did you mean 'schedule'?"),
    (["exchange"], "exchange: missing a command (`ipu-stack exchange --help` shows usage)"),
    (["bench", "siglip-vision", "--layers", "100000"], "siglip-vision does not fit"),
    # options that contradict each other: neither is dropped without a word
    (["bench", "siglip-mlp", "--groups", "2"], "--groups 2 is the pipeline strategy's: give "
                                               "--strategy pipeline (or --chips above 1)"),
    (["bench", "siglip-mlp", "--strategy", "pipeline", "--groups", "1"],
     "a pipeline of one group on one chip is the layers strategy: give --groups 2 or more, "
     "or --strategy layers"),
    (["bench", "siglip-mlp", "--strategy", "pipeline", "--groups", "0"],
     "--groups must be at least 1, got 0"),
    (["bench", "siglip-mlp", "--json", "--record"], "give --json or --record, not both"),
    (["sweep", "siglip-mlp", "--grid", "batch=1,2", "-o", "{missing}", "--address", "x:1"],
     "--address names a Ray cluster: give it with --engine ray"),
    (["-v", "bench", "siglip-mlp", "--quiet"], "give -v or --quiet, not both"),
    (["run", "model.pt2"], "model.pt2 is a model file, not a package: `ipu-stack bench "
                           "model.pt2` compiles and runs it"),
    (["compile", "{onnx_folder}", "-o", "{missing}"], "m.onnx: a folder, not a model file"),
    (["bench", "siglip-vision", "--precision", "f16", "--attention", "fp8"],
     "--attention fp8 runs attention's products in FP8 beside FP8 GEMMs: it takes "
     "--precision fp8"),
    # values a decoder cannot take, and option names as the parser spells them
    (["generate", "smollm2-135m", "--theta", "0"], "--theta must be a finite number above 0, "
                                                   "got 0.0"),
    (["generate", "smollm2-135m", "--eps", "nan"], "--eps must be a finite number above 0, "
                                                   "got nan"),
    (["generate", "smollm2-135m", "--kv-heads", "0"], "--kv-heads must be at least 1, got 0"),
    (["capacity", "smollm2-135m", "--max-context", "2000000"],
     "--max-context must be at most 1048576"),
    (["capacity", "smollm2-135m", "--context", "500", "--max-context", "64"],
     "--max-context searches the cache's positions: give no --context"),
]


@pytest.mark.parametrize("argv, expected", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_a_mistyped_command_gets_one_line(argv, expected, files, capsys) -> None:
    code = main([word.format(**files) for word in argv])
    captured = capsys.readouterr()
    line = one_error_line(code, captured.err)
    assert expected in line, line
    assert "usage:" not in captured.err and captured.out == ""


def test_global_flags_are_taken_after_the_subcommand_too(capsys) -> None:
    """``--quiet`` after the subcommand means what it means before it (no INFO lines)."""
    assert main(["workloads", "--quiet"]) == 0
    assert " INFO " not in capsys.readouterr().err


def test_help_still_prints_usage(capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["bench", "--help"])
    assert stop.value.code == 0
    assert "usage: ipu-stack bench" in capsys.readouterr().out


@pytest.mark.skipif(importlib.util.find_spec("ray") is not None, reason="Ray is installed")
def test_the_ray_engine_without_ray_is_refused_before_the_compile(capsys) -> None:
    assert main(["bench", "siglip-mlp", "--engine", "ray"]) == 2
    assert capsys.readouterr().err.strip() == ("error: --engine ray needs Ray: pip install "
                                               "'ipu-stack[ray]'")
