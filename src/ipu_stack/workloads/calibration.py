"""A disk cache of fitted FP8 scale exponents, so a tower is calibrated once, not per compile.

Fitting a 27-layer tower's activation scales runs the whole model on a calibration image (its
time in a compile: docs/benchmarks.md); the result is a few dozen integers that depend only on
the workload, its sizes and seed and this compiler's version.  They are kept under the compile's
cache folder (``calibration/<key>.json``, the key a SHA-256 of those inputs) by the shared
:class:`~ipu_stack.util.cache.EntryCache`: verified on every read, written atomically, and a
damaged entry dropped with a warning and rewritten.  The compile sets the folder for the
duration of a build (:func:`cache_folder`); with none set, nothing is cached.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from ipu_stack import __version__
from ipu_stack.util.cache import EntryCache, content_key
from ipu_stack.util.log import event

LOG = logging.getLogger("ipu_stack.workloads")
FORMAT = 1
Scales = dict[str, dict[str, int]]
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
    """Everything the exponents depend on; the batch does not change a per-row fit."""
    return content_key({"format": FORMAT, "compiler": __version__, "workload": name,
                        "params": {k: v for k, v in params.items() if k != "batch"}})


def _decode(payload: dict[str, Any]) -> Scales:
    if payload["format"] != FORMAT:
        raise ValueError(f"format {payload['format']!r}, not {FORMAT}")
    return {part: {str(k): int(v) for k, v in payload["scales"][part].items()}
            for part in ("activations", "weights")}


def _cache() -> EntryCache | None:
    folder = _FOLDER.get()
    return None if folder is None else EntryCache(folder, "calibration")


def load(name: str, params: dict[str, Any]) -> Scales | None:
    """The cached ``{"activations": ..., "weights": ...}`` exponents, if any and intact."""
    cache = _cache()
    if cache is None:
        return None
    scales, _ = cache.load(_key(name, params), _decode, workload=name)
    if scales is not None:
        event(LOG, "reused cached calibration", workload=name,
              path=str(cache.path(_key(name, params))))
    return scales


def store(name: str, params: dict[str, Any], scales: Scales) -> None:
    """Keep ``scales`` for the next build of the same workload and sizes."""
    cache = _cache()
    if cache is not None:
        cache.save(_key(name, params), {"format": FORMAT, "scales": scales})
