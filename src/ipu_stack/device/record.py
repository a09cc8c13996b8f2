"""What the simulator records of each superstep when asked (the execution profile's raw data).

Recording costs little: the per-tile cycles and port words exist anyway; on top come the
busiest tile's work items in order and each exchange phase's figures.  ``profile`` turns the
records of a call into ``profile.json``, ``trace.json`` and ``report.html``.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class StepRecord:
    """One superstep (or host stream) of a call, as it ran."""

    index: int
    name: str
    kind: str  # compute | exchange | host_write | host_read
    cycles: int  # the superstep's length before its sync (0 for host streams)
    sync: int
    # compute: each tile's busy cycles; exchange: each tile's port cycles (send or receive)
    tile_cycles: np.ndarray | None = None
    busiest_tile: int = -1
    by_kind: dict[str, int] = field(default_factory=dict)  # busiest tile, by kind of work
    calls: list[dict[str, Any]] = field(default_factory=list)  # kernel, tiles, cycles
    busiest_work: list[dict[str, Any]] = field(default_factory=list)  # in the order it ran
    exchange: dict[str, Any] = field(default_factory=dict)
    host: dict[str, Any] = field(default_factory=dict)
    layer: int | None = None  # the pass of the layer loop this step ran in

    def to_json(self) -> dict[str, Any]:
        """Plain JSON (a worker hands its recorded steps to the coordinator this way); the
        tile cycles as base64 of little-endian int32."""
        data = {k: _plain(v) for k, v in self.__dict__.items() if k != "tile_cycles"}
        data["tile_cycles"] = None if self.tile_cycles is None else base64.b64encode(
            np.asarray(self.tile_cycles).astype("<i4").tobytes()).decode()
        return data

    @staticmethod
    def from_json(data: dict[str, Any]) -> StepRecord:
        raw = data.get("tile_cycles")
        cycles = None if raw is None else \
            np.frombuffer(base64.b64decode(raw), dtype="<i4").astype(np.int64)
        return StepRecord(**{k: v for k, v in data.items() if k != "tile_cycles"},
                          tile_cycles=cycles)


def _plain(value: Any) -> Any:
    """``value`` with numpy scalars and arrays made plain Python (for JSON)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


@dataclass
class ComputeTrace:
    """A compute set's work per tile group, kept only while recording."""

    groups: list[tuple[str, np.ndarray, list[dict[str, Any]]]] = field(default_factory=list)

    def add(self, kernel: str, members: np.ndarray, work: list[dict[str, Any]]) -> None:
        self.groups.append((kernel, members, work))

    def calls(self, busy: np.ndarray) -> list[dict[str, Any]]:
        """Per kernel: how many tiles ran it and the cycles of its busiest tile."""
        merged: dict[str, dict[str, Any]] = {}
        for kernel, members, work in self.groups:
            cycles = sum(item["cycles"] for item in work)
            entry = merged.setdefault(kernel, {"kernel": kernel, "tiles": 0, "cycles": 0})
            entry["tiles"] += int(members.size)
            entry["cycles"] = max(entry["cycles"], cycles)
        return list(merged.values())

    def work_on(self, tile: int) -> list[dict[str, Any]]:
        """The work ``tile`` did, call by call, in the order it ran."""
        return [dict(item, kernel=kernel) for kernel, members, work in self.groups
                if np.any(members == tile) for item in work]
