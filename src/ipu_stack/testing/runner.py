"""The ``ipu-stack`` command line run in this process, its output captured."""

from __future__ import annotations

import contextlib
import io


def cli(argv: list[str]) -> tuple[int, str, str]:
    """Run ``ipu-stack argv`` in this process; return (exit code, stdout, stderr).

    ``SystemExit`` (argparse) becomes its code; any other exception propagates, so a traceback
    is a failure of the caller, not a swallowed error.
    """
    from ipu_stack.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()
