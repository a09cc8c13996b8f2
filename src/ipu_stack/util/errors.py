"""The error types the CLI turns into one line and a non-zero exit.

Each stage raises a subclass of :class:`IpuStackError` whose message names the problem; the
CLI prints ``error: <message>`` and exits 2 (usage/compile), or as the subclass says.
"""

from __future__ import annotations

from collections.abc import Callable


def first_line(exc: BaseException) -> str:
    """The first line of a foreign exception's message (its type's name when it has none):
    what a one-line error quotes of a library's multi-line report."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


class IpuStackError(Exception):
    """Base of every error the CLI reports as one line."""

    exit_code = 2


class UsageError(IpuStackError):
    """Bad command-line input: unknown workload, impossible sizes, missing files."""


class CompileError(IpuStackError):
    """The compiler cannot build the workload (does not fit, no valid plan)."""


class PlacementError(CompileError):
    """A value does not fit in its tile's memory class; ``details`` holds the debug dump."""

    def __init__(self, message: str, details: str = "") -> None:
        super().__init__(message)
        self.details = details
        self.placement: object | None = None  # the partial placement, when there is one
        self.tile: int | None = None  # the tile that ran out
        # the most bytes that found no place at one step on any tile: how far the program
        # overshoots its memory, which sizes the compile's next try
        self.shortfall: int = 0
        self.planned_bytes: int = 0  # the planner's estimate for the plans that failed
        self.interleaved = False  # the buffer that found no place wanted interleaved memory
        # writes the memory reports of the failed program: called once the compile has no
        # try left (``pipeline.Tries``), not at every failed try
        self.write_reports: Callable[[], None] | None = None


class ConversionError(IpuStackError):
    """An imported graph computes other values than the model's own framework: an import
    defect.  Not a :class:`CompileError`, so no fallback that tries another plan when one
    does not fit (a prompt's pass, a capacity search) takes it for a size problem."""


class PackageError(IpuStackError):
    """A package file is missing, corrupt, from another version or target, or malicious."""


class DeviceError(IpuStackError):
    """The device cannot be used (owned by another process) or faulted while running."""


class DeviceFault(DeviceError):
    """The simulator caught what hardware would punish: out-of-bounds access, port clash."""
