"""Constants and rules shared by the package writer and reader.

Both sides import the same tables so that whatever the writer can produce the reader accepts,
and the reader's limits are documented in one place (``docs/package-format.md``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

FORMAT_NAME = "ipu-stack-application"
FORMAT_VERSION = 1

HEADER_MEMBER = "header.json"
MANIFEST_MEMBER = "manifest.json"
ARRAY_PREFIX = "arrays/"
ARRAY_SUFFIX = ".npy"

# Fixed ZIP metadata: identical inputs must give identical bytes on any machine and day.
ZIP_DATE_TIME = (1980, 1, 1, 0, 0, 0)
ZIP_CREATE_SYSTEM = 3  # "Unix", so external_attr carries the permission bits below
ZIP_EXTERNAL_ATTR = 0o100644 << 16  # regular file, rw-r--r--
DEFLATE_LEVEL = 1  # fastest level: packages are written every build, read once per run
# Arrays larger than this are STORED: weights barely compress, so deflating them costs time
# and saves almost no bytes.
STORE_THRESHOLD = 1 << 20

# Reader limits against zip bombs: a member above RATIO_CHECK_MIN_BYTES that claims to expand
# more than MAX_COMPRESSION_RATIO times is refused before anything is decompressed.
MAX_COMPRESSION_RATIO = 1000
RATIO_CHECK_MIN_BYTES = 1 << 20
MAX_NAME_CHARS = 1024
MAX_TEXT_CHARS = 256  # target and compiler_version: they end up in one-line messages
MAX_NPY_HEADER_BYTES = 1 << 16
# The JSON members, read whole before their contents are checked: a header lists a
# package's members (2 MB for the largest compiled, a 1,000-label Swin-L), a manifest its
# tensors and records (about 1 MB); each bound is far above any package's and far below
# what an inflated bomb of whitespace would take
MAX_HEADER_BYTES = 64 << 20
MAX_MANIFEST_BYTES = 256 << 20

# Allowed dtypes: header name -> canonical little-endian numpy dtype.
ALLOWED_DTYPES: dict[str, np.dtype[Any]] = {
    name: np.dtype(name).newbyteorder("<") if np.dtype(name).itemsize > 1 else np.dtype(name)
    for name in (
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
    )
}
_NAME_BY_STR = {dtype.str: name for name, dtype in ALLOWED_DTYPES.items()}

_COMPONENT = re.compile(r"[A-Za-z0-9_.\-]+")
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Package:
    """A package as read back: what the writer was given, plus the file's checksum."""

    manifest: dict[str, Any]
    arrays: dict[str, np.ndarray]
    sha256: str
    target: str
    compiler_version: str


def array_name_problem(name: object) -> str | None:
    """Say why ``name`` is not a valid array name, or ``None`` when it is.

    Names become ZIP member paths, so anything that could escape a directory or mean different
    things on different systems (``..``, absolute paths, backslashes, drive letters) is refused.
    """
    if not isinstance(name, str):
        return f"array name {name!r} is not a string"
    if not name or len(name) > MAX_NAME_CHARS:
        return f"array name {quote(name)} is empty or longer than {MAX_NAME_CHARS} characters"
    for part in name.split("/"):
        if not _COMPONENT.fullmatch(part) or part in (".", ".."):
            return f"array name {quote(name)} is not of the form [A-Za-z0-9_.-]+ joined by '/'"
    return None


def member_for_array(name: str) -> str:
    """ZIP member path that holds array ``name``."""
    return f"{ARRAY_PREFIX}{name}{ARRAY_SUFFIX}"


def array_for_member(member: str) -> str | None:
    """Array name stored in ``member``, or ``None`` if ``member`` is not a valid array member."""
    if not (member.startswith(ARRAY_PREFIX) and member.endswith(ARRAY_SUFFIX)):
        return None
    name = member[len(ARRAY_PREFIX) : -len(ARRAY_SUFFIX)]
    return name if array_name_problem(name) is None else None


def dtype_name(dtype: np.dtype[Any]) -> str | None:
    """Header name of ``dtype`` in its canonical little-endian form, or ``None`` if refused."""
    if dtype.fields is not None or dtype.subdtype is not None or dtype.hasobject:
        return None
    canonical = dtype.newbyteorder("<") if dtype.itemsize > 1 else dtype
    return _NAME_BY_STR.get(canonical.str)


def is_sha256(value: object) -> bool:
    """True for a lowercase hex SHA-256 digest, the only form the header uses."""
    return isinstance(value, str) and _SHA256.fullmatch(value) is not None


def text_problem(what: str, value: object) -> str | None:
    """Why ``value`` is not a usable target/compiler string, or ``None`` if it is."""
    if not isinstance(value, str) or not value or len(value) > MAX_TEXT_CHARS:
        return f"{what} must be a non-empty string of at most {MAX_TEXT_CHARS} characters"
    if not value.isprintable():
        return f"{what} {quote(value)} contains non-printable characters"
    return None


def quote(text: object, limit: int = 120) -> str:
    """Quote untrusted text for a one-line message: escapes newlines, truncates long text."""
    rendered = ascii(text)
    return rendered if len(rendered) <= limit else rendered[: limit - 3] + "..."


def npy_header(dtype: np.dtype[Any], shape: tuple[int, ...]) -> bytes:
    """The ``.npy`` (version 1.0) header for a C-ordered array, built here, not by numpy.

    Building it ourselves keeps package bytes independent of the installed numpy version; the
    layout is the one ``np.load`` reads (magic, version, little-endian length, padded dict).
    """
    text = f"{{'descr': {dtype.str!r}, 'fortran_order': False, 'shape': {tuple(shape)!r}, }}"
    prefix_len = 6 + 2 + 2
    total = prefix_len + len(text) + 1
    padded = text + " " * ((-total) % 64) + "\n"
    encoded = padded.encode("latin1")
    if len(encoded) > 0xFFFF:
        raise ValueError("npy header too long")
    return b"\x93NUMPY\x01\x00" + len(encoded).to_bytes(2, "little") + encoded
