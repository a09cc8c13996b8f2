"""The typed system program: which group of layers runs on which tiles of which chip, and
what moves between the groups.

Every package the pipeline strategy writes (one chip or several) is a system: chips, the
layer groups placed on them (each a tile range running one of the package's group programs,
a :class:`~ipu_stack.contract.program.DeviceProgram` of its own), the hand-offs between
consecutive groups (an exchange phase with its chunk schedule on one chip, a transfer over
the IPU-Link between chips) and the steps a stream of images takes (fill, steady, drain).
:func:`system_to_manifest` writes it as the manifest's ``pipeline`` record and the hand-offs'
arrays; :func:`system_from_manifest` reads it back, checking every field's type and bounds
before anything is sized from it; :func:`verify_system` checks that the whole is one the
machine can run (groups inside their chips and apart, layers covering the model in order,
each hand-off joining consecutive groups with transfers inside their tiles and a schedule
that moves them) and runs at emit and at load, as ``verify_program`` does for a program.
A package compiled for the whole chip (the layers strategy) is the system of one chip and
one group (:func:`single_group`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ipu_stack.contract.program import ByValue
from ipu_stack.exchange import Schedule, Transfers, verify_schedule
from ipu_stack.exchange.model import chunk_cycles
from ipu_stack.target import Target
from ipu_stack.target.links import LINK_FACTS, get_system
from ipu_stack.util.errors import IpuStackError, PackageError

MAX_GROUPS = 1024
"""More groups than any chip has tile pairs for a group each over the largest cluster."""
MAX_NAMES = 1 << 20
MAX_NAME_LENGTH = 4096
MAX_BYTES = 1 << 40
MAX_VALUE = 1 << 32
"""No word count, byte count, cycle or chunk start of one hand-off reaches this."""


@dataclass(frozen=True, eq=False)
class GroupSpec(ByValue):
    """A layer group: layers ``[first_layer, first_layer + layers)`` (halves where the tower
    is cut inside a layer) on tiles ``[tile_base, tile_base + tiles)`` of ``chip``, running
    the package's group program ``program``.  ``names`` maps the program's value names to the
    tower's (groups that share a program name their values as the first of them does);
    ``source_ops`` is the tower's operation id of each of the program's operations."""

    index: int
    chip: int
    tile_base: int
    tiles: int
    program: int
    first_layer: float
    layers: float
    input: str | None
    output: str
    source_ops: tuple[int, ...]
    names: tuple[tuple[str, str], ...]

    @property
    def tile_end(self) -> int:
        return self.tile_base + self.tiles

    def tower(self, name: str) -> str:
        """The tower's name of the program's value ``name``."""
        return dict(self.names).get(name, name)

    def local(self, name: str) -> str:
        """The program's name of the tower's value ``name``."""
        return {tower: own for own, tower in self.names}.get(name, name)


@dataclass(frozen=True, eq=False)
class Handoff(ByValue):
    """The activation ``tensor`` moving from group ``sender`` to group ``receiver``: on one
    chip an exchange phase (``schedule`` over the chip's tile numbers), between chips the
    IPU-Link (tile numbers are each chip's own; the link carries the blocks in order)."""

    sender: int
    receiver: int
    tensor: str
    nbytes: int
    chips: tuple[int, int]
    transfers: Transfers
    schedule: Schedule | None
    estimated_cycles: int

    @property
    def link(self) -> bool:
        return self.chips[0] != self.chips[1]

    @property
    def link_bytes(self) -> int:
        return int(self.transfers.words.sum()) * 4


@dataclass(frozen=True)
class Steps:
    """A stream's steps: ``fill`` before the first image leaves, ``drain`` after the last
    image enters; one image leaves per steady step between them."""

    fill: int
    drain: int


@dataclass(frozen=True, eq=False)
class SystemProgram(ByValue):
    """Chips, their layer groups and the hand-offs between them (see the module)."""

    target: str
    chips: int
    chip_tiles: int
    group_tiles: int
    groups: tuple[GroupSpec, ...]
    handoffs: tuple[Handoff, ...]
    programs: int
    steps: Steps
    reason: str

    @property
    def per_chip(self) -> int:
        return len(self.groups) // self.chips

    def on_chip(self, chip: int) -> tuple[GroupSpec, ...]:
        return tuple(g for g in self.groups if g.chip == chip)


def single_group(target: Target) -> SystemProgram:
    """A whole-chip program as a system: one chip, one group on every tile, no hand-off."""
    group = GroupSpec(0, 0, 0, target.tiles, 0, 0, 0, None, "", (), ())
    return SystemProgram(target.name, 1, target.tiles, target.tiles, (group,), (), 1,
                         Steps(0, 0), "one program over the chip")


# ------------------------------------------------------------------------- wire form
def _transfer_arrays(prefix: str, transfers: Transfers) -> dict[str, np.ndarray]:
    return {
        prefix + "src_tile": transfers.src.astype(np.int32),
        prefix + "dst_offsets": transfers.dst_offsets.astype(np.int64),
        prefix + "dst_tile": transfers.dst.astype(np.int32),
        prefix + "words": transfers.words.astype(np.int64),
    }


def _handoff_manifest(h: Handoff) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    prefix = f"handoff.{h.sender}."
    record: dict[str, Any] = {"from": h.sender, "to": h.receiver, "tensor": h.tensor,
                              "bytes": h.nbytes, "transfers": h.transfers.count}
    arrays = _transfer_arrays(prefix, h.transfers)
    if h.link:
        record.update({"link": True, "from_chip": h.chips[0], "to_chip": h.chips[1],
                       "link_bytes": h.link_bytes})
    else:
        assert h.schedule is not None
        record.update({"lower_bound": int(h.schedule.lower_bound), "kind": h.schedule.kind})
        arrays.update({prefix + "chunk_transfer": h.schedule.chunk_transfer.astype(np.int64),
                       prefix + "chunk_start": h.schedule.chunk_start.astype(np.int64),
                       prefix + "chunk_words": h.schedule.chunk_words.astype(np.int64)})
    record["estimated_cycles"] = h.estimated_cycles
    return record, arrays


def system_to_manifest(system: SystemProgram) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The manifest's records of ``system`` (``pipeline``, and ``system`` over several chips)
    and the hand-offs' arrays."""
    groups = [{"index": g.index, "first_layer": g.first_layer, "layers": g.layers,
               "chip": g.chip, "tile_base": g.tile_base, "tiles": g.tiles,
               "program": g.program, "input": g.input, "output": g.output,
               "source_ops": list(g.source_ops), "names": dict(g.names)}
              for g in system.groups]
    handoffs, arrays = [], {}
    for h in system.handoffs:
        record, found = _handoff_manifest(h)
        handoffs.append(record)
        arrays.update(found)
    records: dict[str, Any] = {"pipeline": {
        "chip_tiles": system.chip_tiles, "group_tiles": system.group_tiles, "groups": groups,
        "handoffs": handoffs, "programs": system.programs,
        "steps": {"fill": system.steps.fill, "drain": system.steps.drain},
        "reason": system.reason}}
    if system.chips > 1:
        records["system"] = get_system(system.target, system.chips).to_json()
    return records, arrays


class _Reader:
    """Typed, bounded reads of the manifest's system records (one line on the first bad
    field)."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self.arrays = arrays

    @staticmethod
    def fail(where: str, what: str) -> PackageError:
        return PackageError(f"system package is invalid: {where}: {what}")

    def object(self, value: Any, where: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(where, f"expected an object, found {type(value).__name__}")
        return value

    def list(self, value: Any, where: str, most: int) -> list[Any]:
        if not isinstance(value, list):
            raise self.fail(where, f"expected a list, found {type(value).__name__}")
        if len(value) > most:
            raise self.fail(where, f"{len(value)} entries exceed the limit {most}")
        return value

    def int(self, value: Any, where: str, least: int = 0, most: int = MAX_BYTES) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(where, f"expected an integer, found {value!r:.40}")
        if not least <= value <= most:
            raise self.fail(where, f"{value} is outside [{least}, {most}]")
        return value

    def layer(self, value: Any, where: str) -> float:
        """A layer count or position: whole or half layers."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not 0 <= value <= MAX_GROUPS * 64 or float(value) * 2 != int(value * 2):
            raise self.fail(where, f"expected a whole or half layer count, found {value!r:.40}")
        return value

    def name(self, value: Any, where: str) -> str:
        if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME_LENGTH:
            raise self.fail(where, f"expected a name, found {value!r:.40}")
        return value

    def array(self, name: str, where: str, tiles: int | None) -> np.ndarray:
        """A 1-D integer array of the package, its values in ``[0, tiles)`` (tile numbers)
        or ``[0, MAX_BYTES]``."""
        array = self.arrays.get(name)
        if array is None:
            raise self.fail(where, f"the package lacks the array {name}")
        if array.dtype.kind not in "iu" or array.ndim != 1:
            raise self.fail(where, f"array {name} is not a 1-D integer array")
        top = MAX_VALUE if tiles is None else tiles - 1
        if array.size and (int(array.min()) < 0 or int(array.max()) > top):
            raise self.fail(where, f"array {name} holds values outside [0, {top}]")
        return array

    def group(self, value: Any, where: str, chip_tiles: int) -> GroupSpec:
        g = self.object(value, where)
        source = self.list(g.get("source_ops"), f"{where}.source_ops", MAX_NAMES)
        names = self.object(g.get("names", {}), f"{where}.names")
        if len(names) > MAX_NAMES:
            raise self.fail(f"{where}.names", f"{len(names)} entries exceed {MAX_NAMES}")
        return GroupSpec(
            self.int(g.get("index"), f"{where}.index", most=MAX_GROUPS),
            self.int(g.get("chip", 0), f"{where}.chip", most=MAX_GROUPS),
            self.int(g.get("tile_base"), f"{where}.tile_base", most=chip_tiles),
            self.int(g.get("tiles"), f"{where}.tiles", 1, chip_tiles),
            self.int(g.get("program"), f"{where}.program", most=MAX_GROUPS),
            self.layer(g.get("first_layer"), f"{where}.first_layer"),
            self.layer(g.get("layers"), f"{where}.layers"),
            None if g.get("input") is None else self.name(g["input"], f"{where}.input"),
            self.name(g.get("output"), f"{where}.output"),
            tuple(self.int(op, f"{where}.source_ops", most=1 << 31) for op in source),
            tuple((self.name(k, f"{where}.names"), self.name(v, f"{where}.names"))
                  for k, v in names.items()))

    def handoff(self, value: Any, where: str, chip_tiles: int,
                chips: dict[int, int]) -> Handoff:
        h = self.object(value, where)
        sender = self.int(h.get("from"), f"{where}.from", most=MAX_GROUPS)
        prefix = f"handoff.{sender}."
        offsets = self.array(prefix + "dst_offsets", where, None)
        transfers = Transfers(chip_tiles, self.array(prefix + "src_tile", where, chip_tiles),
                              offsets, self.array(prefix + "dst_tile", where, chip_tiles),
                              self.array(prefix + "words", where, None))
        n = transfers.count
        if transfers.words.shape != (n,) or offsets.shape != (n + 1,) or (n and (
                offsets[0] != 0 or offsets[-1] != transfers.dst.size
                or np.any(np.diff(offsets) < 1) or int(transfers.words.min()) < 1)):
            raise self.fail(where, "its transfer arrays do not describe one transfer each")
        if h.get("transfers") != n:
            raise self.fail(f"{where}.transfers", f"says {h.get('transfers')!r}, the arrays "
                            f"hold {n}")
        receiver = self.int(h.get("to"), f"{where}.to", most=MAX_GROUPS)
        link = h.get("link", False)
        if link is not False and link is not True:
            raise self.fail(f"{where}.link", "expected true or false")
        schedule = None
        if link:
            route = (self.int(h.get("from_chip"), f"{where}.from_chip", most=MAX_GROUPS),
                     self.int(h.get("to_chip"), f"{where}.to_chip", most=MAX_GROUPS))
            if self.int(h.get("link_bytes"), f"{where}.link_bytes") != \
                    int(transfers.words.sum()) * 4:
                raise self.fail(f"{where}.link_bytes", "is not the transfers' words")
        else:
            route = (chips.get(sender, 0), chips.get(sender, 0))
            starts = self.array(prefix + "chunk_start", where, None)
            words = self.array(prefix + "chunk_words", where, None)
            chosen = self.array(prefix + "chunk_transfer", where, None)
            if not starts.shape == words.shape == chosen.shape:
                raise self.fail(where, "its chunk arrays differ in length")
            kind = h.get("kind")
            if not isinstance(kind, str) or len(kind) > 64:
                raise self.fail(f"{where}.kind", "expected a scheduler's name")
            horizon = int((starts + chunk_cycles(words, None)).max()) if len(starts) else 0
            schedule = Schedule(horizon, self.int(h.get("lower_bound"), f"{where}.lower_bound"),
                                kind, chosen, starts, words)
        return Handoff(sender, receiver, self.name(h.get("tensor"), f"{where}.tensor"),
                       self.int(h.get("bytes"), f"{where}.bytes", 1), route, transfers,
                       schedule, self.int(h.get("estimated_cycles"), f"{where}.estimated_cycles"))


def system_from_manifest(manifest: Any, arrays: dict[str, np.ndarray],
                         target: str) -> SystemProgram:
    """The system a package's manifest describes (every field typed and bounded; run
    :func:`verify_system` on it before use)."""
    read = _Reader(arrays)
    record = read.object(read.object(manifest, "manifest").get("pipeline"), "pipeline")
    chip_tiles = read.int(record.get("chip_tiles"), "pipeline.chip_tiles", 1, 1 << 20)
    system = read.object(manifest.get("system", {"chips": 1}), "system")
    chips = read.int(system.get("chips"), "system.chips", 1, int(LINK_FACTS["max_cards"].value))
    if "system" in manifest and system != get_system(target, chips).to_json():
        raise read.fail("system", "differs from this build's link model for "
                        f"{chips} cards of {target}: compile the package again")
    groups = tuple(read.group(g, f"pipeline.groups[{k}]", chip_tiles) for k, g in enumerate(
        read.list(record.get("groups"), "pipeline.groups", MAX_GROUPS)))
    chip_of = {g.index: g.chip for g in groups}
    handoffs = tuple(read.handoff(h, f"pipeline.handoffs[{k}]", chip_tiles, chip_of)
                     for k, h in enumerate(read.list(record.get("handoffs"),
                                                     "pipeline.handoffs", MAX_GROUPS)))
    steps = read.object(record.get("steps"), "pipeline.steps")
    reason = record.get("reason", "")
    if not isinstance(reason, str):
        raise read.fail("pipeline.reason", "expected text")
    return SystemProgram(
        target, chips, chip_tiles,
        read.int(record.get("group_tiles"), "pipeline.group_tiles", 1, chip_tiles),
        groups, handoffs, read.int(record.get("programs"), "pipeline.programs", 1, MAX_GROUPS),
        Steps(read.int(steps.get("fill"), "pipeline.steps.fill", most=MAX_GROUPS),
              read.int(steps.get("drain"), "pipeline.steps.drain", most=MAX_GROUPS)),
        reason)


# --------------------------------------------------------------------------- verifier
def _fail(what: str) -> PackageError:
    return PackageError(f"system package is invalid: {what}")


def _verify_groups(system: SystemProgram) -> None:
    """Groups in order, each chip's share of them, inside their chip and apart, every
    program used, the layers covered in order."""
    groups = system.groups
    if not groups or len(groups) % system.chips:
        raise _fail(f"{len(groups)} groups cannot share {system.chips} chips evenly")
    used: set[int] = set()
    operations: set[int] = set()
    taken: dict[int, list[tuple[int, int]]] = {}
    end = 0.0
    for k, g in enumerate(groups):
        where = f"group {k}"
        if g.index != k:
            raise _fail(f"{where} is numbered {g.index}")
        if g.chip != k // system.per_chip:
            raise _fail(f"{where} is on chip {g.chip}, not {k // system.per_chip}")
        if g.tile_end > system.chip_tiles:
            raise _fail(f"{where}'s tiles [{g.tile_base}, {g.tile_end}) exceed the chip's "
                        f"{system.chip_tiles}")
        for base, stop in taken.get(g.chip, []):
            if g.tile_base < stop and base < g.tile_end:
                raise _fail(f"{where}'s tiles overlap another group's on chip {g.chip}")
        taken.setdefault(g.chip, []).append((g.tile_base, g.tile_end))
        if g.program >= system.programs:
            raise _fail(f"{where} runs program {g.program} of {system.programs}")
        used.add(g.program)
        if g.first_layer != end or g.layers <= 0:
            raise _fail(f"{where} holds layers from {g.first_layer:g} (+{g.layers:g}), "
                        f"not from {end:g}")
        end = g.first_layer + g.layers
        if len(set(g.source_ops)) != len(g.source_ops) or operations & set(g.source_ops):
            raise _fail(f"{where} names a tower operation twice or another group's")
        operations |= set(g.source_ops)
        if (g.input is None) != (k == 0):
            raise _fail(f"{where} {'has no' if g.input is None else 'has an'} input hand-off")
    if len(used) != system.programs:
        raise _fail(f"programs {sorted(set(range(system.programs)) - used)} run on no group")


def _verify_handoff(system: SystemProgram, k: int, h: Handoff) -> None:
    sender, receiver = system.groups[k], system.groups[k + 1]
    where = f"hand-off {k}"
    if (h.sender, h.receiver) != (k, k + 1):
        raise _fail(f"{where} joins groups {h.sender} and {h.receiver}, not {k} and {k + 1}")
    if h.tensor != sender.output or h.tensor != receiver.input:
        raise _fail(f"{where} moves {h.tensor}, not group {k}'s output into group {k + 1}")
    if h.chips != (sender.chip, receiver.chip):
        raise _fail(f"{where} runs between chips {h.chips}, its groups are on "
                    f"{sender.chip} and {receiver.chip}")
    t = h.transfers
    if t.count and (int(t.src.min()) < sender.tile_base or int(t.src.max()) >= sender.tile_end
                    or int(t.dst.min()) < receiver.tile_base
                    or int(t.dst.max()) >= receiver.tile_end):
        raise _fail(f"{where}'s transfers leave its groups' tiles")
    if h.link:
        return
    if h.schedule is None:
        raise _fail(f"{where} on chip {h.chips[0]} has no exchange schedule")
    try:
        t.validate()
        verify_schedule(t, h.schedule)
    except IpuStackError as why:
        raise _fail(f"{where}'s exchange: {why}") from None


def verify_system(system: SystemProgram, target: Target) -> None:
    """Raise :class:`PackageError` (one line) on the first thing in ``system`` the machine
    could not run as written (see the module)."""
    try:
        get_system(target.name, system.chips)
    except IpuStackError as why:
        raise _fail(str(why)) from None
    if system.target != target.name or system.chip_tiles != target.tiles:
        raise _fail(f"written for {system.chip_tiles} tiles of {system.target}, this chip is "
                    f"{target.name} with {target.tiles}")
    _verify_groups(system)
    if len(system.handoffs) != len(system.groups) - 1:
        raise _fail(f"{len(system.handoffs)} hand-offs join {len(system.groups)} groups")
    for k, h in enumerate(system.handoffs):
        _verify_handoff(system, k, h)
    if system.steps != Steps(len(system.groups) - 1, len(system.groups) - 1):
        raise _fail(f"a stream through {len(system.groups)} groups fills and drains in "
                    f"{len(system.groups) - 1} steps, not {system.steps}")


__all__ = ["GroupSpec", "Handoff", "Steps", "SystemProgram", "single_group",
           "system_from_manifest", "system_to_manifest", "verify_system"]
