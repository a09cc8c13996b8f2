"""``--dump-stages DIR``: each compile stage's artifact, written as the stage finishes.

Triton's ``MLIR_ENABLE_DUMP`` idea: when a compile goes wrong (or just differs), the user
reads what each stage handed the next instead of guessing.  File ``NN-LOGGED.EXT`` holds the
artifact of stage ``NN`` of ``pipeline.STAGES``, named by the phase name the stage is logged
under: the graph text and the stage list, the finalists' plans, the chosen plans and
lowered program with the estimate, the kernel instances, the support memory, the placement
summary, the device program (manifest form, arrays by shape) and the package's checksum.
A stage whose artifact already is a file (the memory reports) names it.  Nothing here
changes what is compiled.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ipu_stack.contract import to_manifest
from ipu_stack.lowering import program as lowered
from ipu_stack.phases.state import Build
from ipu_stack.util.files import write_text_atomic


def _json(value: Any) -> str:
    return json.dumps(value, indent=1, sort_keys=True, default=_plain) + "\n"


def _plain(value: Any) -> Any:
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, np.ndarray):
        return f"<{value.dtype} {list(value.shape)}>"
    return str(value)


def _plans(plans: list) -> list[str]:
    return [p.describe() if p is not None else "row stage" for p in plans]


def build_graph_and_tilings(build: Build) -> tuple[str, str]:
    assert build.graph is not None
    lines = [build.graph.dump(), "", f"stages {len(build.stages)} (compact)"]
    for stage, candidates in zip(build.stages, build.candidates, strict=False):
        lines.append(f"  {stage!r}: {len([c for c in candidates if c is not None])} "
                     "candidate plans")
    if build.loop is not None:
        lines.append(f"layer loop: {build.loop!r}")
    return "txt", "\n".join(lines) + "\n"


def choose_fitting_plans(build: Build) -> tuple[str, str]:
    return "json", _json({"finalists": [_plans(f) for f in build.finalists]})


def _step_line(index: int, step: lowered.Step) -> str:
    if isinstance(step, lowered.ComputeSet):
        tiles = sum(len(c.tiles) for c in step.calls)
        kernels = sorted({c.instance.name for c in step.calls})
        return f"{index:5d} compute {step.name}: {len(step.calls)} calls on {tiles} tiles {kernels}"
    if isinstance(step, lowered.Exchange):
        return (f"{index:5d} exchange {step.name}: {len(step.src_tile)} transfers, "
                f"{int(np.sum(step.words))} words")
    if isinstance(step, lowered.Loop):
        return f"{index:5d} loop {step.name}: {step.count} x {step.length} steps"
    return f"{index:5d} {type(step).__name__} {getattr(step, 'tensor', '')}"


def lower_and_schedule_finalists(build: Build) -> tuple[str, str]:
    assert build.program is not None
    lines = ["plans:", *(f"  {p}" for p in _plans(build.plans)),
             f"estimate: {json.dumps(build.estimate, sort_keys=True)}",
             f"buffers: {len(build.program.buffers)}", "program:"]
    lines += [_step_line(index, step) for _, index, step in build.program.steps()]
    return "txt", "\n".join(lines) + "\n"


def list_kernel_instances(build: Build) -> tuple[str, str]:
    return "json", _json([{"name": k.name, "key": k.key, **k.to_json()}
                          for k in build.instances])


def size_support_memory(build: Build) -> tuple[str, str]:
    return "json", _json({name: {"max": int(np.max(v)), "total": int(np.sum(v))}
                          for name, v in build.support.items()})


def place_buffers(build: Build) -> tuple[str, str]:
    assert build.placement is not None
    peak = build.placement.peak_bytes
    return "json", _json({"peak_tile": int(np.argmax(peak)), "peak_bytes": int(peak.max()),
                          "tiles_used": int(np.count_nonzero(peak > 0)),
                          "fragmentation": build.waste, "peak_tile_by_category": build.filled})


def write_memory_reports(build: Build) -> tuple[str, str]:
    return "txt", "\n".join(str(build.reports / name) for name in (
        "memory-profile.json", "placement.html")) + "\n"


def emit_device_program(build: Build) -> tuple[str, str]:
    assert build.device_program is not None
    fragment, arrays = to_manifest(build.device_program)
    return "json", _json({"program": fragment,
                          "arrays": {name: f"{a.dtype} {list(a.shape)}"
                                     for name, a in sorted(arrays.items())}})


def write_package(build: Build) -> tuple[str, str]:
    assert build.package is not None
    digest = hashlib.sha256(Path(build.package).read_bytes()).hexdigest()
    return "txt", f"{build.package}\nsha256 {digest}\n"


# by stage name (``CompileStage.name``)
ARTIFACTS: dict[str, Callable[[Build], tuple[str, str]]] = {
    "build_graph_and_tilings": build_graph_and_tilings,
    "choose_fitting_plans": choose_fitting_plans,
    "lower_and_schedule_finalists": lower_and_schedule_finalists,
    "list_kernel_instances": list_kernel_instances, "size_support_memory": size_support_memory,
    "place_buffers": place_buffers, "write_memory_reports": write_memory_reports,
    "emit_device_program": emit_device_program, "write_package": write_package,
}


def dump_stage(folder: Path, number: int, name: str, logged_as: str,
               build: Build) -> Path | None:
    """Write stage ``name``'s artifact into ``folder`` as ``NN-<logged_as>.EXT``; the file,
    or None (no artifact)."""
    if name not in ARTIFACTS:
        return None
    extension, text = ARTIFACTS[name](build)
    path = folder / f"{number:02d}-{logged_as}.{extension}"
    write_text_atomic(path, text)
    return path
