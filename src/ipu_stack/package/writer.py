"""Deterministic serialisation of an application package (see ``docs/package-format.md``).

Same inputs give the same bytes in any process and under any ``PYTHONHASHSEED``: every mapping
is written in sorted order, ZIP metadata is fixed, arrays are canonical little-endian C order,
and the ``.npy`` headers are built here rather than by whatever numpy is installed.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import zipfile
from typing import Any

import numpy as np

from ipu_stack.util.errors import PackageError
from ipu_stack.util.files import write_atomic
from ipu_stack.util.log import event

from .format import (
    ALLOWED_DTYPES,
    DEFLATE_LEVEL,
    FORMAT_NAME,
    FORMAT_VERSION,
    HEADER_MEMBER,
    MANIFEST_MEMBER,
    STORE_THRESHOLD,
    ZIP_CREATE_SYSTEM,
    ZIP_DATE_TIME,
    ZIP_EXTERNAL_ATTR,
    array_name_problem,
    dtype_name,
    member_for_array,
    npy_header,
    quote,
    text_problem,
)

logger = logging.getLogger("ipu_stack.package")


def _json_bytes(value: Any, what: str) -> bytes:
    """Canonical JSON: compact, sorted keys, no NaN/Infinity, ASCII only, trailing newline."""
    try:
        text = json.dumps(
            value, sort_keys=True, allow_nan=False, separators=(",", ":"), ensure_ascii=True
        )
    except (TypeError, ValueError, RecursionError) as exc:
        raise PackageError(f"cannot write package: {what} is not valid JSON ({exc})") from None
    return (text + "\n").encode("ascii")


def _npy_bytes(name: str, array: object) -> tuple[bytes, str, list[int]]:
    """Serialise one array as ``.npy``; returns (bytes, dtype name, shape)."""
    if not isinstance(array, (np.ndarray, np.generic)):
        raise PackageError(
            f"cannot write package: array {quote(name)} is a {type(array).__name__}, "
            "not a numpy array"
        )
    array = np.asarray(array)
    dname = dtype_name(array.dtype)
    if dname is None:
        raise PackageError(
            f"cannot write package: array {quote(name)} has dtype {array.dtype}, which packages "
            "do not allow (bool, int8-64, uint8-64, float16/32/64 only)"
        )
    canonical = ALLOWED_DTYPES[dname]
    # asarray(order="C"), not ascontiguousarray: the latter turns 0-d arrays into shape (1,).
    data = np.asarray(array, dtype=canonical, order="C")
    shape = [int(dim) for dim in data.shape]
    return npy_header(canonical, tuple(shape)) + data.tobytes(order="C"), dname, shape


def _zip_info(member: str, compress_type: int) -> zipfile.ZipInfo:
    """A ZipInfo whose every field is fixed, so the archive bytes depend only on the data."""
    info = zipfile.ZipInfo(member, date_time=ZIP_DATE_TIME)
    info.create_system = ZIP_CREATE_SYSTEM
    info.external_attr = ZIP_EXTERNAL_ATTR
    info.compress_type = compress_type
    return info


def package_bytes(
    *,
    target: str,
    compiler_version: str,
    manifest: dict[str, Any],
    arrays: dict[str, np.ndarray],
) -> bytes:
    """Serialise a package to bytes; exactly what :func:`write_package` puts on disk.

    Raises :class:`PackageError` for inputs the format cannot hold (bad names, refused dtypes,
    non-JSON manifest) so that a compiler bug surfaces at build time, not on the device.
    """
    for what, value in (("target", target), ("compiler_version", compiler_version)):
        problem = text_problem(what, value)
        if problem is not None:
            raise PackageError(f"cannot write package: {problem}")
    if not isinstance(manifest, dict):
        raise PackageError("cannot write package: manifest must be a dict")
    if not isinstance(arrays, dict):
        raise PackageError("cannot write package: arrays must be a dict of numpy arrays")

    bodies: dict[str, bytes] = {MANIFEST_MEMBER: _json_bytes(manifest, "manifest")}
    entries: dict[str, dict[str, Any]] = {}
    for name in sorted(arrays, key=str):
        problem = array_name_problem(name)
        if problem is not None:
            raise PackageError(f"cannot write package: {problem}")
        body, dname, shape = _npy_bytes(name, arrays[name])
        member = member_for_array(name)
        bodies[member] = body
        entries[member] = {"dtype": dname, "shape": shape}
    for member, body in bodies.items():
        entry = entries.setdefault(member, {})
        entry["sha256"] = hashlib.sha256(body).hexdigest()
        entry["bytes"] = len(body)

    header = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "target": target,
        "compiler_version": compiler_version,
        "members": entries,
    }
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", allowZip64=True) as archive:
        archive.writestr(
            _zip_info(HEADER_MEMBER, zipfile.ZIP_DEFLATED),
            _json_bytes(header, "header"),
            compresslevel=DEFLATE_LEVEL,
        )
        # MANIFEST_MEMBER sorts after "arrays/..." but is written second, right after the
        # header, so that a reader streaming the file meets the small JSON members first.
        for member in [MANIFEST_MEMBER] + sorted(m for m in bodies if m != MANIFEST_MEMBER):
            body = bodies[member]
            stored = member != MANIFEST_MEMBER and len(body) > STORE_THRESHOLD
            compress = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
            archive.writestr(
                _zip_info(member, compress),
                body,
                compresslevel=None if stored else DEFLATE_LEVEL,
            )
    return buffer.getvalue()


def write_package(
    path: str | os.PathLike[str],
    *,
    target: str,
    compiler_version: str,
    manifest: dict[str, Any],
    arrays: dict[str, np.ndarray],
) -> str:
    """Write the package atomically to ``path`` and return the SHA-256 of the file's bytes.

    The whole file is built in memory first so a serialisation error never leaves a partial
    file behind, and ``write_atomic`` guarantees readers see either the old file or the new one.
    """
    data = package_bytes(
        target=target, compiler_version=compiler_version, manifest=manifest, arrays=arrays
    )
    digest = hashlib.sha256(data).hexdigest()
    try:
        write_atomic(path, lambda handle: handle.write(data))
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise PackageError(f"cannot write package {os.fspath(path)}: {reason}") from None
    event(
        logger,
        "application package written",
        level=logging.DEBUG,
        path=os.fspath(path),
        bytes=len(data),
        arrays=len(arrays),
        sha256=digest,
    )
    return digest
