"""The execution profile: what one ``run`` call did, superstep by superstep, as a versioned file.

Built from the simulator's :class:`~ipu_stack.device.record.StepRecord` s (recorded while the
program ran, never re-derived from the compiler's plan).  ``profile.json`` is compact: the
per-tile arrays (cycles of every tile in every superstep) are base64 little-endian int32,
everything else plain JSON.  The format is versioned; :func:`load_profile` refuses other
versions and damaged files with one line.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ipu_stack.device.record import StepRecord
from ipu_stack.util.errors import UsageError
from ipu_stack.util.files import read_regular, write_text_atomic

FORMAT = "ipu-stack-profile"
VERSION = 1


@dataclass
class Step:
    """One superstep (or host stream) of the profile; ``start`` in cycles from the run's
    start (host streams sit between supersteps and take no device time).  An exchange
    phase's ``sync`` comes just before its ``start`` (the tiles sync, then exchange); a
    compute set has none."""

    index: int
    name: str
    kind: str
    start: int
    cycles: int
    sync: int
    tile_cycles: np.ndarray | None
    busiest_tile: int = -1
    by_kind: dict[str, int] = field(default_factory=dict)
    calls: list[dict[str, Any]] = field(default_factory=list)
    busiest_work: list[dict[str, Any]] = field(default_factory=list)
    exchange: dict[str, Any] = field(default_factory=dict)
    host: dict[str, Any] = field(default_factory=dict)
    part: str = ""  # the model part it serves (``ir.names``), what pages show first

    @property
    def label(self) -> str:
        """What a person reads: the model part, else the program's name."""
        return self.part or self.name

    @property
    def length(self) -> int:
        """Device cycles the superstep takes, its sync included."""
        return self.cycles + self.sync

    @property
    def begin(self) -> int:
        """Where the superstep begins on the run's timeline: its sync, if it has one."""
        return self.start - self.sync

    def to_json(self) -> dict[str, Any]:
        data = {k: v for k, v in self.__dict__.items() if k != "tile_cycles"}
        if self.tile_cycles is not None:
            data["tile_cycles"] = base64.b64encode(
                self.tile_cycles.astype("<i4").tobytes()).decode()
        return data

    @staticmethod
    def from_json(data: dict[str, Any], tiles: int) -> Step:
        raw = data.get("tile_cycles")
        cycles = None
        if raw is not None:
            cycles = np.frombuffer(base64.b64decode(raw), dtype="<i4").astype(np.int64)
            if cycles.size != tiles:
                raise ValueError(f"step {data.get('index')} has {cycles.size} tile entries")
        fields = {k: v for k, v in data.items() if k != "tile_cycles"}
        return Step(**fields, tile_cycles=cycles)


@dataclass
class Profile:
    """A whole ``run`` call: totals, the record's figures and every step."""

    workload: str
    target: str
    tiles: int
    clock_hz: float
    cycles: int
    compute_cycles: int
    exchange_cycles: int
    sync_cycles: int
    host_cycles: int
    host_bytes: int
    steps: list[Step]
    figures: dict[str, Any] = field(default_factory=dict)  # estimate, efficiency, plans, ...
    placement_page: str = ""
    # named tile ranges ``[label, first tile, end]``: a pipeline's groups (one track each)
    tracks: list[list[Any]] = field(default_factory=list)
    # ``[label, path]`` of each group program's placement page (a pipeline), relative to
    # the profile's folder
    placement_pages: list[list[str]] = field(default_factory=list)

    def track_ranges(self) -> list[tuple[str, range]]:
        return [(str(label), range(int(first), int(end))) for label, first, end in self.tracks]

    @property
    def supersteps(self) -> list[Step]:
        return [s for s in self.steps if s.kind in ("compute", "exchange")]

    def superstep_numbers(self) -> dict[int, int]:
        """Each superstep's number by ``id(step)``, counted over supersteps in the order they
        ran (host streams take no device time and get none; every pass of a layer loop has
        its own, though its steps share a program index): the one numbering every page and
        table uses."""
        return {id(step): number for number, step in enumerate(self.supersteps)}

    def active_tiles(self) -> np.ndarray:
        """Tiles that computed or exchanged anything in the run."""
        busy = np.zeros(self.tiles, dtype=np.int64)
        for step in self.supersteps:
            if step.tile_cycles is not None:
                busy += step.tile_cycles
        return np.flatnonzero(busy > 0)

    def to_json(self) -> dict[str, Any]:
        data = {k: v for k, v in self.__dict__.items() if k != "steps"}
        data["steps"] = [s.to_json() for s in self.steps]
        return {"format": FORMAT, "version": VERSION, **data}


def build_profile(records: list[StepRecord], totals: dict[str, int], workload: str,
                  target: str, tiles: int, clock_hz: float, figures: dict[str, Any],
                  placement_page: str = "", tracks: list[list[Any]] | None = None,
                  labels: list[str] | None = None) -> Profile:
    """Lay the recorded steps out on the run's timeline; ``labels`` are their model parts."""
    steps, now = [], 0
    for number, record in enumerate(records):
        name = record.name if record.layer is None else f"{record.name} (layer {record.layer})"
        steps.append(Step(record.index, name, record.kind, now + record.sync, record.cycles,
                          record.sync, record.tile_cycles, record.busiest_tile,
                          dict(record.by_kind), list(record.calls), list(record.busiest_work),
                          dict(record.exchange), dict(record.host),
                          labels[number] if labels else ""))
        now += record.cycles + record.sync
    return Profile(workload, target, tiles, clock_hz, totals["cycles"], totals["compute"],
                   totals["exchange"], totals["sync"], totals["host_cycles"],
                   totals["host_bytes"], steps, figures, placement_page, list(tracks or []))


def save_profile(path: Path, profile: Profile) -> None:
    """``profile.json``, written atomically, with the sha256 of its body inside."""
    body = json.dumps(profile.to_json(), sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(body.encode()).hexdigest()
    write_text_atomic(path, json.dumps({"sha256": digest, "profile": json.loads(body)},
                                       sort_keys=True, separators=(",", ":")) + "\n")


def load_profile(path: Path) -> Profile:
    """Read a ``profile.json``; a wrong format, version or checksum is one line."""
    try:
        outer = json.loads(read_regular(path).decode("utf-8"))  # a device is refused unread
        data = outer["profile"]
        body = json.dumps(data, sort_keys=True, separators=(",", ":"))
        if hashlib.sha256(body.encode()).hexdigest() != outer["sha256"]:
            raise UsageError(f"{path}: profile checksum does not match its contents")
        if data.get("format") != FORMAT or data.get("version") != VERSION:
            raise UsageError(f"{path}: not an ipu-stack profile of version {VERSION}")
        tiles = int(data["tiles"])
        steps = [Step.from_json(s, tiles) for s in data["steps"]]
        fields = {k: v for k, v in data.items() if k not in ("format", "version", "steps")}
        return Profile(**fields, steps=steps)
    except UsageError:
        raise
    except KeyError as exc:  # a JSON file, but not a profile: name the field it lacks
        raise UsageError(f"{path}: not a readable ipu-stack profile (no field {exc})") \
            from None
    except (OSError, ValueError, TypeError) as exc:
        raise UsageError(f"{path}: not a readable ipu-stack profile ({exc})") from None
