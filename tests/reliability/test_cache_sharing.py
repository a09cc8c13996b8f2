"""The on-disk cache at the command line: compiles running in parallel on one fresh cache all
succeed and leave only whole, verified entries; a later compile is served from them.

``tests/unit/test_cache.py`` covers damage and repair of single entries directly.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from ipu_stack.util.cache import payload_digest
from tests.helpers import cache_entries, cli

SMALL = ["siglip-mlp", "--tokens", "16", "--dim", "64", "--hidden", "64", "--finalists", "1"]
ATTENTION = ["attention", "--tokens", "17", "--dim", "64", "--heads", "4", "--finalists", "1"]


def _valid(path: Path) -> bool:
    entry = json.loads(path.read_bytes())
    return path.is_file() and not path.is_symlink() and path.stem == entry["key"] and \
        entry["sha256"] == payload_digest(entry["payload"])


def test_parallel_compiles_share_one_fresh_cache(tmp_path: Path) -> None:
    """Three processes start together on one empty cache (two identical compiles and one of
    another workload): all succeed, identical compiles give identical bytes, every entry is
    valid and no temporary file is left; a fourth compile schedules nothing afresh."""
    cache = tmp_path / "cache"
    jobs = {"mlp-1": SMALL, "mlp-2": SMALL, "attention": ATTENTION}
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "ipu_stack.cli", "--quiet", "compile", *argv,
             "-o", str(tmp_path / name), "--cache-dir", str(cache), "--exchange-cache"],
            env={**os.environ, "PYTHONHASHSEED": str(index)},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for index, (name, argv) in enumerate(jobs.items())
    }
    for name, proc in procs.items():
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, (name, err)
        assert "damaged" not in err and "Traceback" not in err, (name, err)
    assert (tmp_path / "mlp-1" / "model.ipuexe").read_bytes() == \
        (tmp_path / "mlp-2" / "model.ipuexe").read_bytes()
    entries = cache_entries(cache, "exchange")
    assert entries and all(_valid(p) for p in entries)
    assert not [p for p in cache.rglob("*") if p.is_file() and p.suffix != ".json"]
    code, _, err = cli(["-v", "compile", *ATTENTION, "-o", str(tmp_path / "again"),
                        "--cache-dir", str(cache), "--exchange-cache"])
    assert code == 0, err
    line = next(x for x in err.splitlines() if "phase=select_finalist" in x)
    assert re.search(r"\bscheduled_phases=0\b", line) and "rejected_cache_entries=0" in line
    assert cache_entries(cache, "exchange") == entries
