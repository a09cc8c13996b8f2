"""Read a package's program into a :class:`DeviceProgram`, refusing anything malformed.

The package reader guarantees an intact, pickle-free container; this module guarantees that
every field of the program inside has the right type, every array the right dtype, rank and
length, and every kernel parameter a value within the machine's bounds, *before* any array
is sized from it.  A hostile package gets one line naming the step and field.  What the
fields mean on the machine (tiles exist, accesses stay in memory, schedules are valid) is
the verifier's job (:mod:`ipu_stack.contract.verify`), run on the typed result.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ipu_stack.contract.program import (
    Allocations,
    Call,
    Compute,
    DeviceProgram,
    Exchange,
    HostRead,
    HostWrite,
    Loop,
    Step,
    StreamLayout,
    TensorSpec,
)
from ipu_stack.ir.precision import Precision
from ipu_stack.kernels.base import FAMILIES, KernelInstance
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
CHOICES = {"mode": ("fp8", "f16"), "pairs": ("interleaved", "halves"), "itemsize": (1, 2, 4),
           "tables": (1, 2)}  # a biased softmax's additive tables
# no extent, pitch or count of a kernel on one tile can exceed one tile's memory; bounding
# them here keeps a hostile parameter from sizing an array before the verifier runs
PARAM_LIMIT = 1 << 20
LAYOUT_LIMIT = 1 << 31
# a host tensor larger than this (4 GiB as float32, four times the chip's memory) is refused
# before the host sizes a buffer for it
TENSOR_LIMIT = 1 << 30
VALUE_LIMIT = 1 << 32


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


def _count(value: Any, where: str, minimum: int = 0, maximum: int = LAYOUT_LIMIT) -> int:
    if not _is_int(value) or value < minimum:
        raise _fail(where, f"expected an integer >= {minimum}, found {value!r}")
    if value > maximum:
        raise _fail(where, f"{value} exceeds the limit {maximum}")
    return value


def _flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise _fail(where, f"expected true or false, found {type(value).__name__}")
    return value


def _name(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise _fail(where, f"expected a name, found {value!r}")
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
    # every tile, address, length, offset, cycle and step of a program is far below 2^32
    # (-1 marks "none"); bounding them here keeps address + length from overflowing int64
    # in the verifier's range checks
    if array.size:
        low, high = int(array.min()), int(array.max())
        if low < -1 or high > VALUE_LIMIT:
            raise _fail(where, f"array {name} holds {low if low < -1 else high}, outside "
                               f"[-1, {VALUE_LIMIT}]")
    return array


def _int32(array: np.ndarray, where: str) -> np.ndarray:
    """Tile numbers and slots as int32, refused (not wrapped) when they do not fit."""
    if array.size and (int(array.min()) < -1 or int(array.max()) >= 1 << 31):
        bad = int(array.max()) if int(array.max()) >= 1 << 31 else int(array.min())
        raise _fail(where, f"tile or slot number {bad} is out of range")
    return array.astype(np.int32, copy=False)


def check_params(params: Any, where: str) -> dict[str, Any]:
    """Every parameter of a kernel instance: known type and a value within bounds."""
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
                if len(step) == 3 and (not isinstance(step[2], (int, float))
                                       or isinstance(step[2], bool)):
                    raise _fail(here, f"bad chain factor {step[2]!r}")
        elif key in ("b_transposed", "fill", "final"):
            if not isinstance(value, bool):
                raise _fail(here, f"expected true or false, found {value!r}")
        elif key in ("eps", "scale"):
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise _fail(here, f"expected a number, found {value!r}")
        elif key in CHOICES:
            if isinstance(value, bool) or value not in CHOICES[key]:
                raise _fail(here, f"expected one of {', '.join(map(str, CHOICES[key]))}, "
                                  f"found {value!r}")
        elif key in NAMES:
            _name(value, here)
        else:
            # every extent and pitch of an emitted kernel is at least 1 (the compiler never
            # emits an empty call); only a row kernel without aux operands has pitch 0 there,
            # a lookup's first table row and an argmax block's first column may be 0
            _count(value, here, 0 if key in ("aux_pitch", "first_row", "col0") else 1,
                   PARAM_LIMIT)
    for pitch, rows_key, width in (("a_pitch", "depth", "a"), ("out_pitch", "cols", None),
                                   ("x_pitch", "cols", "x")):
        if pitch in params and width and width in params and rows_key in params:
            item = _precision(params[width], where).itemsize
            if params[pitch] < params[rows_key] * item:
                raise _fail(where, f"{pitch} {params[pitch]} is shorter than a row")
    return params


def _tensors(value: Any) -> dict[str, TensorSpec]:
    tensors = {}
    for name, info in _dict(value, "tensors").items():
        info = _dict(info, f"tensor {name}")
        shape = _list(info.get("shape"), f"tensor {name} shape")
        if not shape or not all(_is_int(d) and 0 < d <= LAYOUT_LIMIT for d in shape):
            raise _fail(f"tensor {name}", f"bad shape {shape!r}")
        if int(np.prod(shape, dtype=object)) > TENSOR_LIMIT:
            raise _fail(f"tensor {name}", f"shape {shape!r} holds more than {TENSOR_LIMIT} "
                        "elements")
        precision = _precision(info.get("precision"), f"tensor {name} precision")
        tensors[name] = TensorSpec(tuple(shape), precision, info)
    return tensors


def _kernels(value: Any) -> tuple[KernelInstance, ...]:
    kernels = []
    for index, kernel in enumerate(_list(value, "kernels")):
        kernel = _dict(kernel, f"kernel {index}")
        if kernel.get("family") not in FAMILIES:
            raise _fail(f"kernel {index}", f"unknown kernel family {kernel.get('family')!r}")
        params = check_params(kernel.get("params"), f"kernel {index}")
        instance = KernelInstance(kernel["family"], params)
        try:  # what the verifier will ask of it: parameters that describe no call fail here
            instance.impl.accesses(params)
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
            raise _fail(f"kernel {index}", f"parameters describe no call ({exc})") from None
        kernels.append(instance)
    return tuple(kernels)


def from_manifest(manifest: Any, arrays: dict[str, np.ndarray]) -> DeviceProgram:
    """The typed program of a package (``manifest`` as parsed JSON, ``arrays`` by name)."""
    manifest = _dict(manifest, "manifest")
    for key in ("kernels", "programs", "tensors"):
        if key not in manifest:
            raise _fail("manifest", f"has no {key!r}")
    reader = _StepReader(arrays, _tensors(manifest["tensors"]), _kernels(manifest["kernels"]))
    programs = _dict(manifest["programs"], "programs")
    initialize = reader.program("initialize", programs.get("initialize"))
    run = reader.program("run", programs.get("run"))
    allocations = None
    if "allocations" in manifest:
        allocations = _allocations(manifest["allocations"], arrays)
    return DeviceProgram(reader.kernels, initialize, run, reader.tensors, allocations)


def _allocations(value: Any, arrays: dict[str, np.ndarray]) -> Allocations:
    names = _dict(value, "allocations")
    columns = {key: _array(arrays, names.get(key), f"allocations {key}", 1)
               for key in ("tile", "address", "bytes", "first", "last")}
    if len({len(c) for c in columns.values()}) > 1:
        raise PackageError("package allocation map arrays differ in length")
    return Allocations(**{k: v.astype(np.int64) for k, v in columns.items()})


class _StepReader:
    """Reads one program's steps, tracking the layer loop they may stand in."""

    def __init__(self, arrays: dict[str, np.ndarray], tensors: dict[str, TensorSpec],
                 kernels: tuple[KernelInstance, ...]) -> None:
        self.arrays, self.tensors, self.kernels = arrays, tensors, kernels

    def program(self, program: str, value: Any) -> tuple[Step, ...]:
        raw = _list(value, f"program {program}")
        steps: list[Step] = []
        loop: tuple[int, int, int] | None = None  # (count, slots, last body step)
        for index, step in enumerate(raw):
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
                parsed = self.loop(step, where, len(raw) - index - 1)
                loop = (parsed.count, len(parsed.slots), index + parsed.length)
                steps.append(parsed)
                continue
            inside = None if loop is None else (loop[0], loop[1])
            steps.append(getattr(self, kind)(step, where, inside))
        return tuple(steps)

    def loop(self, step: dict, where: str, after: int) -> Loop:
        count = _count(step["count"], f"{where} count", 1)
        length = _count(step["length"], f"{where} length", 1)
        if length > after:
            raise _fail(where, f"body of {length} steps runs past the program's end")
        tables = []
        for number, name in enumerate(_list(step["slots"], f"{where} slots")):
            table = _array(self.arrays, name, f"{where} slot {number}", 2)
            if table.shape[0] != count:
                raise _fail(where, f"slot {number} table is {list(table.shape)}, not "
                            f"[{count}, {table.shape[1]}]")
            if np.any((table[0] < 0) != (table < 0)):
                raise _fail(where, f"slot {number} is not on the same tiles in every layer")
            tables.append(table.astype(np.int64, copy=False))
        return Loop(_name(step["name"], f"{where} name"), count, length, tuple(tables))

    def _stream(self, step: dict, where: str) -> tuple[StreamLayout, np.ndarray, np.ndarray,
                                                      tuple[int, int]]:
        tensor = step["tensor"]
        if not isinstance(tensor, str) or tensor not in self.tensors:
            raise _fail(where, f"names unknown tensor {tensor!r}")
        lay = _dict(step["layout"], f"{where} layout")
        layout = StreamLayout(
            _count(lay.get("rows"), f"{where} layout rows", 1),
            _count(lay.get("cols"), f"{where} layout cols", 1),
            _precision(lay.get("precision"), f"{where} layout precision"),
            _count(lay.get("row_block"), f"{where} layout row_block", 1),
            _count(lay.get("col_block"), f"{where} layout col_block", 1),
            _flag(lay.get("transposed", False), f"{where} layout transposed"))
        if layout.transposed and step["kind"] != "host_write":
            raise _fail(where, "only a host write stores its blocks transposed")
        spec = self.tensors[tensor]
        t_rows, t_cols = spec.matrix
        origin = (0, 0)
        if step["kind"] == "host_read":
            raw = _list(step.get("origin", [0, 0]), f"{where} origin")
            if len(raw) != 2:
                raise _fail(where, f"origin {raw!r} is not two integers")
            origin = (_count(raw[0], f"{where} origin"), _count(raw[1], f"{where} origin"))
        r0, c0 = origin
        exact = step["kind"] == "host_write"
        if ((exact and (layout.rows, layout.cols) != (t_rows, t_cols))
                or r0 + layout.rows > t_rows or c0 + layout.cols > t_cols):
            raise _fail(where, f"layout {layout.rows}x{layout.cols} at {r0},{c0} does not fit "
                               f"tensor {tensor} {list(spec.shape)}")
        if layout.precision != spec.precision:
            raise _fail(where, f"layout precision differs from tensor {tensor}")
        tiles = _array(self.arrays, step["tiles"], where, 3)
        addresses = _array(self.arrays, step["addresses"], where, 3)
        covers = (tiles.shape[0] * layout.row_block >= layout.rows
                  and tiles.shape[1] * layout.col_block >= layout.cols)
        if not covers or tiles.shape != addresses.shape or tiles.shape[2] < 1:
            raise _fail(where, f"tile grid {list(tiles.shape)} does not cover the layout")
        return layout, _int32(tiles, where), addresses.astype(
            np.int64, copy=False), origin

    def host_write(self, step: dict, where: str, loop: tuple[int, int] | None) -> HostWrite:
        layout, tiles, addresses, _ = self._stream(step, where)
        return HostWrite(step["tensor"], layout, tiles, addresses)

    def host_read(self, step: dict, where: str, loop: tuple[int, int] | None) -> HostRead:
        layout, tiles, addresses, origin = self._stream(step, where)
        checkpoint, operation = (
            None if step.get(f) is None else _count(step[f], f"{where} {f}")
            for f in ("checkpoint", "operation"))
        passes = None
        if "passes" in step:
            if loop is None:
                raise _fail(where, "names per-layer tables outside a loop")
            raw = _list(step["passes"], f"{where} passes")
            if len(raw) != loop[0]:
                raise _fail(where, f"has {len(raw)} passes for a loop of {loop[0]}")
            for entry in raw:
                if not isinstance(entry, list) or len(entry) != 3 or (
                        entry[0] is not None and entry[0] not in self.tensors) or any(
                        e is not None and (not _is_int(e) or e < 0) for e in entry[1:]):
                    raise _fail(where, f"bad pass {entry!r}")
            passes = tuple((e[0], e[1], e[2]) for e in raw)
        slot = None
        if step.get("slot") is not None:
            if loop is None or not _is_int(step["slot"]) or not 0 <= step["slot"] < loop[1]:
                raise _fail(where, f"reads slot {step['slot']!r}, not one of the loop's")
            slot = int(step["slot"])
        return HostRead(step["tensor"], layout, tiles, addresses, origin, checkpoint, operation,
                        passes, slot)

    def compute(self, step: dict, where: str, loop: tuple[int, int] | None) -> Compute:
        calls = []
        for number, call in enumerate(_list(step["calls"], f"{where} calls")):
            here = f"{where} call {number}"
            call = _dict(call, here)
            kernel = call.get("kernel")
            if not _is_int(kernel) or not 0 <= kernel < len(self.kernels):
                raise _fail(here, f"names kernel {kernel!r}")
            tiles = _array(self.arrays, call.get("tiles"), here, 1)
            addresses = _array(self.arrays, call.get("addresses"), here, 2)
            if addresses.shape[0] != tiles.shape[0]:
                raise _fail(here, "has a different number of tiles and address rows")
            if len(np.unique(tiles)) != len(tiles):
                raise _fail(here, "runs twice on one tile")
            slots = []
            raw = _list(call.get("slots", []), f"{where} call {number} slots")
            if raw and loop is None:
                raise _fail(where, "names per-layer tables outside a loop")
            for pair in raw:
                if (not isinstance(pair, list) or len(pair) != 2 or not all(map(_is_int, pair))
                        or not 0 <= pair[0] < addresses.shape[1]
                        or not 0 <= pair[1] < (loop[1] if loop else 0)):
                    raise _fail(here, f"bad slot operand {pair!r}")
                slots.append((pair[0], pair[1]))
            calls.append(Call(kernel, _int32(tiles, here),
                              addresses.astype(np.int64, copy=False), tuple(slots)))
        return Compute(_name(step["name"], f"{where} name"), tuple(calls))

    def exchange(self, step: dict, where: str, loop: tuple[int, int] | None) -> Exchange:
        column = {key: _array(self.arrays, step[key], where, 1)
                  for key in KIND_FIELDS["exchange"] if key not in ("name", "kind_selected")}
        n = column["src_tile"].shape[0]
        for key in ("src_addr", "words"):
            if column[key].shape[0] != n:
                raise _fail(where, f"{key} has the wrong length")
        offsets, m = column["dst_offsets"], column["dst_tile"].shape[0]
        if offsets.shape[0] != n + 1 or offsets[0] != 0 or offsets[-1] != m or np.any(
                np.diff(offsets) < 1):
            raise _fail(where, "destination offsets are malformed")
        if column["dst_addr"].shape[0] != m:
            raise _fail(where, "dst_addr has the wrong length")
        chunks = column["chunk_transfer"].shape[0]
        lanes = None
        if "chunk_lanes" in step:  # paired-tiles option only
            lanes = _array(self.arrays, step["chunk_lanes"], where, 1)
        for key, array in (("chunk_start", column["chunk_start"]),
                           ("chunk_words", column["chunk_words"]), ("chunk_lanes", lanes)):
            if array is not None and array.shape[0] != chunks:
                raise _fail(where, f"{key} has the wrong length")
        for key in ("src_addr", "dst_addr"):
            if np.any(column[key] % 4):
                raise _fail(where, f"{key} has an address that is not word aligned")
        if np.any(column["words"] < 1):
            raise _fail(where, "a transfer moves no words")
        src_slot = None
        if "src_slot" in step:
            if loop is None:
                raise _fail(where, "names per-layer tables outside a loop")
            src_slot = _array(self.arrays, step["src_slot"], where, 1)
            if src_slot.shape[0] != n or np.any((src_slot < -1) | (src_slot >= loop[1])):
                raise _fail(where, "src_slot is malformed")
        kind = step["kind_selected"]
        if not isinstance(kind, str):
            raise _fail(where, f"kind_selected {kind!r} is not a name")
        lower = step.get("lower_bound", 0)
        phase = step.get("phase", 0)
        as64 = {k: v.astype(np.int64, copy=False) for k, v in column.items()}
        return Exchange(
            _name(step["name"], f"{where} name"), _count(phase, f"{where} phase"), kind,
            _count(lower, f"{where} lower_bound"),
            _int32(column["src_tile"], where), as64["src_addr"], as64["words"],
            as64["dst_offsets"], _int32(column["dst_tile"], where),
            as64["dst_addr"], as64["chunk_transfer"], as64["chunk_start"], as64["chunk_words"],
            None if lanes is None else lanes.astype(np.int64, copy=False),
            None if src_slot is None else _int32(src_slot, where))


def check_metadata(manifest: Any) -> None:
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
