"""Turn a finished run into a :class:`~ipu_stack.profile.record.Profile`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ipu_stack.profile.record import Profile, build_profile
from ipu_stack.runtime.session import RunResult
from ipu_stack.target import get_target

FIGURES = ("numericalTest", "estimatedCycles", "estimateError", "efficiencyPercent",
           "effectiveGemmTflops", "gemmModes", "hostCycles")


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
