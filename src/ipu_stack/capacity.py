"""Capacity probes: the largest batch (or number of layers) of a workload that compiles.

A size *fits* when the whole compile succeeds (planning, placement, package) on the target;
nothing is simulated.  The search doubles the size until a compile fails or the limit is
reached, then bisects between the last size that fit and the first that did not, so it
compiles about ``2 log2(limit)`` sizes instead of all of them.  Fitting is monotone in
practice (a larger batch or more layers never needs less memory), which bisection assumes.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ipu_stack.ir.graph import POSITION_GRAIN
from ipu_stack.memory.categories import describe
from ipu_stack.package import read_package
from ipu_stack.pipeline import CompileOptions, compile_workload
from ipu_stack.runtime.groups import group_programs, read_system
from ipu_stack.strategy.compile import compile_pipeline
from ipu_stack.target.links import get_system
from ipu_stack.util.errors import CompileError, UsageError
from ipu_stack.util.log import event
from ipu_stack.workloads.base import LARGEST_SIZE, Workload
from ipu_stack.workloads.calibration import cache_folder
from ipu_stack.workloads.footprint import workload_label

LOG = logging.getLogger("ipu_stack.capacity")


@dataclass
class CapacityResult:
    """The largest size that fits, why the next one does not, and every size tried."""

    parameter: str
    maximum: int
    reason: str
    tried: dict[int, str] = field(default_factory=dict)
    seconds: float = 0.0
    fullest: dict[int, str] = field(default_factory=dict)  # each size that fits: its fullest tile
    refused: int = 0  # sizes refused from the weights alone, without a compile


def fullest_tile(path: Path) -> str:
    """What fills the fullest tile of a compiled package (of its fullest group program):
    ``604160 bytes: weights 349184, kv cache 238080, ...``."""
    package = read_package(path)
    programs = list(group_programs(package, read_system(package)).values())
    memory = max((p.manifest["memory"] for p in programs), key=lambda m: m["peak_bytes"])
    return (f"{int(memory['peak_bytes'])} bytes: "
            f"{describe(memory.get('peak_tile_by_category', {}))}")


def _fits(workload: Workload, params: dict[str, Any], options: CompileOptions,
          compile: Callable[..., Any] = compile_workload,
          fullest: dict[int, str] | None = None, size: int = 0) -> str:
    """'' when the workload compiles (by ``compile``: one program, or a pipeline), else the
    one-line reason it does not; ``fullest[size]`` gets the fullest tile of one that does."""
    with tempfile.TemporaryDirectory(prefix="ipu-stack-capacity-") as out:
        try:  # whether it fits, not how fast: no second plan for the room it leaves
            compile(workload, params, Path(out), replace(options, slack=False))
        except CompileError as failure:
            return str(failure)
        if fullest is not None:
            fullest[size] = fullest_tile(Path(out) / "model.ipuexe")
    return ""


def probe_capacity(
    workload: Workload,
    params: dict[str, Any],
    parameter: str,
    limit: int,
    options: CompileOptions,
) -> CapacityResult:
    """Search ``parameter`` (``batch``, ``blocks``, ``layers`` or a decoder's ``context``) in
    ``[1, limit]``.  A context is searched in whole blocks of ``ir.graph.POSITION_GRAIN``
    positions: the cache is sized in them, so two contexts in one block compile the same
    program, and a probe between them would repeat a compile."""
    if parameter not in params:
        raise UsageError(f"--max-{parameter}: {workload_label(workload, params)} has no "
                         f"--{parameter}")
    if limit < 1:
        raise UsageError(f"--max-{parameter} must be at least 1")
    if limit > LARGEST_SIZE:
        raise UsageError(f"--max-{parameter} must be at most {LARGEST_SIZE} (no size on a "
                         f"tile of 624 KiB can be larger), got {limit}")
    start = time.perf_counter()
    tried: dict[int, str] = {}

    # over several chips, each size as a pipeline over them
    over_chips = {"compile": compile_pipeline} if options.chips > 1 else {}
    fullest: dict[int, str] = {}

    grain = POSITION_GRAIN if parameter == "context" else 1
    units = -(-limit // grain)

    def attempt(unit: int) -> bool:
        size = min(unit * grain, limit)
        reason = _fits(workload, workload.resolve({**params, parameter: size}),
                       replace(options, strategy="pipeline") if over_chips else options,
                       fullest=fullest, size=size, **over_chips)
        tried[size] = reason or "fits"
        event(LOG, "capacity probe", parameter=parameter, size=size, fits=not reason,
              reason=reason or None)
        return not reason

    good, bad = 0, None
    unit = 1
    while unit <= units:
        if attempt(unit):
            good = unit
            unit *= 2
        else:
            bad = unit
            break
    if bad is None and good < units:
        if attempt(units):
            good = units
        else:
            bad = units
    if bad is not None:
        while bad - good > 1:
            middle = (good + bad) // 2
            if attempt(middle):
                good = middle
            else:
                bad = middle
        failed = min(bad * grain, limit)
        reason = f"{parameter}={failed}: {tried[failed]}"
    else:
        reason = f"reached --max-{parameter} {limit}"
    return CapacityResult(parameter, min(good * grain, limit), reason, tried,
                          time.perf_counter() - start, fullest)


def _weight_bytes(workload: Workload, params: dict[str, Any], options: CompileOptions) -> int:
    """The bytes the tower's weights take in their stored precisions (from the graph's
    types: no weight is made).  Built under the compile's cache folder, so a tower's FP8
    calibration runs once, here, and the compiles after it read it from the cache."""
    with cache_folder(Path(options.cache_dir) if options.cache_dir else None):
        graph, _ = workload.build(params)
    return sum(v.type.nbytes for v in graph.by_role("weight"))


def probe_chips(workload: Workload, params: dict[str, Any], limit: int,
                options: CompileOptions) -> CapacityResult:
    """The fewest chips (1 to ``limit``) the workload fits: one chip when the layers
    strategy compiles there, more when a pipeline over that many chips compiles.  Counts
    whose tile memory cannot even hold the weights once are refused without a compile."""
    get_system(options.target, limit, "--max-chips")  # in range, or one line why not
    start = time.perf_counter()
    chip = options.machine()
    memory = chip.tiles * (chip.memory_end - chip.memory_base)
    tried: dict[int, str] = {}
    fullest: dict[int, str] = {}
    refused = 0  # chip counts refused from the weights alone, without a compile
    # a builtin's weights from its parameters alone (its footprint: no graph built, no FP8
    # calibration before a count it cannot fit is refused); an imported program's from its
    # graph's types
    weights = workload.footprint(params).weight_bytes if workload.footprint is not None \
        else _weight_bytes(workload, params, options)
    for chips in range(1, limit + 1):
        if weights > chips * memory:
            refused += 1
            reason = (f"the weights alone take at least {weights} bytes; {chips} chip(s) hold "
                      f"{chips * memory}")
        elif chips == 1:
            reason = _fits(workload, params, replace(options, strategy="layers", chips=1),
                           fullest=fullest, size=chips)
        else:
            reason = _fits(workload, params, replace(options, strategy="pipeline", chips=chips),
                           compile_pipeline, fullest=fullest, size=chips)
        tried[chips] = reason or "fits"
        event(LOG, "capacity probe", parameter="chips", size=chips, fits=not reason,
              reason=reason or None)
        if not reason:
            why = f"chips={chips - 1}: {tried[chips - 1]}" if chips > 1 else "one chip fits"
            return CapacityResult("chips", chips, why, tried, time.perf_counter() - start,
                                  fullest, refused)
    return CapacityResult("chips", 0, f"does not fit {limit} chip{'s' if limit > 1 else ''}: "
                          f"{tried[limit]}", tried, time.perf_counter() - start, fullest,
                          refused)


def capacity_options(options: CompileOptions) -> CompileOptions:
    """Probes plan with one finalist: the question is whether it fits, not how fast."""
    return replace(options, finalists=1)


RECORD_KEYS = {"batch": "maximumBatch", "blocks": "maximumBlocks", "layers": "maximumLayers",
               "context": "maximumContext", "chips": "minimumChips"}
"""The record's name for each search's answer."""


def capacity_record(workload: Workload, params: dict[str, Any], options: CompileOptions,
                    parameter: str, limit: int) -> dict[str, Any]:
    """``ipu-stack capacity``'s record: the largest ``parameter`` up to ``limit`` that
    compiles (``chips``: the fewest chips that hold the workload), why the next does not,
    the fullest tile of the answer and every size tried."""
    options = capacity_options(options)
    if parameter == "chips":
        if limit < 1:
            raise UsageError("--max-chips must be at least 1")
        result = probe_chips(workload, params, limit, options)
    else:
        result = probe_capacity(workload, params, parameter, limit, options)
    return {RECORD_KEYS[parameter]: result.maximum, "workload": workload.name,
            "reason": result.reason, "fullestTile": result.fullest.get(result.maximum),
            "compiles": len(result.tried) - result.refused, "seconds": round(result.seconds, 1),
            "tried": {str(k): v for k, v in sorted(result.tried.items())}}


__all__ = ["RECORD_KEYS", "CapacityResult", "capacity_options", "capacity_record",
           "fullest_tile", "probe_capacity", "probe_chips"]
