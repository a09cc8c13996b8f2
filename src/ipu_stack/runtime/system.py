"""Run a pipeline over several chips: each chip simulated in a worker of its own.

The package is a pipeline package whose groups are spread over ``chips`` cards: chip ``c``
holds groups ``[c G, (c + 1) G)`` on its own tiles.  Each chip's worker
(``runtime.chip_worker``) holds only that chip's tile memories and weights; an image moves
from worker to worker as a message (the chip's output activation, the bytes its device
read out of the sending group's tiles), which is what the IPU-Link carries.  The
coordinator (this module) routes the messages, hands each image's probe reads to that
image's host side, and judges every image against the float64 model of the whole tower,
as a one-chip pipeline does.

**Engines.**  ``local`` forks one process per chip before any weight is made (each makes
its own chip's, and talks over pipes); ``ray`` starts one Ray actor per chip, on a cluster or
a local Ray, and sends each its own weights.  The same packages run on the same simulated
devices either way, so the cycles are the same (tested).  A worker that dies is reported
by chip, never waited on.

**Timing.**  All chips step together: in step ``s`` group ``g`` works on image ``s - g``.
Within a chip the groups' supersteps share the chip's syncs (``runtime.alignment``) and the
step ends with the chip's own hand-off phase; the chips sync with each other only at the end
of the step, where every cable carries its hand-off at once.  So a step is the slowest
chip's step plus the slowest link hand-off, each built from what the workers executed and
what the device prices (``device.pricing.link_cycles``).  The period is the slowest chip's
step with all of that chip's groups busy (the chips couple only through the link phase,
so each chip's full step is an executed step even where the stream is too short to fill
every chip at once) plus the link phase.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from ipu_stack.contract import from_manifest
from ipu_stack.contract.handoff import handoff_transfers, same_transfers
from ipu_stack.device.pricing import link_cycles
from ipu_stack.device.record import StepRecord
from ipu_stack.exchange import Transfers
from ipu_stack.ir.graph import Graph
from ipu_stack.package import Package, read_package_bytes
from ipu_stack.runtime.alignment import merge
from ipu_stack.runtime.chip_worker import (
    ChipWorker,
    Wire,
    chip_weights,
    decode,
    encode,
    peak_rss,
    receive,
    send,
    serve,
)
from ipu_stack.runtime.host_process import HostProcess, fork_available
from ipu_stack.runtime.pipelined import (
    HOSTS_IN_FLIGHT,
    GroupRun,
    PipelineRun,
    _check_tower,
    _load_groups,
    group_programs,
    handoff_phase_cycles,
    package_chips,
    pipeline_fields,
    run_pipeline,
    tower_gemm_modes,
)
from ipu_stack.runtime.session import _host_side, _HostThread, hold_weights
from ipu_stack.target import get_target
from ipu_stack.util.errors import DeviceError, PackageError, UsageError
from ipu_stack.util.log import event

LOG = logging.getLogger("ipu_stack.runtime")
ENGINES = ("local", "ray")


class WorkerFailed(DeviceError):
    """A chip's worker died or failed (one line naming the chip)."""


@dataclass
class SystemRun(PipelineRun):
    """A pipelined run over several chips: the one-chip record plus the chips' part."""

    chips: int = 1
    engine: str = "local"
    chip_steps: list[list[int]] = field(default_factory=list)  # chip -> each step's cycles
    chip_handoffs: list[int] = field(default_factory=list)  # each chip's own hand-off
    link_cycles: list[int] = field(default_factory=list)
    link_bytes: list[int] = field(default_factory=list)
    worker_peak_bytes: list[int] = field(default_factory=list)

    @property
    def chip_full_cycles(self) -> list[int]:
        """Each chip's longest step with all of its groups busy."""
        per_chip = self.groups // self.chips
        out = []
        for chip, steps in enumerate(self.chip_steps):
            first = chip * per_chip + per_chip - 1  # step its last group first works
            full = [steps[s] for s in range(len(steps))
                    if all(0 <= s - g < self.images
                           for g in range(chip * per_chip, (chip + 1) * per_chip))]
            out.append(max(full) if full else max(steps[first:] or steps))
        return out

    @property
    def steady_cycles(self) -> int:
        return max(self.chip_full_cycles) + max(self.link_cycles, default=0)


# ---------------------------------------------------------------- checks on the package
def verify_links(package: Package, programs: dict[int, Package] | None = None
                 ) -> list[tuple[int, int]]:
    """Every hand-off over a link, derived again from the two chips' programs, is the
    package's (the same transfers in the same order, the same bytes): the chips agree on
    what crosses.  Returns each link's ``(cycles, bytes)`` as the device prices it
    (``programs``: the group programs by slot, when already read)."""
    pipeline = package.manifest["pipeline"]
    records = {int(r["index"]): r for r in pipeline["groups"]}
    programs = group_programs(package) if programs is None else programs
    priced = []
    for handoff in pipeline["handoffs"]:
        if not handoff.get("link"):
            continue
        sender, receiver = records[int(handoff["from"])], records[int(handoff["to"])]
        where = (f"hand-off of {handoff['tensor']} from chip {handoff['from_chip']} to chip "
                 f"{handoff['to_chip']}")
        local = []
        for record, name in ((sender, sender["output"]), (receiver, receiver["input"])):
            renamed = {str(v): str(k) for k, v in (record.get("names") or {}).items()}
            local.append(renamed.get(str(name), str(name)))
        send_program = programs[int(sender["program"])]
        receive_program = programs[int(receiver["program"])]
        derived, nbytes = handoff_transfers(
            from_manifest(send_program.manifest, send_program.arrays), local[0],
            from_manifest(receive_program.manifest, receive_program.arrays), local[1],
            int(sender["tile_base"]), int(receiver["tile_base"]),
            int(pipeline["chip_tiles"]))
        a = package.arrays
        prefix = f"handoff.{int(handoff['from'])}."
        try:
            stored = Transfers(int(pipeline["chip_tiles"]), a[prefix + "src_tile"],
                               a[prefix + "dst_offsets"], a[prefix + "dst_tile"],
                               a[prefix + "words"])
        except KeyError as missing:
            raise PackageError(f"{where}: the package lacks {missing}") from None
        if nbytes != int(handoff["bytes"]):
            raise PackageError(f"{where}: the programs move {nbytes} bytes, the package "
                               f"says {handoff['bytes']}")
        if not same_transfers(derived, stored):
            raise PackageError(f"{where}: the chips' programs disagree with the package on "
                               "its blocks or their order")
        priced.append(link_cycles(stored.src, stored.dst_offsets, stored.dst, stored.words,
                                  get_target(package.target).clock_hz))
    return priced


# ------------------------------------------------------------------------------ engines
class LocalEngine:
    """One forked process a chip, pipes to the coordinator."""

    def __init__(self, package: Package, chips: int, tensors: Mapping[str, Any],
                 graph: Graph, record: bool = False) -> None:
        if not fork_available():
            raise UsageError("--engine local needs fork (use --engine ray)")
        context = multiprocessing.get_context("fork")
        self.conns, self.processes = [], []
        for chip in range(chips):
            parent, child = context.Pipe()
            process = context.Process(target=serve, name=f"ipu-chip{chip}",
                                      args=(child, package, chip, tensors, graph, record),
                                      daemon=True)
            process.start()
            child.close()
            self.conns.append(parent)
            self.processes.append(process)

    def wait_ready(self) -> None:
        """Every chip built and loaded (before the first image)."""
        for chip in range(len(self.conns)):
            header, _ = self._receive(chip)
            if header["op"] != "ready":
                raise WorkerFailed(f"chip {chip}'s worker did not start: {header}")

    def _failed(self, chip: int) -> WorkerFailed:
        process = self.processes[chip]
        process.join(timeout=5)
        return WorkerFailed(f"chip {chip}'s worker died (exit code {process.exitcode})")

    def _receive(self, chip: int) -> tuple[dict[str, Any], Wire]:
        try:
            header, wire = receive(self.conns[chip])
        except (EOFError, OSError):
            raise self._failed(chip) from None
        if header["op"] == "error":
            raise WorkerFailed(f"chip {chip}: {header['message']}")
        return header, wire

    def submit(self, chip: int, number: int, inputs: list[tuple[str, Any]]) -> None:
        send(self.conns[chip], {"op": "run", "image": number}, encode(inputs))

    def next(self) -> tuple[int, dict[str, Any], Wire]:
        """The next message from any worker (a dead worker is an error naming its chip)."""
        sentinels = {p.sentinel: chip for chip, p in enumerate(self.processes)}
        ready = wait(self.conns + list(sentinels))
        for item in ready:
            if item in self.conns:
                chip = self.conns.index(item)
                header, wire = self._receive(chip)
                return chip, header, wire
        chip = sentinels[ready[0]]
        raise self._failed(chip)

    def close(self) -> None:
        for conn, process in zip(self.conns, self.processes, strict=True):
            try:
                send(conn, {"op": "stop"})
            except OSError:
                pass
            process.join(timeout=10)
            if process.is_alive():
                process.kill()


class _RayChip:
    """A Ray actor's body: one chip's worker, arrays in the wire form both ways."""

    def __init__(self, package_bytes: bytes, chip: int, weights: Wire,
                 record: bool = False) -> None:
        package = read_package_bytes("system package", package_bytes)
        threadpool_limits(limits=1, user_api="blas")  # a process a chip, one core each
        self.worker = ChipWorker(package, chip, dict(decode(weights)), record)

    def run(self, number: int, inputs: Wire) -> tuple[int, list[Wire], Wire, list, int]:
        probes: list[Wire] = []
        outputs, runs = self.worker.run(dict(decode(inputs)),
                                        lambda items: probes.append(encode(items)), number)
        return number, probes, encode(list(outputs.items())), runs, peak_rss()


class RayEngine:
    """One Ray actor a chip (``ray.init()`` joins a cluster named by ``RAY_ADDRESS`` or
    starts a local one)."""

    def __init__(self, package: Package, chips: int, tensors: Mapping[str, Any],
                 package_bytes: bytes, record: bool = False) -> None:
        try:
            import ray
        except ImportError:
            raise UsageError("--engine ray needs Ray: pip install 'ipu-stack[ray]'") from None
        self.ray = ray
        if not ray.is_initialized():
            ray.init(log_to_driver=False, include_dashboard=False)
        actor = ray.remote(num_cpus=0)(_RayChip)
        self.actors = [actor.remote(package_bytes, chip,
                                    encode(list(chip_weights(package, chip, tensors).items())),
                                    record)
                       for chip in range(chips)]
        self.pending: dict[Any, int] = {}
        self.queue: deque = deque()

    def submit(self, chip: int, number: int, inputs: list[tuple[str, Any]]) -> None:
        self.pending[self.actors[chip].run.remote(number, encode(inputs))] = chip

    def next(self) -> tuple[int, dict[str, Any], Wire]:
        if self.queue:
            return self.queue.popleft()
        ready, _ = self.ray.wait(list(self.pending), num_returns=1)
        chip = self.pending.pop(ready[0])
        try:
            number, probes, outputs, runs, peak = self.ray.get(ready[0])
        except self.ray.exceptions.RayActorError as died:
            raise WorkerFailed(f"chip {chip}'s Ray actor died: "
                               f"{str(died).splitlines()[0]}") from None
        except self.ray.exceptions.RayTaskError as failed:
            cause = failed.cause if getattr(failed, "cause", None) is not None else failed
            raise WorkerFailed(f"chip {chip}: {str(cause).splitlines()[-1]}") from None
        for wire in probes:
            self.queue.append((chip, {"op": "probes", "image": number}, wire))
        self.queue.append((chip, {"op": "done", "image": number, "runs": runs, "peak": peak},
                           outputs))
        return self.queue.popleft()

    def close(self) -> None:
        for actor in self.actors:
            self.ray.kill(actor)


# --------------------------------------------------------------------------- the run
def _chip_steps(run: SystemRun) -> None:
    """Each chip's cycles in each step, and the system's steps (module docstring)."""
    per_chip = run.groups // run.chips
    steps = run.images + run.groups - 1
    link = max(run.link_cycles, default=0)
    run.chip_steps = [[0] * steps for _ in range(run.chips)]
    for s in range(steps):
        slowest, linked = 0, False
        for chip in range(run.chips):
            own = range(chip * per_chip, (chip + 1) * per_chip)
            busy = [(g, s - g) for g in own if 0 <= s - g < run.images]
            if not busy:
                continue
            cycles = merge([(run.runs[p].kinds, run.runs[p].supersteps) for p in busy]).total
            if any(g != own[-1] for g, _ in busy):  # the chip's own hand-off phase
                cycles += run.chip_handoffs[chip]
            run.chip_steps[chip][s] = cycles
            slowest = max(slowest, cycles)
            linked |= any(g == own[-1] and chip < run.chips - 1 for g, _ in busy)
        run.step_cycles.append(slowest + (link if linked else 0))


def run_system(package: Package, graph: Graph, tensors: Mapping[str, np.ndarray],
               images: list[dict[str, np.ndarray]], engine: str = "local",
               package_bytes: bytes | None = None, record: bool = False) -> SystemRun:
    """Stream ``images`` through a pipeline spread over the package's chips, one worker a
    chip (``engine``: ``local`` or ``ray``; Ray is sent ``package_bytes``; ``record``: keep
    the superstep records of each chip's first full step, for a profile)."""
    if engine not in ENGINES:
        raise UsageError(f"--engine {engine!r} is not one of {', '.join(ENGINES)}")
    pipeline = package.manifest["pipeline"]
    chips = package_chips(package)
    groups = len(pipeline["groups"])
    target = get_target(package.target)
    described = _load_groups(package, devices=False)  # programs read, no tile memories
    links = verify_links(package, {int(g.record["program"]): g.package for g in described})
    # the chips' own hand-off phases, verified and priced as the device does
    on_chip: dict[int, int] = {}
    for record in pipeline["handoffs"]:
        if not record.get("link"):
            chip = int(pipeline["groups"][int(record["from"])].get("chip", 0))
            on_chip[chip] = max(on_chip.get(chip, 0),
                                handoff_phase_cycles(package, record, target.tiles))
    _check_tower(described, graph)  # before any worker starts
    modes = tower_gemm_modes(described)
    result = SystemRun(len(images), groups, [], [], {}, sorted(on_chip.values()),
                       chips=chips, engine=engine,
                       link_cycles=[c for c, _ in links], link_bytes=[b for _, b in links],
                       worker_peak_bytes=[0] * chips,
                       chip_handoffs=[on_chip.get(chip, 0) for chip in range(chips)])
    # one BLAS thread in every process (workers and host sides are forked from here): with
    # a process a core already, more threads only spin against each other
    limits = threadpool_limits(limits=1, user_api="blas")
    started = time.perf_counter()
    local: LocalEngine | None = None
    try:
        if engine == "local":  # forked before the weights are made: each makes its own
            local = LocalEngine(package, chips, tensors, graph, record)
            workers: LocalEngine | RayEngine = local
            hold_weights(graph, tensors)  # the host sides' copy, while the workers load
            local.wait_ready()
        else:
            hold_weights(graph, tensors)
            workers = RayEngine(package, chips, tensors, package_bytes or b"", record)
    except BaseException:
        if local is not None:
            local.close()
        limits.restore_original_limits()
        raise
    event(LOG, "chips loaded", chips=chips, engine=engine, groups=groups,
          tile_count=target.tiles * chips)
    outputs_only = {v.name for v in graph.by_role("output")}
    weights = {v.name: tensors[v.name] for v in graph.by_role("weight")}
    hosts: dict[int, Any] = {}
    carried: dict[int, list[tuple[str, Any]]] = {}
    queues = [deque() for _ in range(chips)]
    queues[0].extend(range(len(images)))
    busy: list[int | None] = [None] * chips
    finished: dict[int, dict[str, np.ndarray]] = {}
    waited = 0.0

    def judge(number: int) -> None:
        nonlocal waited
        waited += result.judge(number, hosts.pop(number), finished.pop(number))

    # images in flight: one a chip and one being judged, as far as the host has cores for
    # their host sides (each holds one image's references: gigabytes for a giant tower)
    in_flight = min(chips + 1, max(HOSTS_IN_FLIGHT, (os.cpu_count() or 1) // 2))
    judged = 0
    try:
        while judged < len(images):
            for chip in range(chips):
                if busy[chip] is not None or not queues[chip]:
                    continue
                if chip == 0 and len(hosts) >= in_flight:
                    continue  # enough images in flight (each holds a host side)
                number = queues[chip].popleft()
                if chip == 0:
                    own = {**weights, **images[number]}
                    hosts[number] = (HostProcess(_host_side, graph, own, modes, outputs_only)
                                     if fork_available() else
                                     _HostThread(graph, own, modes, None, outputs_only))
                    carried[number] = list(images[number].items())
                workers.submit(chip, number, carried.pop(number))
                busy[chip] = number
            if all(b is None for b in busy):  # every image let in has left the last chip
                judge(judged)
                judged += 1
                continue
            chip, header, wire = workers.next()
            number = int(header["image"])
            result.worker_peak_bytes[chip] = max(result.worker_peak_bytes[chip],
                                                 int(header.get("peak", 0)))
            if header["op"] == "probes":
                hosts[number].put(decode(wire))
                continue
            busy[chip] = None
            for run in header["runs"]:
                if "records" in run:  # the chip's profiled step (``record``)
                    result.records[int(run["group"])] = [StepRecord.from_json(r)
                                                         for r in run["records"]]
                result.runs[(int(run["group"]), number)] = GroupRun(
                    int(run["group"]), number, int(run["cycles"]), list(run["supersteps"]),
                    int(run["host_bytes"]), list(run["kinds"]))
            arrived = decode(wire)
            hosts[number].put(arrived)  # the hand-off the next chip's first stage is judged on
            if chip < chips - 1:
                carried[number] = arrived
                queues[chip + 1].append(number)
                continue
            hosts[number].put(None)
            finished[number] = {k: np.asarray(v) for k, v in arrived}
            while judged in finished and len(hosts) >= in_flight:
                judge(judged)
                judged += 1
    except BaseException:
        for host in hosts.values():
            host.abandon()
        raise
    finally:
        workers.close()
        limits.restore_original_limits()
    result.simulate_seconds = time.perf_counter() - started - waited
    result.verdict_seconds = waited
    _chip_steps(result)
    return result


def images_to_fill(package: Package) -> int:
    """The fewest images whose run executes a full step of every chip: one a group of a
    chip (the chips couple only through the link phase)."""
    pipeline = package.manifest["pipeline"]
    chips = package_chips(package)
    return len(pipeline["groups"]) // chips


def run_streamed(package: Package, graph: Graph, tensors: Mapping[str, np.ndarray],
                 images: list[dict[str, np.ndarray]], engine: str = "local",
                 record: bool = False, package_bytes: bytes | None = None) -> PipelineRun:
    """A pipeline package's run: on one chip in this process, over several in workers."""
    if package_chips(package) > 1:
        return run_system(package, graph, tensors, images, engine, package_bytes, record)
    return run_pipeline(package, graph, tensors, images, record=record)


def streamed_fields(run: PipelineRun, package: Package, graph: Graph,
                    workload_fields: dict[str, Any], package_path: Any,
                    compile_seconds: float | None) -> dict[str, Any]:
    """The benchmark record of a pipelined run; over several chips, with the chips' part:
    each chip's full step, the link phase and its share of the period, the bytes a link
    carries a step and each worker's peak resident memory."""
    fields = pipeline_fields(run, package, graph, workload_fields, package_path,
                             compile_seconds)
    if not isinstance(run, SystemRun):
        return fields
    link = max(run.link_cycles, default=0)
    fields.update({
        "chips": run.chips, "engine": run.engine,
        "groupsPerChip": run.groups // run.chips,
        "chipStepCycles": run.chip_full_cycles,
        "linkCycles": link, "linkBytes": max(run.link_bytes, default=0),
        "linkSharePercent": round(100 * link / max(run.steady_cycles, 1), 2),
        "estimatedLinkCycles": max(package.manifest["estimate"].get("link_cycles", []),
                                   default=0),
        "workerPeakBytes": run.worker_peak_bytes,
    })
    return fields


__all__ = ["ENGINES", "SystemRun", "WorkerFailed", "images_to_fill", "run_streamed",
           "run_system", "streamed_fields", "verify_links"]
