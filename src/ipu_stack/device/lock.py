"""The hardware-ownership lock of a named, shared simulated device.

A simulated device is not a scarce resource: by default every run gets its own
(:func:`device_lock` gives no lock) and never waits for another process.  ``--device NAME``
names a shared one, as a person sharing a real card would: runs naming the same device take an
exclusive ``flock`` on its lock file and run one at a time.  The owner writes its pid into the
file; the kernel drops the lock when the owner dies, so a lock left by a dead process is
recovered automatically.  A second process waits for as long as the owner runs (logging
``device busy, waiting for its owner``), as on hardware, or with ``wait=False`` fails at once
naming the owner.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import tempfile
import time
from pathlib import Path

from ipu_stack.util.errors import DeviceError, UsageError
from ipu_stack.util.log import event

LOG = logging.getLogger("ipu_stack.device")
LOCK_FOLDER = Path(tempfile.gettempdir())
DEFAULT_LOCK = LOCK_FOLDER / "ipu-stack-device.lock"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def device_lock(name: str | None) -> Path | None:
    """The lock file of the shared device ``name``; ``None`` (a private device) without one."""
    if name is None:
        return None
    if not _NAME.fullmatch(name):
        raise UsageError(f"--device {name!r}: a device name is 1-64 letters, digits, '_', '.' "
                         "or '-', starting with a letter or digit")
    return LOCK_FOLDER / f"ipu-stack-device-{name}.lock"


class HardwareLock:
    """Context manager holding the device lock."""

    def __init__(self, path: Path = DEFAULT_LOCK, wait: bool = True,
                 timeout: float | None = None):
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
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
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
                if deadline is not None and time.monotonic() > deadline:
                    os.close(fd)
                    raise DeviceError(
                        f"timed out after {self.timeout or 0:.0f} s waiting for the device "
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
