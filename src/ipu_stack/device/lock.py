"""The hardware-ownership lock: one process owns the (simulated) device at a time.

An exclusive ``flock`` on a lock file; the owner writes its pid into it.  The kernel drops the
lock when the owner dies, so a lock left by a dead process is recovered automatically.  A
second process waits (logging ``waiting for hardware ownership``) or, with ``wait=False``,
fails at once naming the owner.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from pathlib import Path

from ipu_stack.util.errors import DeviceError
from ipu_stack.util.log import event

LOG = logging.getLogger("ipu_stack.device")
DEFAULT_LOCK = Path("/tmp/ipu-stack-device.lock")


class HardwareLock:
    """Context manager holding the device lock."""

    def __init__(self, path: Path = DEFAULT_LOCK, wait: bool = True, timeout: float = 600.0):
        self.path = Path(path)
        self.wait = wait
        self.timeout = timeout
        self._fd: int | None = None

    def _owner(self) -> str:
        try:
            return self.path.read_text().strip() or "unknown"
        except OSError:
            return "unknown"

    def __enter__(self) -> HardwareLock:
        event(LOG, "waiting for hardware ownership", path=str(self.path))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.timeout
        announced = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not self.wait:
                    os.close(fd)
                    raise DeviceError(
                        f"device is owned by another process (pid {self._owner()}, "
                        f"lock {self.path})"
                    ) from None
                if not announced:
                    event(LOG, "device busy, waiting for its owner", owner=self._owner())
                    announced = True
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise DeviceError(
                        f"timed out after {self.timeout:.0f} s waiting for the device "
                        f"(owner pid {self._owner()})"
                    ) from None
                time.sleep(0.1)
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd
        event(LOG, "acquired hardware ownership", path=str(self.path))
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
