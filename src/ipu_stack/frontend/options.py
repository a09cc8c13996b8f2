"""The options of an imported program (a ``.pt2`` or, renamed, an ONNX file): kept apart
from the workload that takes them so that both importers read one list."""

from __future__ import annotations

from ipu_stack.workloads.base import CHOOSE, Parameter
from ipu_stack.workloads.transformer import ATTENTION_OPTION, KEEP_F16


def program_parameters() -> tuple[Parameter, ...]:
    """The options of an imported program: its file, the batch, precisions, inputs, and
    (a decoder step's) where the next token is chosen."""
    return (
        Parameter("model", str, "", "the .pt2 file"),
        Parameter("sha256", str, "", "sha256 of the .pt2 file (checked when re-imported)"),
        Parameter("batch", int, 0, "images a run (0: as exported; else dynamic)", minimum=0),
        Parameter("tokens", int, 0, "a decoder step's tokens (0: as exported)", minimum=0),
        Parameter("precision", str, "fp8", "GEMM inputs/weights precision", choices=("fp8", "f16")),
        ATTENTION_OPTION("f16"), KEEP_F16,
        Parameter("seed", int, 0, "seed of random inputs (calibration: seed + 1)", minimum=0,
                  maximum=None),
        Parameter("inputs", str, "", "an .npz of the program's inputs (default: random)"),
        CHOOSE,
    )


__all__ = ["program_parameters"]
