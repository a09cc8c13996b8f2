"""Hostile and damaged packages at the command line: ``ipu-stack run`` and ``inspect``.

``tests/package`` covers ``read_package`` itself; here the same kinds of damage (and hostile
*content* in a valid container, which only the device loader can judge) go through the real
CLI.  Every malformed package must give exactly one ``error:`` line on stderr (``--quiet``:
nothing else), exit code 2, no traceback, and nothing written anywhere.

The regression cases (``KNOWN_BUGS``, ``INSPECT_BUGS`` in ``ipu_stack.testing.mutations``)
are refused by the load-time checks: the device program's verifier, ``package/records.py``
for the run records.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ipu_stack.package import read_package
from ipu_stack.testing.mutations import (
    CONTENT_ATTACKS,
    INSPECT_BUGS,
    KNOWN_BUGS,
    container_attacks,
    content_attacks,
    craft,
)
from tests.helpers import cli, snapshot

SMALL = ["--tokens", "16", "--dim", "64", "--hidden", "64", "--finalists", "1"]
ESCAPES = (Path("/tmp/ipu-stack-pwned"), Path("/x"))


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> bytes:
    out = tmp_path_factory.mktemp("good")
    code, _, err = cli(["--quiet", "compile", "siglip-mlp", *SMALL, "-o", str(out),
                        "--cache-dir", str(cache_dir)])
    assert code == 0, err
    return (out / "model.ipuexe").read_bytes()


@pytest.fixture()
def arena(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder to work in (the process's cwd); the victim package lives in arena/pkg/."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    return tmp_path


def refused(arena: Path, data: bytes, command: str = "run") -> str:
    """Run ``command`` on ``data``; assert the documented refusal; return the error line."""
    path = arena / "pkg" / "model.ipuexe"
    path.write_bytes(data)
    before = snapshot(arena)
    escapes = [p.exists() for p in ESCAPES]
    lock = arena / "device.lock"
    extra = ["--lock", str(lock)] if command == "run" else []
    code, out, err = cli(["--quiet", command, str(path), *extra])
    lines = err.splitlines()
    assert code == 2, (code, err)
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert out == ""
    after = snapshot(arena)
    after.pop("device.lock", None)  # the hardware-ownership lock is the only file run may create
    assert after == before
    assert [p.exists() for p in ESCAPES] == escapes
    return lines[0]


def test_container_attacks(arena: Path, original: bytes) -> None:
    """Truncations, bit flips, hostile member names, zip bomb, missing members, wrong format
    version or target: ``run`` and ``inspect`` both refuse every one."""
    cases = container_attacks(original)
    rejected = harmless = 0
    for name, data in cases:
        probe = arena / "probe.ipuexe"
        probe.write_bytes(data)
        try:
            same = read_package(probe, expected_target="ipu21")
        except Exception:  # noqa: BLE001 - any rejection; the CLI check below is the test
            same = None
        finally:
            probe.unlink()
        if same is not None:
            # a flip in a byte ZIP ignores (e.g. a timestamp): content must be unchanged
            assert name.startswith("bit flip"), name
            good = read_package_bytes(arena, original)
            assert same.manifest == good.manifest
            assert same.arrays.keys() == good.arrays.keys()
            assert all((same.arrays[k] == good.arrays[k]).all() for k in good.arrays)
            harmless += 1
            continue
        for command in ("run", "inspect"):
            line = refused(arena, data, command)
            assert "model.ipuexe" in line, (name, line)
        rejected += 1
    assert rejected + harmless == len(cases)
    # at most a few flips land in bytes no reader uses (central-directory timestamps and
    # attributes, measured: 5 of 24 flips on this package); each read back unchanged above
    assert rejected >= len(cases) - 6
    assert rejected >= 45


def read_package_bytes(arena: Path, data: bytes) -> Any:
    path = arena / "reference.ipuexe"
    path.write_bytes(data)
    try:
        return read_package(path)
    finally:
        path.unlink()


@pytest.mark.parametrize("index", range(len(CONTENT_ATTACKS)),
                         ids=[name for name, _, _ in CONTENT_ATTACKS])
def test_content_attack_is_refused_by_run(arena: Path, original: bytes, index: int) -> None:
    ((name, data),) = content_attacks(original, arena / "craft", [CONTENT_ATTACKS[index]])
    refused(arena, data, "run")


# Attacks that leave a package the device accepts: ``inspect`` summarises them (``run``
# refuses them, as it cannot rebuild the workload), and its summary must show exactly what
# the package says, which the test checks.
INSPECT_SUMMARISES = frozenset({"unknown workload", "workload parameter below its minimum",
                                "unknown workload parameter",
                                "gemm modes name operation 999"})


def test_inspect_refuses_hostile_content_or_reads_it_back(arena: Path, original: bytes) -> None:
    """``inspect`` makes every check the device makes before summarising: every content
    attack is refused with one line and exit 2, except the pinned ones above, whose summary
    must read the hostile value back unchanged.  Never a traceback."""
    for name, data in content_attacks(original, arena / "craft"):
        path = arena / "pkg" / "model.ipuexe"
        path.write_bytes(data)
        code, out, err = cli(["--quiet", "inspect", str(path), "--json"])
        if name in INSPECT_SUMMARISES:
            assert code == 0, (name, code, err)
            summary = json.loads(out)
            manifest = read_package(path).manifest
            assert summary["workload"] == manifest["workload"]["identifier"], name
            assert summary["plans"] == manifest["plans"] and summary["estimate"] == (
                manifest["estimate"]), name
            continue
        assert code == 2, (name, code, err)
        assert len(err.splitlines()) == 1 and err.startswith("error: "), (name, err)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the NaNs of "gemm with -5 rows"
@pytest.mark.parametrize(
    "index",
    [pytest.param(i, id=name) for i, (name, _, _) in enumerate(KNOWN_BUGS)],
)
def test_formerly_crashing_package_is_refused_by_run(arena: Path, original: bytes,
                                                     index: int) -> None:
    """Each of these crashes ``run`` without its load-time check (``KNOWN_BUGS`` says how)."""
    name, edit, _ = KNOWN_BUGS[index]
    ((_, data),) = content_attacks(original, arena / "craft", [(name, edit, {})])
    refused(arena, data, "run")


@pytest.mark.parametrize(
    "index",
    [pytest.param(i, id=name) for i, (name, _, _) in enumerate(INSPECT_BUGS)],
)
def test_formerly_crashing_package_is_refused_by_inspect(arena: Path, original: bytes,
                                                         index: int) -> None:
    """Each of these crashes ``inspect`` without its check (``INSPECT_BUGS`` says how)."""
    name, edit, _ = INSPECT_BUGS[index]
    ((_, data),) = content_attacks(original, arena / "craft", [(name, edit, {})])
    refused(arena, data, "inspect")


def test_inspect_refuses_a_package_naming_tile_5000(arena: Path, original: bytes) -> None:
    ((_, data),) = content_attacks(original, arena / "craft", [CONTENT_ATTACKS[1]])
    assert CONTENT_ATTACKS[1][0] == "compute call on tile 5000"
    refused(arena, data, "inspect")


def test_sparse_file_over_the_4_gib_limit(arena: Path) -> None:
    """A 4 GiB + 1 byte sparse file: refused from its size alone, never read."""
    path = arena / "pkg" / "model.ipuexe"
    with open(path, "wb") as handle:
        handle.truncate((4 << 30) + 1)
    for command in ("run", "inspect"):
        code, _, err = cli(["--quiet", command, str(path), *(
            ["--lock", str(arena / "device.lock")] if command == "run" else [])])
        assert code == 2
        assert err.splitlines() == [
            f"error: package {path} is too large: {(4 << 30) + 1} bytes exceeds the limit of "
            f"{4 << 30} bytes"
        ]


def test_size_limit_is_applied_by_the_cli(arena: Path, original: bytes,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """With the limit one byte below the package size the CLI refuses it (the same limit also
    bounds the declared uncompressed sizes, so a 1 MiB limit is needed to read it again)."""
    from ipu_stack.runtime import session

    monkeypatch.setattr(session, "read_package",
                        functools.partial(read_package, max_bytes=len(original) - 1))
    line = refused(arena, original, "run")
    assert f"exceeds the limit of {len(original) - 1} bytes" in line
    monkeypatch.setattr(session, "read_package",
                        functools.partial(read_package, max_bytes=1 << 20))
    code, out, err = cli(["--quiet", "inspect", str(arena / "pkg" / "model.ipuexe")])
    assert code == 0 and "sha256" in out, err


def test_not_a_file(arena: Path, original: bytes) -> None:
    """A folder is read as the package ``compile -o`` writes in it; one without it, or a
    ``model.ipuexe`` that is itself a folder, is refused in one line."""
    for command in ("run", "inspect"):
        code, _, err = cli(["--quiet", command, str(arena / "pkg")])
        assert code == 2 and err == (f"error: {arena / 'pkg'} is a folder with no model.ipuexe "
                                     "in it (the package `ipu-stack compile -o DIR` writes)\n")
    (arena / "pkg" / "model.ipuexe").mkdir()
    code, _, err = cli(["--quiet", "inspect", str(arena / "pkg")])
    assert code == 2 and err.startswith(f"error: package {arena / 'pkg' / 'model.ipuexe'} "
                                        "cannot be read: not a regular file")
    (arena / "pkg" / "model.ipuexe").rmdir()
    (arena / "pkg" / "model.ipuexe").write_bytes(original)
    code, out, err = cli(["--quiet", "inspect", str(arena / "pkg")])
    assert code == 0 and "sha256" in out, err


def test_hostile_packages_through_the_installed_command(tmp_path: Path, original: bytes) -> None:
    """The real entry point in a fresh process: one stderr line, exit 2, nothing else."""
    source = tmp_path / "source.ipuexe"
    source.write_bytes(original)
    package = read_package(source)
    victims = {
        "truncated": original[: len(original) // 2],
        "traversal": container_attacks(original)[-15][1],
        "tile 5000": craft(package, CONTENT_ATTACKS[1][1], tmp_path / "t.ipuexe"),
    }
    assert [n for n, _ in container_attacks(original)][-15] == "member ../x"
    env = {**os.environ, "PYTHONHASHSEED": "1"}
    for name, data in victims.items():
        path = tmp_path / "model.ipuexe"
        path.write_bytes(data)
        proc = subprocess.run(
            [sys.executable, "-m", "ipu_stack.cli", "--quiet", "run", str(path), "--lock",
             str(tmp_path / "device.lock")],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
        )
        assert proc.returncode == 2, (name, proc.stderr)
        assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("error: "), name
        assert proc.stdout == ""
    assert not (tmp_path.parent / "x").exists()


@pytest.mark.parametrize(("edit", "message"), [
    ({"options": "x"}, "options: expected an object, found str"),
    ({"layer_loop": -1}, "layer_loop: expected an object, found int"),
    ({"layer_loop": {"layers": 2}}, "layer_loop.body_steps: expected an integer, found null"),
    ({"layer_loop": {"layers": 2**41}}, f"layer_loop.layers: {2**41} is outside [0, {2**40}]"),
    ({"gemm_modes": 1}, "gemm_modes: expected an object, found int"),
    ({"gemm_modes": {"fc1": {"mode": "fp8", "depth_block": 32}}},
     "gemm_modes['fc1']: keys must be matmul operation ids (decimal)"),
    ({"gemm_modes": {"1": {"mode": "fp7", "depth_block": 32}}},
     "gemm_modes['1'].mode: expected one of fp8, f16"),
    ({"gemm_modes": {"1": {"mode": "fp8", "depth_block": 0}}},
     f"gemm_modes['1'].depth_block: 0 is outside [1, {2**40}]"),
    ({"gemm_modes": {"999": {"mode": "fp8", "depth_block": 32}}},
     "gemm_modes['999']: names no matmul of the package's workload"),
    ({"gemm_modes": {"1": {"mode": "f16", "depth_block": 32, "depth_splits": 0}}},
     f"gemm_modes['1'].depth_splits: 0 is outside [1, {2**40}]"),
    ({"gemm_modes": {"1": {"mode": "f16", "depth_block": 32, "row_chunks": [[0, 8]]}}},
     "gemm_modes['1'].row_chunks[0]: expected [first row, rows, row block]"),
    ({"gemm_modes": {"1": {"mode": "f16", "depth_block": 32,
                           "row_chunks": [[0, 8, 4], [9, 8, 4]]}}},
     "gemm_modes['1'].row_chunks[1][0]: chunk starts at row 9, not 8"),
    ({"gemm_modes": {"1": {"mode": "f16", "depth_block": 32, "swapped": 1, "col_block": 8}}},
     "gemm_modes['1'].swapped: expected true or false"),
    ({"gemm_modes": {"1": {"mode": "f16", "depth_block": 32, "swapped": True}}},
     "gemm_modes['1'].col_block: a swapped plan names its column block"),
    # the host reference's reduce order needs a depth block for each depth tile, and each
    # tile's equal share of the rows (of the columns, swapped): operation 2 sums 64 deep
    ({"gemm_modes": {"2": {"mode": "f16", "depth_block": 64, "depth_splits": 2}}},
     "gemm_modes['2'].depth_splits: 2 depth tiles for 1 depth blocks"),
    ({"gemm_modes": {"2": {"mode": "f16", "depth_block": 8, "depth_splits": 2,
                           "swapped": True, "col_block": 7}}},
     "gemm_modes['2'].col_block: 7 is not 2 equal shares"),
    ({"gemm_modes": {"2": {"mode": "f16", "depth_block": 8, "depth_splits": 2,
                           "row_chunks": [[0, 3, 3]]}}},
     "gemm_modes['2'].row_chunks[0][2]: 3 is not 2 equal shares"),
])
def test_bad_run_records_name_the_field(arena: Path, original: bytes, edit: dict,
                                        message: str) -> None:
    """The records the host reads outside the device program (``package/records.py``) are
    checked against type and bounds: one line naming the field, from run and inspect."""
    path = arena / "pkg" / "model.ipuexe"
    source = _read(original, arena)
    data = craft(source, lambda m, a: m.update(edit), path)
    line = refused(arena, data, "run")
    assert line == f"error: package records are invalid: {message}"
    # inspect does not rebuild the workload, which the operations' checks need
    if not any(part in message for part in ("999", "depth tiles for", "equal shares")):
        assert refused(arena, data, "inspect") == line


def _read(original: bytes, arena: Path):
    source = arena / "source.ipuexe"
    source.write_bytes(original)
    return read_package(source)


@pytest.mark.parametrize(("edit", "message"), [
    ({"dim": 12288, "hidden": 12288},
     "package does not match its workload: its parameters make "
     "siglip-mlp-fp8-b1-t16-d12288-h12288-n1, not siglip-mlp-fp8-b1-t16-d64-h64-n1"),
    ({"blocks": 10**6}, "package names a workload this build cannot make: siglip-mlp does not "
     "fit"),
], ids=["other-widths", "a-million-layers"])
def test_a_packages_parameters_are_checked_before_its_workload_is_built(
        arena: Path, original: bytes, edit: dict, message: str) -> None:
    """Parameters a package records are hostile input: named (the identifier they make)
    and sized (the footprint) before anything is built from them, so a small file cannot
    make ``run`` build a model of a million layers or gigabytes of weights."""
    path = arena / "pkg" / "model.ipuexe"
    source = _read(original, arena)

    def change(manifest, arrays):
        manifest["workload"]["params"].update(edit)
        if "blocks" in edit:  # the identifier follows, so the footprint is what refuses
            manifest["workload"]["identifier"] = manifest["workload"]["identifier"].replace(
                "-n1", f"-n{edit['blocks']}")
    assert refused(arena, craft(source, change, path), "run").startswith(f"error: {message}")


@pytest.mark.parametrize(("params", "message"), [
    ({"model": "/etc/passwd", "sha256": "0" * 64}, "which is not a .pt2 or .onnx file"),
    ({"model": "/tmp/model.pt2"}, "records no sha256 of it"),
], ids=["not-a-model-file", "no-sha256"])
def test_a_package_opens_no_file_but_a_model_it_hashed(arena: Path, original: bytes,
                                                       params: dict, message: str) -> None:
    """A package that says it was imported names its model file: only a ``.pt2`` or
    ``.onnx`` with its sha256 is opened, so no other file of the host is read on its say."""
    path = arena / "pkg" / "model.ipuexe"
    source = _read(original, arena)

    def change(manifest, arrays):
        manifest["workload"]["name"] = "torch-export"
        manifest["workload"]["params"] = params
    line = refused(arena, craft(source, change, path), "run")
    assert message in line and line.startswith("error: package names a workload"), line
