"""Where the command writes and what it reads: every output option given a place it cannot
write is one line and exit 2 before any work; an input that is not a regular file is refused
before a byte of it is read; the files a user gets keep the user's umask."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import cli, one_error_line

SMALL = ["--tokens", "16", "--dim", "64", "--hidden", "64", "--finalists", "1"]
UNWRITABLE = Path("/proc/1")  # a folder no one, root included, can add a file to


def _places(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """Bad places for a folder option: the path and what the error line must say."""
    afile = tmp_path / "afile"
    afile.write_text("a file\n")
    return {
        "file": (afile, "exists and is not a folder"),
        "device": (Path("/dev/null"), "exists and is not a folder"),
        "under a file": (afile / "sub", f"cannot create it, {afile} is not a folder"),
        "uncreatable": (UNWRITABLE / "sub", f"cannot create it in {UNWRITABLE}"),
        "unwritable": (UNWRITABLE, "cannot write there"),
    }


# (command line with OUT for the bad place, the option as the error names it)
COMMANDS = {
    "compile -o": (["compile", "siglip-mlp", *SMALL, "-o", "OUT"], "-o"),
    "compile --cache-dir": (["compile", "siglip-mlp", *SMALL, "-o", "GOOD", "--cache-dir", "OUT"],
                            "--cache-dir"),
    "compile --dump-stages": (["compile", "siglip-mlp", *SMALL, "-o", "GOOD",
                               "--dump-stages", "OUT"], "--dump-stages"),
    "bench --out": (["bench", "siglip-mlp", *SMALL, "--out", "OUT"], "--out"),
    "bench --profile": (["bench", "siglip-mlp", *SMALL, "--out", "GOOD", "--profile", "OUT"],
                        "--profile"),
    "bench --save-tensors": (["bench", "siglip-mlp", *SMALL, "--out", "GOOD",
                              "--save-tensors", "OUT"], "--save-tensors"),
    "run --profile": (["run", "PKG", "--profile", "OUT"], "--profile"),
    "run --save-tensors": (["run", "PKG", "--save-tensors", "OUT"], "--save-tensors"),
    "capacity --cache-dir": (["capacity", "siglip-mlp", *SMALL, "--max-batch", "2",
                              "--cache-dir", "OUT"], "--cache-dir"),
    "sweep -o": (["sweep", "siglip-mlp", *SMALL, "--grid", "tokens=16,32", "-o", "OUT"], "-o"),
}


@pytest.mark.parametrize("place", ["file", "device", "under a file", "uncreatable", "unwritable"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_output_folder_that_cannot_be_written_is_one_line(tmp_path: Path, command: str,
                                                          place: str) -> None:
    bad, problem = _places(tmp_path)[place]
    template, option = COMMANDS[command]
    good = tmp_path / "good"
    argv = [str(bad) if a == "OUT" else str(good) if a == "GOOD" else
            str(tmp_path / "missing.ipuexe") if a == "PKG" else a for a in template]
    code, out, err = cli(["--quiet", *argv])
    line = one_error_line(code, err)
    assert line.startswith(f"error: {option} {bad}: {problem}"), line
    if place in ("file", "device", "under a file"):
        assert line == f"error: {option} {bad}: {problem}"
    assert out == "" and not good.exists()  # refused before any work
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_default_bench_folder_is_checked_too(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("artifacts").write_text("a file where bench puts its packages\n")
    code, _, err = cli(["--quiet", "bench", "siglip-mlp", *SMALL])
    line = one_error_line(code, err)
    assert line.startswith("error: --out (default) artifacts/siglip-mlp-")
    assert line.endswith("cannot create it, artifacts is not a folder")
    # another chip count or strategy: a folder of its own, not the one-chip package's
    for extra, suffix in ((["--chips", "2"], "-n2-c2"), (["--strategy", "pipeline"],
                                                         "-n2-pipeline")):
        code, _, err = cli(["--quiet", "bench", "siglip-vision", "--layers", "2", "--image",
                            "112", *extra])
        line = one_error_line(code, err)
        assert line.startswith("error: --out (default) artifacts/siglip-vision-") and \
            line.split(":")[1].endswith(suffix), line


def test_a_run_line_has_no_fields_without_a_value(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = cli(["--quiet", "bench", "siglip-mlp", *SMALL, "--record"])
    fields = dict(item.split("=", 1) for item in out.split())
    assert code == 0 and fields["numericalTest"] == "PASS" and "None" not in out, err
    code, out, err = cli(["--quiet", "run", str(Path(fields["package"]).parent), "--record"])
    fields = dict(item.split("=", 1) for item in out.split())
    assert code == 0 and fields["numericalTest"] == "PASS", err
    assert "compileSeconds" not in fields  # a run compiles nothing: no field, not None


@pytest.mark.parametrize("place", ["folder", "device", "under a file", "uncreatable"])
def test_exchange_schedule_output_file_that_cannot_be_written(tmp_path: Path,
                                                              place: str) -> None:
    afile = tmp_path / "afile"
    afile.write_text("a file\n")
    instance = tmp_path / "instance.json"
    instance.write_text('{"tiles": 4, "transfers": [{"src": 0, "dst": [1], "words": 8}]}\n')
    bad, problem = {
        "folder": (tmp_path, "exists and is not a regular file"),
        "device": (Path("/dev/null"), "exists and is not a regular file"),
        "under a file": (afile / "s.json", f"its folder {afile}: exists and is not a folder"),
        "uncreatable": (UNWRITABLE / "s.json", f"its folder {UNWRITABLE}: cannot write there"),
    }[place]
    code, out, err = cli(["--quiet", "exchange", "schedule", str(instance), "-o", str(bad)])
    assert one_error_line(code, err).startswith(f"error: -o {bad}: {problem}")
    assert out == "" and Path("/dev/null").is_char_device()


@pytest.fixture()
def fifo(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "fifo.ipuexe"
    os.mkfifo(path)
    yield path


@pytest.mark.parametrize("argv", [["inspect"], ["run"], ["profile"]])
def test_device_input_is_refused_before_it_is_read(argv: list[str]) -> None:
    """``/dev/zero`` never ends: reading it up to the 4 GiB package limit took 4.3 GB and 3 s.
    Refused on its fstat, the command allocates next to nothing."""
    tracemalloc.start()
    try:
        code, _, err = cli(["--quiet", *argv, "/dev/zero"])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert one_error_line(code, err) == \
        "error: package /dev/zero cannot be read: not a regular file"
    assert peak < 64 << 20


def test_folder_and_fifo_inputs_are_refused(tmp_path: Path, fifo: Path) -> None:
    code, _, err = cli(["--quiet", "inspect", str(tmp_path)])
    assert one_error_line(code, err) == f"error: {tmp_path} is a folder with no model.ipuexe " \
        "in it (the package `ipu-stack compile -o DIR` writes)"
    # a FIFO with no writer would block a plain open() for ever: a child, with a time limit
    done = subprocess.run([sys.executable, "-m", "ipu_stack.cli", "--quiet", "inspect",
                           str(fifo)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr == f"error: package {fifo} cannot be read: not a regular file\n"
    for command in (["exchange", "schedule", str(fifo), "-o", str(tmp_path / "s.json")],
                    ["exchange", "verify", "/dev/zero", str(fifo)]):
        code, _, err = cli(["--quiet", *command])
        assert one_error_line(code, err).endswith("not a regular file")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_files_a_user_gets_keep_the_umask(tmp_path: Path, cache_dir: Path) -> None:
    """Atomic writes once came out 0600 (``mkstemp``): a colleague or a web server could not
    read a profile it was handed.  Under umask 027 every file is 0640 and every folder 0750,
    as ``open()`` and ``mkdir`` would make them."""
    old = os.umask(0o027)
    try:
        code, _, err = cli(["--quiet", "bench", "siglip-mlp", *SMALL, "--out",
                            str(tmp_path / "pkg"), "--profile", str(tmp_path / "profile"),
                            "--save-tensors", str(tmp_path / "tensors"),
                            "--lock", str(tmp_path / "lock"), "--cache-dir", str(cache_dir)])
    finally:
        os.umask(old)
    assert code == 0, err
    files = {p.relative_to(tmp_path).as_posix(): _mode(p) for p in tmp_path.rglob("*")
             if p.is_file() and p.name != "lock"}
    for name in ("pkg/model.ipuexe", "pkg/memory/memory-profile.json",
                 "pkg/memory/placement.html", "profile/profile.json", "profile/trace.json",
                 "profile/report.html", "tensors/inputs_weights.npz", "tensors/outputs.npz"):
        assert files.pop(name) == 0o640, name
    assert not files, files  # nothing else was written
    folders = [p for p in tmp_path.rglob("*") if p.is_dir()]
    assert folders and all(_mode(p) == 0o750 for p in folders), [(p, oct(_mode(p)))
                                                                 for p in folders]
