"""The FP8 recipe: the fewest layers to keep F16 so that an FP8 model stays accurate.

PopRT, the vendor's inference runtime, converts a model to FP8 and lets its user keep layers
in FP16 (``--num_of_layers_keep_fp16``, ``--fp8_skip_op_names``), chosen by trial on the
card.  Here the choice needs no card.  The criterion is the outputs' relative RMS error
against the float64 model of the same graph (``--max-error``, default 0.1): the verdict
says the device computes what its precision says (it PASSes an FP8 model whose weights clip,
because the host reference clips the same way); this says whether that precision is good
enough.

**The search** runs on the host, on the graph the compiler would build: the model is built
with the layers kept so far, evaluated at device precision and in float64, and each layer's
*own* contribution to the error is read from the error of its output against the float64
model's, ``sqrt(e_L^2 - e_(L-1)^2)`` (errors of independent roundings add in quadrature).
The layer contributing most is kept next, until the outputs are within the bound; then each
kept layer is dropped again if the bound still holds without it (smallest contribution
first), so the set is minimal for the search's evaluations.  Each step is one host
evaluation of the model, not a compile: a 27-layer tower is searched in minutes.  The
result is then measured on the simulated device, beside all-F16 and all-FP8 (``cli``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ipu_stack.ir.graph import Graph
from ipu_stack.ir.interpret import evaluate, evaluate_float64
from ipu_stack.ir.names import name_layer
from ipu_stack.util.errors import UsageError
from ipu_stack.util.log import event

LOG = logging.getLogger("ipu_stack.recipe")
DEFAULT_MAX_ERROR = 0.1


@dataclass(frozen=True)
class Evaluation:
    """One host evaluation: the layers kept F16, the outputs' relative RMS error against the
    float64 model, and each layer's own contribution to the error."""

    kept: frozenset[int]
    error: float
    contributions: dict[int, float]


@dataclass
class Recipe:
    """The search's answer and the evaluations it made, in order."""

    kept: frozenset[int]
    error: float
    layers: int
    max_error: float
    evaluations: list[Evaluation] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def found(self) -> bool:
        return self.error <= self.max_error


def layer_outputs(graph: Graph) -> dict[int, str]:
    """Each layer's last value (its output to the next layer), by layer number."""
    last: dict[int, str] = {}
    for op in graph.operations:
        name = graph.value(op.outputs[0]).name
        layer = name_layer(name)
        if layer is not None:
            last[layer] = name
    return dict(sorted(last.items()))


def relative_error(got: np.ndarray, ideal: np.ndarray) -> float:
    ideal = np.asarray(ideal, np.float64).reshape(-1)
    diff = np.asarray(got, np.float64).reshape(-1) - ideal
    if not np.isfinite(diff).all():
        return math.inf
    scale = float(np.sqrt(np.mean(ideal**2))) or 1.0
    return float(np.sqrt(np.mean(diff**2))) / scale


def outputs_error(got: dict[str, np.ndarray], ideal: dict[str, np.ndarray],
                  outputs: list[str]) -> float:
    """The criterion: the largest of the outputs' relative RMS errors (each output within
    the bound), as the search and the device's run both read it."""
    return max(relative_error(got[n], ideal[n]) for n in outputs)


def evaluate_errors(graph: Graph, tensors: dict[str, np.ndarray], kept: frozenset[int]
                    ) -> Evaluation:
    """The graph at device precision against float64: the outputs' error and each layer's
    contribution (only the layer outputs and the graph outputs are held)."""
    outputs = [v.name for v in graph.by_role("output")]
    per_layer = layer_outputs(graph)
    if not per_layer:
        raise UsageError(f"{graph.name}: no layers to keep in F16 (no value is named layerN)")
    names = {*outputs, *per_layer.values()}
    device = evaluate(graph, tensors, keep_weights=False, keep=names)
    ideal = evaluate_float64(graph, tensors, keep=names)
    error = outputs_error(device, ideal, outputs)
    contributions, before = {}, 0.0
    for layer, name in per_layer.items():
        at = relative_error(device[name], ideal[name])
        contributions[layer] = math.sqrt(max(at * at - before * before, 0.0)) \
            if math.isfinite(at) else math.inf
        before = at if math.isfinite(at) else before
    return Evaluation(kept, error, contributions)


def search(build: Callable[[frozenset[int]], tuple[Graph, dict[str, np.ndarray]]],
           max_error: float = DEFAULT_MAX_ERROR, max_evaluations: int = 64) -> Recipe:
    """The fewest layers to keep F16 (``build(kept)`` gives the FP8 graph with those layers
    F16) for the outputs to be within ``max_error`` of the float64 model."""
    started = time.perf_counter()
    evaluations: list[Evaluation] = []

    def run(kept: frozenset[int]) -> Evaluation:
        graph, tensors = build(kept)
        found = evaluate_errors(graph, tensors, kept)
        evaluations.append(found)
        worst = max(found.contributions, key=lambda k: found.contributions[k])
        event(LOG, "evaluated an FP8 recipe", kept=_text(kept), error=round(found.error, 5),
              maxError=max_error, worstLayer=worst)
        return found

    current = run(frozenset())
    layers = len(current.contributions)
    added: list[int] = []
    while current.error > max_error and len(evaluations) < max_evaluations:
        free = {k: v for k, v in current.contributions.items() if k not in current.kept}
        if not free:
            break
        layer = max(free, key=lambda k: free[k])
        added.append(layer)
        current = run(current.kept | {layer})
    if current.error <= max_error:
        order = sorted(added, key=lambda k: evaluations[0].contributions.get(k, 0.0))
        for layer in order if len(order) > 1 else []:  # one alone was needed: FP8 failed
            if len(evaluations) >= max_evaluations:
                break
            trial = run(current.kept - {layer})
            if trial.error <= max_error:
                current = trial
    return Recipe(current.kept, current.error, layers, max_error, evaluations,
                  time.perf_counter() - started)


def _text(kept: frozenset[int]) -> str:
    return ",".join(map(str, sorted(kept))) or "none"


def poprt_options(recipe: Recipe, gemms: list[tuple[str, int | None]]) -> str:
    """The same choice as PopRT converter options: how many layers stay FP16, and the
    operations to skip: the kept layers' products, ``gemms`` being (name, layer) of each (an
    ONNX model's MatMul and Gemm nodes, which PopRT names; else this compiler's)."""
    skip = [name for name, layer in gemms if layer in recipe.kept]
    return (f"--precision fp8 --num_of_layers_keep_fp16 {len(recipe.kept)}"
            + (f" --fp8_skip_op_names {','.join(skip)}" if skip else ""))


def recipe_fields(recipe: Recipe) -> dict[str, Any]:
    """The search's part of the record."""
    return {"keepF16": _text(recipe.kept), "keptLayers": len(recipe.kept),
            "layers": recipe.layers, "hostError": float(f"{recipe.error:.4g}"),
            "allFp8HostError": float(f"{recipe.evaluations[0].error:.4g}"),
            "maxError": recipe.max_error, "found": recipe.found,
            "evaluations": len(recipe.evaluations),
            "searchSeconds": round(recipe.seconds, 1)}
