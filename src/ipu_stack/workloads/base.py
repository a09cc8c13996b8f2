"""Builtin workloads: a parameterised graph plus deterministic inputs and weights.

A workload turns its parameters into an :class:`ipu_stack.ir.Graph` and, from a seed, into
the host tensors (inputs and weights as float32 values exactly representable in their
precision).  FP8 scale exponents of inputs and weights are fitted to the data; those of
FP8 activations are static, fitted on a *calibration* input drawn from a different seed, so
the test data never tunes its own scales.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ipu_stack.ir.graph import Graph
from ipu_stack.util.errors import UsageError
from ipu_stack.workloads.footprint import Footprint

# Every integer option's ceiling: the package format refuses a kernel parameter above 2^20,
# since nothing on a tile of 624 KiB can be that large (docs/package-format.md)
LARGEST_SIZE = 1 << 20


@dataclass(frozen=True)
class Parameter:
    """One workload option: name, type, default and help text."""

    name: str
    kind: type
    default: Any
    help: str
    choices: tuple[Any, ...] | None = None
    minimum: int | None = 1
    maximum: int | None = LARGEST_SIZE
    positive: bool = False  # a float that must be above 0 (every float is finite, >= 0)

    @property
    def flag(self) -> str:
        """The option as the command line spells it (``keep_f16``: ``--keep-f16``)."""
        return "--" + self.name.replace("_", "-")


@dataclass(frozen=True)
class Workload:
    """A builtin workload: how to build its graph and tensors from parameters."""

    name: str
    description: str
    parameters: tuple[Parameter, ...]
    build: Callable[[dict[str, Any]], tuple[Graph, dict[str, np.ndarray]]]
    identifier: Callable[[dict[str, Any]], str]
    benchmark_fields: Callable[[dict[str, Any]], dict[str, Any]] = field(default=lambda p: {})
    # image ``i`` (i >= 1) of a stream, as the graph's inputs: ``(params, graph, i)``
    stream_input: Callable[[dict[str, Any], Graph, int], dict[str, np.ndarray]] | None = None
    # the least memory it needs, from its parameters alone (``workloads.footprint``)
    footprint: Callable[[dict[str, Any]], Footprint] | None = None
    # a decoder's decode step inputs: ``(params, tokens, position[, first])``, ``first``
    # the cache position a micro-batch's range begins at (``generation``)
    step_inputs: Callable[..., dict[str, np.ndarray]] | None = None
    # and its prompt's pass that fills the cache: ``(params, prompt ids[, image rows])``
    prompt_inputs: Callable[..., dict[str, np.ndarray]] | None = None
    # a vision-language model: its image program's parameters (the tower and connector,
    # whose rows the prompt's pass reads), and the image's tokens ahead of the prompt's text
    # with the token id they hold
    vision: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    image_prompt: Callable[[dict[str, Any]], tuple[int, int]] | None = None
    # a language model's trained positions (its configuration's max_position_embeddings):
    # ``generate`` fills no more of them
    positions: int | None = None

    def defaults(self) -> dict[str, Any]:
        return {p.name: p.default for p in self.parameters}

    def resolve(self, overrides: dict[str, Any]) -> dict[str, Any]:
        """Defaults updated by ``overrides`` (``None`` means default), each checked."""
        params = self.defaults()
        known = {p.name: p for p in self.parameters}
        for key, value in overrides.items():
            if value is None:
                continue
            if key not in known:
                raise UsageError(f"workload {self.name} has no parameter "
                                 f"--{key.replace('_', '-')}")
            params[key] = value
        for p in self.parameters:
            value = params[p.name]
            option = p.flag
            if p.kind is float and isinstance(value, int) and not isinstance(value, bool):
                value = params[p.name] = float(value)
            if not isinstance(value, p.kind) or (p.kind is int and isinstance(value, bool)):
                raise UsageError(f"{option} must be {p.kind.__name__}, got {value!r}")
            if p.choices is not None and value not in p.choices:
                raise UsageError(
                    f"{option} {value!r} is not one of {', '.join(map(str, p.choices))}"
                )
            if p.kind is float and not (math.isfinite(value) and value >= 0
                                        and (value > 0 or not p.positive)):
                raise UsageError(f"{option} must be a finite number above 0, got {value}"
                                 if p.positive else f"{option} must be a finite number, 0 "
                                 f"or more, got {value}")
            if p.kind is int and p.minimum is not None and value < p.minimum:
                raise UsageError(f"{option} must be at least {p.minimum}, got {value}")
            if p.kind is int and p.maximum is not None and value > p.maximum:
                raise UsageError(f"{option} must be at most {p.maximum} (no size on a "
                                 f"tile of 624 KiB can be larger), got {value}")
        return params


CHOOSE = Parameter("choose", str, "host", "where a language model's next token is chosen: "
                   "the host reads the logits, or an argmax on the device sends each "
                   "sequence's token (4 bytes; generate's default)", choices=("host", "device"))


def choose_suffix(params: dict[str, Any]) -> str:
    """The identifier's mark of a program whose output is chosen on the device (its graph
    differs: two builds that differ must not share an artifact folder)."""
    return "-argmax" if params.get("choose") == "device" else ""


REGISTRY: dict[str, Workload] = {}


def register(workload: Workload) -> Workload:
    REGISTRY[workload.name] = workload
    return workload


def get_workload(name: str) -> Workload:
    if name not in REGISTRY:
        close = difflib.get_close_matches(name, list(REGISTRY), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise UsageError(f"unknown workload {name!r}{hint} (known: {', '.join(sorted(REGISTRY))};"
                         " or a torch program, MODEL.pt2, or an ONNX file, MODEL.onnx)")
    return REGISTRY[name]


def rng_for(seed: int, stream: str) -> np.random.Generator:
    """A generator per named tensor, so adding a tensor never changes the others."""
    digest = sum((i + 1) * ord(ch) for i, ch in enumerate(stream))
    return np.random.default_rng([seed, digest])
