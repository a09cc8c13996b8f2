"""Strict checks of a package's program before the device touches it.

The package reader guarantees an intact, pickle-free container; this module guarantees the
*program* inside is one this machine can run: every field has the right type, every array
the right dtype and rank, every kernel parameter a sane value, every tile exists and every
access and transfer stays inside tile memory on word boundaries.  Anything else is refused
with one line naming the step and field, before a single byte moves.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ipu_stack.ir.precision import Precision
from ipu_stack.kernels.base import FAMILIES
from ipu_stack.target import Target
from ipu_stack.util.errors import PackageError, UsageError

KIND_FIELDS = {
    "host_write": ("tensor", "layout", "tiles", "addresses"),
    "host_read": ("tensor", "layout", "tiles", "addresses"),
    "compute": ("name", "calls"),
    "exchange": ("name", "src_tile", "src_addr", "words", "dst_offsets", "dst_tile", "dst_addr",
                 "chunk_transfer", "chunk_start", "chunk_words", "kind_selected"),
    "loop": ("name", "count", "length", "slots"),
}
PRECISION_KEYS = {"a", "b", "x", "out", "aux", "bias", "partials"}
NAMES = {"name", "op", "family"}
CHOICES = {"mode": ("fp8", "f16"), "pairs": ("interleaved", "halves")}


def _fail(where: str, what: str) -> PackageError:
    return PackageError(f"package program is invalid: {where}: {what}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _dict(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise _fail(where, f"expected an object, found {type(value).__name__}")
    return value


def _list(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise _fail(where, f"expected a list, found {type(value).__name__}")
    return value


def _count(value: Any, where: str, minimum: int = 0) -> int:
    if not _is_int(value) or value < minimum:
        raise _fail(where, f"expected an integer >= {minimum}, found {value!r}")
    return value


def _precision(value: Any, where: str) -> Precision:
    try:
        return Precision.from_json(_dict(value, where))
    except (UsageError, KeyError, TypeError, ValueError) as exc:
        raise _fail(where, f"not a precision ({exc})") from None


def _array(arrays: dict[str, np.ndarray], name: Any, where: str, ndim: int) -> np.ndarray:
    if not isinstance(name, str) or name not in arrays:
        raise _fail(where, f"names a missing array {name!r}")
    array = arrays[name]
    if array.dtype.kind not in "iu":
        raise _fail(where, f"array {name} has dtype {array.dtype}, expected integers")
    if array.ndim != ndim:
        raise _fail(where, f"array {name} has {array.ndim} dimensions, expected {ndim}")
    return array


def validate_params(family: str, params: Any, where: str) -> None:
    """Every parameter of a kernel instance: known type and a sane value."""
    params = _dict(params, where)
    for key, value in params.items():
        here = f"{where} parameter {key}"
        if key in PRECISION_KEYS:
            if value is not None or key not in ("aux", "bias"):
                _precision(value, here)
        elif key == "chain":
            for step in _list(value, here):
                step = _list(step, here)
                if len(step) not in (2, 3) or not isinstance(step[0], str):
                    raise _fail(here, f"bad chain step {step!r}")
                _precision(step[1], here)
                if len(step) == 3 and not isinstance(step[2], (int, float)):
                    raise _fail(here, f"bad chain factor {step[2]!r}")
        elif key in ("b_transposed",):
            if not isinstance(value, bool):
                raise _fail(here, f"expected true or false, found {value!r}")
        elif key in ("eps", "scale"):
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise _fail(here, f"expected a number, found {value!r}")
        elif key in CHOICES:
            if value not in CHOICES[key]:
                raise _fail(here, f"expected one of {', '.join(CHOICES[key])}, found {value!r}")
        elif key in NAMES:
            if not isinstance(value, str):
                raise _fail(here, f"expected a name, found {value!r}")
        else:
            # every extent and pitch of an emitted kernel is at least 1 (the compiler never
            # emits an empty call); only a row kernel without aux operands has pitch 0 there
            _count(value, here, 0 if key == "aux_pitch" else 1)
    for pitch, rows_key, width in (("a_pitch", "depth", "a"), ("out_pitch", "cols", None),
                                   ("x_pitch", "cols", "x")):
        if pitch in params and width and width in params and rows_key in params:
            item = _precision(params[width], where).itemsize
            if params[pitch] < params[rows_key] * item:
                raise _fail(where, f"{pitch} {params[pitch]} is shorter than a row")


def _step_layout(step: dict, arrays: dict[str, np.ndarray], where: str,
                 tensors: dict) -> tuple[np.ndarray, np.ndarray, int]:
    tensor = step["tensor"]
    if not isinstance(tensor, str) or tensor not in tensors:
        raise _fail(where, f"names unknown tensor {tensor!r}")
    layout = _dict(step["layout"], f"{where} layout")
    rows = _count(layout.get("rows"), f"{where} layout rows", 1)
    cols = _count(layout.get("cols"), f"{where} layout cols", 1)
    row_block = _count(layout.get("row_block"), f"{where} layout row_block", 1)
    col_block = _count(layout.get("col_block"), f"{where} layout col_block", 1)
    precision = _precision(layout.get("precision"), f"{where} layout precision")
    info = tensors[tensor]
    shape = info["shape"]
    t_rows, t_cols = (int(np.prod(shape[:-1])) if len(shape) > 1 else 1), shape[-1]
    r0, c0 = (0, 0)
    if step["kind"] == "host_read":
        origin = _list(step.get("origin", [0, 0]), f"{where} origin")
        if len(origin) != 2:
            raise _fail(where, f"origin {origin!r} is not two integers")
        r0, c0 = (_count(v, f"{where} origin") for v in origin)
    exact = step["kind"] == "host_write"
    if (exact and (rows, cols) != (t_rows, t_cols)) or r0 + rows > t_rows or c0 + cols > t_cols:
        raise _fail(where, f"layout {rows}x{cols} at {r0},{c0} does not fit tensor {tensor} "
                           f"{shape}")
    if precision != _precision(info["precision"], f"tensor {tensor}"):
        raise _fail(where, f"layout precision differs from tensor {tensor}")
    tiles = _array(arrays, step["tiles"], where, 3)
    addresses = _array(arrays, step["addresses"], where, 3)
    covers = tiles.shape[0] * row_block >= rows and tiles.shape[1] * col_block >= cols
    if not covers or tiles.shape != addresses.shape or tiles.shape[2] < 1:
        raise _fail(where, f"tile grid {list(tiles.shape)} does not cover the layout")
    pitch = -(-col_block * precision.itemsize // 4) * 4
    return tiles, addresses, row_block * pitch


def validate_manifest(manifest: Any, arrays: dict[str, np.ndarray], target: Target) -> None:
    """Refuse anything the device could not run exactly as written."""
    manifest = _dict(manifest, "manifest")
    for key in ("kernels", "programs", "tensors"):
        if key not in manifest:
            raise _fail("manifest", f"has no {key!r}")
    tensors = _dict(manifest["tensors"], "tensors")
    for name, info in tensors.items():
        info = _dict(info, f"tensor {name}")
        shape = _list(info.get("shape"), f"tensor {name} shape")
        if not shape or not all(_is_int(d) and d > 0 for d in shape):
            raise _fail(f"tensor {name}", f"bad shape {shape!r}")
        _precision(info.get("precision"), f"tensor {name} precision")
    kernels = _list(manifest["kernels"], "kernels")
    for index, kernel in enumerate(kernels):
        kernel = _dict(kernel, f"kernel {index}")
        if kernel.get("family") not in FAMILIES:
            raise _fail(f"kernel {index}", f"unknown kernel family {kernel.get('family')!r}")
        validate_params(kernel["family"], kernel.get("params"), f"kernel {index}")
    programs = _dict(manifest["programs"], "programs")
    for program in ("initialize", "run"):
        steps = _list(programs.get(program), f"program {program}")
        loop: tuple[int, int, int] | None = None  # (count, slots, last body step)
        for index, step in enumerate(steps):
            where = f"{program} step {index}"
            step = _dict(step, where)
            kind = step.get("kind")
            if not isinstance(kind, str) or kind not in KIND_FIELDS:
                raise _fail(where, f"unknown step kind {kind!r}")
            for field in KIND_FIELDS[kind]:
                if field not in step:
                    raise _fail(where, f"has no {field!r}")
            if loop is not None and index > loop[2]:
                loop = None
            if kind == "loop":
                if program != "run" or loop is not None:
                    raise _fail(where, "a loop may only stand in run, and not in a loop")
                loop = _validate_loop(step, arrays, where, len(steps) - index - 1, target)
                loop = (loop[0], loop[1], index + step["length"])
                continue
            _validate_step(kind, step, arrays, where, tensors, len(kernels), target)
            _validate_passes(kind, step, arrays, where, tensors, loop)


def _validate_loop(step: dict, arrays: dict[str, np.ndarray], where: str, after: int,
                   target: Target) -> tuple[int, int]:
    """A loop's count, body length (within the program) and per-layer address tables."""
    count = _count(step["count"], f"{where} count", 1)
    length = _count(step["length"], f"{where} length", 1)
    if length > after:
        raise _fail(where, f"body of {length} steps runs past the program's end")
    slots = _list(step["slots"], f"{where} slots")
    for number, name in enumerate(slots):
        table = _array(arrays, name, f"{where} slot {number}", 2)
        if table.shape != (count, target.tiles):
            raise _fail(where, f"slot {number} table is {list(table.shape)}, not "
                        f"[{count}, {target.tiles}]")
        if np.any((table[0] < 0) != (table < 0)):
            raise _fail(where, f"slot {number} is not on the same tiles in every layer")
    return count, len(slots)


def _validate_passes(kind: str, step: dict, arrays: dict[str, np.ndarray], where: str,
                     tensors: dict, loop: tuple[int, int, int] | None) -> None:
    """Per-layer fields of a loop body's steps, and none outside a loop."""
    count, slots = (loop[0], loop[1]) if loop is not None else (0, 0)
    uses = {"compute": any("slots" in c for c in step.get("calls", []) if isinstance(c, dict)),
            "exchange": "src_slot" in step, "host_read": "passes" in step}.get(kind, False)
    if uses and loop is None:
        raise _fail(where, "names per-layer tables outside a loop")
    if kind == "compute":
        for number, call in enumerate(step["calls"]):
            for pair in _list(call.get("slots", []), f"{where} call {number} slots"):
                operands = arrays[call["addresses"]].shape[1]
                if (not isinstance(pair, list) or len(pair) != 2 or not all(map(_is_int, pair))
                        or not 0 <= pair[0] < operands or not 0 <= pair[1] < slots):
                    raise _fail(f"{where} call {number}", f"bad slot operand {pair!r}")
    elif kind == "exchange" and "src_slot" in step:
        src_slot = _array(arrays, step["src_slot"], where, 1)
        if src_slot.shape[0] != arrays[step["src_tile"]].shape[0] or np.any(
                (src_slot < -1) | (src_slot >= slots)):
            raise _fail(where, "src_slot is malformed")
    elif kind == "host_read" and "passes" in step:
        passes = _list(step["passes"], f"{where} passes")
        if len(passes) != count:
            raise _fail(where, f"has {len(passes)} passes for a loop of {count}")
        for entry in passes:
            if not isinstance(entry, list) or len(entry) != 3 or (
                    entry[0] is not None and entry[0] not in tensors) or any(
                    e is not None and (not _is_int(e) or e < 0) for e in entry[1:]):
                raise _fail(where, f"bad pass {entry!r}")


def _validate_step(kind: str, step: dict, arrays: dict[str, np.ndarray], where: str,
                   tensors: dict, kernel_count: int, target: Target) -> None:
    if kind in ("host_write", "host_read"):
        _step_layout(step, arrays, where, tensors)
        if kind == "host_read":
            for field in ("checkpoint", "operation"):
                if step.get(field) is not None:
                    _count(step[field], f"{where} {field}")
    elif kind == "compute":
        for number, call in enumerate(_list(step["calls"], f"{where} calls")):
            here = f"{where} call {number}"
            call = _dict(call, here)
            kernel = call.get("kernel")
            if not _is_int(kernel) or not 0 <= kernel < kernel_count:
                raise _fail(here, f"names kernel {kernel!r}")
            tiles = _array(arrays, call.get("tiles"), here, 1)
            addresses = _array(arrays, call.get("addresses"), here, 2)
            if addresses.shape[0] != tiles.shape[0]:
                raise _fail(here, "has a different number of tiles and address rows")
            if len(np.unique(tiles)) != len(tiles):
                raise _fail(here, "runs twice on one tile")
    else:
        n = _array(arrays, step["src_tile"], where, 1).shape[0]
        for field in ("src_addr", "words"):
            if _array(arrays, step[field], where, 1).shape[0] != n:
                raise _fail(where, f"{field} has the wrong length")
        offsets = _array(arrays, step["dst_offsets"], where, 1)
        m = _array(arrays, step["dst_tile"], where, 1).shape[0]
        if offsets.shape[0] != n + 1 or offsets[0] != 0 or offsets[-1] != m or np.any(
            np.diff(offsets) < 1
        ):
            raise _fail(where, "destination offsets are malformed")
        if _array(arrays, step["dst_addr"], where, 1).shape[0] != m:
            raise _fail(where, "dst_addr has the wrong length")
        chunks = _array(arrays, step["chunk_transfer"], where, 1).shape[0]
        lanes = ("chunk_lanes",) if "chunk_lanes" in step else ()  # paired-tiles option only
        for field in ("chunk_start", "chunk_words", *lanes):
            if _array(arrays, step[field], where, 1).shape[0] != chunks:
                raise _fail(where, f"{field} has the wrong length")
        for field in ("src_addr", "dst_addr"):
            if np.any(arrays[step[field]] % 4):
                raise _fail(where, f"{field} has an address that is not word aligned")
        if np.any(arrays[step["words"]] < 1):
            raise _fail(where, "a transfer moves no words")


def validate_metadata(manifest: Any) -> None:
    """The compiler's records the runtime reports from (not needed by the device)."""
    manifest = _dict(manifest, "manifest")
    for key in ("estimate", "memory", "workload", "plans"):
        if key not in manifest:
            raise _fail("manifest", f"has no {key!r}")
    if not _is_int(_dict(manifest["estimate"], "estimate").get("cycles")):
        raise _fail("estimate", "has no integer cycles")
    if not _is_int(_dict(manifest["memory"], "memory").get("peak_bytes")):
        raise _fail("memory", "has no integer peak_bytes")
    workload = _dict(manifest["workload"], "workload")
    if not isinstance(workload.get("name"), str) or not isinstance(workload.get("params"), dict):
        raise _fail("workload", "needs a name and params")
    if not isinstance(workload.get("identifier"), str):
        raise _fail("workload", "needs an identifier")
    _list(manifest["plans"], "plans")
