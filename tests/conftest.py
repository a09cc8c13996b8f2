"""Shared fixtures: an isolated device lock and on-disk cache per test session.  Every
compile in the suite runs the verifiers between its stages (``IPU_STACK_VERIFY_STAGES``;
``--verify-stages`` on the command line), in this process and in every CLI child.  Each
xdist worker first takes its share of numba's compiling (``tests/numba_warmup.py``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.numba_warmup import warm_up_xdist_worker

os.environ.setdefault("IPU_STACK_VERIFY_STAGES", "1")


def pytest_sessionstart(session: pytest.Session) -> None:
    warm_up_xdist_worker()


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture()
def lock_path(tmp_path: Path) -> Path:
    return tmp_path / "device.lock"
