"""Compile options (frozen: their key and their package record come from their fields'
marks) and the record the stages fill.

Each stage of ``pipeline.STAGES`` reads fields earlier stages set and sets its own; the
record is the written contract between them (Triton-style: a stage's artifact is a field,
and every field has one writer).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import Field, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from ipu_stack.contract import DeviceProgram
from ipu_stack.exchange import Schedule, ScheduleMemo
from ipu_stack.ir.graph import Graph
from ipu_stack.kernels.base import KernelInstance
from ipu_stack.lowering.fuse import NEIGHBOUR_WINDOW
from ipu_stack.lowering.program import Program
from ipu_stack.memory.placement import Placement
from ipu_stack.planning.fit import SUPPORT_RESERVE, MemoryBudget, planned_cycles
from ipu_stack.planning.gemm import GemmPlan
from ipu_stack.planning.repeat import LayerLoop
from ipu_stack.planning.stages import Stage
from ipu_stack.target import Target, get_target
from ipu_stack.util.cache import default_cache_dir
from ipu_stack.workloads.base import Workload

# How a compile option reaches the package, read from its field's metadata under ``ROLE``.
# Unmarked fields are RECORDED, so that a new option changes the options key (and shows in
# the package) unless someone decides, by marking it, that it cannot change a package byte.
ROLE = "ipu_stack.option"
RECORDED = "recorded"  # in the key and in the package's options record
WHEN_SET = "when_set"  # in the key; in the record only when it differs from its default
IMPLIED = "implied"  # in the key, not in the record: what it chose is recorded elsewhere
INERT = "inert"  # changes no byte of the package: in neither
KEYED = (RECORDED, WHEN_SET, IMPLIED)


def role(option: Field[Any]) -> str:
    """How ``option`` (a field of :class:`CompileOptions`) reaches the package."""
    return str(option.metadata.get(ROLE, RECORDED))


def _marked(default: Any, how: str) -> Any:
    return field(default=default, metadata={ROLE: how})


GEMM_MODES = ("auto", "fp8", "f16")  # CompileOptions.gemm_mode: the planner picks, or one
STRATEGIES = ("layers", "pipeline", "auto")  # CompileOptions.strategy


@dataclass(frozen=True)
class CompileOptions:
    """Frozen compile options.  Each field's role (``ROLE`` in its metadata) says whether it
    is in :meth:`key` and in the package's options record (:meth:`to_json`): both are
    derived from the marks, so an option cannot be left out of one by hand."""

    target: str = "ipu21"
    finalists: int = 3
    cache_dir: str | None = _marked(str(default_cache_dir()), INERT)  # calibrations, schedules
    diagnostics: bool = False
    memory_proportion: float = 1.0  # retried lower when placement fails
    # a tile's bytes left out of the plan for support memory (code, exchange tables, carried
    # activations): assumed at first, then the compile's own placement measures it
    support_reserve: int = _marked(SUPPORT_RESERVE, WHEN_SET)
    # interleaved bytes left out of the plan: placement found that a tile's weights and
    # partials need more of it than the planner's per-plan fullest tiles add up to
    interleaved_reserve: int = _marked(0, WHEN_SET)
    # GEMMs of more rows than this take column blocks two AMP column groups wide at least
    # (fewer, larger transfers: smaller exchange tables), and all-gathers among many tiles
    # stay multicasts (one send a slice); 0: any width, unicast gathers.  Set by the second
    # chain of tries of a compile whose plans did not place (pipeline.Tries.leaner)
    lean_table_rows: int = _marked(0, WHEN_SET)
    # tile pairs share an exchange bus: a broadcast to whole pairs moves two words a cycle
    # (the vendor's and the reference's production width selection, hardware-replayed;
    # docs/machine.md).  On by default; off (``--no-paired-exchange``) for one-lane phases
    paired_exchange: bool = True
    # a decode step runs its independent stages side by side (``lowering.fuse``); off
    # (``--no-fuse-supersteps``) for one stage after another, and every program unfused
    fuse_supersteps: bool = _marked(True, WHEN_SET)
    # any other program fuses a step with the last few supersteps (``lowering.fuse``); 0
    # where that program did not place (``pipeline.Attempts``)
    fuse_window: int = _marked(NEIGHBOUR_WINDOW, WHEN_SET)
    gemm_mode: str = "auto"  # auto (the planner picks per stage), fp8 or f16
    share_layers: bool = True  # identical consecutive layers run as one loop body
    tiles: int = _marked(0, WHEN_SET)  # plan for this many of the chip's tiles; 0: all
    # how strategy.compile_strategy compiles: layers, pipeline or auto, and a pipeline's
    # group count (0: the planner's choice); --strategy and --groups, or a sweep's axes
    strategy: str = _marked("layers", WHEN_SET)
    groups: int = _marked(0, WHEN_SET)
    chips: int = _marked(1, WHEN_SET)  # C600 cards in a line (--chips)
    # plan a placed program again for the room it left (pipeline._into_slack); off where only
    # whether it fits matters (capacity probes).  A package planned so records its reserve,
    # so the flag itself is not recorded, though it does change the package.
    slack: bool = _marked(True, IMPLIED)
    # a reused or cached schedule is the one scheduling gives
    reuse_schedules: bool = _marked(True, INERT)
    exchange_cache: bool = _marked(False, INERT)  # also keep schedules under cache_dir/exchange
    dump_stages: str | None = _marked(None, INERT)  # each stage's artifact here (phases/dump.py)
    # check the lowered program and the placement between stages (also when the environment
    # sets IPU_STACK_VERIFY_STAGES=1): they only raise, never change what is built
    verify_stages: bool = _marked(False, INERT)

    def machine(self) -> Target:
        """The machine the planner plans for: the target, or ``tiles`` of its tiles."""
        target = get_target(self.target)
        return target.with_tiles(self.tiles) if self.tiles else target

    def to_json(self) -> dict[str, Any]:
        """The package's options record: what a run reads back (``diagnostics``) and what a
        reader needs to know how the package was planned."""
        record = {}
        for option in fields(self):
            value = getattr(self, option.name)
            how = role(option)
            if how == RECORDED or (how == WHEN_SET and value != option.default):
                record[option.name] = value
        return record

    def key(self) -> str:
        """sha256 of the canonical JSON of every option that can change the package: equal
        keys, equal packages for the same workload and compiler.  Numbers are compared as
        their field's type, so ``memory_proportion=1`` and ``1.0`` are one key."""
        keyed = {option.name: _canonical(option, getattr(self, option.name))
                 for option in fields(self) if role(option) in KEYED}
        text = json.dumps(keyed, sort_keys=True, separators=(",", ":"), allow_nan=False)
        return hashlib.sha256(text.encode()).hexdigest()


def _canonical(option: Field[Any], value: Any) -> Any:
    if option.type == "float" and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return value


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


@dataclass(frozen=True)
class Planned:
    """What planning hands lowering: the finalist plan sets (one plan per planned stage,
    None for a row stage) that fit ``budget``, and how often each stage runs.  Enough to
    price the plans analytically, which is all a choice between layouts or memory shares
    needs before anything is lowered."""

    finalists: tuple[tuple[GemmPlan | None, ...], ...]
    budget: MemoryBudget
    traded: int  # moves to leaner plans the fitter made to fit the budget, all finalists
    repeats: tuple[int, ...]  # how many times each planned stage runs

    def cycles(self, finalist: int) -> int:
        """The analytical GEMM cycles of finalist ``finalist``."""
        return planned_cycles(list(self.finalists[finalist]), list(self.repeats))

    def best_cycles(self) -> int:
        """The best finalist's analytical GEMM cycles."""
        return min(self.cycles(i) for i in range(len(self.finalists)))


@dataclass(frozen=True)
class Placed:
    """What lowering and placement hand emission: the chosen finalist's program, its
    exchange schedules and refined estimate, the support memory and the buffer addresses.
    Nothing of it is written yet, so a placed program can still be set aside for a better
    one (``pipeline._into_slack``)."""

    plans: tuple[GemmPlan | None, ...]
    program: Program
    schedules: Mapping[int, Schedule]
    estimate: Mapping[str, int]
    support: Mapping[str, np.ndarray]
    placement: Placement

    @property
    def peak_bytes(self) -> int:
        """The fullest tile's bytes: support plus the most live at one step."""
        return int(self.placement.peak_bytes.max())


@dataclass(frozen=True)
class Emitted:
    """What emission leaves: the written package and the device program it holds."""

    package: Path
    device_program: DeviceProgram


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
    # each exchange phase's table bytes per tile, by the phase's name
    table_phases: list[tuple[str, np.ndarray]] = field(default_factory=list)
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
