"""Run a piece of work in a forked child, so that the memory it needed goes with the child.

A giant tower's calibration pass makes every weight and evaluates the whole model in
float32 (gigabytes), for a result of a few dozen integers.  Done in the compiling process,
that memory stays with it (freed blocks are kept for reuse, ``util.heap``), and every
process forked from it later (a chip's worker, a host side) starts with that peak as its
own.  In a child the peak is the child's: the parent receives only the JSON of the result.

Only a result that JSON carries comes back.  Where the platform has no ``fork``, or the
child fails (an exception, a signal, memory), :func:`call_forked`'s answer says why
(``Forked.failure``) and the caller does the work itself, which raises the same error
where it has one, with its own type and message.
"""

from __future__ import annotations

import json
import os
import resource
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Forked:
    """What a forked call gave back: its result, or why there is none, and the child's
    peak resident bytes."""

    result: Any = None
    failure: str | None = None
    peak_bytes: int = 0

    @property
    def ok(self) -> bool:
        return self.failure is None


def call_forked(work: Callable[[], Any]) -> Forked:
    """``work()`` in a forked child; its JSON result (or the child's failure) here."""
    if not hasattr(os, "fork"):
        return Forked(failure="this platform cannot fork")
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the caller's stack
        status = 0
        try:
            os.close(read_end)
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            try:
                result = work()
                peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
                data = json.dumps({"result": result, "peak_bytes": peak})
            except BaseException as failure:  # noqa: BLE001 - reported to the parent
                data = json.dumps({"failure": f"{type(failure).__name__}: {failure}",
                                   "peak_bytes": peak})
            with os.fdopen(write_end, "wb") as out:
                out.write(data.encode())
        except BaseException:  # noqa: BLE001 - the parent sees the exit status
            status = 1
        finally:
            os._exit(status)
    os.close(write_end)
    try:
        with os.fdopen(read_end, "rb") as source:
            data = source.read()
    except BaseException:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise
    _, status = os.waitpid(pid, 0)
    if not data:
        return Forked(failure=f"the child ended with status {os.waitstatus_to_exitcode(status)} "
                      "and no result")
    payload = json.loads(data)
    return Forked(payload.get("result"), payload.get("failure"), int(payload["peak_bytes"]))


__all__ = ["Forked", "call_forked"]
