"""Turn a finished run into a :class:`~ipu_stack.profile.record.Profile`."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ipu_stack.contract.system import SystemProgram
from ipu_stack.device.alignment import merge
from ipu_stack.device.record import StepRecord
from ipu_stack.ir.names import Part, parts_from_json, step_label
from ipu_stack.package import Package
from ipu_stack.planning.groups import layer_range
from ipu_stack.profile import write_profile_files, write_system_profile_files
from ipu_stack.profile.record import Profile, build_profile
from ipu_stack.runtime.execute import Outcome
from ipu_stack.runtime.groups import group_programs
from ipu_stack.runtime.session import RunResult
from ipu_stack.runtime.stream import StreamRun
from ipu_stack.target import get_target, timing
from ipu_stack.util.errors import UsageError

FIGURES = ("numericalTest", "estimatedCycles", "estimateError", "efficiencyPercent",
           "effectiveGemmTflops", "gemmModes", "hostCycles")
PIPELINE_FIGURES = ("strategy", "imagesPerSecond", "latencyMicroseconds", "pipelineGroups",
                    "groupCyclesMax", "groupCyclesMin", "handoffCycles")


def placement_link(package_path: Path, folder: Path | None) -> str:
    """The whole-chip package's placement page beside it, relative to ``folder`` (where the
    profile is written); empty when there is none."""
    placement = Path(package_path).parent / "memory" / "placement.html"
    if not placement.exists():
        return ""
    return os.path.relpath(placement, folder) if folder is not None else str(placement)


def profile_of(result: RunResult, package_path: Path, record: dict[str, Any],
               folder: Path | None = None) -> Profile:
    """The profile of ``result``'s ``run`` call (recorded with ``run_package(record=True)``);
    ``folder`` is where it will be written, so the placement page link is relative to it."""
    target = get_target(result.package.target)
    run = result.run
    link = placement_link(package_path, folder)
    totals = {"cycles": run.cycles, "compute": run.compute_cycles,
              "exchange": run.exchange_cycles, "sync": run.sync_cycles,
              "host_cycles": run.host_cycles, "host_bytes": run.host_bytes}
    figures = {k: record[k] for k in FIGURES if k in record}
    figures["plans"] = result.package.manifest.get("plans", [])
    parts = package_parts(result.package)
    labels = [step_label(r.name, parts, r.layer or 0) for r in run.steps]
    return build_profile(run.steps, totals, result.package.manifest["workload"]["identifier"],
                         target.name, target.tiles, target.clock_hz, figures, link,
                         labels=labels)


def package_parts(package: Package) -> dict[int, Part]:
    """The model part of each stage of a program package (``ir.names``); none for a
    package written without them. A malformed record is one line: it came from a file."""
    try:
        return parts_from_json(package.manifest.get("parts", []))
    except ValueError as exc:
        raise UsageError(f"package parts record is invalid: {exc}") from None


def _group_labels(package: Package, system: SystemProgram, groups: list[int]
                  ) -> dict[int, Callable[[StepRecord], str]]:
    """Each group's step labeller: its program's parts, their layers moved by how far the
    group's first layer is from that of the group the shared program was compiled for."""
    specs = {g.index: g for g in system.groups}
    programs = group_programs(package, system, {specs[g].program for g in groups})
    owner = {}
    for spec in system.groups:
        owner.setdefault(spec.program, spec)
    labellers = {}
    for g in groups:
        spec = specs[g]
        parts = package_parts(programs[spec.program])
        shift = math.floor(spec.first_layer) - math.floor(owner[spec.program].first_layer)
        labellers[g] = (lambda rec, parts=parts, shift=shift:
                        step_label(rec.name, parts, shift + (rec.layer or 0)))
    return labellers


def group_placement_pages(package_path: Path, package: Package, system: SystemProgram,
                          folder: Path | None) -> list[list[str]]:
    """``[label, path]`` of each group program's placement page: program ``k`` was compiled
    into ``group<N>`` (or ``group<N>.aligned``) beside the package, ``N`` its first group;
    the folder whose package holds program ``k``'s very bytes is it.  Paths relative to
    ``folder``."""
    if len(system.groups) == 1:  # a whole-chip package's stream: its own page, beside it
        link = placement_link(package_path, folder)
        return [["the whole chip", link]] if link else []
    pages, seen = [], set()
    for spec in system.groups:
        if spec.program in seen:
            continue
        seen.add(spec.program)
        held = package.arrays[f"program.{spec.program}"]
        for name in (f"group{spec.index}.aligned", f"group{spec.index}"):
            page = Path(package_path).parent / name / "memory" / "placement.html"
            built = page.parent.parent / "model.ipuexe"
            if page.exists() and built.exists() and built.stat().st_size == held.size \
                    and built.read_bytes() == held.tobytes():
                label = f"group {spec.index}: layers {layer_range(spec.first_layer, spec.layers)}"
                pages.append([label, os.path.relpath(page, folder) if folder else str(page)])
                break
    return pages


def profile_of_stream(run: StreamRun, package: Package, system: SystemProgram,
                      record: dict[str, Any], chip: int = 0) -> Profile:
    """The profile of chip ``chip``'s first step with every group busy (recorded with
    ``RunSettings(record=True)``): the groups' supersteps merged as the chip runs them
    (``device.alignment``), each merged superstep's tiles the groups' tiles at their base,
    then the chip's hand-off phase; one track per group."""
    target = get_target(package.target)
    specs = system.on_chip(chip)
    groups = sorted(g.index for g in specs if g.index in run.records)
    bases = {g.index: g.tile_base for g in specs}
    merged = merge([([r.kind for r in run.records[g]],
                     [r.cycles + r.sync for r in run.records[g]]) for g in groups])
    labeller = _group_labels(package, system, groups)
    steps: list[StepRecord] = []
    labels: list[str] = []
    for k in range(len(merged.cycles)):
        members = [(g, run.records[g][int(merged.members[row, k])])
                   for row, g in enumerate(groups) if merged.members[row, k] >= 0]
        tiles = np.zeros(target.tiles, dtype=np.int64)
        for g, rec in members:
            if rec.tile_cycles is not None:
                tiles[bases[g]: bases[g] + rec.tile_cycles.size] = rec.tile_cycles
        longest = max(members, key=lambda m: m[1].cycles)[1]
        labels.append(" | ".join(labeller[g](rec) for g, rec in members))
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
        labels.append("hand-offs between groups")
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
                         target.name, target.tiles, target.clock_hz, figures, "", tracks,
                         labels)


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
    slowest = max(profiles_of_stream(outcome.result, outcome.package, outcome.system,
                                     outcome.record), key=lambda p: p.cycles)
    slowest.placement_pages = group_placement_pages(outcome.path, outcome.package,
                                                    outcome.system, folder)
    return slowest


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
    chips = profiles_of_stream(outcome.result, outcome.package, system, outcome.record)
    for number, profile in enumerate(chips):  # each chip's own groups' pages, from chipN/
        own = {f"group {g.index}:" for g in system.on_chip(number)}
        profile.placement_pages = [
            page for page in group_placement_pages(outcome.path, outcome.package, system,
                                                   folder / f"chip{number}")
            if page[0].split(" layers")[0] in own]
    write_system_profile_files(folder, chips, labels,
                               max(outcome.result.link_cycles, default=0))
