"""Design-space sweeps: a grid of compiles and runs, on a local process pool or a Ray cluster.

``run_sweep`` expands the grid, skips every point whose key is already in
``DIR/results.jsonl`` (a sweep resumes where it was killed), runs the rest on the chosen
engine, appends each record as it finishes, and rewrites ``results.csv`` and ``sweep.html``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from ipu_stack.sweep.grid import Point, expand, parse_grid
from ipu_stack.sweep.results import (
    append_result,
    format_table,
    read_results,
    write_csv,
    write_page,
)
from ipu_stack.sweep.run import ENGINES
from ipu_stack.util.errors import UsageError
from ipu_stack.util.log import Progress, event

LOG = logging.getLogger("ipu_stack.sweep")

__all__ = ["Point", "SweepResult", "expand", "format_table", "parse_grid", "read_results",
           "run_sweep"]


@dataclass
class SweepResult:
    points: int
    skipped: int
    ran: int
    failed: int
    seconds: float


def run_sweep(points: list[Point], out_dir: Path, engine: str = "local", workers: int = 1,
              address: str | None = None, title: str = "sweep") -> SweepResult:
    """Run every point not yet in ``out_dir/results.jsonl``; returns the counts."""
    if engine not in ENGINES:
        raise UsageError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = out_dir / "results.jsonl"
    done = {r["key"] for r in read_results(results)}
    todo = [p for p in points if p.key not in done]
    event(LOG, "starting sweep", points=len(points), skipped=len(points) - len(todo),
          engine=engine, workers=workers)
    started = time.perf_counter()
    progress = Progress("sweep points", len(todo))
    runner = ENGINES[engine]
    stream = runner(todo, out_dir, workers) if engine == "local" else runner(todo, out_dir,
                                                                             address)
    for record in stream:
        append_result(results, record)
        event(LOG, "sweep point finished", key=record["key"], status=record["status"],
              cycles=record.get("cycles", "-"), error=record.get("error") or "-")
        progress.step(record["key"])
    progress.close()
    records = read_results(results)
    write_csv(out_dir / "results.csv", records)
    write_page(out_dir / "sweep.html", records, title)
    asked = {p.key for p in points}  # a folder may hold other sweeps' points: not counted
    failed_total = sum(r["status"] != "ok" for r in records if r["key"] in asked)
    seconds = time.perf_counter() - started
    event(LOG, "sweep finished", points=len(records), ran=len(todo), failed=failed_total,
          seconds=round(seconds, 1))
    return SweepResult(len(points), len(points) - len(todo), len(todo), failed_total, seconds)
