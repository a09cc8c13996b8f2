"""The host's side of a run: the reference at device precision, the float64 model, and the
verdict on each stage as the device hands its values over.

It runs in a forked process (``verdict.host_process``: no turns on the interpreter lock with
the device), or on a thread for an imported program (torch's outputs are its fidelity
target, and torch is not forked) or where fork does not exist.  Every strategy and chip count
judges its images through :func:`start_host_side`.
"""

from __future__ import annotations

import logging
import queue
import resource
import threading
import time
from collections.abc import Callable, Generator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ipu_stack.ir.graph import Graph
from ipu_stack.ir.values import CompactValues
from ipu_stack.util.log import event
from ipu_stack.verdict.host_process import HostProcess, fork_available
from ipu_stack.verdict.judge import StageJudge, Verdict
from ipu_stack.verdict.reference import evaluate_float64_steps, evaluate_steps

LOG = logging.getLogger("ipu_stack.runtime")

# how far (in bytes of stored values) the host reference may run ahead of the stages judged:
# the reference's values wait there for the device's, so this bounds what a run holds
REFERENCE_AHEAD_BYTES = 256 << 20


class HostThread:
    """The host side on a thread of this process, with :class:`HostProcess`'s interface:
    for an imported program (torch's outputs are its fidelity target, and torch is not
    forked) or where fork does not exist."""

    def __init__(self, graph: Graph, tensors: dict[str, np.ndarray],
                 gemm_modes: dict[str, dict] | None,
                 model: Callable[[Graph, dict[str, np.ndarray]], dict[str, np.ndarray]] | None,
                 outputs_only: set[str]) -> None:
        self.arrivals: queue.SimpleQueue = queue.SimpleQueue()
        self.peak_bytes = 0  # the host side's peak resident memory, once it has finished
        self.abandoned = threading.Event()  # the device failed: the host side stops at once
        self.pool = ThreadPoolExecutor(max_workers=1)
        self.future = self.pool.submit(host_side, graph, tensors, gemm_modes, model,
                                       outputs_only, self.arrivals, self.abandoned)

    def put(self, items: list | None) -> None:
        self.arrivals.put(items)

    def result(self) -> tuple[Mapping[str, np.ndarray], Verdict]:
        try:
            reference, ideal_values, ideal_seconds, judging = self.future.result()
        finally:
            self.pool.shutdown()
        verdict = judging.finish(ideal_values)
        verdict.ideal_seconds = ideal_seconds
        # on a thread of this process: its peak is this process's (Linux counts KiB)
        self.peak_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return reference, verdict

    def abandon(self) -> None:
        self.abandoned.set()
        self.arrivals.put(None)
        self.pool.shutdown()


def host_side(graph: Graph, tensors: dict[str, np.ndarray],
               gemm_modes: dict[str, dict] | None,
               model: Callable[[Graph, dict[str, np.ndarray]], dict[str, np.ndarray]] | None,
               outputs_only: set[str], arrivals: queue.SimpleQueue,
               abandon: threading.Event | None = None
               ) -> tuple[Mapping[str, np.ndarray], dict[str, np.ndarray], float, StageJudge]:
    """The host's side of a run: the device-precision reference (every value, without the
    weights: the verdict rounds each stage's weights when it reruns it), then the
    stage-by-stage verdict on the device's values as they arrive (``arrivals``: lists of
    ``(name, values)``, ``None`` at the end), with the model fidelity is measured against
    (and its seconds) computed in between."""
    device_done = False
    try:
        reference = CompactValues()
        reference_steps = evaluate_steps(graph, tensors, gemm_modes, reference)
        reference_seconds = 0.0
        judging = StageJudge(graph, tensors, reference, gemm_modes)
        ideal, ideal_seconds = None, 0.0
        if model is not None:  # an imported program's fidelity target: torch's outputs
            started = time.perf_counter()
            ideal, ideal_seconds = model(graph, tensors), time.perf_counter() - started
        model_steps = evaluate_float64_steps(graph, tensors, outputs_only) if ideal is None \
            else None
        while abandon is None or not abandon.is_set():
            while not device_done:  # take whatever the device has handed over
                try:
                    arrived = arrivals.get_nowait()
                except queue.Empty:
                    break
                device_done = arrived is None
                for name, values in arrived or ():
                    judging.arrive(name, values)
            judging.judge_ready()
            started = time.perf_counter()
            if reference_steps is not None and (
                    device_done or reference.nbytes < REFERENCE_AHEAD_BYTES):
                if advance_steps(reference_steps)[0]:
                    reference_steps = None
                    event(LOG, "evaluated host reference", referencePrecision="device",
                          elapsed_ms=int(reference_seconds * 1000))
                reference_seconds += time.perf_counter() - started
            elif model_steps is not None:
                finished, value = advance_steps(model_steps)
                if finished:
                    ideal, model_steps = value, None
                ideal_seconds += time.perf_counter() - started
            elif not device_done:  # nothing to do until the device hands something over
                arrived = arrivals.get()
                device_done = arrived is None
                for name, values in arrived or ():
                    judging.arrive(name, values)
            elif reference_steps is None:
                break
        return reference, ideal, ideal_seconds, judging
    except BaseException:
        while not device_done and arrivals.get() is not None:  # let the device finish
            pass
        raise


def advance_steps(steps: Generator[None, None, Any]) -> tuple[bool, Any]:
    """One step of a generator: whether it has finished, and then its value."""
    try:
        next(steps)
    except StopIteration as done:
        return True, done.value
    return False, None


def start_host_side(graph: Graph, tensors: Mapping[str, Any], gemm_modes: dict[str, dict] | None,
                    outputs_only: set[str],
                    model: Callable[[Graph, dict[str, np.ndarray]], dict[str, np.ndarray]]
                    | None = None) -> HostProcess | HostThread:
    """One image's host side, started: a forked process, or a thread for an imported
    program's torch model or where fork does not exist.  Both take ``put`` (probe reads,
    ``None`` at the end), ``result`` and ``abandon``."""
    if model is None and fork_available():
        return HostProcess(host_side, graph, tensors, gemm_modes, outputs_only)
    return HostThread(graph, tensors, gemm_modes, model, outputs_only)


__all__ = ["REFERENCE_AHEAD_BYTES", "HostThread", "advance_steps", "host_side",
           "start_host_side"]
