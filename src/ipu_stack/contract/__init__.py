"""The typed contract between compiler and device: the program, its wire form, its verifier."""

from ipu_stack.contract.parse import check_metadata, from_manifest
from ipu_stack.contract.program import (
    Allocations,
    Call,
    Compute,
    DeviceProgram,
    Exchange,
    HostRead,
    HostWrite,
    Loop,
    Step,
    StreamLayout,
    TensorSpec,
    to_manifest,
)
from ipu_stack.contract.verify import verify_program

__all__ = [
    "Allocations", "Call", "Compute", "DeviceProgram", "Exchange", "HostRead", "HostWrite",
    "Loop", "Step", "StreamLayout", "TensorSpec", "check_metadata", "from_manifest",
    "to_manifest", "verify_program",
]
