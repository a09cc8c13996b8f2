"""Builtin workloads (``ipu-stack workloads`` lists them)."""

from ipu_stack.workloads import (  # noqa: F401  (registers)
    decoder,
    mlp,
    swin,
    text,
    transformer,
    vision,
    vlm,
)
from ipu_stack.workloads.base import REGISTRY, Parameter, Workload, get_workload

__all__ = ["REGISTRY", "Parameter", "Workload", "get_workload"]
