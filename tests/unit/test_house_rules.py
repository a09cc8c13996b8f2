"""House rules, read from the source with ``ast`` over ``src/ipu_stack``, ``tests`` and
``benchmarks`` (in the spirit of ``test_imports.py``, and of tinygrad's ``sz.py``: each test
prints the table it checks, so ``pytest -s`` shows it):

* no private name (one leading underscore, not a dunder) is imported from another project
  module with ``from X import _name`` (X an ``ipu_stack``, ``tests`` or ``benchmarks`` module,
  or relative): what a module shares, it names publicly;
* no file is over ``MAX_FILE_LINES`` lines;
* no function is over ``MAX_FUNCTION_LINES`` lines (``def`` line to last line, nested
  functions counted on their own too), except compiled loops: functions decorated with
  numba's ``njit``, ``jit``, ``vectorize`` and the like, which are written as one flat loop
  so the compiler sees it whole.

The rules have no exemption list: a violation is fixed where it is, not recorded here.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TREES = ("src/ipu_stack", "tests", "benchmarks")
PROJECT = ("ipu_stack", "tests", "benchmarks")
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80
COMPILED = {"njit", "jit", "vectorize", "guvectorize", "stencil", "cfunc", "generated_jit"}
SHOWN = 10  # rows of each "largest" table


@dataclass(frozen=True)
class Source:
    path: str  # relative to the repository root
    text: str

    @property
    def lines(self) -> int:
        return len(self.text.splitlines())

    def tree(self) -> ast.Module:
        return ast.parse(self.text, filename=self.path)


def _sources() -> list[Source]:
    return [Source(str(path.relative_to(ROOT)), path.read_text())
            for tree in TREES for path in sorted((ROOT / tree).rglob("*.py"))]


SOURCES = _sources()


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports(source: Source) -> list[str]:
    """``path:line: from X import _name`` for each private name imported from a project module."""
    found = []
    for node in ast.walk(source.tree()):
        if not isinstance(node, ast.ImportFrom):
            continue
        module = node.module or ""
        if not node.level and module.split(".")[0] not in PROJECT:
            continue
        where = "." * node.level + module
        found += [f"{source.path}:{node.lineno}: from {where} import {alias.name}"
                  for alias in node.names if is_private(alias.name)]
    return found


def _decorator_name(node: ast.expr) -> str:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def function_lengths(source: Source) -> list[tuple[int, str, bool]]:
    """``(lines, "path:line name", compiled)`` for every function and method."""
    found = []
    for node in ast.walk(source.tree()):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            compiled = any(_decorator_name(d) in COMPILED for d in node.decorator_list)
            found.append((node.end_lineno - node.lineno + 1,
                          f"{source.path}:{node.lineno} {node.name}", compiled))
    return found


def long_functions(source: Source) -> list[str]:
    return [f"{where} ({lines} lines)" for lines, where, compiled in function_lengths(source)
            if lines > MAX_FUNCTION_LINES and not compiled]


def _table(title: str, rows: list[tuple[int, str]]) -> None:
    print(f"\n{title}")
    print("-" * 100)
    for count, name in rows:
        print(f"{count:>6}  {name}")


def _violations(title: str, bad: list[str]) -> None:
    print(f"\n{title}: {len(bad)}")
    for line in bad:
        print(f"  {line}")


# ---------------------------------------------------------------- the checker catches
SYNTHETIC = Source("synthetic.py", "\n".join([
    "from ipu_stack.lowering.lower import _group_calls, __all__",
    "from .sibling import _helper",
    "from numpy import _NoValue",
    "import numba",
    "def long():",
    *["    x = 1"] * (MAX_FUNCTION_LINES),
    "@numba.njit(cache=True)",
    "def compiled():",
    *["    x = 1"] * (MAX_FUNCTION_LINES),
    "def short():",
    "    return 1",
]))


def test_the_checker_flags_a_synthetic_source():
    assert private_imports(SYNTHETIC) == [
        "synthetic.py:1: from ipu_stack.lowering.lower import _group_calls",
        "synthetic.py:2: from .sibling import _helper",
    ]
    assert long_functions(SYNTHETIC) == [f"synthetic.py:5 long ({MAX_FUNCTION_LINES + 1} lines)"]
    lengths = {where.split()[-1]: lines for lines, where, _ in function_lengths(SYNTHETIC)}
    assert lengths == {"long": MAX_FUNCTION_LINES + 1, "compiled": MAX_FUNCTION_LINES + 1,
                       "short": 2}
    assert SYNTHETIC.lines == 2 * MAX_FUNCTION_LINES + 9


def test_the_walk_sees_the_trees():
    paths = {s.path for s in SOURCES}
    assert "src/ipu_stack/lowering/driver.py" in paths
    assert "tests/unit/test_house_rules.py" in paths
    assert any(p.startswith("benchmarks/") for p in paths)


# ---------------------------------------------------------------- the rules
def test_no_private_name_is_imported_across_files():
    bad = [line for source in SOURCES for line in private_imports(source)]
    _violations("private names imported across files", bad)
    assert not bad, "private names imported across files:\n" + "\n".join(bad)


def test_no_file_is_too_long():
    sizes = sorted(((s.lines, s.path) for s in SOURCES), reverse=True)
    _table(f"largest files (limit {MAX_FILE_LINES} lines; {len(sizes)} files, "
           f"{sum(n for n, _ in sizes)} lines in all)", sizes[:SHOWN])
    bad = [f"{path} ({lines} lines)" for lines, path in sizes if lines > MAX_FILE_LINES]
    _violations(f"files over {MAX_FILE_LINES} lines", bad)
    assert not bad, f"files over {MAX_FILE_LINES} lines:\n" + "\n".join(bad)


def test_no_function_is_too_long():
    lengths = sorted((f for s in SOURCES for f in function_lengths(s)), reverse=True)
    _table(f"largest functions (limit {MAX_FUNCTION_LINES} lines; compiled loops exempt)",
           [(n, where + (" [compiled]" if compiled else "")) for n, where, compiled
            in lengths[:SHOWN]])
    bad = [line for source in SOURCES for line in long_functions(source)]
    _violations(f"functions over {MAX_FUNCTION_LINES} lines", bad)
    assert not bad, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(bad)
