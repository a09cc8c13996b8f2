"""Kernel families: functional semantics on tile bytes (batched over tiles) and cycle costs."""

from ipu_stack.kernels import (  # noqa: F401  (registers the families)
    argmax,
    copy,
    epilogue,
    gemm,
    rowwise,
    slice,
)
from ipu_stack.kernels.base import FAMILIES, KernelFamily, KernelInstance

__all__ = ["FAMILIES", "KernelFamily", "KernelInstance"]
