"""The hardware-ownership lock: exclusive, names its owner, recovered when the owner dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ipu_stack.device.lock import HardwareLock
from ipu_stack.util.errors import DeviceError

HOLDER = """
import sys, time
from pathlib import Path
from ipu_stack.device.lock import HardwareLock
with HardwareLock(Path(sys.argv[1]), wait=False):
    print("held", flush=True)
    time.sleep(60)
"""

CONTENDER = """
import sys
from pathlib import Path
from ipu_stack.device.lock import HardwareLock
from ipu_stack.util.errors import DeviceError
try:
    with HardwareLock(Path(sys.argv[1]), wait=False):
        print("acquired", flush=True)
except DeviceError as exc:
    print("refused:", exc, flush=True)
"""


def start_holder(path: Path) -> subprocess.Popen:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)], stdout=subprocess.PIPE, text=True
    )
    line = holder.stdout.readline().strip()
    assert line == "held", line
    return holder


def contend(path: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-c", CONTENDER, str(path)],
        capture_output=True, text=True, timeout=30, check=True,
    )
    return done.stdout.strip()


def test_second_owner_is_refused_naming_the_pid_and_recovers_after_kill(tmp_path: Path) -> None:
    path = tmp_path / "device.lock"
    holder = start_holder(path)
    try:
        assert path.read_text() == str(holder.pid)
        # another process
        assert contend(path) == (
            f"refused: device is owned by another process (pid {holder.pid}, lock {path})"
        )
        # and this process, through a separate open file description
        with pytest.raises(DeviceError, match=rf"owned by another process \(pid {holder.pid},"):
            with HardwareLock(path, wait=False):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        holder.stdout.close()
    # the dead owner's pid is still in the file, but the kernel dropped its flock
    assert path.read_text() == str(holder.pid)
    with HardwareLock(path, wait=False):
        assert path.read_text() == str(os.getpid())
        assert contend(path).startswith(f"refused: device is owned by another process (pid "
                                        f"{os.getpid()},")
    assert path.read_text() == ""  # released: the owner field is cleared
    assert contend(path) == "acquired"


def test_waiting_owner_times_out_naming_the_owner(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "device.lock"
    with HardwareLock(path, wait=False):
        start = time.monotonic()
        with pytest.raises(DeviceError, match=rf"timed out after 0 s waiting for the device "
                           rf"\(owner pid {os.getpid()}\)"):
            with HardwareLock(path, wait=True, timeout=0.3):
                pass
        assert 0.25 < time.monotonic() - start < 5


def test_waiting_owner_gets_the_device_when_it_is_released(tmp_path: Path) -> None:
    path = tmp_path / "device.lock"
    holder = start_holder(path)
    try:
        started = time.monotonic()
        killer = threading.Timer(0.4, holder.kill)  # the owner dies while we wait
        killer.start()
        with HardwareLock(path, wait=True, timeout=20):
            waited = time.monotonic() - started
            assert path.read_text() == str(os.getpid())
        assert waited >= 0.3
        killer.join()
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait(timeout=10)
        holder.stdout.close()
