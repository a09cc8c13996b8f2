"""The numba loops compiled once a suite, shared out between the xdist workers.

Why: on a fresh clone numba's cache is empty, and every worker compiled every loop itself
(about a minute of the two cores, the same work twice).  Each group below is compiled by
the first worker that takes its file lock; a worker that finds a group's lock taken waits
for it and then loads the machine code the other worker wrote to numba's cache (the
functions are ``cache=True``), so the two exchange schedulers' loops compile side by side,
once each.  Each group calls the product's public functions on a tiny problem, which
compiles exactly the signatures the suite uses (``tests/unit/test_numba_warmup.py``
checks that nothing of a group compiles again afterwards)."""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ipu_stack.exchange.families import random_multicast, random_unicast
from ipu_stack.exchange.model import endpoint_lower_bound
from ipu_stack.exchange.multicast import schedule_multicast
from ipu_stack.exchange.unicast import schedule_unicast
from ipu_stack.ir.rounding import (
    decode_f16,
    decode_float64,
    decode_fp8,
    encode_f16,
    encode_fp8,
    round_f16,
)


def compile_multicast() -> None:
    """The multicast scheduler's event loop (the largest: about 30 s cold)."""
    schedule_multicast(random_multicast(64, tiles=64))


def compile_unicast_and_rounding() -> None:
    """The exact unicast scheduler's event loop, then the FP16 and FP8 rounding loops."""
    transfers = random_unicast(64, tiles=16)
    schedule_unicast(transfers, endpoint_lower_bound(transfers))
    values = np.linspace(-2.0, 2.0, 64, dtype=np.float32)
    decode_f16(encode_f16(round_f16(values)))
    codes = encode_fp8(values, "F8F143", 0)
    decode_fp8(codes, "F8F143", 0)
    decode_float64(codes, "F8F143", 0)


GROUPS: tuple[Callable[[], None], ...] = (compile_multicast, compile_unicast_and_rounding)


def warm_up(worker: int, lock_folder: Path) -> None:
    """Compile (or load) every group, starting at this worker's own, each under its lock."""
    lock_folder.mkdir(parents=True, exist_ok=True)
    for step in range(len(GROUPS)):
        index = (worker + step) % len(GROUPS)
        with open(lock_folder / f"numba-group-{index}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            GROUPS[index]()


def warm_up_xdist_worker() -> None:
    """Under pytest-xdist with two workers or more, this worker's share of the compiling;
    elsewhere (one process, ``-n 0``) nothing: the loops compile where first used."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw") or int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) < 2:
        return
    # one folder of locks a checkout, whatever the run: a lock outlives no process
    checkout = hashlib.sha256(str(Path(__file__).resolve().parent).encode()).hexdigest()[:12]
    warm_up(int(worker[2:]), Path(tempfile.gettempdir()) / f"ipu-stack-numba-locks-{checkout}")
