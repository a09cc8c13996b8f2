"""The one on-disk cache the compiler keeps between runs: content-addressed JSON entries that
are verified on every read, written atomically and repaired when damaged.

Two things use it: the calibration cache (fitted FP8 scale exponents of a tower,
``workloads/calibration.py``) and the exchange schedule store (``exchange/memo.py``).  Both
keep results that are expensive to recompute and cheap to check, so they share the rules:

* **content address**: an entry's key is the sha256 of everything its value depends on
  (:func:`content_key`); it lives at ``<root>/<key>.json``;
* **verify**: an entry is ``{"key", "payload", "sha256"}``, the sha256 taken over the
  canonical JSON of the payload; a read checks the checksum and that the entry names the key
  it is stored under, then hands the payload to the caller's ``decode``, which may refuse it
  too (the exchange store runs the schedule verifier there);
* **atomic write**: through :func:`~ipu_stack.util.files.write_atomic`, so parallel compiles
  on one cache both succeed and a reader never sees half an entry;
* **repair**: an entry that fails any check (garbage, truncated, a stale checksum, a folder or
  a symlink in its place) is removed with one warning naming why, and the caller rebuilds it.

A cache is an optimisation, never a reason to fail: a write that fails is a warning.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ipu_stack.util.files import read_regular, write_bytes_atomic
from ipu_stack.util.log import event

T = TypeVar("T")
LOG = logging.getLogger("ipu_stack.cache")

# what a decode may raise to call an entry damaged (json and base64 raise ValueErrors)
DAMAGE = (OSError, ValueError, KeyError, TypeError, AttributeError)
MAX_ENTRY_BYTES = 256 << 20  # far above any real entry; a larger file is damage, not data


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/ipu-stack`` or ``~/.cache/ipu-stack``: where ``--cache-dir`` points
    unless given."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ipu-stack"


def content_key(*parts: Any) -> str:
    """sha256 of the canonical JSON of ``parts``: the name of the entry they determine."""
    body = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(body.encode()).hexdigest()


def payload_digest(payload: Any) -> str:
    """The checksum an entry carries: sha256 of the payload's canonical JSON."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


class EntryCache:
    """Entries of one kind under ``root`` (e.g. ``<cache>/calibration``); ``what`` names the
    kind in warnings."""

    def __init__(self, root: Path, what: str) -> None:
        self.root = Path(root)
        self.what = what

    def path(self, key: str) -> Path:
        return self.root / f"{key}.json"

    def load(self, key: str, decode: Callable[[dict[str, Any]], T],
             **fields: Any) -> tuple[T | None, str]:
        """The value stored under ``key`` and ``""``; or None and ``""`` when there is no
        entry; or None and why, when there was one and it was damaged (it is removed, with a
        warning carrying ``fields``, so the caller's rebuild replaces it).

        ``decode`` turns the verified payload into the value, raising one of :data:`DAMAGE`
        for a payload it will not use (that is damage too)."""
        path = self.path(key)
        if not path.exists() and not path.is_symlink():
            return None, ""
        try:
            if path.is_symlink() or not path.is_file():
                raise ValueError("entry is not a regular file")
            data = read_regular(path, MAX_ENTRY_BYTES)
            if len(data) > MAX_ENTRY_BYTES:
                raise ValueError(f"entry larger than {MAX_ENTRY_BYTES} bytes")
            entry = json.loads(data)
            if entry["key"] != key:
                raise ValueError("entry is stored under another key")
            if entry["sha256"] != payload_digest(entry["payload"]):
                raise ValueError("checksum mismatch")
            return decode(entry["payload"]), ""
        except DAMAGE as failure:
            reason = f"{type(failure).__name__}: {failure}"
        self.discard(key)
        event(LOG, "dropped a damaged cache entry, rebuilding", level=logging.WARNING,
              cache=self.what, path=str(path), reason=reason, **fields)
        return None, reason

    def save(self, key: str, payload: dict[str, Any]) -> bool:
        """Write ``payload`` under ``key`` atomically; False (and a warning) when the disk
        refuses, since the value in hand is still good."""
        entry = {"key": key, "payload": payload, "sha256": payload_digest(payload)}
        try:
            write_bytes_atomic(self.path(key), json.dumps(entry, sort_keys=True).encode() + b"\n")
        except OSError as failure:
            event(LOG, "could not write cache entry", level=logging.WARNING, cache=self.what,
                  path=str(self.path(key)), reason=failure.strerror or str(failure))
            return False
        return True

    def discard(self, key: str) -> None:
        """Remove the entry under ``key``, whatever is there (a folder or symlink included;
        a symlink is removed, never followed)."""
        path = self.path(key)
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()
        except OSError as failure:
            event(LOG, "could not remove damaged cache entry", level=logging.WARNING,
                  cache=self.what, path=str(path), reason=failure.strerror or str(failure))
