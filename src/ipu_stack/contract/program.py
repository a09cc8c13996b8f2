"""The typed device program: what the compiler hands the device, and nothing else.

A package's manifest (JSON) and arrays are the wire form; :class:`DeviceProgram` is the
form both sides work with.  ``codegen`` builds one from the placed program, the
:mod:`verifier <ipu_stack.contract.verify>` checks it against the machine, and
:func:`to_manifest` writes it; at load, :func:`from_manifest <ipu_stack.contract.parse>`
reads it back (checking every field's type and bounds before any array is sized from it),
the same verifier runs again, and the simulator executes the typed steps.

The steps are frozen dataclasses holding numpy arrays, so equality is by value
(:func:`same`): a program written and read back is equal to the one written.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

import numpy as np

from ipu_stack.exchange import Schedule, Transfers
from ipu_stack.exchange.model import chunk_cycles
from ipu_stack.ir.layout import WORD, BlockLayout, round_up
from ipu_stack.ir.precision import Precision
from ipu_stack.kernels.base import KernelInstance


class ByValue:
    """Equality by value for dataclasses that hold arrays (``==`` compares every field)."""

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and all(
            same(getattr(self, f.name), getattr(other, f.name)) for f in fields(self))  # type: ignore[arg-type]

    __hash__ = None  # type: ignore[assignment]


def same(a: Any, b: Any) -> bool:
    """Deep equality that treats arrays by value (dtype and shape included)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                and a.shape == b.shape and bool(np.array_equal(a, b)))
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if is_dataclass(a) and not isinstance(a, (type, ByValue)):  # e.g. Transfers, Schedule
        return type(a) is type(b) and all(same(getattr(a, f.name), getattr(b, f.name))
                                          for f in fields(a))
    return bool(a == b)


# the tensors the host writes in ``initialize``: weights, and states (a KV cache: resident,
# its initial bytes written once, then updated in place by the programs that run)
RESIDENT_ROLES = ("weight", "state")


@dataclass(frozen=True, eq=False)
class TensorSpec(ByValue):
    """A host tensor the programs read or write: its shape and stored precision (``info``
    is the manifest entry as written, role included, kept for the runtime)."""

    shape: tuple[int, ...]
    precision: Precision
    info: dict[str, Any]

    @property
    def matrix(self) -> tuple[int, int]:
        """The tensor as the device streams it: all leading dimensions are rows."""
        rows = int(np.prod(self.shape[:-1])) if len(self.shape) > 1 else 1
        return rows, int(self.shape[-1])


@dataclass(frozen=True, eq=False)
class StreamLayout(ByValue):
    """How a host stream cuts its tensor into blocks: ``rows x cols`` in blocks of
    ``row_block x col_block``, stored at ``precision`` (``transposed``: each block stored as
    its transpose, ``ir.layout``)."""

    rows: int
    cols: int
    precision: Precision
    row_block: int
    col_block: int
    transposed: bool = False

    def on(self, tiles: np.ndarray) -> BlockLayout:
        return BlockLayout(self.rows, self.cols, self.precision, self.row_block,
                           self.col_block, tiles, self.transposed)

    @property
    def block_bytes(self) -> int:
        """One block's bytes on a tile (rows padded to whole words, as ``BlockLayout``)."""
        lines, width = ((self.col_block, self.row_block) if self.transposed
                        else (self.row_block, self.col_block))
        return lines * round_up(width * self.precision.itemsize, WORD)


@dataclass(frozen=True, eq=False)
class HostWrite(ByValue):
    """The host writes a whole tensor: block ``(i, j)`` to every tile in ``tiles[i, j]``
    (-1: no replica) at ``addresses[i, j]``."""

    tensor: str
    layout: StreamLayout
    tiles: np.ndarray  # int32 [row blocks, col blocks, replicas]
    addresses: np.ndarray  # int64, same shape

    kind = "host_write"


@dataclass(frozen=True, eq=False)
class HostRead(ByValue):
    """The host reads a piece of a tensor at ``origin`` from each block's first replica.

    ``checkpoint`` / ``operation``: a probe read (a stage's value for the verdict), not an
    output.  ``passes``: inside the layer loop, what the read is on each pass
    (``(tensor, checkpoint, operation)``; a ``None`` tensor means the pass reads nothing)."""

    tensor: str
    layout: StreamLayout
    tiles: np.ndarray
    addresses: np.ndarray
    origin: tuple[int, int] = (0, 0)
    checkpoint: int | None = None
    operation: int | None = None
    passes: tuple[tuple[str | None, int | None, int | None], ...] | None = None
    slot: int | None = None  # the loop's per-layer buffer read (a layer's KV cache)

    kind = "host_read"

    def on_pass(self, layer: int | None) -> HostRead | None:
        """This read as it runs on pass ``layer`` of the loop (``None``: nothing to read)."""
        if layer is None or self.passes is None:
            return self
        tensor, checkpoint, operation = self.passes[layer]
        if tensor is None:
            return None
        return HostRead(tensor, self.layout, self.tiles, self.addresses, self.origin,
                        checkpoint, operation, slot=self.slot)


@dataclass(frozen=True, eq=False)
class Call(ByValue):
    """Kernel ``kernel`` (an index into the program's kernels) on ``tiles``, with operand
    ``k`` of tile ``t`` at ``addresses[t, k]``.  ``slots``: ``(operand, slot)`` pairs whose
    address moves to layer ``k``'s copy on pass ``k`` of the loop."""

    kernel: int
    tiles: np.ndarray  # int32 [n]
    addresses: np.ndarray  # int64 [n, operands]
    slots: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, eq=False)
class Compute(ByValue):
    """A compute superstep: every call runs; the tiles sync only before an exchange phase
    (a compute set reads its own tile's memory, so the next one needs no barrier)."""

    name: str
    calls: tuple[Call, ...]

    kind = "compute"


@dataclass(frozen=True, eq=False)
class Exchange(ByValue):
    """An exchange phase: transfers (destinations in CSR form) with absolute addresses and
    the compiler's chunk schedule.  ``src_slot``: per transfer, the slot whose per-layer
    copy it sends (-1: none)."""

    name: str
    phase: int
    kind_selected: str
    lower_bound: int
    src_tile: np.ndarray
    src_addr: np.ndarray
    words: np.ndarray
    dst_offsets: np.ndarray
    dst_tile: np.ndarray
    dst_addr: np.ndarray
    chunk_transfer: np.ndarray
    chunk_start: np.ndarray
    chunk_words: np.ndarray
    chunk_lanes: np.ndarray | None = None
    src_slot: np.ndarray | None = None

    kind = "exchange"

    def transfers(self, tiles: int) -> Transfers:
        return Transfers(tiles, self.src_tile, self.dst_offsets, self.dst_tile, self.words)

    def schedule(self) -> Schedule:
        """The chunk schedule as the package states it (its horizon from the chunks)."""
        lanes = None if self.chunk_lanes is None else np.maximum(self.chunk_lanes, 1)
        cycles = chunk_cycles(self.chunk_words, lanes)
        horizon = int((self.chunk_start + cycles).max()) if len(self.chunk_start) else 0
        return Schedule(horizon, self.lower_bound, self.kind_selected, self.chunk_transfer,
                        self.chunk_start, self.chunk_words, self.chunk_lanes)


@dataclass(frozen=True, eq=False)
class Loop(ByValue):
    """The layer loop: the next ``length`` steps run ``count`` times; slot ``s``'s table
    (``[count, tiles]``, -1 where the tile holds none) gives each layer's address."""

    name: str
    count: int
    length: int
    slots: tuple[np.ndarray, ...]

    kind = "loop"


Step = HostWrite | HostRead | Compute | Exchange | Loop


@dataclass(frozen=True, eq=False)
class Allocations(ByValue):
    """The compiler's allocation map: what lives where, from which step to which (global
    step indices: ``initialize`` first, then ``run``)."""

    tile: np.ndarray
    address: np.ndarray
    bytes: np.ndarray
    first: np.ndarray
    last: np.ndarray


@dataclass(frozen=True, eq=False)
class DeviceProgram(ByValue):
    """Everything the device runs: kernel instances, the two host-callable programs, the
    host tensors they stream, and the allocation map the verifier checks accesses against."""

    kernels: tuple[KernelInstance, ...]
    initialize: tuple[Step, ...]
    run: tuple[Step, ...]
    tensors: dict[str, TensorSpec]
    allocations: Allocations | None = None

    def program(self, name: str) -> tuple[Step, ...]:
        if name not in ("initialize", "run"):
            raise KeyError(name)
        return self.initialize if name == "initialize" else self.run

    @property
    def step_count(self) -> int:
        return len(self.initialize) + len(self.run)


# ---------------------------------------------------------------------- the wire form
def _layout_json(layout: StreamLayout, tiles: np.ndarray) -> dict[str, Any]:
    return {"rows": layout.rows, "cols": layout.cols, "precision": layout.precision.to_json(),
            "row_block": layout.row_block, "col_block": layout.col_block,
            "grid": [*tiles.shape], **({"transposed": True} if layout.transposed else {})}


class _Arrays:
    """Names arrays as the package stores them (dtype fixed per field)."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}

    def put(self, name: str, array: np.ndarray, dtype: Any) -> str:
        self.arrays[name] = np.ascontiguousarray(np.asarray(array, dtype=dtype))
        return name


_EXCHANGE_COLUMNS = (
    ("src_tile", np.int32), ("src_addr", np.int64), ("words", np.int64),
    ("dst_offsets", np.int64), ("dst_tile", np.int32), ("dst_addr", np.int64),
    ("chunk_transfer", np.int64), ("chunk_start", np.int64), ("chunk_words", np.int64),
)


def _step_json(out: _Arrays, prefix: str, step: Step) -> dict[str, Any]:
    if isinstance(step, (HostWrite, HostRead)):
        entry: dict[str, Any] = {
            "kind": step.kind, "tensor": step.tensor,
            "layout": _layout_json(step.layout, step.tiles),
            "tiles": out.put(f"{prefix}/tiles", step.tiles, np.int32),
            "addresses": out.put(f"{prefix}/addresses", step.addresses, np.int64),
        }
        if isinstance(step, HostRead):
            entry.update(origin=list(step.origin), checkpoint=step.checkpoint,
                         operation=step.operation)
            if step.passes is not None:
                entry["passes"] = [list(p) for p in step.passes]
            if step.slot is not None:
                entry["slot"] = step.slot
        return entry
    if isinstance(step, Compute):
        calls = []
        for c, call in enumerate(step.calls):
            entry = {"kernel": call.kernel,
                     "tiles": out.put(f"{prefix}/c{c}/tiles", call.tiles, np.int32),
                     "addresses": out.put(f"{prefix}/c{c}/addresses", call.addresses, np.int64)}
            if call.slots:
                entry["slots"] = [list(pair) for pair in call.slots]
            calls.append(entry)
        return {"kind": "compute", "name": step.name, "calls": calls}
    if isinstance(step, Exchange):
        entry = {"kind": "exchange", "name": step.name, "phase": step.phase,
                 "kind_selected": step.kind_selected, "lower_bound": step.lower_bound}
        columns = [(key, getattr(step, key), dtype) for key, dtype in _EXCHANGE_COLUMNS]
        if step.chunk_lanes is not None:
            columns.append(("chunk_lanes", step.chunk_lanes, np.int64))
        if step.src_slot is not None:
            columns.append(("src_slot", step.src_slot, np.int32))
        for key, array, dtype in columns:
            entry[key] = out.put(f"{prefix}/{key}", array, dtype)
        return entry
    assert isinstance(step, Loop)
    return {"kind": "loop", "name": step.name, "count": step.count, "length": step.length,
            "slots": [out.put(f"{prefix}/slot{s}", t, np.int64) for s, t in enumerate(step.slots)]}


def to_manifest(program: DeviceProgram) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The manifest fragment (``kernels``, ``programs``, ``allocations``) and its arrays.

    Array names follow the step's global index (``s{index}/...``), so the same program
    always gives the same bytes.  ``tensors`` is written by the package stage beside it."""
    out = _Arrays()
    programs: dict[str, list[dict[str, Any]]] = {}
    index = 0
    for name in ("initialize", "run"):
        programs[name] = []
        for step in program.program(name):
            programs[name].append(_step_json(out, f"s{index}", step))
            index += 1
    fragment: dict[str, Any] = {
        "kernels": [{"name": k.name, "key": k.key, **k.to_json()} for k in program.kernels],
        "programs": programs,
    }
    if program.allocations is not None:
        a = program.allocations
        fragment["allocations"] = {
            "tile": out.put("alloc/tile", a.tile, np.int32),
            "address": out.put("alloc/address", a.address, np.int64),
            "bytes": out.put("alloc/bytes", a.bytes, np.int64),
            "first": out.put("alloc/first", a.first, np.int64),
            "last": out.put("alloc/last", a.last, np.int64),
        }
    return fragment, out.arrays


# ---------------------------------------------------------------------- per-layer addresses
def call_addresses(call: Call, tables: tuple[np.ndarray, ...], layer: int) -> np.ndarray:
    """A call's operand addresses on pass ``layer``: each slot operand moved by its table
    (layer ``k``'s address minus layer 0's, per tile)."""
    if not call.slots or layer == 0:
        return call.addresses
    addresses = call.addresses.copy()
    for operand, slot in call.slots:
        table = tables[slot]
        addresses[:, operand] += table[layer, call.tiles] - table[0, call.tiles]
    return addresses


def exchange_sources(step: Exchange, tables: tuple[np.ndarray, ...], layer: int) -> np.ndarray:
    """An exchange's source addresses on pass ``layer`` (sends of per-layer weights moved
    by their slot's table)."""
    if step.src_slot is None or layer == 0:
        return step.src_addr
    src = step.src_addr.copy()
    for slot in np.unique(step.src_slot[step.src_slot >= 0]):
        sel = step.src_slot == slot
        table = tables[int(slot)]
        src[sel] += table[layer, step.src_tile[sel]] - table[0, step.src_tile[sel]]
    return src


def read_addresses(step: HostRead, tables: tuple[np.ndarray, ...], layer: int | None
                   ) -> np.ndarray:
    """A host read's block addresses on pass ``layer`` (a per-layer buffer's read moved by
    its slot's table)."""
    if step.slot is None or not layer:
        return step.addresses
    table = tables[step.slot]
    held = step.tiles >= 0
    moved = step.addresses.copy()
    moved[held] += table[layer, step.tiles[held]] - table[0, step.tiles[held]]
    return moved


def per_layer(step: Step) -> bool:
    """Whether a step's addresses differ between passes of the loop (it names a slot)."""
    if isinstance(step, Compute):
        return any(call.slots for call in step.calls)
    if isinstance(step, HostRead):
        return step.slot is not None
    return isinstance(step, Exchange) and step.src_slot is not None


def execution_order(steps: tuple[Step, ...]) -> Iterator[tuple[int, Step, int | None, int]]:
    """``(index, step, layer, loop)`` of every step in the order the device runs them: a
    loop's body once per layer (``layer`` is ``None`` outside a loop; ``loop`` is the loop
    step's index, -1 outside)."""
    index = 0
    while index < len(steps):
        step = steps[index]
        if not isinstance(step, Loop):
            yield index, step, None, -1
            index += 1
            continue
        body = range(index + 1, index + 1 + step.length)
        for layer in range(step.count):
            for at in body:
                yield at, steps[at], layer, index
        index = body.stop
