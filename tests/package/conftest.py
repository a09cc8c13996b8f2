"""Fixtures for package tests: a sample package and a tool to hand-craft hostile variants.

Helpers are exposed as fixtures (not imported from a module) so that test-file and helper
names cannot collide with other test directories under pytest's default import mode.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ipu_stack.package import package_bytes


def sample_arrays() -> dict[str, np.ndarray]:
    """Small arrays covering every allowed dtype family, 0-d, empty and nested names."""
    rng = np.random.default_rng(7)
    return {
        "weights": rng.standard_normal((4, 6)).astype(np.float32),
        "bias": np.arange(6, dtype=np.float16),
        "phase/3/src": np.array([5, 1, 1471], dtype=np.int32),
        "phase/3/dst": np.array([[0, 1], [2, 3]], dtype=np.uint64),
        "mask": np.array([True, False, True]),
        "fp8.raw": rng.integers(0, 256, size=16, dtype=np.uint8),
        "scale": np.float64(0.125) * np.ones(()),
        "empty": np.zeros((0, 3), dtype=np.int16),
    }


SAMPLE_MANIFEST: dict[str, Any] = {
    "tiles": 1472,
    "workload": "siglip-mlp",
    "phases": [{"id": 0, "cycles": 204006}, {"id": 1, "cycles": 55519}],
    "clock_ghz": 1.5,
    "notes": None,
}


@pytest.fixture
def sample_kwargs() -> dict[str, Any]:
    return {
        "target": "ipu21",
        "compiler_version": "0.1.0",
        "manifest": json.loads(json.dumps(SAMPLE_MANIFEST)),
        "arrays": sample_arrays(),
    }


@pytest.fixture
def sample_bytes(sample_kwargs: dict[str, Any]) -> bytes:
    return package_bytes(**sample_kwargs)


def zip_members(data: bytes) -> dict[str, bytes]:
    """All members of a (valid) package, in archive order."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return {info.filename: archive.read(info) for info in archive.infolist()}


def build_zip(
    members: list[tuple[str, bytes]] | dict[str, bytes],
    compress: int = zipfile.ZIP_DEFLATED,
) -> bytes:
    """A ZIP with exactly these (possibly hostile) member names, in order."""
    items = list(members.items()) if isinstance(members, dict) else list(members)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=compress) as archive:
        for name, body in items:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = compress
            archive.writestr(info, body)
    return buffer.getvalue()


def repack(
    data: bytes,
    *,
    drop: tuple[str, ...] = (),
    add: dict[str, bytes] | None = None,
    replace: dict[str, bytes] | None = None,
    header_edit: Callable[[dict[str, Any]], None] | None = None,
    fix_hashes: bool = True,
) -> bytes:
    """Rebuild ``data`` with members dropped/added/replaced and the header edited.

    With ``fix_hashes`` the header's sha256/bytes of replaced members are updated, so the test
    reaches the check it targets instead of stopping at the checksum.
    """
    members = zip_members(data)
    header = json.loads(members["header.json"])
    for name in drop:
        members.pop(name)
    for name, body in (replace or {}).items():
        members[name] = body
        if fix_hashes and name in header["members"]:
            entry = header["members"][name]
            entry["sha256"] = hashlib.sha256(body).hexdigest()
            entry["bytes"] = len(body)
    members.update(add or {})
    if header_edit is not None:
        header_edit(header)
    if "header.json" in members:
        members["header.json"] = json.dumps(header).encode()
    return build_zip(members)


def write(tmp_path: Path, data: bytes, name: str = "model.ipuexe") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.fixture
def pkg() -> Any:
    """The crafting helpers as one namespace."""

    class Tools:
        zip_members = staticmethod(zip_members)
        build_zip = staticmethod(build_zip)
        repack = staticmethod(repack)
        write = staticmethod(write)

    return Tools
