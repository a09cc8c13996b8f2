"""Run sweep points: one compile-and-run per point, on a local process pool or on Ray.

A point runs exactly as ``bench`` would and returns its bench record plus the sweep's own
fields (key, swept values, compiler version, options hash, status).  A point that fails to
compile or place, or whose numbers FAIL, is a record with ``status`` and ``error``: it never
stops the sweep.  Each point runs on its own private simulated device (no lock, nothing
waits); the on-disk cache is shared (its writes are atomic and verified on read).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from ipu_stack import __version__
from ipu_stack.runtime.execute import RunSettings, run_any
from ipu_stack.strategy import compile_strategy
from ipu_stack.sweep.grid import Point
from ipu_stack.util.errors import IpuStackError
from ipu_stack.workloads import get_workload

Record = dict[str, Any]




def run_point(point: dict[str, Any], out_dir: str) -> Record:
    """Compile and run one point (a :meth:`Point.to_json` dict); never raises for the point's
    own failures: they come back as the record's ``status`` and ``error``."""
    previous = logging.root.manager.disable  # restored: with one worker this runs in-process
    logging.disable(logging.WARNING)
    try:
        return _run_point(point, out_dir)
    finally:
        logging.disable(previous)


def _run_point(point: dict[str, Any], out_dir: str) -> Record:
    p = Point(point["workload"], point["params"], point["options"], point["grid"])
    base = {"key": p.key, "workload": p.workload, "point": p.grid, "params": p.params,
            "compilerVersion": __version__, "optionsHash": p.options_hash,
            "worker": os.getpid()}
    started = time.perf_counter()
    workload = get_workload(p.workload)
    folder = Path(out_dir) / "points" / p.key
    try:
        options = p.compile_options()
        with contextlib.redirect_stdout(io.StringIO()):
            compiled = compile_strategy(workload, p.params, folder, options)
            # a pipeline streams one image a group: a full steady step
            outcome = run_any(compiled.package, compiled.graph, compiled.tensors, workload,
                              p.params, compiled.timings["compile"], RunSettings())
            passed, record = outcome.passed, outcome.record
        status = "ok" if passed else "fail"
        return {**base, "status": status, "error": None if passed else
                f"numericalTest=FAIL ({record['failedParts']})",
                "seconds": round(time.perf_counter() - started, 2), **record}
    except IpuStackError as exc:
        return {**base, "status": "error", "error": str(exc).splitlines()[0],
                "seconds": round(time.perf_counter() - started, 2)}


def local_engine(points: list[Point], out_dir: Path, workers: int) -> Iterator[Record]:
    """The points on a pool of ``workers`` processes (spawned: a clean interpreter each),
    yielded as they finish."""
    if workers <= 1:
        for point in points:
            yield run_point(point.to_json(), str(out_dir))
        return
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(run_point, point.to_json(), str(out_dir)) for point in points]
        for future in as_completed(futures):
            yield future.result()


def ray_engine(points: list[Point], out_dir: Path, address: str | None) -> Iterator[Record]:
    """The points as Ray tasks: on the cluster at ``address``, or on a local Ray started for
    the run.  Ray is the optional extra ``[ray]``."""
    try:
        import ray
    except ImportError:
        raise IpuStackError("--engine ray needs Ray: pip install 'ipu-stack[ray]'") from None
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=address, include_dashboard=False, log_to_driver=False,
                 logging_level=logging.ERROR)
    try:
        task = ray.remote(run_point)
        pending = [task.remote(point.to_json(), str(out_dir)) for point in points]
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            yield ray.get(done[0])
    finally:
        if started_here:
            ray.shutdown()


ENGINES: dict[str, Callable[..., Iterator[Record]]] = {"local": local_engine, "ray": ray_engine}
