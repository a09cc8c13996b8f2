"""The one line a first run prints while numba compiles (``util.log.note_first_compile``):
at a terminal only, and once however many loops compile (numba fires its compile event only
when a loop is not in its cache)."""

from __future__ import annotations

import io
import sys

import numba
from numba.core import event

from ipu_stack.util.log import FIRST_COMPILE_NOTE, note_first_compile


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_compile_at_a_terminal_is_announced_once(monkeypatch) -> None:
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    listener = note_first_compile()
    assert listener is not None
    try:
        @numba.njit(cache=False)
        def twice(x):
            return 2 * x

        assert twice(3) == 6 and twice(1.5) == 3.0  # two compiles, one line
    finally:
        event.unregister("numba:compile", listener)
    assert terminal.getvalue() == FIRST_COMPILE_NOTE + "\n"


def test_off_a_terminal_nothing_is_said(monkeypatch) -> None:
    pipe = io.StringIO()
    monkeypatch.setattr(sys, "stderr", pipe)
    assert note_first_compile() is None

    @numba.njit(cache=False)
    def thrice(x):
        return 3 * x

    assert thrice(2) == 6 and pipe.getvalue() == ""
