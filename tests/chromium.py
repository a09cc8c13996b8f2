"""Headless Chromium for the pages' browser tests (placement page, profile report, sweep
page): one command line, a skip where Chromium is not installed, and the page's script
errors (recorded on the root element by ``util/html``) turned into a failure."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")


def headless(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """Run headless Chromium with ``args``; skip the test when there is no Chromium."""
    if not CHROMIUM.exists():
        pytest.skip("headless check needs /usr/bin/chromium (apt-get install chromium)")
    command = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
               "--no-first-run", "--disable-background-networking", "--disable-component-update",
               "--disable-sync", f"--user-data-dir={tmp_path / 'chromium'}", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def rendered_dom(tmp_path: Path, url: str) -> str:
    """The page's DOM after its scripts ran; fails if a script raised."""
    dom = headless(tmp_path, "--dump-dom", url).stdout
    assert not re.search(r"<html[^>]*data-js-error", dom), dom[:500]
    return dom
