"""Shared fixtures: an isolated device lock and on-disk cache per test session.  Every
compile in the suite runs the verifiers between its stages (``IPU_STACK_VERIFY_STAGES``;
``--verify-stages`` on the command line), in this process and in every CLI child."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("IPU_STACK_VERIFY_STAGES", "1")


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture()
def lock_path(tmp_path: Path) -> Path:
    return tmp_path / "device.lock"
