"""An FP8 recipe measured: the search's choice compiled and run on the simulated device
beside all-F16 and all-FP8, each with its cycles, throughput, verdict and its outputs'
error against the float64 model."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ipu_stack.ir.interpret import evaluate_float64
from ipu_stack.ir.names import name_layer
from ipu_stack.pipeline import CompileOptions
from ipu_stack.recipe.search import Recipe, outputs_error, poprt_options, recipe_fields, search
from ipu_stack.runtime.execute import RunSettings, run_any
from ipu_stack.strategy import compile_strategy
from ipu_stack.util.errors import CompileError, UsageError
from ipu_stack.util.log import event

LOG = logging.getLogger("ipu_stack.recipe")

RUN_FIELDS = ("numericalTest", "cycles", "qpsWithHost", "imagesPerSecond", "gemmModes",
              "noiseRatio", "peakTileBytes")


def kept_text(kept: frozenset[int]) -> str:
    return ",".join(map(str, sorted(kept)))


def device_error(outcome: Any, graph: Any, tensors: Any) -> float:
    """The device's outputs against the float64 model of the graph it ran."""
    outputs = [v.name for v in graph.by_role("output")]
    ideal = evaluate_float64(graph, tensors, keep=set(outputs))
    return outputs_error(outcome.result.outputs, ideal, outputs)


def measure(workload: Any, params: dict[str, Any], out: Path, options: CompileOptions,
            settings: RunSettings) -> dict[str, Any]:
    """Compile and run one precision choice; its record's figures and device error, or
    why it could not run (all-F16 weights of a large tower do not fit one chip)."""
    try:
        return _measure(workload, params, out, options, settings)
    except CompileError as exc:  # placement errors too
        return {"numericalTest": "NOT RUN", "reason": str(exc), "gemms": []}


def _measure(workload: Any, params: dict[str, Any], out: Path, options: CompileOptions,
             settings: RunSettings) -> dict[str, Any]:
    compiled = compile_strategy(workload, params, out, options)
    outcome = run_any(compiled.package, compiled.graph, compiled.tensors, workload, params,
                      compiled.timings["compile"], settings)
    fields = {k: outcome.record.get(k) for k in RUN_FIELDS}
    fields["deviceError"] = float(f"{device_error(outcome, compiled.graph, compiled.tensors):.4g}")
    fields["gemms"] = _gemm_names(compiled.graph)
    return fields


def _gemm_names(graph: Any) -> list[str]:
    return [graph.value(op.outputs[0]).name for op in graph.operations if op.kind == "matmul"]


def run_recipe(workload: Any, params: dict[str, Any], max_error: float, out: Path,
               options: CompileOptions, settings: RunSettings) -> dict[str, Any]:
    """Search the recipe on the host, then measure all-F16, all-FP8 and the recipe."""
    if "keep_f16" not in {p.name for p in workload.parameters}:
        raise UsageError(f"workload {workload.name} has no layers an FP8 recipe can keep F16")
    if not max_error > 0:
        raise UsageError("--max-error must be positive")
    base = {**params, "precision": "fp8", "keep_f16": ""}

    def build(kept: frozenset[int]) -> Any:
        return workload.build({**base, "keep_f16": kept_text(kept)})

    recipe: Recipe = search(build, max_error)
    runs = {"allF16": {**base, "precision": "f16"}, "allFp8": base}
    if recipe.kept:
        runs["recipe"] = {**base, "keep_f16": kept_text(recipe.kept)}
    measured = {label: measure(workload, p, out / label, options, settings)
                for label, p in runs.items()}
    measured.setdefault("recipe", measured["allFp8"])
    gemms = [(name, name_layer(name)) for name in measured["allFp8"].pop("gemms", [])]
    if getattr(workload, "source_gemms", ()):  # an ONNX model: its own node names
        gemms = list(workload.source_gemms)
    for fields in measured.values():
        fields.pop("gemms", None)
    device = measured["recipe"].get("deviceError")
    within = None if device is None else bool(device <= max_error)
    if within is False:
        event(LOG, "the recipe's device error is over the bound", level=logging.WARNING,
              deviceError=device, hostError=float(f"{recipe.error:.4g}"), maxError=max_error)
    return {"workload": workload.identifier(params), **recipe_fields(recipe),
            "deviceWithinBound": within, "poprtOptions": poprt_options(recipe, gemms),
            **measured}


def format_recipe(record: dict[str, Any]) -> str:
    """The recipe and its three runs, as a person reads them."""
    kept = record["keepF16"]
    lines = [f"fp8-recipe {record['workload']}: keep "
             f"{'no layer' if kept == 'none' else 'layers ' + kept} in F16 "
             f"({record['keptLayers']} of {record['layers']})"
             + ("" if record["found"] else " -- NOT FOUND: even these exceed --max-error"),
             f"  host error against float64: all-FP8 {record['allFp8HostError']:.4g}, recipe "
             f"{record['hostError']:.4g} (bound {record['maxError']:g}); "
             f"{record['evaluations']} evaluation{'s' if record['evaluations'] != 1 else ''} "
             f"in {record['searchSeconds']} s"]
    for label, name in (("allF16", "all-F16"), ("allFp8", "all-FP8"), ("recipe", "recipe")):
        run = record[label]
        if "reason" in run:
            lines.append(f"  {name:<8} not run: {run['reason']}")
            continue
        lines.append(f"  {name:<8} {run['numericalTest']} cycles={run['cycles']} "
                     f"qpsWithHost={run['qpsWithHost']} deviceError={run['deviceError']:.4g} "
                     f"gemmModes={run['gemmModes']}")
    if record.get("deviceWithinBound") is False:
        lines.append(f"  the recipe's device error {record['recipe']['deviceError']:.4g} is "
                     f"over the bound {record['maxError']:g} (the host's search read "
                     f"{record['hostError']:.4g}): tighten --max-error or keep more layers")
    lines.append(f"  PopRT: {record['poprtOptions']}")
    return "\n".join(lines)
