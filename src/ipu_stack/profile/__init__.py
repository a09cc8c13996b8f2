"""Execution profiles: recorded by the simulator, written as ``profile.json`` (the record),
``trace.json`` (Chrome trace events, for Perfetto) and ``report.html`` (one offline page);
summarised and compared by ``ipu-stack profile``."""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

from ipu_stack.profile.record import Profile, build_profile, load_profile, save_profile
from ipu_stack.profile.report import write_report
from ipu_stack.profile.summary import compare, format_compare, format_summary, summary
from ipu_stack.profile.trace import write_system_trace, write_trace
from ipu_stack.util.log import event

LOG = logging.getLogger("ipu_stack.profile")

__all__ = ["Profile", "build_profile", "compare", "format_compare", "format_summary",
           "load_profile", "save_profile", "summary", "write_profile_files",
           "write_system_profile_files"]


def write_profile_files(folder: Path, profile: Profile) -> dict[str, int]:
    """``profile.json``, ``trace.json`` and ``report.html`` in ``folder``; their sizes."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_profile(folder / "profile.json", profile)
    sizes = {"profile.json": (folder / "profile.json").stat().st_size,
             "trace.json": write_trace(folder / "trace.json", profile),
             "report.html": write_report(folder / "report.html", profile,
                                         profile.track_ranges() or None)}
    event(LOG, "wrote execution profile", path=str(folder),
          samples=sum(1 for s in profile.steps), **{k.replace(".", "_"): v
                                                    for k, v in sizes.items()})
    return sizes


def write_system_profile_files(folder: Path, chips: list[Profile], labels: list[str],
                               link_cycles: int) -> dict[str, int]:
    """A multi-chip run's profile in ``folder``: each chip's full step in ``chipN/`` (its
    own profile.json, trace.json and report.html, its groups as tracks); the slowest chip's
    (the one that sets the period) also as ``folder``'s profile.json and report.html, which
    ``ipu-stack profile folder`` reads; and ``trace.json`` with one track a chip and the
    link hand-off."""
    folder = Path(folder)
    for number, profile in enumerate(chips):
        write_profile_files(folder / f"chip{number}", profile)
    slowest = max(range(len(chips)), key=lambda k: chips[k].cycles)
    pages = [[label, os.path.normpath(os.path.join(f"chip{slowest}", path))]
             for label, path in chips[slowest].placement_pages]  # the copy sits a level up
    sizes = write_profile_files(folder, dataclasses.replace(chips[slowest],
                                                            placement_pages=pages))
    sizes["trace.json"] = write_system_trace(folder / "trace.json", chips, labels, link_cycles)
    event(LOG, "wrote multi-chip profile", path=str(folder), chips=len(chips),
          slowest_chip=slowest)
    return sizes
