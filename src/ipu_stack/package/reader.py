"""Reading an application package: the simulated device's security boundary.

The device loads nothing but this file, so everything in it is treated as hostile until
checked: the ZIP directory is vetted (names, sizes, overlap, compression ratio) before a single
byte is decompressed; every member is read with a bounded read and checked against the SHA-256
in ``header.json``; arrays are parsed from ``.npy`` without pickle and against the declared
dtype and shape.  Nothing is ever extracted to disk.  Every rejection is one
:class:`PackageError` line; no other exception type escapes :func:`read_package`.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import os
import re
import struct
import zipfile
import zlib
from typing import Any, NoReturn

import numpy as np

from ipu_stack.util.errors import PackageError
from ipu_stack.util.files import ZIP_LOCAL_HEADER_BYTES, open_regular, overlapping_member
from ipu_stack.util.log import event

from .format import (
    ALLOWED_DTYPES,
    FORMAT_NAME,
    FORMAT_VERSION,
    HEADER_MEMBER,
    MANIFEST_MEMBER,
    MAX_COMPRESSION_RATIO,
    MAX_HEADER_BYTES,
    MAX_MANIFEST_BYTES,
    MAX_NPY_HEADER_BYTES,
    RATIO_CHECK_MIN_BYTES,
    Package,
    array_for_member,
    is_sha256,
    npy_header,
    quote,
    text_problem,
)

logger = logging.getLogger("ipu_stack.package")

_HEADER_KEYS = {"format", "format_version", "target", "compiler_version", "members"}
_MANIFEST_ENTRY_KEYS = {"sha256", "bytes"}
_ARRAY_ENTRY_KEYS = {"sha256", "bytes", "dtype", "shape"}
_DRIVE = re.compile(r"[A-Za-z]:")


def read_package(
    path: str | os.PathLike[str],
    *,
    expected_target: str | None = None,
    max_bytes: int = 4 << 30,
) -> Package:
    """Read and fully verify the package at ``path``.

    The file is read once into memory (at most ``max_bytes``) so that the checksum, the ZIP
    directory and the members all describe the same bytes even if the file changes meanwhile.
    ``expected_target`` makes a package built for another IPU a one-line error, not a fault.
    """
    name = os.fspath(path)
    try:
        # a device, FIFO or folder is refused on its fstat, before a byte is read
        with open_regular(path) as handle:
            size = os.fstat(handle.fileno()).st_size
            if size > max_bytes:
                raise PackageError(_too_large(name, size, max_bytes))
            data = handle.read(max_bytes + 1)
    except FileNotFoundError:
        raise PackageError(f"package {name} not found") from None
    except OSError as exc:
        raise PackageError(f"package {name} cannot be read: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise PackageError(_too_large(name, len(data), max_bytes))
    event(logger, "parsing application package", level=logging.DEBUG, path=name, bytes=len(data))
    try:
        package = _Reader(name, data, max_bytes).read(expected_target)
    except (PackageError, MemoryError):
        raise
    except Exception as exc:  # noqa: BLE001 - the boundary: anything else means a corrupt file
        detail = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:200]
        raise PackageError(f"package {name} is corrupt: {detail}") from None
    event(
        logger,
        "application package verified",
        level=logging.DEBUG,
        path=name,
        arrays=len(package.arrays),
        sha256=package.sha256,
    )
    return package


def read_package_bytes(name: str, data: bytes, *, expected_target: str | None = None,
                       max_bytes: int = 4 << 30) -> Package:
    """Verify and read a package held in memory (a pipeline package's group programs are
    packages inside it): the same checks as :func:`read_package`."""
    if len(data) > max_bytes:
        raise PackageError(_too_large(name, len(data), max_bytes))
    try:
        return _Reader(name, data, max_bytes).read(expected_target)
    except (PackageError, MemoryError):
        raise
    except Exception as exc:  # noqa: BLE001 - the boundary, as in read_package
        detail = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:200]
        raise PackageError(f"package {name} is corrupt: {detail}") from None


def _too_large(name: str, size: int, max_bytes: int) -> str:
    return f"package {name} is too large: {size} bytes exceeds the limit of {max_bytes} bytes"


def _unsafe_member_name(member: str) -> bool:
    """True for names that could mean a path outside the archive on some system."""
    if "\\" in member or "\x00" in member or member.startswith("/") or _DRIVE.match(member):
        return True
    return any(part in ("", ".", "..") for part in member.split("/"))


class _Reader:
    """One verification pass over the bytes of one package file."""

    def __init__(self, name: str, data: bytes, max_bytes: int) -> None:
        self.name = name
        self.data = data
        self.max_bytes = max_bytes
        self.infos: dict[str, zipfile.ZipInfo] = {}
        self.archive: zipfile.ZipFile  # set by read() once the ZIP directory has parsed

    def corrupt(self, detail: str) -> NoReturn:
        raise PackageError(f"package {self.name} is corrupt: {detail}")

    def read(self, expected_target: str | None) -> Package:
        try:
            archive = zipfile.ZipFile(io.BytesIO(self.data))
        except zipfile.BadZipFile as exc:
            self.corrupt(f"not a ZIP archive or truncated ({exc})")
        with archive:
            self.archive = archive
            self._check_directory(archive)
            header = self._read_header()
            members = header["members"]
            self._check_member_set(members)
            target = header["target"]
            if expected_target is not None and target != expected_target:
                raise PackageError(
                    f"package {self.name}: package targets {target}, "
                    f"but this device is {expected_target}"
                )
            manifest = self._read_manifest(members[MANIFEST_MEMBER])
            arrays: dict[str, np.ndarray] = {}
            for member in sorted(members):
                if member != MANIFEST_MEMBER:
                    arrays[array_for_member(member) or member] = self._read_array(
                        member, members[member]
                    )
        return Package(
            manifest=manifest,
            arrays=arrays,
            sha256=hashlib.sha256(self.data).hexdigest(),
            target=target,
            compiler_version=header["compiler_version"],
        )

    # -- the ZIP directory, before anything is decompressed ------------------------------

    def _check_directory(self, archive: zipfile.ZipFile) -> None:
        """Vet names, sizes and layout from the central directory alone (zip-bomb guard)."""
        total = 0
        for info in archive.infolist():
            member = info.filename
            if _unsafe_member_name(info.orig_filename) or _unsafe_member_name(member):
                self.corrupt(f"unsafe member name {quote(info.orig_filename)}")
            if member in self.infos:
                self.corrupt(f"duplicate member {quote(member)}")
            if info.flag_bits & 0x1:
                self.corrupt(f"member {quote(member)} is encrypted")
            if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                self.corrupt(f"member {quote(member)} uses compression method {info.compress_type}")
            if info.compress_size > len(self.data):
                self.corrupt(
                    f"member {quote(member)} declares {info.compress_size} compressed bytes "
                    f"but the file has only {len(self.data)}"
                )
            if info.compress_type == zipfile.ZIP_STORED and info.file_size != info.compress_size:
                self.corrupt(f"stored member {quote(member)} has inconsistent sizes")
            total += info.file_size
            if total > self.max_bytes:
                self.corrupt(
                    f"uncompressed size exceeds the limit of {self.max_bytes} bytes "
                    f"(at member {quote(member)})"
                )
            if (
                info.file_size > RATIO_CHECK_MIN_BYTES
                and info.file_size > MAX_COMPRESSION_RATIO * info.compress_size
            ):
                self.corrupt(
                    f"member {quote(member)} would expand {info.compress_size} bytes to "
                    f"{info.file_size} (ratio above {MAX_COMPRESSION_RATIO}:1, zip bomb?)"
                )
            self.infos[member] = info
        self._check_layout(archive)
        for info in self.infos.values():
            self._check_local_header(info)

    def _check_local_header(self, info: zipfile.ZipInfo) -> None:
        """The local header must say what the central directory says.

        Pinned policy: name, extra-field length, flags, method, CRC-32 and both sizes must be
        equal (ipu-stack writes no data descriptors and no extra fields, so nothing may
        legitimately differ); any difference refuses the package, naming the field.
        """
        at = info.header_offset
        fields = struct.unpack("<4sHHHHHIIIHH", self.data[at : at + ZIP_LOCAL_HEADER_BYTES])
        signature, _, flags, method, _, _, crc, packed, size, name_length, extra_length = fields
        name = self.data[at + ZIP_LOCAL_HEADER_BYTES : at + ZIP_LOCAL_HEADER_BYTES + name_length]
        member = quote(info.filename)
        expected = {
            "signature": (signature, b"PK\x03\x04"),
            "name": (name, info.orig_filename.encode("utf-8" if info.flag_bits & 0x800
                                                      else "cp437")),
            "extra length": (extra_length, len(info.extra)),
            "flags": (flags, info.flag_bits),
            "method": (method, info.compress_type),
            "CRC-32": (crc, info.CRC),
            "compressed size": (packed, info.compress_size),
            "size": (size, info.file_size),
        }
        for field, (local, central) in expected.items():
            if local != central:
                self.corrupt(f"member {member}: local header {field} {quote(local)} differs "
                             f"from the central directory's {quote(central)}")

    def _check_layout(self, archive: zipfile.ZipFile) -> None:
        """Member data must not overlap: overlapping entries are how small files expand hugely."""
        found = overlapping_member(archive)
        if found is not None:
            self.corrupt(f"member {quote(found[0].filename)} overlaps other data or runs past it")

    def _read_member(self, member: str, entry: dict[str, Any]) -> bytes:
        """Bounded read of one member, checked against the header's size and SHA-256."""
        info = self.infos[member]
        expected = entry["bytes"]
        if info.file_size != expected:
            self.corrupt(
                f"member {member} is {info.file_size} bytes in the ZIP directory "
                f"but {expected} in header.json"
            )
        body = self._bounded_read(info)
        if hashlib.sha256(body).hexdigest() != entry["sha256"]:
            self.corrupt(f"member {member} sha256 mismatch")
        return body

    def _bounded_read(self, info: zipfile.ZipInfo) -> bytes:
        """Read at most the declared size (+1 to reach EOF, which makes zipfile check the CRC)."""
        try:
            with self.archive.open(info) as handle:
                body = handle.read(info.file_size + 1)
        except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError) as exc:
            detail = str(exc).replace("\n", " ")[:120] or type(exc).__name__
            self.corrupt(f"member {quote(info.filename)} cannot be read ({detail})")
        if len(body) != info.file_size:
            self.corrupt(f"member {quote(info.filename)} is shorter or longer than declared")
        return body

    # -- header.json ---------------------------------------------------------------------

    def _read_header(self) -> dict[str, Any]:
        if HEADER_MEMBER not in self.infos:
            self.corrupt(f"member {HEADER_MEMBER} is missing")
        if self.infos[HEADER_MEMBER].file_size > MAX_HEADER_BYTES:
            self.corrupt(f"{HEADER_MEMBER} is {self.infos[HEADER_MEMBER].file_size} bytes "
                         f"(at most {MAX_HEADER_BYTES})")
        header = self._parse_json(HEADER_MEMBER, self._bounded_read(self.infos[HEADER_MEMBER]))
        if not isinstance(header, dict):
            self.corrupt(f"{HEADER_MEMBER} is not a JSON object")
        if header.get("format") != FORMAT_NAME:
            raise PackageError(
                f"package {self.name} is not an ipu-stack application package "
                f"(format {quote(header.get('format'))}, expected {FORMAT_NAME})"
            )
        version = header.get("format_version")
        if type(version) is not int:
            self.corrupt(f"{HEADER_MEMBER} format_version {quote(version)} is not an integer")
        if version != FORMAT_VERSION:
            raise PackageError(
                f"package {self.name}: package format version {quote(version, 24)} is not "
                f"supported by this reader (expects {FORMAT_VERSION})"
            )
        if set(header) != _HEADER_KEYS:
            self.corrupt(f"{HEADER_MEMBER} keys {quote(sorted(header))} are not the expected ones")
        for key in ("target", "compiler_version"):
            problem = text_problem(key, header[key])
            if problem is not None:
                self.corrupt(f"{HEADER_MEMBER}: {problem}")
        members = header["members"]
        if not isinstance(members, dict):
            self.corrupt(f"{HEADER_MEMBER} members is not a JSON object")
        if MANIFEST_MEMBER not in members:
            self.corrupt(f"{HEADER_MEMBER} does not list {MANIFEST_MEMBER}")
        for member, entry in members.items():
            self._check_entry(member, entry)
        return header

    def _check_entry(self, member: str, entry: object) -> None:
        """Each header entry must be exactly what the writer produces for that kind of member."""
        is_array = member != MANIFEST_MEMBER
        if is_array and array_for_member(member) is None:
            self.corrupt(f"{HEADER_MEMBER} lists invalid member name {quote(member)}")
        keys = _ARRAY_ENTRY_KEYS if is_array else _MANIFEST_ENTRY_KEYS
        if not isinstance(entry, dict) or set(entry) != keys:
            self.corrupt(f"{HEADER_MEMBER} entry for {member} is malformed")
        if not is_sha256(entry["sha256"]):
            self.corrupt(f"{HEADER_MEMBER} entry for {member} has an invalid sha256")
        if type(entry["bytes"]) is not int or entry["bytes"] < 0:
            self.corrupt(f"{HEADER_MEMBER} entry for {member} has an invalid size")
        if not is_array:
            return
        if not isinstance(entry["dtype"], str) or entry["dtype"] not in ALLOWED_DTYPES:
            self.corrupt(f"array member {member} has dtype {quote(entry['dtype'])}, not allowed")
        shape = entry["shape"]
        if not isinstance(shape, list) or any(type(dim) is not int or dim < 0 for dim in shape):
            self.corrupt(f"{HEADER_MEMBER} entry for {member} has an invalid shape")

    def _check_member_set(self, members: dict[str, Any]) -> None:
        expected = set(members) | {HEADER_MEMBER}
        present = set(self.infos)
        missing = sorted(expected - present)
        if missing:
            self.corrupt(f"member {quote(missing[0])} is missing ({len(missing)} missing)")
        extra = sorted(present - expected)
        if extra:
            self.corrupt(f"unexpected member {quote(extra[0])} ({len(extra)} unexpected)")

    # -- manifest.json and arrays ------------------------------------------------------------

    def _parse_json(self, member: str, body: bytes) -> Any:
        def no_constants(token: str) -> NoReturn:
            raise ValueError(f"{token} is not allowed")

        def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
            result = dict(pairs)
            if len(result) != len(pairs):
                raise ValueError("duplicate key")
            return result

        try:
            return json.loads(
                body.decode("utf-8"),
                parse_constant=no_constants,
                object_pairs_hook=no_duplicates,
            )
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
            self.corrupt(f"{member} is not valid JSON ({str(exc)[:80]})")

    def _read_manifest(self, entry: dict[str, Any]) -> dict[str, Any]:
        if entry.get("bytes", 0) > MAX_MANIFEST_BYTES:
            self.corrupt(f"{MANIFEST_MEMBER} is {entry['bytes']} bytes (at most "
                         f"{MAX_MANIFEST_BYTES})")
        manifest = self._parse_json(MANIFEST_MEMBER, self._read_member(MANIFEST_MEMBER, entry))
        if not isinstance(manifest, dict):
            self.corrupt(f"{MANIFEST_MEMBER} is not a JSON object")
        return manifest

    def _read_array(self, member: str, entry: dict[str, Any]) -> np.ndarray:
        """Parse a ``.npy`` member without pickle; dtype/shape must match the header exactly."""
        body = self._read_member(member, entry)
        dtype = ALLOWED_DTYPES[entry["dtype"]]
        shape = tuple(entry["shape"])
        try:  # the header the writer makes for this entry (a hostile shape may have none)
            written = npy_header(dtype, shape)
        except ValueError:
            written = None
        offset = len(written) if written and body.startswith(written) else \
            self._parsed_header_end(member, body, entry)
        count = math.prod(shape)
        if len(body) - offset != count * dtype.itemsize:
            self.corrupt(
                f"member {member} holds {len(body) - offset} data bytes, expected "
                f"{count * dtype.itemsize}"
            )
        array = np.frombuffer(body, dtype=dtype, count=count, offset=offset).reshape(shape).copy()
        if dtype.kind == "b" and count and array.view(np.uint8).max() > 1:
            self.corrupt(f"member {member} holds bool values other than 0 and 1")
        return array

    def _parsed_header_end(self, member: str, body: bytes, entry: dict[str, Any]) -> int:
        """Where the data of a ``.npy`` member whose header is not the writer's byte for byte
        begins, its header parsed by numpy (without pickle) and held to the declared dtype
        and shape; the writer's own headers are compared as bytes, at a fraction of the
        cost of numpy's parse."""
        dtype, shape = ALLOWED_DTYPES[entry["dtype"]], tuple(entry["shape"])
        handle = io.BytesIO(body)
        try:
            version = np.lib.format.read_magic(handle)
            if version == (1, 0):
                parsed = np.lib.format.read_array_header_1_0(
                    handle, max_header_size=MAX_NPY_HEADER_BYTES
                )
            elif version == (2, 0):
                parsed = np.lib.format.read_array_header_2_0(
                    handle, max_header_size=MAX_NPY_HEADER_BYTES
                )
            else:
                raise ValueError(f"unsupported .npy version {version}")
        except (ValueError, TypeError, SyntaxError, OSError) as exc:
            self.corrupt(f"member {member} is not a valid .npy array ({str(exc)[:80]})")
        npy_shape, fortran_order, npy_dtype = parsed
        if npy_dtype.str != dtype.str or npy_dtype.hasobject:
            self.corrupt(
                f"member {member} holds dtype {quote(str(npy_dtype))} but header.json says "
                f"{entry['dtype']}"
            )
        if fortran_order or tuple(npy_shape) != shape:
            self.corrupt(f"member {member} shape {npy_shape} does not match header.json {shape}")
        return handle.tell()
