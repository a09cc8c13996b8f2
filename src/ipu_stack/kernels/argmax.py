"""An argmax along rows on the tiles where the rows lie: popnn's ``ReduceMaxClassGather``
and ``ReduceMaxClassSparse``, as ``popnn::argMax`` composes them (``lib/popnn/Loss.cpp``,
``maxMinArgMaxMin``).

``gather`` runs where a block of the input lies (an LM head's logits, a column block a
tile): for each of its rows, each of the six workers takes ``worker_size`` consecutive
columns and writes the largest value (as F32) and its column (the block's first column
``col0`` added: the vertex's ``index`` field) as one pair.  ``sparse`` takes up to 32 such
pairs a row and writes the largest one's pair, or with ``final`` its column alone (I32): the
levels of sparse calls reduce a row's pairs to one.  A pair is two words, the value's F32
bits then the column, so the exchange between levels moves words like any I32 tensor.

Both vertices keep the first of equal values (a strict ``>``) and the pairs are laid in
column order, so the result is the row's first largest value's column, as ``numpy.argmax``
gives it.  Work: the rows and the busiest worker's elements (``gather``), the rows and the
pairs (``sparse``), which ``device.pricing`` prices at the vendor's estimators.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ipu_stack.ir.precision import Precision
from ipu_stack.kernels.base import (
    KernelFamily,
    Region,
    read_matrix,
    read_values,
    register,
    write_rows,
)
from ipu_stack.target.timing import Work

PAIR_BYTES = 8  # an F32 value and an I32 column
SPARSE_PAIRS = 32  # pairs a sparse vertex takes (Loss.cpp: ``partialsSize``)


def gather_pairs(cols: int, worker_size: int) -> int:
    """Pairs a gather call writes a row: one a worker with columns to take."""
    return -(-cols // worker_size)


def block_pairs(cols: int) -> int:
    """Pairs a gather call over ``cols`` columns writes a row, the columns dealt to six
    workers as :func:`gather_params` deals them."""
    return gather_pairs(cols, -(-cols // 6))


def _worker_size(p: dict[str, Any]) -> int:
    """A gather's columns a worker, never more than the block's (a package's value is
    hostile input: the temporaries stay within twice the block)."""
    return max(1, min(int(p["worker_size"]), int(p["cols"])))


def _name(p: dict[str, Any]) -> str:
    if p["op"] == "gather":
        return f"argmax_gather_r{p['rows']}_c{p['cols']}_w{p['worker_size']}"
    return f"argmax_sparse_r{p['rows']}_n{p['count']}" + ("_ids" if p["final"] else "")


def _pairs_of(mem: np.ndarray, tiles: np.ndarray, address: np.ndarray, rows: int, pairs: int,
              pitch: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``[T, rows, pairs]`` values (F32) and columns (I32) of a pairs operand."""
    words = read_matrix(mem, tiles, address, rows, 2 * pairs, pitch, np.dtype("<u4"))
    raw = np.ascontiguousarray(words).reshape(len(tiles), rows, pairs, 2)
    return raw[..., 0].copy().view(np.float32), raw[..., 1].copy().view(np.int32)


def _write_pairs(mem: np.ndarray, tiles: np.ndarray, address: np.ndarray, pitch: int,
                 values: np.ndarray, columns: np.ndarray) -> None:
    pairs = np.stack([values.astype(np.float32).view(np.uint32),
                      columns.astype(np.int32).view(np.uint32)], axis=-1)
    write_rows(mem, tiles, address, pitch,
               np.ascontiguousarray(pairs).view(np.uint8).reshape(len(tiles), values.shape[1], -1))


def _run(p: dict[str, Any], mem: np.ndarray, tiles: np.ndarray, addresses: list) -> list[Work]:
    source, out = addresses
    rows = p["rows"]
    if p["op"] == "gather":
        cols, size = p["cols"], _worker_size(p)
        x = read_values(mem, tiles, source, rows, cols, p["x_pitch"],
                        Precision.from_json(p["x"]))
        count = gather_pairs(cols, size)
        padded = np.full((len(tiles), rows, count * size), -np.inf, np.float32)
        padded[..., :cols] = x
        chunks = padded.reshape(len(tiles), rows, count, size)
        local = chunks.argmax(axis=-1)  # the first largest, as the vertex's strict compare
        values = np.take_along_axis(chunks, local[..., None], axis=-1)[..., 0]
        columns = p["col0"] + np.arange(count)[None, None, :] * size + local
        _write_pairs(mem, tiles, out, p["out_pitch"], values, columns)
        return [Work("argmax_gather", {"rows": rows, "busiest": size})]
    values, columns = _pairs_of(mem, tiles, source, rows, p["count"], p["in_pitch"])
    best = values.argmax(axis=-1)[..., None]
    chosen = np.take_along_axis(columns, best, axis=-1)
    if p["final"]:
        write_rows(mem, tiles, out, p["out_pitch"],
                   np.ascontiguousarray(chosen.astype(np.int32)).view(np.uint8))
    else:
        _write_pairs(mem, tiles, out, p["out_pitch"],
                     np.take_along_axis(values, best, axis=-1), chosen)
    return [Work("argmax_sparse", {"rows": rows, "pairs": p["count"]})]


def _shapes(p: dict[str, Any]) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """``(rows, row bytes, pitch)`` of the operand read and the one written."""
    rows = p["rows"]
    if p["op"] == "gather":
        read = (rows, p["cols"] * Precision.from_json(p["x"]).itemsize, p["x_pitch"])
        written = gather_pairs(p["cols"], _worker_size(p)) * PAIR_BYTES
    else:
        read = (rows, p["count"] * PAIR_BYTES, p["in_pitch"])
        written = 4 if p["final"] else PAIR_BYTES
    return read, (rows, written, p["out_pitch"])


def _accesses(p: dict[str, Any]) -> list[tuple[int, int, bool]]:
    return [(k, (rows - 1) * pitch + row_bytes, k == 1)
            for k, (rows, row_bytes, pitch) in enumerate(_shapes(p))]


def _regions(p: dict[str, Any]) -> list[Region]:
    return [Region(k, 0, rows, row_bytes, pitch, k == 1)
            for k, (rows, row_bytes, pitch) in enumerate(_shapes(p))]


ARGMAX = register(KernelFamily(
    name="argmax",
    source="poplibs lib/popnn/codelets/ReduceMaxClassGather.cpp, ReduceMaxClassSparse.cpp",
    code_bytes=512,  # assumed: the two vertices' assembly
    make_name=_name, run=_run, accesses=_accesses, regions=_regions))


def gather_params(rows: int, cols: int, x: Precision, x_pitch: int, col0: int,
                  out_pitch: int) -> dict[str, Any]:
    """A gather call over a block of ``rows x cols`` whose first column is ``col0``; the
    columns dealt to the six workers (Loss.cpp's ``argMinMaxSplitFirstReduction``)."""
    return {"op": "gather", "rows": int(rows), "cols": int(cols), "x": x.to_json(),
            "x_pitch": int(x_pitch), "worker_size": -(-int(cols) // 6), "col0": int(col0),
            "out_pitch": int(out_pitch)}


def sparse_params(rows: int, pairs: int, in_pitch: int, out_pitch: int,
                  final: bool) -> dict[str, Any]:
    """A sparse call over ``pairs`` pairs (``count``) of each of ``rows`` rows; ``final``:
    write the column alone."""
    return {"op": "sparse", "rows": int(rows), "count": int(pairs), "in_pitch": int(in_pitch),
            "out_pitch": int(out_pitch), "final": bool(final)}


__all__ = ["ARGMAX", "PAIR_BYTES", "SPARSE_PAIRS", "block_pairs", "gather_pairs",
           "gather_params", "sparse_params"]
