"""A disk cache of fitted FP8 scale exponents, so a tower is calibrated once, not per compile.

Fitting a 27-layer tower's activation scales runs the whole model on a calibration image
(about 20 s on 2 cores); the result is a few dozen integers that depend only on the
workload, its sizes and seed and this compiler's version.  They are kept as JSON under the
compile's cache folder (``calibration/<key>.json``, the key a SHA-256 of those inputs) with a
checksum of the content; an entry that fails the checksum is ignored and rewritten.  The
compile sets the folder for the duration of a build (:func:`cache_folder`); with none set,
nothing is cached.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from ipu_stack import __version__
from ipu_stack.util.files import write_text_atomic
from ipu_stack.util.log import event

LOG = logging.getLogger("ipu_stack.workloads")
FORMAT = 1
_FOLDER: ContextVar[Path | None] = ContextVar("calibration_cache", default=None)


@contextlib.contextmanager
def cache_folder(folder: Path | None) -> Iterator[None]:
    """Cache calibrations under ``folder / "calibration"`` while the block runs."""
    token = _FOLDER.set(None if folder is None else Path(folder) / "calibration")
    try:
        yield
    finally:
        _FOLDER.reset(token)


def _key(name: str, params: dict[str, Any]) -> str:
    body = json.dumps({"format": FORMAT, "compiler": __version__, "workload": name,
                       "params": {k: v for k, v in params.items() if k != "batch"}},
                      sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()


def _digest(scales: dict[str, dict[str, int]]) -> str:
    return hashlib.sha256(json.dumps(scales, sort_keys=True).encode()).hexdigest()


def load(name: str, params: dict[str, Any]) -> dict[str, dict[str, int]] | None:
    """The cached ``{"activations": ..., "weights": ...}`` exponents, if any and intact."""
    folder = _FOLDER.get()
    if folder is None:
        return None
    path = folder / f"{_key(name, params)}.json"
    try:
        entry = json.loads(path.read_text())
        scales = {part: {str(k): int(v) for k, v in entry["scales"][part].items()}
                  for part in ("activations", "weights")}
        if entry["sha256"] != _digest(scales):
            raise ValueError("checksum mismatch")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        event(LOG, "ignored a damaged calibration cache entry", level=logging.WARNING,
              path=str(path), reason=str(exc))
        return None
    event(LOG, "reused cached calibration", workload=name, path=str(path))
    return scales


def store(name: str, params: dict[str, Any], scales: dict[str, dict[str, int]]) -> None:
    folder = _FOLDER.get()
    if folder is None:
        return
    folder.mkdir(parents=True, exist_ok=True)
    entry = {"format": FORMAT, "scales": scales, "sha256": _digest(scales)}
    write_text_atomic(folder / f"{_key(name, params)}.json",
                      json.dumps(entry, sort_keys=True, indent=1) + "\n")
