"""The import rules, read from the source: stages import one way, and no module cycles.

Every ``import`` and ``from ... import`` of an ``ipu_stack`` module anywhere in a file (late
imports inside functions included) is an edge.  The checks:

* the stage order of docs/architecture.md: a stage imports only itself, ``util``, ``target``,
  ``ir`` and the stages before it;
* the planner and the device share only the price table: ``device`` imports nothing from
  ``planning`` or ``phases``, ``planning`` nothing from ``device``;
* no cycle among modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "ipu_stack"
ORDER = ["util", "target", "ir", "kernels", "exchange", "workloads", "frontend", "planning",
         "lowering", "memory", "contract", "codegen", "package", "device", "verdict", "runtime",
         "profile", "phases", "pipeline", "strategy", "capacity", "sweep", "recipe", "generation",
         "cli_parser", "cli", "testing"]


def _module(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _edges() -> dict[str, set[str]]:
    modules = {_module(p): p for p in SRC.rglob("*.py")}
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                    + ([base] if base else []))
                # ``from X import m`` where X.m is a module needs X.m; otherwise X itself
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                         for a in node.names]
            for name in names:
                while name and name not in modules:
                    name = name.rpartition(".")[0]
                # a module's own parent packages are initialised before it by Python
                if name.startswith("ipu_stack.") and not module.startswith(name):
                    edges[module].add(name)
    return edges


EDGES = _edges()


def _stage(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def test_the_walk_sees_the_package():
    assert "ipu_stack.device.simulator" in EDGES
    assert "ipu_stack.contract.program" in EDGES["ipu_stack.device.simulator"]


@pytest.mark.parametrize(("importer", "forbidden"), [
    ("device", {"planning", "phases"}),
    ("planning", {"device"}),
])
def test_estimate_and_device_timing_share_only_the_table(importer, forbidden):
    bad = sorted(f"{m} -> {t}" for m, targets in EDGES.items() if _stage(m) == importer
                 for t in targets if _stage(t) in forbidden)
    assert not bad, bad


def test_stages_import_one_way():
    rank = {stage: i for i, stage in enumerate(ORDER)}
    unknown = {_stage(m) for m in EDGES if _stage(m) and _stage(m) not in rank}
    assert not unknown, f"stages missing from ORDER: {unknown}"
    bad = sorted(f"{m} -> {t}" for m, targets in EDGES.items() for t in targets
                 if _stage(m) and _stage(t) and rank[_stage(t)] > rank[_stage(m)])
    assert not bad, bad


def test_no_module_imports_itself_around_a_cycle():
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(EDGES.get(module, ())):
            if state.get(target) == 1:
                cycles.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[module] = 2

    for module in sorted(EDGES):
        if module not in state:
            visit(module, [module])
    assert not cycles, [" -> ".join(c) for c in cycles]
