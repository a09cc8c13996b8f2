"""Run a system package: images streamed through its layer groups, on one chip or several.

One coordinator runs any :class:`~ipu_stack.contract.system.SystemProgram` over an engine
(``runtime.engines``: in this process, forked processes, or Ray actors; one worker a chip,
holding only that chip's tile memories and weights).  An image moves from chip to chip as a
message (the chip's output activation, the bytes its device read out of the sending group's
tiles), which is what the IPU-Link carries.  The coordinator routes the messages, hands each
image's probe reads to that image's host side, and judges every image against the float64
model of the whole tower, as a whole-chip run is judged.

**Timing.**  All chips step together: in step ``s`` group ``g`` works on image ``s - g``:
``G - 1`` fill steps, then one image leaves per steady step, then ``G - 1`` drain steps.
Within a chip all tiles sync together, so the groups' supersteps share the chip's
(``device.alignment``: same-kind supersteps side by side, each shared one as long as the
longest), and the step ends with the chip's own hand-off phase; the chips sync with each
other only at the end of the step, where every cable carries its hand-off at once.  So a
step is the slowest chip's step plus the slowest link hand-off, each built from what the
workers executed and what the device prices.  On the IPU the cycles of a superstep do not
depend on the values, so one executed full step gives the period (tested: two data sets
give the same step cycles): the slowest chip's step with all of that chip's groups busy (the
chips couple only through the link phase) plus the link phase.

**Host sides.**  Images in flight are one a chip and one being judged, as far as the host has
cores for their host sides (each holds one image's references): the device goes on to the
next image while the last one's verdict finishes.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from ipu_stack.contract.system import SystemProgram
from ipu_stack.device import HardwareLock
from ipu_stack.device.alignment import chip_step_cycles
from ipu_stack.device.record import StepRecord
from ipu_stack.device.simulator import CallReport
from ipu_stack.ir.graph import Graph, fidelity_values
from ipu_stack.package import Package
from ipu_stack.runtime.engines import (
    ENGINES,
    InProcessEngine,
    LocalEngine,
    RayEngine,
)
from ipu_stack.runtime.groups import (
    check_tower,
    handoff_phase_cycles,
    load_groups,
    read_system,
    tower_gemm_modes,
    verify_handoffs,
)
from ipu_stack.runtime.session import hold_weights
from ipu_stack.target import get_target
from ipu_stack.util.errors import UsageError
from ipu_stack.util.log import event
from ipu_stack.verdict.host_side import start_host_side
from ipu_stack.verdict.judge import Verdict, log_verdict

LOG = logging.getLogger("ipu_stack.runtime")
HOSTS_IN_FLIGHT = 2
"""Host sides judging at once at least (two lanes on two cores)."""


@dataclass
class GroupRun:
    """One group's executed run on one image: its supersteps' cycles."""

    group: int
    image: int
    cycles: int
    supersteps: list[int]
    host_bytes: int
    kinds: list[str]  # compute or exchange, per superstep


@dataclass
class StreamRun:
    """Every image's outputs and verdict, and the step timing built from executed runs."""

    images: int
    groups: int
    chips: int = 1
    engine: str = "inprocess"
    outputs: list[dict[str, np.ndarray]] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    runs: dict[tuple[int, int], GroupRun] = field(default_factory=dict)
    step_cycles: list[int] = field(default_factory=list)
    chip_steps: list[list[int]] = field(default_factory=list)  # chip -> each step's cycles
    chip_handoffs: list[int] = field(default_factory=list)  # each chip's own hand-off phase
    link_cycles: list[int] = field(default_factory=list)
    link_bytes: list[int] = field(default_factory=list)
    worker_peak_bytes: list[int] = field(default_factory=list)
    simulate_seconds: float = 0.0
    verdict_seconds: float = 0.0
    # when recording: each group's superstep records in its chip's first full step
    records: dict[int, list[StepRecord]] = field(default_factory=dict)
    # the largest peak resident memory of the images' host sides (forked processes)
    host_peak_bytes: int = 0
    # a whole-chip run (``run_stream(whole=True)``): every stage's agreement logged when
    # ``per_stage``, fidelity measured against ``source``, each image's reference kept, and
    # the device's own reports of initialize and of each image's run, by (chip, image)
    whole: bool = False
    per_stage: bool = False
    source: str = "float64"
    references: list[Mapping[str, np.ndarray]] = field(default_factory=list)
    initialized: list[list[CallReport]] = field(default_factory=list)
    reports: dict[tuple[int, int], list[CallReport]] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(v.passed for v in self.verdicts)

    @property
    def handoff_cycles(self) -> int:
        """The longest on-chip hand-off phase."""
        return max(self.chip_handoffs, default=0)

    @property
    def chip_full_cycles(self) -> list[int]:
        """Each chip's longest step with all of its groups busy (with fewer images than a
        chip's groups, its longest step from when its last group first works)."""
        per_chip = self.groups // self.chips
        out = []
        for chip, steps in enumerate(self.chip_steps):
            first = chip * per_chip + per_chip - 1  # the step its last group first works
            full = [steps[s] for s in range(len(steps))
                    if all(0 <= s - g < self.images
                           for g in range(chip * per_chip, (chip + 1) * per_chip))]
            out.append(max(full) if full else max(steps[first:] or steps))
        return out

    @property
    def steady_cycles(self) -> int:
        """The period: the slowest chip's full step, then the link phase."""
        return max(self.chip_full_cycles) + max(self.link_cycles, default=0)

    def chip_host_bytes(self, number: int) -> list[int]:
        """The bytes image (or call) ``number`` moves over each chip's host link: each C600
        card has its own PCIe link, carrying its groups' inputs in and outputs out."""
        per_chip = self.groups // self.chips
        moved = [0] * self.chips
        for (group, image), done in self.runs.items():
            if image == number:
                moved[group // per_chip] += done.host_bytes
        return moved

    def judge(self, number: int, host: Any, outputs: dict[str, np.ndarray]
              ) -> tuple[float, Mapping[str, np.ndarray]]:
        """Image ``number``'s verdict from its host side, kept and logged with its
        ``outputs``; the seconds spent waiting for it, and the host's reference."""
        wait = time.perf_counter()
        reference, verdict = host.result()
        self.host_peak_bytes = max(self.host_peak_bytes, getattr(host, "peak_bytes", 0))
        verdict.seconds = time.perf_counter() - wait
        log_verdict(verdict, per_stage=self.per_stage, source=self.source)
        if self.whole:
            self.references.append(reference)
            event(LOG, "numerical verdict", numericalTest="PASS" if verdict.passed else "FAIL",
                  failedParts=",".join(verdict.failed_parts) or "none",
                  elapsed_ms=int(verdict.seconds * 1000))
        else:
            event(LOG, "image judged", image=number,
                  numericalTest="PASS" if verdict.passed else "FAIL",
                  failedParts=",".join(verdict.failed_parts) or "none")
        self.verdicts.append(verdict)
        self.outputs.append(outputs)
        return verdict.seconds, reference


def step_schedule(groups: int, images: int) -> list[list[tuple[int, int]]]:
    """``(group, image)`` pairs busy in each step: fill, steady steps, drain."""
    return [[(g, s - g) for g in range(groups) if 0 <= s - g < images]
            for s in range(images + groups - 1)]


def merged_step(runs: list[GroupRun], handoff: int) -> int:
    """One chip's step as the device times it (``device.alignment``) from its groups'
    executed supersteps, then its hand-off phase."""
    return chip_step_cycles([(r.kinds, r.supersteps) for r in runs], handoff)


def time_steps(run: StreamRun) -> None:
    """Each chip's cycles in each step, and the system's steps (module docstring)."""
    per_chip = run.groups // run.chips
    link = max(run.link_cycles, default=0)
    run.chip_steps = [[0] * (run.images + run.groups - 1) for _ in range(run.chips)]
    run.step_cycles = []
    for s, busy_all in enumerate(step_schedule(run.groups, run.images)):
        slowest, linked = 0, False
        for chip in range(run.chips):
            own = range(chip * per_chip, (chip + 1) * per_chip)
            busy = [pair for pair in busy_all if pair[0] in own]
            if not busy:
                continue
            # the chip's own hand-off phase when a group other than its last was busy
            handoff = run.chip_handoffs[chip] if any(g != own[-1] for g, _ in busy) else 0
            cycles = merged_step([run.runs[p] for p in busy], handoff)
            run.chip_steps[chip][s] = cycles
            slowest = max(slowest, cycles)
            linked |= any(g == own[-1] and chip < run.chips - 1 for g, _ in busy)
        run.step_cycles.append(slowest + (link if linked else 0))


def stream_images(workload: Any, params: dict[str, Any], graph: Graph,
                  tensors: Mapping[str, np.ndarray], count: int) -> list[dict[str, np.ndarray]]:
    """``count`` images as the graph's inputs: the workload's own first, then the workload's
    stream (``Workload.stream_input``: the inputs it varies, a decode step's token ids, with
    the first image's others: its mask, slots and angles), or else the first image's rows in
    a seeded random order (the same values, so exactly representable in the input's
    precision)."""
    first = {v.name: np.asarray(tensors[v.name]) for v in graph.by_role("input")}
    images = [first]
    for index in range(1, count):
        if getattr(workload, "stream_input", None) is not None:
            images.append({**first, **workload.stream_input(params, graph, index)})
            continue
        rng = np.random.default_rng(index)
        shuffled = {}
        for name, values in first.items():
            rows = values.reshape(-1, values.shape[-1])
            shuffled[name] = rows[rng.permutation(rows.shape[0])].reshape(values.shape)
        images.append(shuffled)
    return images


@dataclass(frozen=True)
class RunSettings:
    """How to run: images to stream (``None``: the fewest that fill a step), the engine
    (``None``: in this process on one chip, forked workers over several), superstep records
    for a profile, poison checks, the lock of a shared named device (``None``: a private one;
    ``wait``: take turns), Ray's copy of the package."""

    images: int | None = None
    engine: str | None = None
    record: bool = False
    poison: bool = False
    lock_path: Path | None = None
    wait: bool = True
    send_package: bool = False


Model = Callable[[Graph, dict[str, np.ndarray]], dict[str, np.ndarray]]
"""The outputs fidelity is measured against, by output name (an imported program's: torch's)."""


def prepare_run(package: Package, system: SystemProgram, graph: Graph, images: int,
                engine: str) -> tuple[StreamRun, dict[str, dict]]:
    """Everything checked before a worker starts: the groups' programs against the tower,
    the links as both chips' programs derive them, the hand-offs priced as the device does;
    the run's record to fill and the tower's GEMM modes."""
    target = get_target(package.target)
    described = load_groups(package, system, devices=False)  # programs read, no tile memories
    links = verify_handoffs(system, {g.spec.program: g.package for g in described},
                         target.clock_hz)
    check_tower(described, graph)
    on_chip = [max((handoff_phase_cycles(h) for h in system.handoffs
                    if not h.link and system.groups[h.sender].chip == chip), default=0)
               for chip in range(system.chips)]
    run = StreamRun(images, len(system.groups), system.chips, engine,
                    chip_handoffs=on_chip, link_cycles=[c for c, _ in links],
                    link_bytes=[b for _, b in links], worker_peak_bytes=[0] * system.chips)
    return run, tower_gemm_modes(described)


def start_engine(package: Package, system: SystemProgram, graph: Graph, tensors: Any,
                 settings: RunSettings, engine: str, on_probes: Callable[[int, list], None],
                 whole: bool = False, package_bytes: bytes | None = None
                 ) -> InProcessEngine | LocalEngine | RayEngine:
    """The engine's workers built, their chips loaded and initialised (the weights are
    held before, except for forked workers, which make their own first); ``whole``: a
    whole-chip run, whose device reports are kept."""
    if engine == "local":  # forked before the weights are made: each makes its own
        local = LocalEngine(package, system.chips, tensors, graph, settings.record,
                            settings.poison)
        try:
            hold_weights(graph, tensors)  # the host sides' copy, while the workers load
            local.wait_ready()
        except BaseException:
            local.close()
            raise
        return local
    if engine == "ray":
        return RayEngine(package, system, tensors, package_bytes or b"",
                         settings.record, settings.poison)
    name = f"sim://private-{os.getpid()}" if settings.lock_path is None else \
        f"sim://{settings.lock_path.stem}"
    event(LOG, "opening IPU device", path=name)
    workers = InProcessEngine(package, system, tensors, on_probes, settings.record,
                              settings.poison, whole)
    event(LOG, "application loaded and initial synchronization completed",
          tile_count=system.chip_tiles * system.chips)
    return workers


def run_stream(package: Package, graph: Graph, tensors: Mapping[str, np.ndarray],
               images: list[dict[str, np.ndarray]] | StepFeed,
               settings: RunSettings | None = None, model: Model | None = None,
               whole: bool = False, package_bytes: bytes | None = None) -> StreamRun:
    """Stream ``images`` (each the tower's inputs by name) through the package's system,
    judged against ``model`` (``None``: the float64 model); ``whole``: a whole-chip
    program's run, which keeps its device reports and references."""
    settings = settings or RunSettings()
    system = read_system(package)
    engine = settings.engine or ("inprocess" if system.chips == 1 else "local")
    if engine not in ENGINES:
        raise UsageError(f"--engine {engine!r} is not one of {', '.join(ENGINES)}")
    run, modes = prepare_run(package, system, graph, len(images), engine)
    run.whole, run.source = whole, "float64" if model is None else \
        getattr(model, "source", "torch")
    run.per_stage = whole and bool(package.manifest.get("options", {}).get("diagnostics"))
    owner = nullcontext() if settings.lock_path is None else \
        HardwareLock(settings.lock_path, wait=settings.wait)
    # one BLAS thread in every process (workers and host sides are forked from here): with
    # a process a core already, more threads only spin against each other
    with owner, threadpool_limits(limits=1, user_api="blas"):
        coordinator = Coordinator(run, graph, tensors, images, modes, model)
        if engine != "local":  # a forked worker makes its own chip's weights
            hold_weights(graph, tensors)
        started = time.perf_counter()
        workers = start_engine(package, system, graph, tensors, settings, engine,
                               coordinator.probes, whole, package_bytes)
        if not whole:
            event(LOG, "chips loaded", chips=system.chips, engine=engine,
                  groups=len(system.groups), tile_count=system.chip_tiles * system.chips)
        try:
            coordinator.stream(workers)
        finally:
            workers.close()
        if isinstance(workers, InProcessEngine):
            run.initialized, run.reports = workers.initialized, workers.reports
    run.verdict_seconds = coordinator.waited
    run.simulate_seconds = time.perf_counter() - started - coordinator.waited
    time_steps(run)
    return run


class StepFeed:
    """Calls whose inputs depend on the calls before (decode steps: each step's token is
    the last step's choice, and its state the device's cache after the step before): the
    coordinator runs them one at a time, asking for each call's inputs once the call before
    is judged."""

    def __len__(self) -> int:
        raise NotImplementedError

    def inputs(self, number: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Call ``number``'s device inputs, and the state the host judges it from."""
        raise NotImplementedError

    def probed(self, items: list) -> None:
        """Probe reads of the running call, ``(tensor, values)``."""
        raise NotImplementedError

    def judged(self, number: int, outputs: dict[str, np.ndarray],
               reference: Mapping[str, np.ndarray]) -> None:
        """Call ``number`` judged: the device's outputs and the host's reference."""
        raise NotImplementedError


class Coordinator:
    """The one run loop: images let into chip 0 as far as host sides may be in flight,
    each chip's output sent on to the next chip, every image judged in order."""

    def __init__(self, run: StreamRun, graph: Graph, tensors: Mapping[str, Any],
                 images: list[dict[str, np.ndarray]] | StepFeed, modes: dict[str, dict],
                 model: Callable[[Graph, dict[str, np.ndarray]], dict[str, np.ndarray]] | None
                 ) -> None:
        self.run, self.graph, self.images, self.modes, self.model = \
            run, graph, images, modes, model
        self.outputs_only = set(fidelity_values(graph).values())
        self.tensors = tensors
        self.weights: dict[str, Any] | None = None  # taken once the weights are held
        self.hosts: dict[int, Any] = {}
        self.admitted: dict[int, list[tuple[str, Any]]] = {}  # inputs of images in flight
        self.finished: dict[int, dict[str, np.ndarray]] = {}
        self.waited = 0.0
        self.judged = 0
        self.in_flight = min(run.chips + 1, max(HOSTS_IN_FLIGHT, (os.cpu_count() or 1) // 2))
        if isinstance(images, StepFeed):  # each call's inputs wait for the call before
            self.in_flight = 1

    def probes(self, number: int, items: list) -> None:
        """Probe reads of image ``number`` for its host side (and for a feed, which keeps
        the device's state for the next call's verdict)."""
        if isinstance(self.images, StepFeed):
            self.images.probed(items)
        self.hosts[number].put(items)

    def judge_next(self) -> None:
        number = self.judged
        outputs = self.finished.pop(number)
        seconds, reference = self.run.judge(number, self.hosts.pop(number), outputs)
        self.waited += seconds
        if isinstance(self.images, StepFeed):
            self.images.judged(number, outputs, reference)
        self.judged += 1

    def admit(self, number: int) -> list[tuple[str, Any]]:
        """Image ``number`` let in: its host side started; its inputs for chip 0 (a
        :class:`StepFeed` makes them from the calls before, with the host's state)."""
        if self.weights is None:
            self.weights = {v.name: self.tensors[v.name] for v in self.graph.by_role("weight")}
        if isinstance(self.images, StepFeed):
            image, state = self.images.inputs(number)
        else:
            image, state = self.images[number], {}
        own = {**self.weights, **state, **image}
        self.hosts[number] = start_host_side(self.graph, own, self.modes, self.outputs_only,
                                             self.model)
        if self.run.chips > 1:
            self.admitted[number] = list(image.items())
        return list(image.items())

    def done(self, chip: int, number: int, header: dict[str, Any],
             arrived: list[tuple[str, Any]]) -> bool:
        """A chip finished image ``number``: its groups' runs kept, its output handed to
        the host side (the next chip's first stage is judged on it); True when the image
        has left the last chip."""
        run = self.run
        for done in header["runs"]:
            if "records" in done:  # the chip's profiled step
                run.records[int(done["group"])] = [StepRecord.from_json(r)
                                                   for r in done["records"]]
            run.runs[(int(done["group"]), number)] = GroupRun(
                int(done["group"]), number, int(done["cycles"]), list(done["supersteps"]),
                int(done["host_bytes"]), list(done["kinds"]))
        self.hosts[number].put(arrived)
        if chip < run.chips - 1:
            return False
        self.hosts[number].put(None)
        self.finished[number] = {k: np.asarray(v) for k, v in arrived}
        self.admitted.pop(number, None)
        return True

    def stream(self, workers: Any) -> None:
        """Every image through every chip and judged (a failure abandons the host sides)."""
        chips = self.run.chips
        queues: list[deque] = [deque() for _ in range(chips)]
        queues[0].extend(range(len(self.images)))
        carried: dict[int, list[tuple[str, Any]]] = {}
        busy: list[int | None] = [None] * chips
        try:
            while self.judged < len(self.images):
                for chip in range(chips):
                    if busy[chip] is not None or not queues[chip] or (
                            chip == 0 and len(self.hosts) >= self.in_flight):
                        continue
                    number = queues[chip].popleft()
                    if chip == 0:
                        carried[number] = self.admit(number)
                    workers.submit(chip, number, carried.pop(number))
                    busy[chip] = number
                if all(b is None for b in busy):  # every image let in has left
                    self.judge_next()
                    continue
                chip, header, arrived = workers.next()
                number = int(header["image"])
                self.run.worker_peak_bytes[chip] = max(self.run.worker_peak_bytes[chip],
                                                       int(header.get("peak", 0)))
                if header["op"] == "probes":
                    self.probes(number, arrived)
                    continue
                busy[chip] = None
                if not self.done(chip, number, header, arrived):
                    # the next chip's groups read the hand-off, and the host's inputs
                    carried[number] = arrived + self.admitted[number]
                    queues[chip + 1].append(number)
                    continue
                while self.judged in self.finished and len(self.hosts) >= self.in_flight:
                    self.judge_next()
        except BaseException:
            for host in self.hosts.values():
                host.abandon()
            raise


__all__ = ["GroupRun", "Model", "RunSettings", "StepFeed", "StreamRun", "merged_step",
           "run_stream", "step_schedule", "stream_images", "time_steps"]
