"""Execution profiles: recorded by the simulator, written as ``profile.json`` (the record),
``trace.json`` (Chrome trace events, for Perfetto) and ``report.html`` (one offline page);
summarised and compared by ``ipu-stack profile``."""

from __future__ import annotations

import logging
from pathlib import Path

from ipu_stack.profile.record import Profile, build_profile, load_profile, save_profile
from ipu_stack.profile.report import write_report
from ipu_stack.profile.summary import compare, format_compare, format_summary, summary
from ipu_stack.profile.trace import write_trace
from ipu_stack.util.log import event

LOG = logging.getLogger("ipu_stack.profile")

__all__ = ["Profile", "build_profile", "compare", "format_compare", "format_summary",
           "load_profile", "save_profile", "summary", "write_profile_files"]


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
