"""Structured logging in the reference format: ``LEVEL target: message key=value ...``.

Every stage logs through :func:`event` so that the lines look like the reference logs
(``INFO ipu_stack.exchange: optimized physical exchange schedule phase=3 ...``).  Values are
rendered the way the reference renders them: strings quoted, numbers bare, lists as ``[...]``
(without spaces, so that a line splits into its fields on them).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def format_value(value: Any) -> str:
    """Render one field value: strings in double quotes, everything else as ``str``."""
    if isinstance(value, str):
        if value and all(ch.isalnum() or ch in "._/-:" for ch in value):
            return value
        return '"' + value.replace('"', '\\"') + '"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, tuple)):  # no spaces: a line splits on them into its fields
        return "[" + ",".join(format_value(item) for item in value) + "]"
    return str(value)


def format_fields(fields: dict[str, Any]) -> str:
    """Render ``key=value`` pairs in insertion order; a field without a value (``None``:
    a JSON record's null) is left out."""
    return " ".join(f"{key}={format_value(value)}" for key, value in fields.items()
                    if value is not None)


def event(logger: logging.Logger, message: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log ``message key=value ...`` at ``level`` (cheap when the level is disabled)."""
    if logger.isEnabledFor(level):
        text = message if not fields else f"{message} {format_fields(fields)}"
        logger.log(level, text)


class ReferenceFormatter(logging.Formatter):
    """``LEVEL target: message`` with the level left-padded like the reference logs."""

    def format(self, record: logging.LogRecord) -> str:
        text = f"{record.levelname:>5} {record.name}: {record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time of the record (test captures swap it)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self):  # noqa: D102
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # the base class assigns it; we always use sys.stderr
        pass


def configure(level: int = logging.INFO, shown: int | None = None,
              asked: tuple[str, ...] = ()) -> None:
    """Send ``ipu_stack.*`` logs to stderr in the reference format (idempotent): records of
    ``level`` and above are made (tests and profiles read them), those of ``shown`` and above
    (default: ``level``) are printed, and all of those the loggers named in ``asked`` make
    (an option that asks for lines, ``--diagnostics``, shows them without ``-v``)."""
    root = logging.getLogger("ipu_stack")
    root.setLevel(level)
    for handler in list(root.handlers):
        if isinstance(handler, _StderrHandler):
            root.removeHandler(handler)
    handler = _StderrHandler()
    least = level if shown is None else shown
    handler.addFilter(lambda record: record.levelno >= least or record.name in asked)
    handler.setFormatter(ReferenceFormatter())
    root.addHandler(handler)


@contextmanager
def phase(logger: logging.Logger, name: str, **fields: Any) -> Iterator[dict[str, Any]]:
    """Time a build phase and log ``package build phase finished phase=... elapsed_ms=...``.

    The yielded dict collects extra fields the phase wants on its closing line.
    """
    extra: dict[str, Any] = {}
    start = time.perf_counter()
    success = False
    try:
        yield extra
        success = True
    finally:
        elapsed_ms = int(round((time.perf_counter() - start) * 1000))
        event(
            logger,
            "package build phase finished",
            phase=name,
            elapsed_ms=elapsed_ms,
            success=success,
            **fields,
            **extra,
        )


class Progress:
    """A one-line progress display on stderr, only when stderr is a terminal.

    Logs stay the record; this is for the person watching a long phase, so it draws nothing
    when output is piped or captured (CI, tests, ``2> file``).
    """

    def __init__(self, label: str, total: int) -> None:
        self.label = label
        self.total = max(total, 1)
        self.done = 0
        self.enabled = sys.stderr.isatty()

    def step(self, what: str = "") -> None:
        self.done += 1
        if self.enabled:
            sys.stderr.write(f"\r\033[K{self.label} {self.done}/{self.total} {what}")
            sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()



FIRST_COMPILE_NOTE = ("note: numba is compiling the simulator's loops, once for this install "
                      "(about 25 s on 2 cores); later runs load them from its cache")


def note_first_compile() -> object | None:
    """At a terminal, one line the first time numba compiles a loop in this process (its
    cache on disk was cold): a first run is otherwise silent for half a minute.  Compiles
    are numba's ``numba:compile`` events, which fire only on a cache miss.  Returns the
    listener (``numba.core.event.unregister`` takes it back), or ``None`` off a terminal."""
    if not sys.stderr.isatty():
        return None
    from numba.core import event

    class FirstCompile(event.Listener):
        said = False

        def on_start(self, _event) -> None:  # noqa: ANN001
            if not self.said:
                self.said = True
                print(FIRST_COMPILE_NOTE, file=sys.stderr, flush=True)

        def on_end(self, _event) -> None:  # noqa: ANN001
            pass

    listener = FirstCompile()
    event.register("numba:compile", listener)
    return listener
