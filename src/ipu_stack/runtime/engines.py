"""The engines that run a system's chips: in this process, forked processes, or Ray actors.

Every engine holds one :class:`~ipu_stack.runtime.chip_worker.ChipWorker` a chip and has the
same four calls: ``wait_ready`` (every chip built and loaded), ``submit`` (an image's inputs
to a chip), ``next`` (the next message from any chip: ``probes`` or ``done``, with its arrays
decoded) and ``close``.  The coordinator (``runtime.stream``) runs the same loop over any of
them, so the same packages run on the same simulated devices whichever is used, and the
cycles are the same (tested).

- ``inprocess``: the workers live in this process and run an image when ``next`` asks for
  its result; probe reads go straight to the image's host side (``on_probes``) as they are
  made.  The default for one chip.
- ``local``: one forked process a chip, forked before any weight is made (each makes its own
  chip's), talking over pipes.  The default over several chips.
- ``ray``: one Ray actor a chip, on a cluster or a local Ray, each sent its own weights.

A worker that dies is reported by chip, never waited on.
"""

from __future__ import annotations

import multiprocessing
from collections import deque
from collections.abc import Callable, Mapping
from multiprocessing.connection import wait
from typing import Any

from threadpoolctl import threadpool_limits

from ipu_stack.contract.system import SystemProgram
from ipu_stack.device.simulator import CallReport
from ipu_stack.ir.graph import Graph
from ipu_stack.package import Package, read_package_bytes
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
from ipu_stack.util.errors import DeviceError, UsageError
from ipu_stack.verdict.host_process import fork_available

ENGINES = ("inprocess", "local", "ray")
Message = tuple[int, dict[str, Any], list[tuple[str, Any]]]
"""``(chip, header, arrays)``: header ``op`` is ``probes`` or ``done`` (with ``image``, and
for ``done`` the groups' ``runs`` and the worker's ``peak`` bytes)."""


class WorkerFailed(DeviceError):
    """A chip's worker died or failed (one line naming the chip)."""


class InProcessEngine:
    """Every chip's worker in this process; an image runs when its result is asked for."""

    def __init__(self, package: Package, system: SystemProgram, tensors: Mapping[str, Any],
                 on_probes: Callable[[int, list], None], record: bool = False,
                 poison: bool = False, keep_reports: bool = False) -> None:
        self.workers = [ChipWorker(package, system, chip, tensors, record, poison, keep_reports)
                        for chip in range(system.chips)]
        self.on_probes = on_probes
        self.jobs: deque[tuple[int, int, dict[str, Any]]] = deque()
        # with ``keep_reports``: each chip's devices' initialize reports, and each image's
        # run reports by (chip, image)
        self.initialized = [worker.initialized for worker in self.workers]
        self.reports: dict[tuple[int, int], list[CallReport]] = {}

    def wait_ready(self) -> None:
        """Nothing to wait for: the workers were built in the constructor."""

    def submit(self, chip: int, number: int, inputs: list[tuple[str, Any]]) -> None:
        self.jobs.append((chip, number, dict(inputs)))

    def next(self) -> Message:
        chip, number, inputs = self.jobs.popleft()
        worker = self.workers[chip]
        outputs, runs = worker.run(inputs, lambda items: self.on_probes(number, items), number)
        if worker.keep_reports:
            self.reports[(chip, number)] = worker.reports
        return chip, {"op": "done", "image": number, "runs": runs, "peak": peak_rss()}, \
            list(outputs.items())

    def close(self) -> None:
        self.workers.clear()


class LocalEngine:
    """One forked process a chip, pipes to the coordinator."""

    def __init__(self, package: Package, chips: int, tensors: Mapping[str, Any],
                 graph: Graph, record: bool = False, poison: bool = False) -> None:
        if not fork_available():
            raise UsageError("--engine local needs fork (use --engine inprocess or ray)")
        context = multiprocessing.get_context("fork")
        self.conns, self.processes = [], []
        for chip in range(chips):
            parent, child = context.Pipe()
            process = context.Process(target=serve, name=f"ipu-chip{chip}",
                                      args=(child, package, chip, tensors, graph, record,
                                            poison), daemon=True)
            process.start()
            child.close()
            self.conns.append(parent)
            self.processes.append(process)

    def wait_ready(self) -> None:
        """Every chip built and loaded (before the first image)."""
        for chip in range(len(self.conns)):
            header, _ = self.receive(chip)
            if header["op"] != "ready":
                raise WorkerFailed(f"chip {chip}'s worker did not start: {header}")

    def failed(self, chip: int) -> WorkerFailed:
        process = self.processes[chip]
        process.join(timeout=5)
        return WorkerFailed(f"chip {chip}'s worker died (exit code {process.exitcode})")

    def receive(self, chip: int) -> tuple[dict[str, Any], Wire]:
        try:
            header, wire = receive(self.conns[chip])
        except (EOFError, OSError):
            raise self.failed(chip) from None
        if header["op"] == "error":
            raise WorkerFailed(f"chip {chip}: {header['message']}")
        return header, wire

    def submit(self, chip: int, number: int, inputs: list[tuple[str, Any]]) -> None:
        send(self.conns[chip], {"op": "run", "image": number}, encode(inputs))

    def next(self) -> Message:
        """The next message from any worker (a dead worker is an error naming its chip)."""
        sentinels = {p.sentinel: chip for chip, p in enumerate(self.processes)}
        ready = wait(self.conns + list(sentinels))
        for item in ready:
            if item in self.conns:
                chip = self.conns.index(item)
                header, wire = self.receive(chip)
                return chip, header, decode(wire)
        raise self.failed(sentinels[ready[0]])

    def close(self) -> None:
        for conn, process in zip(self.conns, self.processes, strict=True):
            try:
                send(conn, {"op": "stop"})
            except OSError:
                pass
            process.join(timeout=10)
            if process.is_alive():
                process.kill()


class RayChip:
    """A Ray actor's body: one chip's worker, arrays in the wire form both ways."""

    def __init__(self, package_bytes: bytes, chip: int, weights: Wire,
                 record: bool = False, poison: bool = False) -> None:
        from ipu_stack.runtime.groups import read_system

        package = read_package_bytes("system package", package_bytes)
        threadpool_limits(limits=1, user_api="blas")  # a process a chip, one core each
        self.worker = ChipWorker(package, read_system(package), chip, dict(decode(weights)),
                                 record, poison)

    def run(self, number: int, inputs: Wire) -> tuple[int, list[Wire], Wire, list, int]:
        probes: list[Wire] = []
        outputs, runs = self.worker.run(dict(decode(inputs)),
                                        lambda items: probes.append(encode(items)), number)
        return number, probes, encode(list(outputs.items())), runs, peak_rss()


class RayEngine:
    """One Ray actor a chip (``ray.init()`` joins a cluster named by ``RAY_ADDRESS`` or
    starts a local one)."""

    def __init__(self, package: Package, system: SystemProgram, tensors: Mapping[str, Any],
                 package_bytes: bytes, record: bool = False, poison: bool = False) -> None:
        try:
            import ray
        except ImportError:
            raise UsageError("--engine ray needs Ray: pip install 'ipu-stack[ray]'") from None
        self.ray = ray
        if not ray.is_initialized():
            ray.init(log_to_driver=False, include_dashboard=False)
        actor = ray.remote(num_cpus=0)(RayChip)
        self.actors = [actor.remote(package_bytes, chip, encode(list(
            chip_weights(package, system, chip, tensors).items())), record, poison)
            for chip in range(system.chips)]
        self.pending: dict[Any, int] = {}
        self.queue: deque[Message] = deque()

    def wait_ready(self) -> None:
        """Nothing to wait for: an actor's first call waits for its constructor."""

    def submit(self, chip: int, number: int, inputs: list[tuple[str, Any]]) -> None:
        self.pending[self.actors[chip].run.remote(number, encode(inputs))] = chip

    def next(self) -> Message:
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
            self.queue.append((chip, {"op": "probes", "image": number}, decode(wire)))
        self.queue.append((chip, {"op": "done", "image": number, "runs": runs, "peak": peak},
                           decode(outputs)))
        return self.queue.popleft()

    def close(self) -> None:
        for actor in self.actors:
            self.ray.kill(actor)


__all__ = ["ENGINES", "InProcessEngine", "LocalEngine", "Message", "RayChip", "RayEngine",
           "WorkerFailed"]
