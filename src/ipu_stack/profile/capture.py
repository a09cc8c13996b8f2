"""Turn a finished run into a :class:`~ipu_stack.profile.record.Profile`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ipu_stack.device.record import StepRecord
from ipu_stack.package import Package
from ipu_stack.planning.groups import layer_range
from ipu_stack.profile.record import Profile, build_profile
from ipu_stack.runtime.alignment import merge
from ipu_stack.runtime.pipelined import PipelineRun, package_chips
from ipu_stack.runtime.session import RunResult
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


def profile_of_pipeline(run: PipelineRun, package: Package, record: dict[str, Any],
                        chip: int | None = None) -> Profile:
    """The profile of one pipeline step with every group busy (recorded with
    ``run_pipeline(record=True)``): the groups' supersteps merged as the chip runs them
    (``runtime.alignment``), each merged superstep's tiles the groups' tiles at their base,
    then the hand-off phase; one track per group.  ``chip``: only that chip's groups (a
    multi-chip run's records hold each chip's first full step)."""
    target = get_target(package.target)
    pipeline = package.manifest["pipeline"]
    records = [g for g in pipeline["groups"] if chip is None or int(g.get("chip", 0)) == chip]
    groups = sorted(g for g in run.records if chip is None
                    or int(pipeline["groups"][g].get("chip", 0)) == chip)
    bases = {int(g["index"]): int(g["tile_base"]) for g in records}
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
    handoff = max(run.handoff_cycles, default=0) if chip is None else \
        int(getattr(run, "chip_handoffs", [0])[chip])
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
    if chip is not None:
        figures["chip"] = chip
    tracks = [[f"group {g['index']}: layers {layer_range(g['first_layer'], g['layers'])}",
               int(g["tile_base"]),
               int(g["tile_base"]) + int(g["tiles"])] for g in records]
    return build_profile(steps, totals, package.manifest["workload"]["identifier"],
                         target.name, target.tiles, target.clock_hz, figures, "", tracks)


def profiles_of_system(run: PipelineRun, package: Package, record: dict[str, Any]
                       ) -> list[Profile]:
    """A multi-chip run's profiles: each chip's first full step (its groups as tracks)."""
    chips = package_chips(package)
    return [profile_of_pipeline(run, package, record, chip) for chip in range(chips)]
