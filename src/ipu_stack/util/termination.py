"""SIGTERM handled as Ctrl-C is: the command unwinds, so that what it holds is cleaned up.

Why: Python's default for SIGTERM (``timeout``, a job scheduler, ``kill``) ends the process
at once, so ``with`` blocks never exit: ``capacity``'s temporary folder of packages (hundreds
of MB) and a file being written atomically stayed behind.  Under :func:`terminate_unwinds`
the signal raises :class:`Terminated` in the main thread instead; the command says so in one
line and exits 143.  Processes forked while it is in force (a run's host side, a chip's
worker) keep the default: their parent decides when they end."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

RESEND_SECONDS = 0.05  # a signal Python ignored is sent again after this


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: unwind as an interrupt does."""


@contextmanager
def terminate_unwinds() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` in this process while the block runs (only from
    the main thread, where Python can install a handler; elsewhere nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    owner = os.getpid()

    def on_terminate(signum: int, frame: FrameType | None) -> None:
        if os.getpid() != owner:  # a forked child: end as the default would
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        raise Terminated()

    def on_unraisable(unraisable: Any) -> None:
        """The signal arrived where Python ignores what is raised (an at-fork hook such as
        logging's ``_releaseLock``, a ``__del__``): the command would go on as if it had never
        come.  Sent again from another thread a moment later, it raises in the main thread's
        ordinary code (sent from here, it would raise in this hook, ignored again)."""
        if isinstance(unraisable.exc_value, Terminated) and os.getpid() == owner:
            again = threading.Timer(RESEND_SECONDS, os.kill, (owner, signal.SIGTERM))
            again.daemon = True
            again.start()
            return
        previous_hook(unraisable)

    previous = signal.signal(signal.SIGTERM, on_terminate)
    previous_hook, sys.unraisablehook = sys.unraisablehook, on_unraisable
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        sys.unraisablehook = previous_hook
