"""Shared fixtures: an isolated device lock and on-disk cache per test session."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture()
def lock_path(tmp_path: Path) -> Path:
    return tmp_path / "device.lock"
