"""Run a package on the simulated device and check it: the ``run`` and ``bench`` commands.

Reads the package, takes hardware ownership, loads it, calls ``initialize`` with the weights
and ``run`` with the inputs, evaluates the host reference at device precision, applies the
tolerance policy and builds the benchmark record (the fields of reference log 004).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ipu_stack.device.simulator import CallReport
from ipu_stack.ir.graph import Graph
from ipu_stack.ir.values import DeferredTensors, compact_weights, weight_storer
from ipu_stack.package import Package, read_package
from ipu_stack.target import get_target
from ipu_stack.util.errors import UsageError
from ipu_stack.util.heap import keep_freed_memory, release_freed_memory
from ipu_stack.util.log import event
from ipu_stack.verdict.judge import Verdict
from ipu_stack.verdict.tolerance import Comparison

LOG = logging.getLogger("ipu_stack.runtime")


@dataclass
class RunResult:
    """Everything a run produced: outputs, cycle reports, the comparison, the verdict."""

    package: Package
    outputs: dict[str, np.ndarray]
    reference: dict[str, np.ndarray]
    comparisons: dict[str, Comparison]
    initialize: CallReport
    run: CallReport
    simulate_seconds: float
    verdict: Verdict = field(default_factory=Verdict)
    reference_source: str = "float64"  # what fidelity measures against: the float64 model or torch
    stream: Any = None  # the run loop's run of it (runtime.stream.StreamRun)

    @property
    def passed(self) -> bool:
        """PASS only when every stage agrees with the host's rerun of it on the device's own
        inputs and the outputs are as close to the float64 model as the precision allows
        (``verdict/judge.py``)."""
        return self.verdict.passed


def load_package(path: Path, target_name: str = "ipu21") -> Package:
    event(LOG, "reading application package")
    package = read_package(path, expected_target=target_name)
    event(LOG, "application package read", tiles=get_target(target_name).tiles,
          compiler=package.compiler_version)
    return package


def group_program_tiles(package: Package) -> int | None:
    """The tiles a package's program was compiled for when that is part of its chip (one
    pipeline group's program, written under ``DIR/group<N>/`` beside the pipeline's own
    package), else ``None``."""
    options = package.manifest.get("options")
    tiles = options.get("tiles") if isinstance(options, dict) else None
    if "pipeline" in package.manifest or type(tiles) is not int \
            or not 0 < tiles < get_target(package.target).tiles:
        return None  # a whole chip's program (or a malformed record, refused where read)
    return tiles


def refuse_group_program(package: Package, path: Path) -> None:
    """One line, not a device fault, for a run of one group's program on its own: its input
    is the previous group's output, which only the pipeline's package streams in."""
    tiles = group_program_tiles(package)
    if tiles is None:
        return
    whole = Path(path).parent.parent / "model.ipuexe"
    raise UsageError(f"{path} is one pipeline group's program ({tiles} of "
                     f"{get_target(package.target).tiles} tiles), which runs only inside its "
                     f"pipeline: run the pipeline's package"
                     + (f" {whole}" if whole.is_file() else ""))


# the stored weights above which a run gives the compile's leftovers back to the OS: their
# float32 copies, freed, are then hundreds of MB; below it the heap is reused as it is
RELEASE_AFTER_BYTES = 64 << 20


def hold_weights(graph: Graph, tensors: Mapping[str, np.ndarray]) -> None:
    """Every weight a run needs, made and held as its storage codes (every reader takes
    them through ``np.asarray``); what the compile and the float32 weights left behind is
    given back where the weights are large enough for it to matter."""
    keep_freed_memory()
    if isinstance(tensors, DeferredTensors) and tensors.pending:
        # a compile made none of the weights' values; the run needs them all, made on
        # every core (each has its own random stream: the same values whenever made)
        started = time.perf_counter()
        made = tensors.make_all(os.cpu_count() or 1, weight_storer(graph))
        event(LOG, "made weight values", tensors=made,
              elapsed_ms=int((time.perf_counter() - started) * 1000))
    held = compact_weights(graph, tensors)
    event(LOG, "holding weights in their stored precisions", bytes=held)
    if held >= RELEASE_AFTER_BYTES:  # a full collection takes ~0.1 s beside torch's objects
        release_freed_memory()
