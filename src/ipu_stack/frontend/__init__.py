"""Users' own models: import a ``torch.export`` program into the IR (optional extra ``[torch]``).

torch is imported lazily, inside the functions that need it, so ``import ipu_stack.frontend``
works without torch and the core compiler never depends on it.  See ``docs/frontend.md``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["import_program", "imported_workload", "is_program_path", "list_operations",
           "make_workload"]


def is_program_path(text: str) -> bool:
    """Whether a command-line workload argument names a torch program file (``*.pt2``)."""
    return str(text).lower().endswith(".pt2")


def import_program(*args: Any, **kwargs: Any) -> Any:
    from ipu_stack.frontend.workload import import_program as run

    return run(*args, **kwargs)


def imported_workload(path: Any) -> Any:
    from ipu_stack.frontend.workload import imported_workload as run

    return run(path)


def make_workload(*args: Any, **kwargs: Any) -> Any:
    from ipu_stack.frontend.workload import make_workload as run

    return run(*args, **kwargs)


def list_operations(program: Any) -> Any:
    from ipu_stack.frontend.listing import list_operations as run

    return run(program)
