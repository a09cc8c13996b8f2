"""Builtin workloads (``ipu-stack workloads`` lists them)."""

from ipu_stack.workloads import decoder, mlp, text, transformer, vision, vlm  # noqa: F401  (registers)
from ipu_stack.workloads.base import REGISTRY, Parameter, Workload, get_workload

__all__ = ["REGISTRY", "Parameter", "Workload", "get_workload"]
