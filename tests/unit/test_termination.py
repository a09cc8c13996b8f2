"""SIGTERM unwinds the command even where it arrives in code whose exceptions Python ignores
(an at-fork hook, a ``__del__``): there the first ``Terminated`` is lost, so it is raised
again from the main thread's ordinary code."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import os, signal, time
from ipu_stack.util.termination import Terminated, terminate_unwinds

class Finaliser:
    def __del__(self):  # the signal arrives here, where what is raised is ignored
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(100000):
            pass

try:
    with terminate_unwinds():
        Finaliser()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            pass
        print("went on")
except Terminated:
    print("terminated")
"""


def test_a_signal_python_ignored_is_raised_again() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "terminated", done
    assert "Exception ignored" not in done.stderr, done.stderr
