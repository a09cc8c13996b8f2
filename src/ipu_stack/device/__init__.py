"""The device: a small contract (load a package, call a program) and the simulated ipu21."""

from ipu_stack.device.lock import DEFAULT_LOCK, HardwareLock, device_lock
from ipu_stack.device.simulator import CallReport, SimulatedIpu

__all__ = ["CallReport", "DEFAULT_LOCK", "HardwareLock", "SimulatedIpu", "device_lock"]
