"""Compile options (frozen: their JSON goes into the package) and the record the stages fill.

Each stage of ``pipeline.STAGES`` reads fields earlier stages set and sets its own; the
record is the written contract between them (Triton-style: a stage's artifact is a field,
and every field has one writer).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ipu_stack.contract import DeviceProgram
from ipu_stack.exchange import Schedule, ScheduleMemo
from ipu_stack.ir.graph import Graph
from ipu_stack.kernels.base import KernelInstance
from ipu_stack.lowering.program import Program
from ipu_stack.memory.placement import Placement
from ipu_stack.planning.fit import SUPPORT_RESERVE, MemoryBudget
from ipu_stack.planning.gemm import GemmPlan
from ipu_stack.planning.repeat import LayerLoop
from ipu_stack.planning.stages import Stage
from ipu_stack.target import Target, get_target
from ipu_stack.util.cache import default_cache_dir
from ipu_stack.workloads.base import Workload


@dataclass(frozen=True)
class CompileOptions:
    """Frozen compile options; their JSON is recorded in the package."""

    target: str = "ipu21"
    finalists: int = 3
    cache_dir: str | None = str(default_cache_dir())
    diagnostics: bool = False
    memory_proportion: float = 1.0  # retried lower when placement fails
    # a tile's bytes left out of the plan for support memory (code, exchange tables, carried
    # activations): assumed at first, then the compile's own placement measures it
    support_reserve: int = SUPPORT_RESERVE
    # tile pairs share an exchange bus: a broadcast to whole pairs moves two words a cycle
    # (the vendor's and the reference's production width selection, hardware-replayed;
    # docs/machine.md).  On by default; off (``--no-paired-exchange``) for one-lane phases
    paired_exchange: bool = True
    gemm_mode: str = "auto"  # auto (the planner picks per stage), fp8 or f16
    share_layers: bool = True  # identical consecutive layers run as one loop body
    tiles: int = 0  # plan for this many of the chip's tiles (a pipeline group); 0: all
    # how strategy.compile_strategy compiles: layers, pipeline or auto, and a pipeline's
    # group count (0: the planner's choice); --strategy and --groups, or a sweep's axes
    strategy: str = "layers"
    groups: int = 0
    chips: int = 1  # C600 cards in a line (--chips): the pipeline's groups over all of them
    # plan a placed program again for the room it left (pipeline._into_slack); off where only
    # whether it fits matters (capacity probes).  A package planned so records its reserve,
    # so the flag itself is not recorded.
    slack: bool = True
    # Neither changes the package (a reused or cached schedule is the one scheduling gives),
    # so neither is recorded in it.
    reuse_schedules: bool = True
    exchange_cache: bool = False  # also keep schedules on disk under cache_dir/exchange
    dump_stages: str | None = None  # write each stage's artifact here (phases/dump.py)

    def machine(self) -> Target:
        """The machine the planner plans for: the target, or ``tiles`` of its tiles."""
        target = get_target(self.target)
        return target.with_tiles(self.tiles) if self.tiles else target

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "finalists": self.finalists,
                "diagnostics": self.diagnostics, "memory_proportion": self.memory_proportion,
                "paired_exchange": self.paired_exchange, "gemm_mode": self.gemm_mode,
                "share_layers": self.share_layers,
                **({"tiles": self.tiles} if self.tiles else {}),
                **({"support_reserve": self.support_reserve}
                   if self.support_reserve != SUPPORT_RESERVE else {}),
                **({"strategy": self.strategy} if self.strategy != "layers" else {}),
                **({"groups": self.groups} if self.groups else {}),
                **({"chips": self.chips} if self.chips > 1 else {})}


@dataclass
class CompileResult:
    package: Path
    graph: Graph
    tensors: dict[str, np.ndarray]
    estimate: dict[str, int]
    timings: dict[str, float] = field(default_factory=dict)
    plans: list[str] = field(default_factory=list)
    body_plans: list[str] = field(default_factory=list)  # the layer loop body's, in order
    peak_bytes: int = 0
    active_tiles: int = 0
    device_program: DeviceProgram | None = None  # what the package holds, typed
    # the run program's supersteps as the planner prices them, in order (kind, cycles,
    # name): what a pipeline's step estimate merges (``phases.costing.superstep_estimates``)
    superstep_kinds: list[str] = field(default_factory=list)
    superstep_cycles: list[int] = field(default_factory=list)
    superstep_names: list[str] = field(default_factory=list)


@dataclass
class Build:
    """One compile attempt: its inputs, then each stage's artifact, in stage order."""

    workload: Workload
    params: dict[str, Any]
    out_dir: Path
    options: CompileOptions
    target: Target
    memo: ScheduleMemo | None
    # the workload's graph and tensors, kept by ``compile_workload`` across placement
    # retries (building a 27-layer tower's weights again would cost tens of seconds)
    prepared: dict[str, Any] = field(default_factory=dict)
    # the layer loop body's GEMM plans to take (``Plan.describe()``, in body order), so that
    # this program's layers run superstep for superstep beside another's (pipeline groups)
    body_hints: tuple[str, ...] = ()
    # construct_mid
    graph: Graph | None = None
    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    stages: list[Stage] = field(default_factory=list)  # compact: one pass of a layer loop
    all_stages: list[Stage] = field(default_factory=list)
    loop: LayerLoop | None = None
    candidates: list[list[GemmPlan | None]] = field(default_factory=list)
    fronts: list[list[GemmPlan]] = field(default_factory=list)
    # lower_mid
    finalists: list[list[GemmPlan | None]] = field(default_factory=list)
    budget: MemoryBudget | None = None  # what the fitter planned the finalists for
    traded: int = 0  # moves to leaner plans the fitter made to fit the budget, all finalists
    # select_finalist
    plans: list[GemmPlan | None] = field(default_factory=list)
    program: Program | None = None
    schedules: dict[int, Schedule] = field(default_factory=dict)
    estimate: dict[str, int] = field(default_factory=dict)
    # plan_kernels
    instances: list[KernelInstance] = field(default_factory=list)
    # size_tile_code
    support: dict[str, np.ndarray] = field(default_factory=dict)
    # place_storage
    placement: Placement | None = None
    waste: dict[str, float] = field(default_factory=dict)
    filled: dict[str, int] = field(default_factory=dict)  # peak (or failing) tile by category
    # write_memory_reports
    profile: dict[str, Any] = field(default_factory=dict)
    # emit_tile_code
    device_program: DeviceProgram | None = None
    fragment: dict[str, Any] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    # write_package
    package: Path | None = None

    @property
    def reports(self) -> Path:
        return Path(self.out_dir) / "memory"
