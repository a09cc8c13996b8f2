"""The kernel cache at the command line: damaged entries are rebuilt, never trusted; compiles
running in parallel on one fresh cache both succeed.

``tests/unit/test_kernels.py`` covers ``compile_kernels`` directly; these go through
``ipu-stack compile`` (in-process, and as separate processes for the parallel case).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.reliability import cli

SMALL = ["siglip-mlp", "--tokens", "16", "--dim", "64", "--hidden", "64", "--finalists", "1"]


def _entries(cache: Path) -> list[Path]:
    return sorted((cache / "kernels").glob("*/kernel.json"))


def _valid(path: Path) -> bool:
    return path.is_file() and not path.is_symlink() and \
        hashlib.sha256(path.read_bytes()).hexdigest() == path.parent.name


def _compile(cache: Path, out: Path) -> tuple[int, str, bytes]:
    code, _, err = cli(["--quiet", "compile", *SMALL, "-o", str(out), "--cache-dir", str(cache)])
    data = (out / "model.ipuexe").read_bytes() if code == 0 else b""
    return code, err, data


def test_damaged_entries_are_rebuilt(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    code, err, first = _compile(cache, tmp_path / "a")
    assert code == 0, err
    entries = _entries(cache)
    assert len(entries) >= 4 and all(_valid(p) for p in entries)
    good = {p: p.read_bytes() for p in entries}
    garbage, truncated, lying, deleted = entries[:4]
    garbage.write_bytes(b"\x00garbage\xff" * 10)
    truncated.write_bytes(good[truncated][: len(good[truncated]) // 2])
    # valid JSON of the right shape but a different size: the hash still catches it
    lying.write_bytes(good[lying].replace(b'"code_bytes": ', b'"code_bytes": 1'))
    deleted.unlink()
    code, err, second = _compile(cache, tmp_path / "b")
    assert code == 0, err
    assert err.count("kernel cache entry corrupt, rebuilding") == 3, err
    assert "Traceback" not in err
    assert second == first  # the package never depends on what the cache held
    assert all(p.read_bytes() == good[p] for p in entries)
    assert not list(cache.rglob("*.tmp"))
    code, err, third = _compile(cache, tmp_path / "c")
    assert code == 0 and "corrupt" not in err and third == first


def test_entry_symlinked_outside_the_cache_is_replaced_not_written_through(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    assert _compile(cache, tmp_path / "a")[0] == 0
    victim = _entries(cache)[0]
    good = victim.read_bytes()
    outside = tmp_path / "precious.txt"
    outside.write_bytes(b"not a kernel\n")
    victim.unlink()
    victim.symlink_to(outside)
    code, err, _ = _compile(cache, tmp_path / "b")
    assert code == 0, err
    assert outside.read_bytes() == b"not a kernel\n"
    assert not victim.is_symlink() and victim.read_bytes() == good


def test_entry_that_is_a_directory_is_rebuilt(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    assert _compile(cache, tmp_path / "a")[0] == 0
    victim = _entries(cache)[0]
    victim.unlink()
    victim.mkdir()
    code, err, _ = _compile(cache, tmp_path / "b")
    assert code == 0, err


def test_cache_dir_that_is_a_file_is_a_one_line_error(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.write_text("not a folder\n")
    code, err, _ = _compile(cache, tmp_path / "a")
    assert code == 2 and err.startswith("error: ") and len(err.splitlines()) == 1


def test_parallel_compiles_share_one_fresh_cache(tmp_path: Path) -> None:
    """Three processes start together on one empty cache (two identical compiles and one of
    another workload): all succeed, identical compiles give identical bytes, every entry is
    valid and no temporary file is left."""
    cache = tmp_path / "cache"
    jobs = {
        "mlp-1": SMALL,
        "mlp-2": SMALL,
        "attention": ["attention", "--tokens", "17", "--dim", "64", "--heads", "4",
                      "--finalists", "1"],
    }
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "ipu_stack.cli", "--quiet", "compile", *argv,
             "-o", str(tmp_path / name), "--cache-dir", str(cache)],
            env={**os.environ, "PYTHONHASHSEED": str(index)},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for index, (name, argv) in enumerate(jobs.items())
    }
    for name, proc in procs.items():
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, (name, err)
        assert "corrupt" not in err and "Traceback" not in err, (name, err)
    assert (tmp_path / "mlp-1" / "model.ipuexe").read_bytes() == \
        (tmp_path / "mlp-2" / "model.ipuexe").read_bytes()
    entries = _entries(cache)
    assert entries and all(_valid(p) for p in entries)
    # nothing half-written: kernel entries, and whole calibration entries (workloads.calibration)
    assert not [p for p in cache.rglob("*") if p.is_file() and p.name != "kernel.json"
                and p.parent.name != "calibration"]
    calibrations = list((cache / "calibration").glob("*"))
    assert all(p.suffix == ".json" and json.loads(p.read_text())["sha256"] for p in calibrations)
    # a later compile finds every kernel it needs already there
    code, err, _ = _compile(cache, tmp_path / "again")
    assert code == 0 and len(_entries(cache)) == len(entries)
