"""The shared on-disk cache (``util/cache.py``): content address, verify on read, atomic write,
repair.  The calibration cache and the exchange schedule store are built on it; their own
tests (``test_calibration_cache.py``, ``tests/e2e/test_schedule_reuse.py``) go through them."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from ipu_stack.util.cache import EntryCache, content_key, payload_digest


def _decode(payload: dict[str, Any]) -> list[int]:
    values = payload["values"]
    if not all(isinstance(v, int) for v in values):
        raise TypeError("values must be integers")
    return values


def _cache(root: Path) -> EntryCache:
    return EntryCache(root / "numbers", "numbers")


def test_content_key_is_canonical_and_covers_every_part() -> None:
    assert content_key({"a": 1, "b": 2}) == content_key({"b": 2, "a": 1})
    assert content_key("x", 1) != content_key("x", 2) != content_key("y", 1)
    assert len(content_key("x")) == 64


def test_saved_entry_reads_back_and_names_its_key(tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    key = content_key("numbers", 3)
    assert cache.load(key, _decode) == (None, "")  # no entry: not damage, no warning
    assert cache.save(key, {"values": [1, 2, 3]})
    assert cache.load(key, _decode) == ([1, 2, 3], "")
    entry = json.loads(cache.path(key).read_text())
    assert entry["key"] == key and entry["sha256"] == payload_digest({"values": [1, 2, 3]})
    assert cache.path(key).parent == tmp_path / "numbers"
    assert [p.name for p in cache.path(key).parent.iterdir()] == [f"{key}.json"]  # no .tmp


def _damage(path: Path, how: str, tmp_path: Path) -> None:
    good = path.read_bytes()
    if how == "garbage":
        path.write_bytes(b"\x00garbage\xff" * 10)
    elif how == "truncated":
        path.write_bytes(good[: len(good) // 2])
    elif how == "stale checksum":
        entry = json.loads(good)
        entry["payload"]["values"][0] = 7
        path.write_text(json.dumps(entry))
    elif how == "refused by decode":
        entry = json.loads(good)
        entry["payload"]["values"][0] = "seven"
        entry["sha256"] = payload_digest(entry["payload"])
        path.write_text(json.dumps(entry))
    elif how == "not an object":
        path.write_text("[1, 2, 3]")
    elif how == "folder":
        path.unlink()
        (path / "inside").mkdir(parents=True)
    elif how == "symlink":
        outside = tmp_path / "precious.json"
        outside.write_bytes(good)  # even a valid entry is not read through a link
        path.unlink()
        path.symlink_to(outside)


@pytest.mark.parametrize(("how", "reason"), [
    ("garbage", "JSONDecodeError"), ("truncated", "JSONDecodeError"),
    ("stale checksum", "checksum mismatch"), ("refused by decode", "values must be integers"),
    ("not an object", "TypeError"), ("folder", "not a regular file"),
    ("symlink", "not a regular file"),
])
def test_damaged_entry_is_dropped_with_one_warning_and_rebuilt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, how: str, reason: str
) -> None:
    caplog.set_level(logging.INFO, logger="ipu_stack")
    cache = _cache(tmp_path)
    key = content_key("numbers", 3)
    cache.save(key, {"values": [1, 2, 3]})
    _damage(cache.path(key), how, tmp_path)
    value, why = cache.load(key, _decode, phase=4)
    assert value is None and reason in why
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "dropped a damaged cache entry, rebuilding cache=numbers" in warnings[0]
    assert "phase=4" in warnings[0] and reason in warnings[0]
    assert not cache.path(key).exists() and not cache.path(key).is_symlink()
    if how == "symlink":  # the link went, never what it pointed to
        assert json.loads((tmp_path / "precious.json").read_text())["key"] == key
    cache.save(key, {"values": [1, 2, 3]})  # the caller's rebuild
    assert cache.load(key, _decode) == ([1, 2, 3], "")


def test_entry_copied_under_another_key_is_refused(tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    one, two = content_key(1), content_key(2)
    cache.save(one, {"values": [1]})
    cache.path(two).write_bytes(cache.path(one).read_bytes())
    assert cache.load(two, _decode) == (None, "ValueError: entry is stored under another key")
    assert cache.load(one, _decode) == ([1], "")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_a_write_the_disk_refuses_is_a_warning(tmp_path: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    cache = _cache(tmp_path)
    cache.root.mkdir()
    cache.root.chmod(0o500)
    try:
        assert not cache.save(content_key(1), {"values": [1]})
    finally:
        cache.root.chmod(0o700)
    assert "could not write cache entry" in caplog.text


def test_a_cache_root_that_is_a_file_is_a_warning(tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    """The value in hand is still good: a cache that cannot be written never fails a build."""
    (tmp_path / "numbers").write_text("not a folder\n")
    cache = _cache(tmp_path)
    assert not cache.save(content_key(1), {"values": [1]})
    assert "could not write cache entry cache=numbers" in caplog.text
    assert cache.load(content_key(1), _decode) == (None, "")
