"""Property tests: whatever bytes the reader is given, only PackageError comes out."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ipu_stack.package import package_bytes, read_package
from ipu_stack.util.errors import PackageError

FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
ARRAYS = {
    "weights": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4),
    "phase/0/src": np.array([1, 2, 1471], dtype=np.int32),
    "mask": np.array([True, False]),
    "scale": np.ones((), dtype=np.float16),
}
SAMPLE = package_bytes(
    target="ipu21", compiler_version="0.1.0", manifest={"tiles": 1472, "x": [1.5]}, arrays=ARRAYS
)


def read_bytes(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "fuzz.ipuexe"
    path.write_bytes(data)
    try:
        read_package(path, expected_target="ipu21", max_bytes=1 << 20)
    except PackageError as exc:
        assert "\n" not in str(exc)


@FUZZ
@given(data=st.binary(max_size=4096))
def test_random_bytes(tmp_path: Path, data: bytes) -> None:
    read_bytes(tmp_path, data)


@FUZZ
@given(data=st.binary(max_size=2048))
def test_random_bytes_behind_zip_magic(tmp_path: Path, data: bytes) -> None:
    read_bytes(tmp_path, b"PK\x03\x04" + data + b"PK\x05\x06" + data[:18])


@FUZZ
@given(
    edits=st.lists(
        st.tuples(st.integers(0, len(SAMPLE) - 1), st.integers(0, 255)), min_size=1, max_size=8
    ),
    cut=st.none() | st.integers(0, len(SAMPLE)),
)
def test_mutated_valid_package(
    tmp_path: Path, edits: list[tuple[int, int]], cut: int | None
) -> None:
    data = bytearray(SAMPLE)
    for position, value in edits:
        data[position] = value
    read_bytes(tmp_path, bytes(data[:cut]))


def test_sample_is_valid(tmp_path: Path) -> None:
    path = tmp_path / "ok.ipuexe"
    path.write_bytes(SAMPLE)
    assert np.array_equal(read_package(path).arrays["weights"], ARRAYS["weights"])


@pytest.mark.slow
@settings(max_examples=5000, deadline=None, suppress_health_check=list(HealthCheck))
@given(edits=st.lists(st.tuples(st.integers(0, len(SAMPLE) - 1), st.integers(0, 255)), max_size=4))
def test_mutated_valid_package_long(tmp_path: Path, edits: list[tuple[int, int]]) -> None:
    data = bytearray(SAMPLE)
    for position, value in edits:
        data[position] = value
    read_bytes(tmp_path, bytes(data))
