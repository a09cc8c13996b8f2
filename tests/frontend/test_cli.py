"""The command line on torch programs: compile/bench/run/ops/capacity of a ``.pt2``, and the
one-line errors for unsupported operations and bad files."""

from __future__ import annotations

import io
import json
import shutil
import zipfile
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ipu_stack.cli import main  # noqa: E402
from tests.frontend.models import TinyVit, export  # noqa: E402


@torch.library.custom_op("ipu_stack_test::twist", mutates_args=())
def twist(x: torch.Tensor) -> torch.Tensor:
    """An operation the importer has no rule for (reverses the last dimension)."""
    return x.flip(-1)


@twist.register_fake
def _twist_fake(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class Twisted(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(32, 32)
        self.head = torch.nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(twist(self.fc(x)))  # the line the error must quote


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(7)
    path = tmp_path_factory.mktemp("models") / "tiny.pt2"
    torch.export.save(export(TinyVit(dim=32, heads=2, layers=1, hidden=64, image=16),
                             torch.randn(1, 3, 16, 16)), str(path))
    return path


def _error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error:")]


def test_unsupported_operation_is_one_line_exit_2(tmp_path: Path, capsys) -> None:
    path = tmp_path / "twisted.pt2"
    torch.export.save(export(Twisted(), torch.randn(1, 8, 32)), str(path))
    code = main(["--quiet", "compile", str(path), "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("error: unsupported operation ipu_stack_test.twist.default "
                               "in module <top> (Twisted) at test_cli.py:")
    assert "return self.head(twist(self.fc(x)))" in lines[0]


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    from ipu_stack.util.errors import CompileError

    path = tmp_path / "twisted.pt2"
    torch.export.save(export(Twisted(), torch.randn(1, 8, 32)), str(path))
    with pytest.raises(CompileError, match="ipu_stack_test.twist"):
        main(["--debug", "compile", str(path), "-o", str(tmp_path / "out")])


def test_ops_lists_every_operation(tmp_path: Path, capsys) -> None:
    path = tmp_path / "twisted.pt2"
    torch.export.save(export(Twisted(), torch.randn(1, 8, 32)), str(path))
    assert main(["ops", str(path), "--json"]) == 1  # one unsupported: exit 1
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["target"], r["supported"]) for r in rows] == [
        ("aten.linear.default", True), ("ipu_stack_test.twist.default", False),
        ("aten.linear.default", True)]
    assert rows[0]["module"] == "fc (Linear)"
    assert rows[1]["status"].startswith("unsupported: unsupported operation")


def test_ops_text_summary(tiny: Path, capsys) -> None:
    assert main(["ops", str(tiny)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("operations=") and out[-1].endswith("unsupported=0")
    assert any("aten.conv2d" in line and line.startswith("yes") for line in out)


@pytest.mark.parametrize("damage", ["truncated", "text", "foreign-zip", "newer-schema",
                                    "torch-save"])
def test_bad_files_are_one_line_exit_2(tiny: Path, tmp_path: Path, capsys, damage: str) -> None:
    path = tmp_path / "bad.pt2"
    data = tiny.read_bytes()
    if damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "text":
        path.write_text("not a model\n")
    elif damage == "foreign-zip":
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("readme.txt", "a zip, but not an exported program")
    elif damage == "torch-save":  # a state dict saved under the name a user expects
        torch.save({"weight": torch.zeros(2)}, str(path))
    else:  # an export from a newer torch: its schema version is one this torch cannot read
        with zipfile.ZipFile(tiny) as src, zipfile.ZipFile(path, "w") as dst:
            for item in src.infolist():
                body = src.read(item)
                if "/models/" in item.filename and item.filename.endswith(".json"):
                    model = json.loads(body)
                    model["schema_version"] = {"major": 99, "minor": 0}
                    model["torch_version"] = "9.9.0"
                    body = json.dumps(model).encode()
                dst.writestr(item, body)
    code = main(["--quiet", "compile", str(path), "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2
    assert len(_error_lines(err)) == 1 and "Traceback" not in err, err
    expected = {"truncated": "not a torch.export .pt2 archive",
                "text": "not a torch.export .pt2 archive",
                "foreign-zip": "torch.export.load failed",
                "newer-schema": "exported by torch 9.9.0 (schema 99.0)",
                "torch-save": "a torch.save file (a pickle), not a torch.export program"}[damage]
    assert expected in err


def test_compile_then_run_and_a_changed_file(tiny: Path, tmp_path: Path, cache_dir: Path,
                                             lock_path: Path, capsys) -> None:
    model = tmp_path / "model.pt2"
    shutil.copy(tiny, model)
    out = tmp_path / "pkg"
    assert main(["--quiet", "compile", str(model), "-o", str(out), "--cache-dir",
                 str(cache_dir)]) == 0
    capsys.readouterr()
    assert main(["--quiet", "run", str(out / "model.ipuexe"), "--json", "--lock",
                 str(lock_path)]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["numericalTest"] == "PASS" and record["referenceSource"] == "torch"
    assert record["model"] == str(model.resolve())
    # a different program saved under the same name: the package no longer matches it
    torch.manual_seed(8)
    torch.export.save(export(TinyVit(dim=32, heads=2, layers=1, hidden=64, image=16),
                             torch.randn(1, 3, 16, 16)), str(model))
    code = main(["--quiet", "run", str(out / "model.ipuexe"), "--lock", str(lock_path)])
    err = capsys.readouterr().err
    assert code == 2 and len(_error_lines(err)) == 1
    assert "changed since the package was compiled" in err


def test_an_imported_stream_reports_its_host_sides_peak(tiny: Path, tmp_path: Path,
                                                       cache_dir: Path, lock_path: Path,
                                                       capsys) -> None:
    """Two micro-batches, each judged on a thread of this process: its peak is reported."""
    code = main(["--quiet", "bench", str(tiny), "--precision", "f16", "--images", "2",
                 "--out", str(tmp_path / "b"), "--json", "--lock", str(lock_path),
                 "--cache-dir", str(cache_dir)])
    record = json.loads(capsys.readouterr().out)
    assert code == 0 and record["imagesPassed"] == 2, record
    assert isinstance(record["hostPeakBytes"], int) and record["hostPeakBytes"] > 2**20


def test_bench_with_inputs_file(tiny: Path, tmp_path: Path, cache_dir: Path, lock_path: Path,
                                capsys) -> None:
    pixels = np.random.default_rng(11).standard_normal((1, 3, 16, 16)).astype(np.float32)
    np.savez(tmp_path / "in.npz", pixels=pixels)
    code = main(["--quiet", "bench", str(tiny), "--precision", "f16", "--inputs",
                 str(tmp_path / "in.npz"), "--out", str(tmp_path / "b"), "--json", "--lock",
                 str(lock_path), "--cache-dir", str(cache_dir), "--save-tensors",
                 str(tmp_path / "t")])
    record = json.loads(capsys.readouterr().out)
    assert code == 0 and record["numericalTest"] == "PASS", record
    program = torch.export.load(str(tiny))
    with torch.no_grad():
        expected = program.module()(torch.from_numpy(pixels)).numpy().reshape(-1, 32)
    got = np.load(tmp_path / "t" / "outputs.npz")
    out = next(iter(got.values())).reshape(-1, 32)
    assert np.abs(out - expected).max() < 0.05 * np.abs(expected).max()
    # wrong shape: one line
    np.savez(tmp_path / "bad.npz", pixels=pixels[:, :, :8])
    code = main(["--quiet", "compile", str(tiny), "--inputs", str(tmp_path / "bad.npz"), "-o",
                 str(tmp_path / "c")])
    err = capsys.readouterr().err
    assert code == 2 and "was exported for [1, 3, 16, 16]" in err
    # an array the program does not take (a misspelt name): one line, not a random input
    np.savez(tmp_path / "extra.npz", pixels=pixels, pixel=pixels)
    code = main(["--quiet", "compile", str(tiny), "--inputs", str(tmp_path / "extra.npz"), "-o",
                 str(tmp_path / "c")])
    assert code == 2 and capsys.readouterr().err.strip() == (
        f"error: --inputs {tmp_path / 'extra.npz'}: pixel is not an input of the program (its "
        "inputs: pixels)")
    # integer pixels for a floating-point input (uint8 from an image decoder): one line
    np.savez(tmp_path / "ints.npz", pixels=(pixels > 0).astype(np.uint8))
    code = main(["--quiet", "compile", str(tiny), "--inputs", str(tmp_path / "ints.npz"), "-o",
                 str(tmp_path / "c")])
    assert code == 2 and capsys.readouterr().err.strip() == (
        f"error: --inputs {tmp_path / 'ints.npz'}: pixels holds uint8 values and the program "
        "takes floating point there (cast the array if meant)")


def test_an_imported_tower_over_two_chips(tmp_path: Path, cache_dir: Path, capsys) -> None:
    torch.manual_seed(3)
    path = tmp_path / "four.pt2"
    torch.export.save(export(TinyVit(dim=32, heads=2, layers=4, hidden=64, image=16),
                             torch.randn(1, 3, 16, 16)), str(path))
    code = main(["--quiet", "bench", str(path), "--chips", "2", "--out", str(tmp_path / "b"),
                 "--json", "--cache-dir", str(cache_dir)])
    record = json.loads(capsys.readouterr().out)
    assert code == 0 and record["numericalTest"] == "PASS", record
    assert record["chips"] == 2 and record["pipelineGroups"] == 2 * record["groupsPerChip"]
    assert record["cycles"] == max(record["chipStepCycles"]) + record["linkCycles"]


def test_builtin_options_are_refused_for_a_program(tiny: Path, tmp_path: Path, capsys) -> None:
    code = main(["--quiet", "compile", str(tiny), "--heads", "4", "-o", str(tmp_path / "o")])
    assert code == 2 and "takes no --heads" in capsys.readouterr().err
    # --tokens is a decoder step's, exported with a dynamic sequence length
    code = main(["--quiet", "compile", str(tiny), "--tokens", "64", "-o", str(tmp_path / "o")])
    assert code == 2 and capsys.readouterr().err.strip() == (
        "error: --tokens 64: a .pt2 program runs at the sequence length it was exported at")


def test_capacity_of_a_dynamic_batch_program(tmp_path: Path, cache_dir: Path, capsys) -> None:
    torch.manual_seed(9)
    module = TinyVit(dim=32, heads=2, layers=1, hidden=64, image=16).eval()
    batch = torch.export.Dim("batch", min=1, max=64)
    path = tmp_path / "dynamic.pt2"
    torch.export.save(torch.export.export(module, (torch.randn(2, 3, 16, 16),),
                                          dynamic_shapes={"pixels": {0: batch}}), str(path))
    assert main(["--quiet", "capacity", str(path), "--max-batch", "3", "--json",
                 "--cache-dir", str(cache_dir)]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["maximumBatch"] == 3 and record["tried"] == {"1": "fits", "2": "fits",
                                                                "3": "fits"}
    # a batch whose input no chip holds is refused before its example arrays are made
    wide = tmp_path / "wide.pt2"
    torch.export.save(torch.export.export(torch.nn.Linear(4096, 8), (torch.randn(2, 4096),),
                                          dynamic_shapes=({0: batch},)), str(wide))
    code = main(["--quiet", "compile", str(wide), "--batch", "1000000", "-o",
                 str(tmp_path / "c")])
    assert code == 2 and capsys.readouterr().err.strip() == (
        "error: batch 1000000: an input would be [1000000, 4096]: more elements than a "
        "chip's memory holds (940,572,672 bytes)")


def test_capacity_of_a_static_program_says_why_not(tiny: Path, capsys) -> None:
    assert main(["--quiet", "capacity", str(tiny), "--max-batch", "4"]) == 2
    err = capsys.readouterr().err
    assert "error: batch 2: the program was exported for batch 1 without a dynamic batch" in err
    assert main(["--quiet", "capacity", str(tiny), "--max-blocks", "4"]) == 2
    assert capsys.readouterr().err.strip() == f"error: --max-blocks: {tiny.name} has no --blocks"


def test_sweep_of_a_program_is_refused_in_one_line(tiny: Path, tmp_path: Path, capsys) -> None:
    code = main(["--quiet", "sweep", str(tiny), "--grid", "precision=fp8,f16", "-o",
                 str(tmp_path / "s")])
    err = capsys.readouterr().err
    assert code == 2 and len(_error_lines(err)) == 1 and "sweep takes a builtin" in err


class _Touch:
    """Pickles to a call that creates ``marker``: proof of unpickling if it ever runs."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _overlap(path: Path) -> None:
    """Point the central directory's ``tiny/extra/inner`` into ``tiny/extra/outer``'s data
    (the entry's local header offset moved back by 2,048 bytes)."""
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        inner = archive.getinfo("tiny/extra/inner")
    at = data.rfind(b"PK\x01\x02", 0, data.rfind(b"tiny/extra/inner"))
    data[at + 42:at + 46] = (inner.header_offset - 2048).to_bytes(4, "little")
    path.write_bytes(bytes(data))


def _rewritten(tiny: Path, path: Path, change) -> None:
    """``tiny`` copied to ``path`` member by member, ``change(name, body)`` giving each
    member's new body (None: left out) and ``change(None, archive)`` adding members."""
    with zipfile.ZipFile(tiny) as src, zipfile.ZipFile(path, "w") as dst:
        for item in src.infolist():
            body = change(item.filename, src.read(item))
            if body is not None:
                dst.writestr(item, body)
        change(None, dst)


@pytest.mark.parametrize("attack", ["pickled-weight", "custom-object", "legacy-weights",
                                    "deflate-bomb", "repeated-member", "overlapping-member"])
def test_an_archive_that_could_run_code_or_explode_is_refused_unread(
        tiny: Path, tmp_path: Path, capsys, attack: str) -> None:
    """A ``.pt2`` is hostile input: a payload torch would unpickle (a weight stored with
    ``use_pickle``, a custom object, a legacy weights file) is refused before torch reads
    the archive, so the pickle never runs; a member that inflates hugely or is listed twice
    (a zip bomb) is refused from the central directory."""
    path, marker = tmp_path / "bad.pt2", tmp_path / "unpickled"

    def change(name, body):
        if name is None:
            if attack == "legacy-weights":
                body.writestr("tiny/data/weights/model.pt", b"legacy")
            elif attack == "deflate-bomb":
                body.writestr(zipfile.ZipInfo("tiny/extra/zeros"), bytes(64 << 20),
                              compress_type=zipfile.ZIP_DEFLATED)
            elif attack == "overlapping-member":
                body.writestr("tiny/extra/outer", bytes(4096))
                body.writestr("tiny/extra/inner", b"inside")
            elif attack == "repeated-member":
                body.writestr("tiny/extra/note", b"first")
                body.writestr("tiny/extra/note", b"again")
            return None
        if name.endswith("weights/model_weights_config.json") and attack in (
                "pickled-weight", "custom-object"):
            config = json.loads(body)
            key = next(iter(config["config"]))
            if attack == "pickled-weight":
                config["config"][key]["use_pickle"] = True
            else:
                config["config"][key]["path_name"] = "custom_obj_0"
            return json.dumps(config).encode()
        if name.endswith("weights/weight_0") and attack == "pickled-weight":
            buffer = io.BytesIO()
            torch.save(_Touch(marker), buffer)
            return buffer.getvalue()
        return body

    with pytest.warns(UserWarning) if attack == "repeated-member" else nullcontext():
        _rewritten(tiny, path, change)
    if attack == "overlapping-member":  # a second directory entry inside the first's data
        _overlap(path)
    code = main(["--quiet", "ops", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and len(_error_lines(err)) == 1 and "Traceback" not in err, err
    expected = {"pickled-weight": "is stored as a pickle (weight_0)",
                "custom-object": "is stored as a pickle (custom_obj_0)",
                "legacy-weights": "holds data/weights/model.pt, which torch would unpickle",
                "deflate-bomb": "archive member tiny/extra/zeros inflates",
                "repeated-member": "archive member tiny/extra/note repeats or overlaps",
                "overlapping-member": "overlaps tiny/extra/inner (a zip bomb)"}[attack]
    assert expected in err, err
    assert not marker.exists()


def test_an_inputs_file_is_bounded_by_the_programs_inputs(tiny: Path, tmp_path: Path,
                                                          capsys) -> None:
    """An ``.npz`` is read only when every member is an array and all of them declare no
    more than the program's inputs could take (as float64): a 12 MB array for a 3 KB input
    is refused from its header, unread."""
    pixels = np.zeros((1, 3, 16, 16), np.float32)
    with zipfile.ZipFile(tmp_path / "junk.npz", "w") as archive:
        buffer = io.BytesIO()
        np.save(buffer, pixels)
        archive.writestr("pixels.npy", buffer.getvalue())
        archive.writestr("junk", b"not an array")
    np.savez(tmp_path / "big.npz", pixels=np.zeros((1, 3, 16, 16 << 20 >> 8), np.float32))
    for name, expected in (("junk", "member 'junk' is not an array (.npy)"),
                           ("big", "its arrays declare 12,582,912 bytes, more than the "
                                   "1,054,720 its program's inputs can take")):
        code = main(["--quiet", "compile", str(tiny), "--inputs", str(tmp_path / f"{name}.npz"),
                     "-o", str(tmp_path / "c")])
        err = capsys.readouterr().err
        assert code == 2 and err.strip() == f"error: --inputs {tmp_path / name}.npz: {expected}"


def test_inputs_the_model_itself_overflows_are_one_line(tiny: Path, tmp_path: Path,
                                                        capsys) -> None:
    """Inputs for which torch's own float32 output is not finite leave nothing to compare
    with: said so, not blamed on the importer."""
    np.savez(tmp_path / "huge.npz", pixels=np.full((1, 3, 16, 16), 1e30, np.float32))
    code = main(["--quiet", "compile", str(tiny), "--inputs", str(tmp_path / "huge.npz"),
                 "-o", str(tmp_path / "c")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: torch's own output ") and err.endswith(
        "holds NaN or infinite values for these inputs: give inputs the model computes in "
        "float32"), err



class Widens(torch.nn.Module):
    """A small input made 2 GiB wide by one product (a 4 MB weight)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 1 << 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def test_a_value_past_the_bound_is_refused_before_it_is_made(tmp_path: Path, capsys) -> None:
    """A value of over 1 GiB (here a product's result, from a 0.5 MB input) is refused from
    the export's shapes, before the listing or the import makes it (a ``[1, 50M, 16]``
    input took 10 GB to list its operations)."""
    path = tmp_path / "widens.pt2"
    torch.export.save(export(Widens(), torch.zeros(1, 1 << 13, 16)), str(path))
    code = main(["--quiet", "ops", str(path)])
    assert code == 2 and capsys.readouterr().err.strip() == (
        "error: widens.pt2: aten.linear linear's result takes 2.0 GiB, over the bound of "
        "1.0 GiB for one value")
    code = main(["--quiet", "compile", str(path), "-o", str(tmp_path / "c")])
    err = capsys.readouterr().err
    assert code == 2 and len(_error_lines(err)) == 1 and "widens.pt2" in err, err


class _Masked(torch.nn.Module):
    """A layer that reads an integer mask no lookup reads (a prefill's attention_mask)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.proj(x) * attention_mask[..., None].float()


def test_an_integer_input_that_is_not_ids_is_one_line_saying_what_to_export(tmp_path: Path,
                                                                          capsys) -> None:
    path = tmp_path / "masked.pt2"
    torch.export.save(torch.export.export(_Masked().eval(), (
        torch.randn(1, 4, 8), torch.ones(1, 4, dtype=torch.long))), str(path))
    code = main(["--quiet", "ops", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and len(_error_lines(err)) == 1, err
    assert "program input attention_mask is an integer tensor that no lookup" in err
    assert "export without it (an attention_mask: the model builds its causal mask" in err
