"""Reading hostile or damaged packages: each rejection is one PackageError line naming it."""

from __future__ import annotations

import io
import pickle
import struct
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ipu_stack.package import read_package
from ipu_stack.package.format import npy_header
from ipu_stack.util.errors import PackageError

UNPICKLED: list[str] = []


def _record_unpickling() -> str:
    UNPICKLED.append("unpickled")
    return "pwned"


class _Payload:
    """Pickles to a call of _record_unpickling: proof of unpickling if it ever runs."""

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return (_record_unpickling, ())


def rejects(path: Path, match: str, **kwargs: Any) -> str:
    with pytest.raises(PackageError, match=match) as info:
        read_package(path, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=True)
    return buffer.getvalue()


def test_missing_file(tmp_path: Path) -> None:
    message = rejects(tmp_path / "model.ipuexe", "not found")
    assert message == f"package {tmp_path / 'model.ipuexe'} not found"


def test_directory_instead_of_file(tmp_path: Path) -> None:
    rejects(tmp_path, "cannot be read")


def test_not_a_zip(tmp_path: Path, pkg: Any) -> None:
    rejects(pkg.write(tmp_path, b"hello, this is not a zip\n" * 10), "not a ZIP archive")
    rejects(pkg.write(tmp_path, b""), "not a ZIP archive")


def test_truncated_at_many_cut_points(tmp_path: Path, sample_bytes: bytes, pkg: Any) -> None:
    cuts = sorted(
        {1, 4, 30, 100, len(sample_bytes) // 2, len(sample_bytes) - 23}
        | set(range(len(sample_bytes) - 1, len(sample_bytes) - 400, -37))
    )
    for cut in cuts:
        rejects(pkg.write(tmp_path, sample_bytes[:cut]), "is corrupt")


def test_too_large(tmp_path: Path, sample_bytes: bytes, pkg: Any) -> None:
    path = pkg.write(tmp_path, sample_bytes)
    rejects(path, r"too large: \d+ bytes exceeds the limit of 100 bytes", max_bytes=100)


@pytest.mark.parametrize(
    "name", ["../evil", "/abs", "a\\b.npy", "C:/x.npy", "arrays/../x.npy", "arrays//x.npy"]
)
def test_unsafe_member_names(tmp_path: Path, sample_bytes: bytes, pkg: Any, name: str) -> None:
    path = pkg.write(tmp_path, pkg.repack(sample_bytes, add={name: b"payload"}))
    rejects(path, "is corrupt: unsafe member name")


def test_duplicate_member(tmp_path: Path, sample_bytes: bytes, pkg: Any) -> None:
    members = list(pkg.zip_members(sample_bytes).items())
    with pytest.warns(UserWarning, match="Duplicate name"):
        data = pkg.build_zip([*members, members[-1]])
    rejects(pkg.write(tmp_path, data), "duplicate member")


def test_unexpected_member(tmp_path: Path, sample_bytes: bytes, pkg: Any) -> None:
    path = pkg.write(tmp_path, pkg.repack(sample_bytes, add={"extra.txt": b"hi"}))
    rejects(path, "unexpected member 'extra.txt'")


@pytest.mark.parametrize(
    ("drop", "match"),
    [
        ("arrays/weights.npy", "member 'arrays/weights.npy' is missing"),
        ("manifest.json", "member 'manifest.json' is missing"),
        ("header.json", "member header.json is missing"),
    ],
)
def test_missing_member(
    tmp_path: Path, sample_bytes: bytes, pkg: Any, drop: str, match: str
) -> None:
    rejects(pkg.write(tmp_path, pkg.repack(sample_bytes, drop=(drop,))), match)


def test_header_without_manifest_entry(tmp_path: Path, sample_bytes: bytes, pkg: Any) -> None:
    def edit(header: dict[str, Any]) -> None:
        del header["members"]["manifest.json"]

    data = pkg.repack(sample_bytes, drop=("manifest.json",), header_edit=edit)
    rejects(pkg.write(tmp_path, data), "does not list manifest.json")


def _patch_central_sizes(data: bytes, member: str, compress: int | None, size: int) -> bytes:
    """Overwrite a member's sizes in the central directory (what a zip bomb lies about)."""
    offset = data.index(b"PK\x01\x02")
    while True:
        name_len = struct.unpack_from("<H", data, offset + 28)[0]
        if data[offset + 46 : offset + 46 + name_len].decode() == member:
            break
        extra_len, comment_len = struct.unpack_from("<HH", data, offset + 30)
        offset += 46 + name_len + extra_len + comment_len
    patched = bytearray(data)
    if compress is not None:
        struct.pack_into("<I", patched, offset + 20, compress)
    struct.pack_into("<I", patched, offset + 24, size)
    return bytes(patched)


def test_zip_bomb_by_compression_ratio(
    tmp_path: Path, sample_bytes: bytes, pkg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    bomb = b"\0" * (64 << 20)  # deflates about 1030:1
    data = pkg.repack(sample_bytes, replace={"arrays/weights.npy": bomb})

    def no_decompression(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("decompressed before the bomb check")

    monkeypatch.setattr(zipfile.ZipFile, "open", no_decompression)
    rejects(pkg.write(tmp_path, data), r"arrays/weights.npy.*ratio above 1000:1")


def test_zip_bomb_by_declared_size(
    tmp_path: Path, sample_bytes: bytes, pkg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(zipfile.ZipFile, "open", None)  # any decompression would fail loudly
    huge = _patch_central_sizes(sample_bytes, "arrays/weights.npy", None, 0xFFFFFFF0)
    rejects(pkg.write(tmp_path, huge), "uncompressed size exceeds the limit of 4294967296")
    big = _patch_central_sizes(sample_bytes, "arrays/weights.npy", None, 100 << 20)
    rejects(pkg.write(tmp_path, big), "would expand .* to 104857600 .*ratio above 1000:1")
    lying = _patch_central_sizes(sample_bytes, "arrays/weights.npy", 1 << 30, 1 << 30)
    rejects(pkg.write(tmp_path, lying), "declares 1073741824 compressed bytes but the file has")


def test_total_uncompressed_size_limit(tmp_path: Path, pkg: Any) -> None:
    from ipu_stack.package import package_bytes

    data = package_bytes(
        target="ipu21",
        compiler_version="x",
        manifest={},
        arrays={"zeros": np.zeros(250_000, np.float32)},  # < 1 MiB: deflated to ~1 KB
    )
    path = pkg.write(tmp_path, data)
    rejects(path, "uncompressed size exceeds the limit of 100000 bytes", max_bytes=100_000)


def test_sha256_mismatch(tmp_path: Path, sample_bytes: bytes, pkg: Any) -> None:
    other = npy(np.ones((4, 6), np.float32))
    data = pkg.repack(sample_bytes, replace={"arrays/weights.npy": other}, fix_hashes=False)

    def keep_size(header: dict[str, Any]) -> None:
        header["members"]["arrays/weights.npy"]["bytes"] = len(other)

    data = pkg.repack(data, header_edit=keep_size)
    message = rejects(pkg.write(tmp_path, data), "sha256 mismatch")
    assert message.endswith("is corrupt: member arrays/weights.npy sha256 mismatch")


def test_size_mismatch_between_header_and_zip(
    tmp_path: Path, sample_bytes: bytes, pkg: Any
) -> None:
    def edit(header: dict[str, Any]) -> None:
        header["members"]["manifest.json"]["bytes"] += 1

    rejects(pkg.write(tmp_path, pkg.repack(sample_bytes, header_edit=edit)), "in header.json")


def test_wrong_format_name(tmp_path: Path, sample_bytes: bytes, pkg: Any) -> None:
    def edit(header: dict[str, Any]) -> None:
        header["format"] = "something-else"

    path = pkg.write(tmp_path, pkg.repack(sample_bytes, header_edit=edit))
    rejects(path, "is not an ipu-stack application package")


def test_wrong_format_version(tmp_path: Path, sample_bytes: bytes, pkg: Any) -> None:
    def edit(header: dict[str, Any]) -> None:
        header["format_version"] = 2
        header["new_field"] = "v2 layouts may differ"

    path = pkg.write(tmp_path, pkg.repack(sample_bytes, header_edit=edit))
    rejects(path, r"package format version 2 is not supported by this reader \(expects 1\)")


def test_wrong_target(tmp_path: Path, sample_bytes: bytes, pkg: Any) -> None:
    path = pkg.write(tmp_path, sample_bytes)
    rejects(path, "package targets ipu21, but this device is ipu2$", expected_target="ipu2")
    assert read_package(path, expected_target="ipu21").target == "ipu21"


def test_header_declares_object_dtype(tmp_path: Path, sample_bytes: bytes, pkg: Any) -> None:
    def edit(header: dict[str, Any]) -> None:
        header["members"]["arrays/weights.npy"]["dtype"] = "object"

    path = pkg.write(tmp_path, pkg.repack(sample_bytes, header_edit=edit))
    rejects(path, "arrays/weights.npy has dtype 'object', not allowed")


def test_object_npy_with_pickle_payload_is_never_unpickled(
    tmp_path: Path, sample_bytes: bytes, pkg: Any
) -> None:
    evil = npy(np.array([_Payload(), 1], dtype=object))
    assert b"_record_unpickling" in evil
    UNPICKLED.clear()
    data = pkg.repack(sample_bytes, replace={"arrays/weights.npy": evil})
    rejects(pkg.write(tmp_path, data), "holds dtype 'object' but header.json says float32")

    def edit(header: dict[str, Any]) -> None:
        header["members"]["arrays/weights.npy"]["dtype"] = "object"

    data = pkg.repack(data, header_edit=edit)
    rejects(pkg.write(tmp_path, data), "not allowed")
    assert UNPICKLED == []


def test_raw_pickle_instead_of_npy(tmp_path: Path, sample_bytes: bytes, pkg: Any) -> None:
    UNPICKLED.clear()
    data = pkg.repack(sample_bytes, replace={"arrays/weights.npy": pickle.dumps(_Payload())})
    rejects(pkg.write(tmp_path, data), "arrays/weights.npy is not a valid .npy array")
    assert UNPICKLED == []


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (npy(np.zeros((6, 4), np.float32)), r"shape \(6, 4\) does not match"),
        (npy(np.zeros((4, 6), np.float64)), "holds dtype 'float64' but header.json says float32"),
        (npy(np.zeros((4, 6), ">f4")), "holds dtype '>f4'"),
        (npy(np.asfortranarray(np.zeros((4, 6), np.float32))), "does not match"),
        (npy(np.zeros((4, 6), np.float32))[:-4], "data bytes, expected 96"),
        (npy(np.zeros((4, 6), np.float32)) + b"junk", "data bytes, expected 96"),
    ],
)
def test_npy_disagrees_with_header(
    tmp_path: Path, sample_bytes: bytes, pkg: Any, body: bytes, match: str
) -> None:
    data = pkg.repack(sample_bytes, replace={"arrays/weights.npy": body})
    rejects(pkg.write(tmp_path, data), match)


def test_bool_array_with_values_other_than_0_and_1(
    tmp_path: Path, sample_bytes: bytes, pkg: Any
) -> None:
    body = npy_header(np.dtype(bool), (3,)) + b"\x01\x02\x00"
    data = pkg.repack(sample_bytes, replace={"arrays/mask.npy": body})
    rejects(pkg.write(tmp_path, data), "bool values other than 0 and 1")


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b"{not json", "manifest.json is not valid JSON"),
        (b'{"x": NaN}', "manifest.json is not valid JSON"),
        (b'{"x": 1, "x": 2}', "duplicate key"),
        (b"[1, 2]", "manifest.json is not a JSON object"),
        (b'{"x": "\xff"}', "manifest.json is not valid JSON"),
        pytest.param(b"[" * 100_000, "manifest.json is not valid JSON", id="deep-nesting"),
    ],
)
def test_invalid_manifest_json(
    tmp_path: Path, sample_bytes: bytes, pkg: Any, body: bytes, match: str
) -> None:
    data = pkg.repack(sample_bytes, replace={"manifest.json": body})
    rejects(pkg.write(tmp_path, data), match)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda h: h.update(target="ipu\n21"), "non-printable"),
        (lambda h: h.update(format_version="1"), "format_version '1' is not an integer"),
        (lambda h: h.update(extra=1), "are not the expected ones"),
        (lambda h: h.update(members=[]), "members is not a JSON object"),
        (lambda h: h["members"]["arrays/bias.npy"].update(sha256="00"), "invalid sha256"),
        (lambda h: h["members"]["arrays/bias.npy"].update(bytes=-1), "invalid size"),
        (lambda h: h["members"]["arrays/bias.npy"].update(shape=[-1]), "invalid shape"),
        (lambda h: h["members"]["arrays/bias.npy"].pop("shape"), "malformed"),
        (lambda h: h["members"].update({"arrays/../x.npy": {}}), "invalid member name"),
    ],
)
def test_malformed_header(
    tmp_path: Path, sample_bytes: bytes, pkg: Any, edit: Any, match: str
) -> None:
    rejects(pkg.write(tmp_path, pkg.repack(sample_bytes, header_edit=edit)), match)


def test_header_not_json(tmp_path: Path, sample_bytes: bytes, pkg: Any) -> None:
    members = pkg.zip_members(sample_bytes)
    members["header.json"] = b"\x00\x01garbage"
    rejects(pkg.write(tmp_path, pkg.build_zip(members)), "header.json is not valid JSON")


def test_encrypted_flag(tmp_path: Path, sample_bytes: bytes, pkg: Any) -> None:
    offset = sample_bytes.index(b"PK\x01\x02")
    patched = bytearray(sample_bytes)
    patched[offset + 8] |= 0x1
    rejects(pkg.write(tmp_path, bytes(patched)), "encrypted")


def test_overlapping_members(tmp_path: Path, sample_bytes: bytes, pkg: Any) -> None:
    """Two directory entries pointing at the same data: the classic overlapped zip bomb."""
    data = bytearray(sample_bytes)
    first = data.index(b"PK\x01\x02")
    second = data.index(b"PK\x01\x02", first + 4)
    struct.pack_into("<I", data, second + 42, struct.unpack_from("<I", data, first + 42)[0])
    rejects(pkg.write(tmp_path, bytes(data)), "overlaps")


def test_random_bit_flips(tmp_path: Path, sample_bytes: bytes, pkg: Any) -> None:
    """Every flip is rejected with PackageError, or hits a byte ZIP ignores (content intact)."""
    reference = read_package(pkg.write(tmp_path, sample_bytes, "reference.ipuexe"))
    rng = np.random.default_rng(2024)
    rejected = 0
    for _ in range(200):
        flipped = bytearray(sample_bytes)
        position = int(rng.integers(len(flipped)))
        flipped[position] ^= 1 << int(rng.integers(8))
        path = pkg.write(tmp_path, bytes(flipped))
        try:
            package = read_package(path)
        except PackageError as exc:
            assert "\n" not in str(exc)
            rejected += 1
            continue
        assert package.manifest == reference.manifest, position
        assert package.target == reference.target
        assert package.compiler_version == reference.compiler_version
        assert sorted(package.arrays) == sorted(reference.arrays)
        for name, array in reference.arrays.items():
            assert package.arrays[name].dtype == array.dtype
            np.testing.assert_array_equal(package.arrays[name], array)
    assert rejected > 150


@pytest.mark.parametrize(("bound", "member"), [("MAX_HEADER_BYTES", "header.json"),
                                               ("MAX_MANIFEST_BYTES", "manifest.json")])
def test_a_json_member_above_its_bound_is_not_inflated(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, sample_bytes: bytes, pkg: Any,
        bound: str, member: str) -> None:
    """The JSON members are read whole: one larger than its bound (a whitespace bomb that
    deflates under the ratio limit) is refused from the ZIP directory's size or the
    header's, before it is inflated. The bounds are lowered here to a real package's."""
    from ipu_stack.package import reader

    monkeypatch.setattr(reader, bound, 64)
    path = pkg.write(tmp_path, sample_bytes)
    rejects(path, f"{member} is [0-9]+ bytes \\(at most 64\\)")
