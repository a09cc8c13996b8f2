"""Sweep points: a grid of workload parameters and compile options, each point with a key.

``--grid NAME=V1,V2`` names either a parameter of the workload (``batch``, ``precision``,
``tokens``, ...) or a compile option (``memory-proportion``, ``paired-exchange``,
``gemm-mode``, ``finalists``).  A point's key is the sha256 of its workload, resolved
parameters, compile options and the compiler version: what resume compares.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass
from typing import Any

from ipu_stack import __version__
from ipu_stack.phases.state import GEMM_MODES, STRATEGIES, CompileOptions
from ipu_stack.target.links import get_system
from ipu_stack.util.errors import UsageError
from ipu_stack.workloads import get_workload

# each compile option's values as the command line checks them (``cli``): a grid value
# the command line would refuse is refused before any point runs
CHOICES: dict[str, tuple[str, ...]] = {"gemm-mode": GEMM_MODES, "strategy": STRATEGIES}
LEAST: dict[str, int] = {"finalists": 1, "groups": 1, "chips": 1}

OPTIONS: dict[str, tuple[str, type]] = {
    "memory-proportion": ("memory_proportion", float),
    "paired-exchange": ("paired_exchange", bool),
    "fuse-supersteps": ("fuse_supersteps", bool),
    "gemm-mode": ("gemm_mode", str),
    "finalists": ("finalists", int),
    "strategy": ("strategy", str),
    "groups": ("groups", int),
    "chips": ("chips", int),
}


@dataclass(frozen=True)
class Point:
    """One compile-and-run of a sweep."""

    workload: str
    params: dict[str, Any]
    options: dict[str, Any]  # CompileOptions fields
    grid: dict[str, Any]  # the values this point took on the swept axes

    @property
    def key(self) -> str:
        """The point's content address: its workload, parameters, the options' own key
        (every field that changes the package) and the compiler."""
        text = json.dumps({"workload": self.workload, "params": self.params,
                           "options": self.options_hash, "compiler": __version__},
                          sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @property
    def options_hash(self) -> str:
        return self.compile_options().key()[:16]

    def compile_options(self) -> CompileOptions:
        return CompileOptions(**self.options)

    def to_json(self) -> dict[str, Any]:
        return {"workload": self.workload, "params": self.params, "options": self.options,
                "grid": self.grid}


def _value(text: str, kind: type, name: str) -> Any:
    try:
        if kind is bool:
            if text.lower() not in ("true", "false", "1", "0", "on", "off"):
                raise ValueError(text)
            return text.lower() in ("true", "1", "on")
        return kind(text)
    except ValueError:
        what = {"int": "a whole number", "float": "a number", "bool": "true or false"}
        raise UsageError(f"--grid {name}: {text!r} is not "
                         f"{what.get(kind.__name__, kind.__name__)}") from None


def parse_grid(specs: list[str]) -> dict[str, list[str]]:
    """``["batch=1,2", "precision=fp8,f16"]`` -> ``{"batch": ["1", "2"], ...}``."""
    grid: dict[str, list[str]] = {}
    for spec in specs:
        name, sep, values = spec.partition("=")
        name = name.strip().lstrip("-")
        items = [v.strip() for v in values.split(",")]
        if not sep or not name or not all(items):
            raise UsageError(f"--grid {spec!r}: expected NAME=V1,V2,...")
        if name in grid:
            raise UsageError(f"--grid {name} is given twice")
        twice = next((v for i, v in enumerate(items) if v in items[:i]), None)
        if twice is not None:
            raise UsageError(f"--grid {name}: {twice} is given twice")
        grid[name] = items
    return grid


def option_value(name: str, text: str) -> Any:
    """A compile option's grid value, checked as the command line checks it."""
    field_name, kind = OPTIONS[name]
    value = _value(text, kind, name)
    if name in CHOICES and value not in CHOICES[name]:
        raise UsageError(f"--grid {name}: {value!r} is not one of {', '.join(CHOICES[name])}")
    if name in LEAST and value < LEAST[name]:
        raise UsageError(f"--grid {name}: {value} is below {LEAST[name]}")
    if name == "chips":  # a cluster's card count, or one line why not
        get_system("ipu21", value, "--grid chips:")
    if name == "memory-proportion" and not 0 < value <= 1:
        raise UsageError(f"--grid memory-proportion: {value} is not in (0, 1]")
    return value


def expand(workload_name: str, grid: dict[str, list[str]], base_params: dict[str, Any],
           base_options: CompileOptions) -> list[Point]:
    """Every combination of the grid's values, in grid order, as resolved points."""
    workload = get_workload(workload_name)
    kinds = {p.name: p.kind for p in workload.parameters}
    axes: list[list[tuple[str, Any]]] = []
    for name, values in grid.items():
        key = name.replace("-", "_")
        if key in kinds:
            axes.append([(key, _value(v, kinds[key], name)) for v in values])
        elif name in OPTIONS:
            axes.append([(f"option:{OPTIONS[name][0]}", option_value(name, v))
                         for v in values])
        else:
            known = ", ".join(sorted(list(kinds) + list(OPTIONS)))
            raise UsageError(f"--grid {name}: not a parameter of {workload.name} or a compile "
                             f"option (known: {known})")
    points = []
    for combination in itertools.product(*axes):
        params = dict(base_params)
        options = {k: v for k, v in base_options.__dict__.items()}
        chosen = {}
        for key, value in combination:
            if key.startswith("option:"):
                options[key[7:]] = value
                chosen[key[7:].replace("_", "-")] = value
            else:
                params[key] = value
                chosen[key] = value
        if int(options["chips"]) > 1 and options["strategy"] == "layers" and \
                "strategy" not in chosen:
            options["strategy"] = "pipeline"  # over several chips a tower is pipelined
        point = Point(workload.name, workload.resolve(params), options, chosen)
        same = next((p for p in points if p.key == point.key), None)
        if same is not None:  # e.g. tokens=16,016: one compile, which would run twice
            raise UsageError(f"--grid: {same.grid} and {chosen} are the same point")
        points.append(point)
    return points
