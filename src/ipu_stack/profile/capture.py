"""Turn a finished run into a :class:`~ipu_stack.profile.record.Profile`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ipu_stack.contract.system import SystemProgram
from ipu_stack.device.alignment import merge
from ipu_stack.device.record import StepRecord
from ipu_stack.package import Package
from ipu_stack.planning.groups import layer_range
from ipu_stack.profile import write_profile_files, write_system_profile_files
from ipu_stack.profile.record import Profile, build_profile
from ipu_stack.runtime.execute import Outcome
from ipu_stack.runtime.session import RunResult
from ipu_stack.runtime.stream import StreamRun
from ipu_stack.target import get_target, timing

FIGURES = ("numericalTest", "estimatedCycles", "estimateError", "efficiencyPercent",
           "effectiveGemmTflops", "gemmModes", "hostCycles")
PIPELINE_FIGURES = ("strategy", "imagesPerSecond", "latencyMicroseconds", "pipelineGroups",
                    "groupCyclesMax", "groupCyclesMin", "handoffCycles")


def profile_of(result: RunResult, package_path: Path, record: dict[str, Any],
               folder: Path | None = None) -> Profile:
    """The profile of ``result``'s ``run`` call (recorded with ``run_package(record=True)``);
    ``folder`` is where it will be written, so the placement page link is relative to it."""
    target = get_target(result.package.target)
    run = result.run
    placement = Path(package_path).parent / "memory" / "placement.html"
    link = ""
    if placement.exists():
        link = os.path.relpath(placement, folder) if folder is not None else str(placement)
    totals = {"cycles": run.cycles, "compute": run.compute_cycles,
              "exchange": run.exchange_cycles, "sync": run.sync_cycles,
              "host_cycles": run.host_cycles, "host_bytes": run.host_bytes}
    figures = {k: record[k] for k in FIGURES if k in record}
    figures["plans"] = result.package.manifest.get("plans", [])
    return build_profile(run.steps, totals, result.package.manifest["workload"]["identifier"],
                         target.name, target.tiles, target.clock_hz, figures, link)


def profile_of_stream(run: StreamRun, package: Package, system: SystemProgram,
                      record: dict[str, Any], chip: int = 0) -> Profile:
    """The profile of chip ``chip``'s first step with every group busy (recorded with
    ``StreamOptions(record=True)``): the groups' supersteps merged as the chip runs them
    (``device.alignment``), each merged superstep's tiles the groups' tiles at their base,
    then the chip's hand-off phase; one track per group."""
    target = get_target(package.target)
    specs = system.on_chip(chip)
    groups = sorted(g.index for g in specs if g.index in run.records)
    bases = {g.index: g.tile_base for g in specs}
    merged = merge([([r.kind for r in run.records[g]],
                     [r.cycles + r.sync for r in run.records[g]]) for g in groups])
    steps: list[StepRecord] = []
    for k in range(len(merged.cycles)):
        members = [(g, run.records[g][int(merged.members[row, k])])
                   for row, g in enumerate(groups) if merged.members[row, k] >= 0]
        tiles = np.zeros(target.tiles, dtype=np.int64)
        for g, rec in members:
            if rec.tile_cycles is not None:
                tiles[bases[g]: bases[g] + rec.tile_cycles.size] = rec.tile_cycles
        longest = max(members, key=lambda m: m[1].cycles)[1]
        steps.append(StepRecord(k, " | ".join(f"g{g} {rec.name}" for g, rec in members),
                                longest.kind, longest.cycles, longest.sync, tiles,
                                int(np.argmax(tiles)), dict(longest.by_kind),
                                list(longest.calls), list(longest.busiest_work),
                                dict(longest.exchange)))
    handoff = run.chip_handoffs[chip] if chip < len(run.chip_handoffs) else 0
    if handoff:
        sync = int(timing.p("sync"))
        steps.append(StepRecord(len(steps), "pipeline hand-offs", "exchange", handoff - sync,
                                sync, None))
    compute = sum(s.cycles for s in steps if s.kind == "compute")
    exchange = sum(s.cycles for s in steps if s.kind == "exchange")
    sync_total = sum(s.sync for s in steps)
    totals = {"cycles": compute + exchange + sync_total, "compute": compute,
              "exchange": exchange, "sync": sync_total, "host_cycles": 0, "host_bytes": 0}
    figures = {k: record[k] for k in FIGURES + PIPELINE_FIGURES if k in record}
    if system.chips > 1:
        figures["chip"] = chip
    tracks = [[f"group {g.index}: layers {layer_range(g.first_layer, g.layers)}",
               g.tile_base, g.tile_end] for g in specs]
    return build_profile(steps, totals, package.manifest["workload"]["identifier"],
                         target.name, target.tiles, target.clock_hz, figures, "", tracks)


def profiles_of_stream(run: StreamRun, package: Package, system: SystemProgram,
                       record: dict[str, Any]) -> list[Profile]:
    """A stream's profiles: each chip's first full step (its groups as tracks)."""
    return [profile_of_stream(run, package, system, record, chip)
            for chip in range(system.chips)]


def profile_of_outcome(outcome: Outcome, folder: Path | None = None) -> Profile:
    """The profile of a finished run (recorded with ``RunSettings(record=True)``): a
    whole-chip run's, or the step of the chip that sets a stream's period."""
    if isinstance(outcome.result, RunResult):
        return profile_of(outcome.result, outcome.path, outcome.record, folder)
    return max(profiles_of_stream(outcome.result, outcome.package, outcome.system,
                                  outcome.record), key=lambda p: p.cycles)


def write_run_profile(folder: Path, outcome: Outcome) -> None:
    """A finished run's profile files in ``folder``: one chip's, or every chip's (in
    ``chipN/``) and the system trace with one track a chip."""
    folder = Path(folder)
    if isinstance(outcome.result, RunResult) or outcome.system.chips == 1:
        write_profile_files(folder, profile_of_outcome(outcome, folder))
        return
    system = outcome.system
    labels = []
    for chip in range(system.chips):
        own = system.on_chip(chip)
        first = own[0].first_layer
        labels.append(f"chip {chip}: layers " + layer_range(first, own[-1].first_layer
                                                           + own[-1].layers - first))
    write_system_profile_files(folder, profiles_of_stream(outcome.result, outcome.package,
                                                          system, outcome.record),
                               labels, max(outcome.result.link_cycles, default=0))
