"""The frontend's modules import one way (issue 24): no cycle among them, no import inside a
function (a late import hiding a cycle) except the package's lazy entry points, and no
private name imported from another file."""

from __future__ import annotations

import ast
from pathlib import Path

import ipu_stack.frontend

FOLDER = Path(ipu_stack.frontend.__file__).parent
PACKAGE = "ipu_stack.frontend"


def _imports() -> dict[str, list[tuple[str, list[str], bool]]]:
    """module -> [(imported frontend module, names, at top level)]."""
    found: dict[str, list[tuple[str, list[str], bool]]] = {}
    for path in sorted(FOLDER.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top = set(map(id, tree.body))
        entries = []
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(
                    PACKAGE):
                names = [a.name for a in node.names]
                if node.module == PACKAGE:  # from ipu_stack.frontend import rope, fused
                    entries += [(name, [], id(node) in top) for name in names]
                else:
                    entries.append((node.module[len(PACKAGE) + 1:], names, id(node) in top))
        found[path.stem] = entries
    return found


def test_no_late_imports_and_no_private_names() -> None:
    for module, entries in _imports().items():
        for target, names, top in entries:
            if module != "__init__":
                assert top, f"{module} imports {target} inside a function"
            assert not [n for n in names if n.startswith("_")], (module, target, names)


def test_the_modules_form_no_cycle() -> None:
    graph = {m: {t for t, _, _ in e if t != m} for m, e in _imports().items()}
    state: dict[str, int] = {}

    def visit(module: str, path: list[str]) -> None:
        if state.get(module) == 2:
            return
        assert state.get(module) != 1, " -> ".join([*path, module])
        state[module] = 1
        for target in graph.get(module, ()):
            visit(target, [*path, module])
        state[module] = 2

    for module in graph:
        visit(module, [])
