"""An ``--inputs`` file as hostile input: every malformed file refused in one line, each
array's size bounded from its header before it is read."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest

from ipu_stack.frontend.input_file import MOST_INPUT_BYTES, read_input_arrays
from ipu_stack.util.errors import UsageError


def refusal(path) -> str:
    with pytest.raises(UsageError) as caught:
        read_input_arrays(path)
    return str(caught.value)


def test_a_good_file_gives_its_arrays_by_name(tmp_path):
    path = tmp_path / "in.npz"
    np.savez(path, pixels=np.ones((2, 3), np.float32), ids=np.arange(4))
    arrays = read_input_arrays(path)
    assert sorted(arrays) == ["ids", "pixels"] and arrays["ids"].tolist() == [0, 1, 2, 3]


def test_files_that_are_not_an_npz_of_numbers_are_refused(tmp_path):
    garbage = tmp_path / "bad.npz"
    garbage.write_bytes(b"not a zip at all")
    assert refusal(garbage).startswith(f"--inputs {garbage}: not a readable .npz (")
    npy = tmp_path / "plain.npy"
    np.save(npy, np.ones(3))
    assert refusal(npy).startswith(f"--inputs {npy}: not a readable .npz (")
    objects = tmp_path / "objects.npz"
    np.savez(objects, x=np.array([{"a": 1}], dtype=object))
    assert refusal(objects) == f"--inputs {objects}: x holds object values, not numbers"
    nan = tmp_path / "nan.npz"
    np.savez(nan, x=np.array([1.0, np.nan], np.float32))
    assert refusal(nan) == f"--inputs {nan}: x holds NaN or infinite values"
    assert refusal(tmp_path) == f"--inputs {tmp_path}: not a regular file"
    assert refusal(tmp_path / "absent.npz") == f"--inputs {tmp_path / 'absent.npz'}: no such file"
    empty = tmp_path / "empty.npz"
    np.savez(empty)
    assert refusal(empty) == f"--inputs {empty}: holds no arrays (an .npz from numpy.savez)"


def test_an_array_declaring_terabytes_is_refused_from_its_header(tmp_path):
    """A compressed member can expand without bound: its header's shape is read first."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f4", "fortran_order": False, "shape": (1 << 20, 1 << 20)})
    path = tmp_path / "bomb.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("x.npy", np.lib.format.MAGIC_PREFIX + b"\x01\x00"
                         + header.getvalue()[8:] + b"\x00" * 64)
    assert refusal(path) == (f"--inputs {path}: its arrays declare 4096.0 GiB, more than the "
                             f"{MOST_INPUT_BYTES >> 30} GiB an inputs file may hold")


def test_a_save_tensors_file_is_not_taken_for_inputs(tmp_path):
    """What ``--save-tensors`` writes holds every value of the graph and its precisions."""
    path = tmp_path / "inputs_weights.npz"
    np.savez(path, x=np.zeros((2, 4), np.float32), __precisions__=np.array("{}"))
    with pytest.raises(UsageError, match="a --save-tensors file .* not a program's inputs"):
        read_input_arrays(path)
