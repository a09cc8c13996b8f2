"""ZIP local headers that disagree with the central directory: the pinned policy is to refuse
every difference (name, extra length, flags, method, CRC-32, sizes), naming the field; an
untouched package reads back unchanged."""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest

from ipu_stack.package import read_package, write_package
from ipu_stack.util.errors import PackageError

# offsets inside a local file header
FIELDS = {"flags": (6, "<H"), "method": (8, "<H"), "CRC-32": (14, "<I"),
          "compressed size": (18, "<I"), "size": (22, "<I"), "extra length": (28, "<H")}


@pytest.fixture()
def package_bytes(tmp_path: Path) -> bytes:
    path = tmp_path / "model.ipuexe"
    write_package(path, target="ipu21", compiler_version="0.1.0",
                  manifest={"hello": "world"}, arrays={"a": np.arange(10, dtype=np.int64)})
    return path.read_bytes()


def _first_array_header(data: bytes) -> int:
    with zipfile.ZipFile(__import__("io").BytesIO(data)) as archive:
        info = next(i for i in archive.infolist() if i.filename.startswith("arrays/"))
        return info.header_offset


def test_untouched_package_reads_back(tmp_path: Path, package_bytes: bytes) -> None:
    path = tmp_path / "ok.ipuexe"
    path.write_bytes(package_bytes)
    package = read_package(path)
    np.testing.assert_array_equal(package.arrays["a"], np.arange(10))
    assert package.manifest == {"hello": "world"}


@pytest.mark.parametrize("field", list(FIELDS))
def test_every_local_header_field_mismatch_is_refused(tmp_path: Path, package_bytes: bytes,
                                                      field: str) -> None:
    data = bytearray(package_bytes)
    at = _first_array_header(package_bytes)
    offset, fmt = FIELDS[field]
    (value,) = struct.unpack_from(fmt, data, at + offset)
    struct.pack_into(fmt, data, at + offset, value ^ 1)
    path = tmp_path / "bad.ipuexe"
    path.write_bytes(bytes(data))
    with pytest.raises(PackageError, match=rf"local header {field} \d+ differs from the "
                                           rf"central directory's \d+"):
        read_package(path)


def test_local_name_mismatch_is_refused(tmp_path: Path, package_bytes: bytes) -> None:
    data = bytearray(package_bytes)
    at = _first_array_header(package_bytes)
    data[at + 30] = ord("A") if data[at + 30] != ord("A") else ord("B")  # first name byte
    path = tmp_path / "bad.ipuexe"
    path.write_bytes(bytes(data))
    with pytest.raises(PackageError, match="local header name .* differs from the central"):
        read_package(path)
