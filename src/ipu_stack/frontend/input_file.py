"""An ``--inputs`` file read as hostile input: a regular ``.npz`` of numeric arrays, each
array's size bounded from its header before it is read, its values finite.

A user's inputs file is the one file format a run reads that nobody compiled: a ``.npy`` by
mistake, a truncated download, a compressed archive that expands to terabytes, pickled
objects, NaNs from a broken preprocessing step.  Each gets one line naming the file and what
is wrong with it; NaNs in particular would otherwise surface later as a failed conversion
check that blames the importer.
"""

from __future__ import annotations

import math
import zipfile
from pathlib import Path

import numpy as np

from ipu_stack.target import get_target
from ipu_stack.util.errors import UsageError
from ipu_stack.util.files import NotRegularFile, open_regular

MOST_INPUT_ELEMENTS = get_target("ipu21").tiles * get_target("ipu21").tile_bytes
"""An input's most elements: at a byte each (FP8) a chip's memory; a larger one cannot run."""

MOST_INPUT_BYTES = 1 << 34
"""The most bytes an inputs file's arrays may declare in all (16 GiB): far above any input a
chip's 0.9 GB can take, far below what a host can hold."""


def refuse_past_a_chip(what: str, shape: tuple[int, ...]) -> None:
    """Refuse ``what`` of ``shape``, before a byte of it is allocated, where it has more
    elements than a chip holds at a byte each."""
    if math.prod(shape) > MOST_INPUT_ELEMENTS:
        raise UsageError(f"{what} would be {list(shape)}: more elements than a chip's memory "
                         f"holds ({MOST_INPUT_ELEMENTS:,} bytes)")


def _declared_bytes(archive: zipfile.ZipFile, member: str, where: str) -> int:
    """Bytes the ``.npy`` member declares in its header (shape x item size), read without
    reading the array; refuses object and non-numeric arrays."""
    with archive.open(member) as handle:
        try:
            version = np.lib.format.read_magic(handle)
            header = {(1, 0): np.lib.format.read_array_header_1_0,
                      (2, 0): np.lib.format.read_array_header_2_0}.get(version)
            if header is None:  # 3.0 exists only for structured dtypes' unicode names
                raise ValueError(f"format version {version[0]}.{version[1]}")
            shape, _, dtype = header(handle)
        except (ValueError, OSError, EOFError) as exc:
            raise UsageError(f"{where}: {member} is not a readable array ({exc})") from None
    if dtype.kind not in "biuf":
        raise UsageError(f"{where}: {member.removesuffix('.npy')} holds {dtype} values, not "
                         "numbers")
    return int(np.prod(shape, dtype=np.float64)) * dtype.itemsize


def read_input_arrays(path: str | Path, option: str = "--inputs",
                      most_bytes: int = MOST_INPUT_BYTES) -> dict[str, np.ndarray]:
    """The arrays of the ``.npz`` at ``path`` by name, each numeric and finite, declaring
    at most ``most_bytes`` in all (a program's inputs as float64, where the caller knows
    them), every member an array."""
    where = f"{option} {path}"
    try:
        with open_regular(path) as handle, zipfile.ZipFile(handle) as archive:
            members = archive.namelist()
            if not members:
                raise UsageError(f"{where}: holds no arrays (an .npz from numpy.savez)")
            if "__precisions__.npy" in members:
                raise UsageError(f"{where}: a --save-tensors file (the graph's values as the "
                                 "device holds them, weights too), not a program's inputs: "
                                 "give an .npz of the model's inputs by name")
            other = next((m for m in members if not m.endswith(".npy")), None)
            if other is not None:
                raise UsageError(f"{where}: member {other[:80]!r} is not an array (.npy)")
            declared = sum(_declared_bytes(archive, m, where) for m in members)
            if declared > MOST_INPUT_BYTES:
                raise UsageError(f"{where}: its arrays declare {declared / 2**30:.1f} GiB, more "
                                 f"than the {MOST_INPUT_BYTES >> 30} GiB an inputs file may hold")
            if declared > most_bytes:
                raise UsageError(f"{where}: its arrays declare {declared:,} bytes, more than "
                                 f"the {most_bytes:,} its program's inputs can take")
            handle.seek(0)
            with np.load(handle, allow_pickle=False) as data:
                arrays = {name: data[name] for name in data.files}
    except NotRegularFile:
        raise UsageError(f"{where}: not a regular file") from None
    except FileNotFoundError:
        raise UsageError(f"{where}: no such file") from None
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise UsageError(f"{where}: not a readable .npz ({exc})") from None
    for name, array in arrays.items():
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            raise UsageError(f"{where}: {name} holds NaN or infinite values")
    return arrays
