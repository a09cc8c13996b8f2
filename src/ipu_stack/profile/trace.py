"""``trace.json``: the profile in the Chrome trace-event format (Perfetto, ``chrome://tracing``).

Tracks (every one covers the whole run: its slices' cycles add up to the run's cycles):

* program / supersteps: each superstep by name, with its sync; host streams as instants;
* tiles: the busiest tile, the least busy active tile and a sample of others, each superstep
  split into its own work (compute or exchange ports), waiting for the slowest tile, and sync;
* critical tile: the busiest tile of each compute superstep, as its supervisor and its six
  workers: AMP weight loads and launches on the supervisor, the rows on the workers (the
  six interleave round robin; a slice spans the pass), vector work on the workers;
* counters: active tiles and exchange words per superstep.

Timestamps are microseconds at the target clock; every slice also carries ``cycles``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ipu_stack.profile.record import Profile, Step
from ipu_stack.target.timing import p
from ipu_stack.util.files import write_text_atomic

PROGRAM, TILES, CRITICAL, GROUPS = 1, 2, 3, 4
WORKERS = 6


class _Tracks:
    """Collects complete events, filling every gap of a track with ``idle``."""

    def __init__(self, clock_hz: float) -> None:
        self.scale = 1e6 / clock_hz
        self.events: list[dict[str, Any]] = []

    def name(self, pid: int, tid: int | None, text: str) -> None:
        if tid is None:
            self.events.append({"ph": "M", "name": "process_name", "pid": pid,
                                "args": {"name": text}})
        else:
            self.events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                                "args": {"name": text}})

    def slice(self, pid: int, tid: int, name: str, start: int, cycles: int, category: str,
              **args: Any) -> None:
        if cycles <= 0:
            return
        self.events.append({"name": name, "cat": category, "ph": "X", "pid": pid, "tid": tid,
                            "ts": round(start * self.scale, 4),
                            "dur": round(cycles * self.scale, 4),
                            "args": {"cycles": int(cycles), **args}})

    def segments(self, pid: int, tid: int, step: Step, parts: list[tuple[int, int, str, dict]]
                 ) -> None:
        """``parts`` (offset, cycles, name, args) inside ``step``; gaps become ``idle``."""
        at = 0
        for offset, cycles, name, args in sorted(parts, key=lambda part: part[0]):
            self.slice(pid, tid, "idle", step.start + at, offset - at, "idle")
            self.slice(pid, tid, name, step.start + offset, cycles, step.kind, **args)
            at = offset + cycles
        self.slice(pid, tid, "idle", step.start + at, step.cycles - at, "idle")
        self.slice(pid, tid, "sync", step.begin, step.sync, "sync")


def sample_tiles(profile: Profile, count: int = 6) -> dict[int, str]:
    """The busiest and least busy active tiles and ``count`` others spread over the chip."""
    active = profile.active_tiles()
    if active.size == 0:
        return {}
    busy = np.zeros(profile.tiles, dtype=np.int64)
    for step in profile.supersteps:
        if step.tile_cycles is not None:
            busy += step.tile_cycles
    chosen = {int(active[np.argmax(busy[active])]): "busiest",
              int(active[np.argmin(busy[active])]): "least busy"}
    for tile in active[np.linspace(0, active.size - 1, count).astype(int)]:
        chosen.setdefault(int(tile), "sample")
    return chosen


def _critical_parts(step: Step) -> tuple[list, list]:
    """Supervisor and worker slices of the critical tile's work in one compute superstep."""
    supervisor, workers = [], []
    at = 0
    for item in step.busiest_work:
        cycles, counts = int(item["cycles"]), item.get("counts", {})
        args = {"kernel": item["kernel"], **{k: v for k, v in counts.items()
                                             if not isinstance(v, list)}}
        if item["kind"] == "amp":
            rows = p("amp_row") * int(counts.get("rows", 0)) * int(counts.get("passes", 0))
            supervisor.append((at, cycles - rows, "AMP weight loads, syncs, launches", args))
            workers.append((at + cycles - rows, rows, "AMP rows", args))
        else:
            workers.append((at, cycles, item["kind"], args))
        at += cycles
    return supervisor, workers


def _group_segments(tracks: _Tracks, pid: int, first_tid: int,
                    groups: list[tuple[str, range]], step: Step) -> None:
    """Each tile group's busiest tile in ``step``, on threads ``first_tid``, ... of ``pid``."""
    for number, (_, span) in enumerate(groups):
        own = int(step.tile_cycles[span.start:span.stop].max()) \
            if step.tile_cycles is not None else 0
        tracks.segments(pid, first_tid + number, step, [(0, own, step.kind, {})] if own else [])


def trace(profile: Profile, sample: int = 6) -> dict[str, Any]:
    """The trace-event object for ``profile``."""
    tracks = _Tracks(profile.clock_hz)
    tracks.name(PROGRAM, None, f"program {profile.workload}")
    tracks.name(PROGRAM, 1, "supersteps")
    tracks.name(TILES, None, "tiles")
    tracks.name(CRITICAL, None, "critical tile (busiest of each compute superstep)")
    tracks.name(CRITICAL, 0, "supervisor")
    for worker in range(WORKERS):
        tracks.name(CRITICAL, worker + 1, f"worker {worker}")
    tiles = sample_tiles(profile, sample)
    for tile, role in tiles.items():
        tracks.name(TILES, tile, f"tile {tile} ({role})")
    groups = profile.track_ranges()  # a pipeline's tile groups: one track each
    if groups:
        tracks.name(GROUPS, None, "tile groups (busiest tile of each)")
        for number, (label, _) in enumerate(groups):
            tracks.name(GROUPS, number, label)
    numbers = profile.superstep_numbers()
    for step in profile.steps:
        if step.kind.startswith("host"):
            tracks.events.append({"name": f"{step.kind} {step.label}", "ph": "i",
                                  "s": "p", "pid": PROGRAM, "tid": 1,
                                  "ts": round(step.start * tracks.scale, 4),
                                  "args": {"bytes": step.host.get("bytes", 0),
                                           "tensor": step.host.get("tensor")}})
            continue
        tracks.slice(PROGRAM, 1, step.label, step.start, step.cycles, step.kind,
                     superstep=numbers[id(step)], program_step=step.name,
                     busiest_tile=step.busiest_tile)
        tracks.slice(PROGRAM, 1, "sync", step.begin, step.sync, "sync")
        active = int(np.count_nonzero(step.tile_cycles)) if step.tile_cycles is not None else 0
        tracks.events.append({"name": "active tiles", "ph": "C", "pid": PROGRAM,
                              "ts": round(step.start * tracks.scale, 4),
                              "args": {"tiles": active}})
        tracks.events.append({"name": "exchange words", "ph": "C", "pid": PROGRAM,
                              "ts": round(step.start * tracks.scale, 4),
                              "args": {"words": int(step.exchange.get("words", 0))}})
        for tile in tiles:
            own = int(step.tile_cycles[tile]) if step.tile_cycles is not None else 0
            tracks.segments(TILES, tile, step, [(0, own, step.kind, {})] if own else [])
        _group_segments(tracks, GROUPS, 0, groups, step)
        supervisor, workers = _critical_parts(step) if step.kind == "compute" else ([], [])
        if step.kind == "exchange":
            workers = [(0, step.cycles, "exchange", {})]
        tracks.segments(CRITICAL, 0, step, supervisor)
        for worker in range(WORKERS):
            tracks.segments(CRITICAL, worker + 1, step, workers)
    return {"traceEvents": tracks.events, "displayTimeUnit": "ns",
            "otherData": {"workload": profile.workload, "cycles": profile.cycles,
                          "clock_hz": profile.clock_hz}}


def write_trace(path: Path, profile: Profile) -> int:
    """Write ``trace.json`` atomically; returns its size in bytes."""
    text = json.dumps(trace(profile), separators=(",", ":"))
    write_text_atomic(path, text)
    return len(text)


def system_trace(chips: list[Profile], labels: list[str], link_cycles: int) -> dict[str, Any]:
    """The trace of a multi-chip pipeline step: one process (track) a chip.  Each chip's
    supersteps run on its own timeline from 0, since the cards sync with each other only at
    the end of the step; a card that finishes early waits for the slowest, then every card
    takes part in the link hand-off.  Each chip's tile groups are threads of its process
    (their busiest tile in each superstep)."""
    tracks = _Tracks(chips[0].clock_hz)
    end = max(profile.cycles for profile in chips)
    for number, (profile, label) in enumerate(zip(chips, labels, strict=True)):
        pid = 10 + number
        tracks.name(pid, None, label)
        tracks.name(pid, 1, "supersteps")
        groups = profile.track_ranges()
        for index, (name, _) in enumerate(groups):
            tracks.name(pid, index + 2, name)
        numbers = profile.superstep_numbers()
        for step in profile.supersteps:
            tracks.slice(pid, 1, step.label, step.start, step.cycles, step.kind,
                         superstep=numbers[id(step)], program_step=step.name,
                         busiest_tile=step.busiest_tile)
            tracks.slice(pid, 1, "sync", step.begin, step.sync, "sync")
            _group_segments(tracks, pid, 2, groups, step)
        tracks.slice(pid, 1, "waiting for the slowest card", profile.cycles,
                     end - profile.cycles, "idle")
        tracks.slice(pid, 1, "IPU-Link hand-off (with the sync across cards)", end,
                     link_cycles, "link")
    return {"traceEvents": tracks.events, "displayTimeUnit": "ns",
            "otherData": {"workload": chips[0].workload, "cycles": end + link_cycles,
                          "clock_hz": chips[0].clock_hz, "chips": len(chips)}}


def write_system_trace(path: Path, chips: list[Profile], labels: list[str],
                       link_cycles: int) -> int:
    """Write a multi-chip step's ``trace.json`` atomically; returns its size in bytes."""
    text = json.dumps(system_trace(chips, labels, link_cycles), separators=(",", ":"))
    write_text_atomic(path, text)
    return len(text)
