"""The manifest's run records: the fields the host reads outside the device program.

The device program (allocations, kernels, programs) is judged by the device's own checks at
load.  A package also carries records the host side reads while it runs and reports: the
compile ``options`` (whether to log every stage's agreement), the ``gemm_modes`` the host
reference rounds by, and the ``layer_loop`` summary the benchmark line reports.  These came
after the reader was hardened, and a hostile package could set them to anything (``options =
'x'`` raised AttributeError deep in the runtime).  :func:`validate_records` checks each
against its type and bounds before anything reads it, so a bad one is one
:class:`~ipu_stack.util.errors.PackageError` line.  The fields are optional (packages that
predate them stay readable); present, they must be right.
"""

from __future__ import annotations

from typing import Any

from ipu_stack.util.errors import PackageError

GEMM_MODES = ("fp8", "f16")
MAX_COUNT = 1 << 40  # far above any real layer count, depth or byte count; bounds the sums
_LOOP_FIELDS = ("layers", "body_steps", "per_layer_weights", "bytes_per_layer_max",
                "bytes_per_layer_peak_tile")


def _fail(where: str, what: str) -> PackageError:
    return PackageError(f"package records are invalid: {where}: {what}")


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _count(value: Any, where: str, least: int = 0) -> int:
    """An integer in ``[least, MAX_COUNT]`` (JSON true/false are not integers)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(where, f"expected an integer, found {_kind(value)}")
    if not least <= value <= MAX_COUNT:
        raise _fail(where, f"{value} is outside [{least}, {MAX_COUNT}]")
    return value


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(where, f"expected an object, found {_kind(value)}")
    return value


def _row_chunks(value: Any, where: str) -> None:
    """A GEMM plan's row chunks: ``[first row, rows, row block]`` each, in row order."""
    if not isinstance(value, list):
        raise _fail(where, f"expected a list, found {_kind(value)}")
    end = 0
    for index, chunk in enumerate(value):
        if not isinstance(chunk, list) or len(chunk) != 3:
            raise _fail(f"{where}[{index}]", "expected [first row, rows, row block]")
        first = _count(chunk[0], f"{where}[{index}][0]")
        rows = _count(chunk[1], f"{where}[{index}][1]")
        _count(chunk[2], f"{where}[{index}][2]", least=1)
        if first != end:
            raise _fail(f"{where}[{index}][0]", f"chunk starts at row {first}, not {end}")
        end = first + rows


def validate_records(manifest: Any) -> None:
    """Check ``options``, ``gemm_modes`` and ``layer_loop`` of ``manifest`` (when present);
    raise one :class:`PackageError` naming the first bad field."""
    if not isinstance(manifest, dict):
        raise _fail("manifest", f"expected an object, found {_kind(manifest)}")
    if "options" in manifest:
        options = _object(manifest["options"], "options")
        if "diagnostics" in options and not isinstance(options["diagnostics"], bool):
            raise _fail("options.diagnostics", f"expected true or false, found "
                        f"{_kind(options['diagnostics'])}")
    if "gemm_modes" in manifest:
        for op, mode in _object(manifest["gemm_modes"], "gemm_modes").items():
            where = f"gemm_modes[{op!r}]"
            if not (op.isascii() and op.isdigit()) or len(op) > 9:
                raise _fail(where, "keys must be matmul operation ids (decimal)")
            mode = _object(mode, where)
            if mode.get("mode") not in GEMM_MODES:
                raise _fail(f"{where}.mode", f"expected one of {', '.join(GEMM_MODES)}")
            _count(mode.get("depth_block"), f"{where}.depth_block", least=1)
            for name in ("depth_splits", "col_block"):
                if name in mode:
                    _count(mode[name], f"{where}.{name}", least=1)
            if "row_chunks" in mode:
                _row_chunks(mode["row_chunks"], f"{where}.row_chunks")
            if not isinstance(mode.get("swapped", False), bool):
                raise _fail(f"{where}.swapped", "expected true or false")
            if mode.get("swapped") and "col_block" not in mode:
                raise _fail(f"{where}.col_block", "a swapped plan names its column block")
    if "layer_loop" in manifest:
        loop = _object(manifest["layer_loop"], "layer_loop")
        layers = _count(loop.get("layers"), "layer_loop.layers")
        for name in _LOOP_FIELDS[1:] if layers else ():
            _count(loop.get(name), f"layer_loop.{name}")


def check_gemm_modes(manifest: dict[str, Any], depths: dict[int, int]) -> None:
    """Every operation ``gemm_modes`` names is a matmul of the workload the package says it
    was compiled from (``depths``: the depth each of its matmul and head_matmul operations
    sums over, by id), and its record describes a reduce the host reference can follow:
    each depth tile finishes an equal share of a block's rows (of its columns, swapped) and
    owns a depth block of its own.  Run after :func:`validate_records`.  The save-tensors
    file indexes the graph by these ids."""
    for op, mode in manifest.get("gemm_modes", {}).items():
        where = f"gemm_modes[{op!r}]"
        if int(op) not in depths:
            raise _fail(where, "names no matmul of the package's workload")
        splits = int(mode.get("depth_splits", 1))
        blocks = -(-depths[int(op)] // int(mode["depth_block"]))
        if splits > blocks:
            raise _fail(f"{where}.depth_splits", f"{splits} depth tiles for {blocks} depth "
                        "blocks")
        shared = [("col_block", int(mode["col_block"]))] if mode.get("swapped") else [
            (f"row_chunks[{i}][2]", int(chunk[2]))
            for i, chunk in enumerate(mode.get("row_chunks", []))]
        for name, block in shared:
            if block % splits:
                raise _fail(f"{where}.{name}", f"{block} is not {splits} equal shares")
