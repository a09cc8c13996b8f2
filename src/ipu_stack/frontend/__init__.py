"""Users' own models: import a ``torch.export`` program or an ONNX model into the IR
(optional extras ``[torch]`` and ``[onnx]``).

torch is imported lazily, inside the functions that need it, so ``import ipu_stack.frontend``
works without torch and the core compiler never depends on it.  See ``docs/frontend.md``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["import_program", "imported_workload", "is_onnx_path", "is_program_path",
           "list_operations", "make_workload", "reimport"]


def is_program_path(text: str) -> bool:
    """Whether a command-line workload argument names a model file: a torch program
    (``*.pt2``) or an ONNX model (``*.onnx``)."""
    return str(text).lower().endswith((".pt2", ".onnx"))


def import_program(*args: Any, **kwargs: Any) -> Any:
    from ipu_stack.frontend.workload import import_program as run

    return run(*args, **kwargs)


def is_onnx_path(text: Any) -> bool:
    return str(text).lower().endswith(".onnx")


def imported_workload(path: Any) -> Any:
    """The workload of a model file and its base parameters: ``.pt2`` or ``.onnx``."""
    if is_onnx_path(path):
        from ipu_stack.frontend.onnx_workload import onnx_workload

        return onnx_workload(path)
    from ipu_stack.frontend.workload import imported_workload as run

    return run(path)


def reimport(params: dict[str, Any]) -> Any:
    """The workload a package recorded: the same model file, unchanged (same sha256)."""
    from ipu_stack.frontend.workload import recorded_file

    return imported_workload(recorded_file(params))[0]


def make_workload(*args: Any, **kwargs: Any) -> Any:
    from ipu_stack.frontend.workload import make_workload as run

    return run(*args, **kwargs)


def list_operations(program: Any, label: str = "the program") -> Any:
    from ipu_stack.frontend.listing import list_operations as run

    return run(program, label)
