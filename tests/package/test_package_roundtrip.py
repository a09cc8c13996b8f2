"""Writing packages: round trip, byte-for-byte determinism, atomicity, refused inputs."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ipu_stack.package import (
    FORMAT_NAME,
    FORMAT_VERSION,
    Package,
    package_bytes,
    read_package,
    write_package,
)
from ipu_stack.package.format import STORE_THRESHOLD
from ipu_stack.util.errors import PackageError

SRC = Path(__file__).resolve().parents[2] / "src"


def assert_same_arrays(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(want)
    for name, array in want.items():
        expected = np.asarray(array)
        assert got[name].shape == expected.shape, name
        assert got[name].dtype == expected.dtype.newbyteorder("<") or (
            expected.dtype.itemsize == 1 and got[name].dtype == expected.dtype
        ), name
        np.testing.assert_array_equal(got[name], expected, err_msg=name)


def test_round_trip(tmp_path: Path, sample_kwargs: dict[str, Any]) -> None:
    path = tmp_path / "model.ipuexe"
    digest = write_package(path, **sample_kwargs)
    assert digest == hashlib.sha256(path.read_bytes()).hexdigest()
    package = read_package(path, expected_target="ipu21")
    assert isinstance(package, Package)
    assert package.sha256 == digest
    assert package.target == "ipu21"
    assert package.compiler_version == "0.1.0"
    assert package.manifest == sample_kwargs["manifest"]
    assert_same_arrays(package.arrays, sample_kwargs["arrays"])
    assert package.arrays["scale"].shape == ()
    assert package.arrays["weights"].flags.writeable
    assert package.arrays["weights"].flags.c_contiguous



def test_the_writers_headers_are_read_without_numpys_parser(
        tmp_path: Path, sample_kwargs: dict[str, Any], monkeypatch) -> None:
    """A member whose ``.npy`` header is the writer's own, byte for byte, is read without
    numpy's header parser (its ``literal_eval`` is most of a package's read time); any other
    header still goes through it (test_package_reject)."""
    path = tmp_path / "model.ipuexe"
    write_package(path, **sample_kwargs)

    def refuse(*_: Any, **__: Any) -> None:
        raise AssertionError("numpy's header parser ran on a header the writer made")

    monkeypatch.setattr(np.lib.format, "read_array_header_1_0", refuse)
    assert_same_arrays(read_package(path).arrays, sample_kwargs["arrays"])


def test_layout_matches_the_documented_format(sample_bytes: bytes) -> None:
    with zipfile.ZipFile(io.BytesIO(sample_bytes)) as archive:
        names = archive.namelist()
        infos = archive.infolist()
        header = json.loads(archive.read("header.json"))
        assert np.load(io.BytesIO(archive.read("arrays/bias.npy")), allow_pickle=False).dtype == (
            np.float16
        )
    assert names[:2] == ["header.json", "manifest.json"]
    assert names[2:] == sorted(names[2:])
    assert all(info.date_time == (1980, 1, 1, 0, 0, 0) for info in infos)
    assert all(info.external_attr == 0o100644 << 16 for info in infos)
    assert header["format"] == FORMAT_NAME and header["format_version"] == FORMAT_VERSION
    assert set(header["members"]) == set(names) - {"header.json"}
    assert header["members"]["arrays/phase/3/src.npy"]["dtype"] == "int32"
    assert header["members"]["arrays/phase/3/src.npy"]["shape"] == [3]


def test_large_arrays_are_stored_small_ones_deflated() -> None:
    arrays = {"big": np.zeros(STORE_THRESHOLD // 4 + 1, np.float32), "small": np.zeros(8, np.int8)}
    data = package_bytes(target="ipu21", compiler_version="x", manifest={}, arrays=arrays)
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        assert archive.getinfo("arrays/big.npy").compress_type == zipfile.ZIP_STORED
        assert archive.getinfo("arrays/small.npy").compress_type == zipfile.ZIP_DEFLATED


def test_big_endian_and_non_contiguous_inputs_are_canonicalised() -> None:
    base = np.arange(24, dtype=np.int32).reshape(4, 6)
    variants = [base, base.astype(">i4"), np.asfortranarray(base), base.T.copy().T]
    outputs = {
        package_bytes(target="ipu21", compiler_version="x", manifest={}, arrays={"a": v})
        for v in variants
    }
    assert len(outputs) == 1


def test_two_writes_are_byte_identical(tmp_path: Path, sample_kwargs: dict[str, Any]) -> None:
    first = write_package(tmp_path / "a.ipuexe", **sample_kwargs)
    shuffled = dict(reversed(list(sample_kwargs["arrays"].items())))
    manifest = dict(reversed(list(sample_kwargs["manifest"].items())))
    kwargs = {**sample_kwargs, "arrays": shuffled, "manifest": manifest}
    second = write_package(tmp_path / "b.ipuexe", **kwargs)
    assert first == second
    assert (tmp_path / "a.ipuexe").read_bytes() == (tmp_path / "b.ipuexe").read_bytes()


_CHILD = """
import hashlib, numpy as np
from ipu_stack.package import package_bytes
names = {f"layer{i}/w" for i in range(40)}  # set order depends on PYTHONHASHSEED
arrays = {n: np.full((3, 2), len(n), dtype=np.float32) for n in names}
manifest = {n: {"k" + n: [1, 2.5]} for n in names}
data = package_bytes(target="ipu21", compiler_version="0.1.0", manifest=manifest, arrays=arrays)
print(hashlib.sha256(data).hexdigest())
"""


def test_deterministic_across_processes_and_hash_seeds() -> None:
    digests = set()
    for seed in ("0", "1", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(SRC)}
        result = subprocess.run(
            [sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, check=True
        )
        digests.add(result.stdout.strip())
    assert len(digests) == 1


def test_atomic_write_leaves_nothing_on_failure(
    tmp_path: Path, sample_kwargs: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(PackageError, match="cannot write package .*No space left"):
        write_package(tmp_path / "model.ipuexe", **sample_kwargs)
    assert list(tmp_path.iterdir()) == []


def test_atomic_write_keeps_old_file_when_interrupted(
    tmp_path: Path, sample_kwargs: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "model.ipuexe"
    old_digest = write_package(path, **sample_kwargs)
    import ipu_stack.package.writer as writer

    real = writer.write_atomic

    def interrupted(target: Any, write: Any) -> None:
        def half(handle: Any) -> None:
            handle.write(b"PK\x03\x04 partial")
            raise KeyboardInterrupt

        real(target, half)

    monkeypatch.setattr(writer, "write_atomic", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_package(path, **{**sample_kwargs, "target": "ipu2"})
    assert [p.name for p in tmp_path.iterdir()] == ["model.ipuexe"]
    assert read_package(path).sha256 == old_digest


@pytest.mark.parametrize(
    ("arrays", "manifest", "message"),
    [
        ({"../evil": np.zeros(1)}, {}, "array name"),
        ({"/abs": np.zeros(1)}, {}, "array name"),
        ({"a//b": np.zeros(1)}, {}, "array name"),
        ({"a\\b": np.zeros(1)}, {}, "array name"),
        ({"": np.zeros(1)}, {}, "array name"),
        ({"x": np.array([object()], dtype=object)}, {}, "dtype object"),
        ({"x": np.zeros(2, dtype=np.complex64)}, {}, "dtype complex64"),
        ({"x": np.zeros(2, dtype=[("a", "<i4")])}, {}, "which packages do not allow"),
        ({"x": [1, 2, 3]}, {}, "not a numpy array"),
        ({}, {"x": float("nan")}, "manifest is not valid JSON"),
        ({}, {"x": object()}, "manifest is not valid JSON"),
    ],
)
def test_writer_refuses_what_the_format_cannot_hold(
    arrays: dict[str, Any], manifest: dict[str, Any], message: str
) -> None:
    with pytest.raises(PackageError, match=message):
        package_bytes(target="ipu21", compiler_version="x", manifest=manifest, arrays=arrays)


def test_writer_refuses_fp8_extension_dtypes() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    arrays = {"w": np.zeros(4, dtype=ml_dtypes.float8_e4m3fn)}
    with pytest.raises(PackageError, match="do not allow"):
        package_bytes(target="ipu21", compiler_version="x", manifest={}, arrays=arrays)
    raw = {"w": arrays["w"].view(np.uint8)}  # the supported way to carry FP8 bytes
    package_bytes(target="ipu21", compiler_version="x", manifest={}, arrays=raw)


@pytest.mark.parametrize("target", ["", "ipu\n21", 5])
def test_writer_refuses_bad_target(target: Any) -> None:
    with pytest.raises(PackageError, match="target"):
        package_bytes(target=target, compiler_version="x", manifest={}, arrays={})
