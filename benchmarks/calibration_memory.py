"""What a cold build of a tower leaves in the compiling process: its peak and held memory.

Usage: ``python benchmarks/calibration_memory.py WORKLOAD apart|here``.

Builds ``WORKLOAD`` (its default sizes) in a fresh calibration cache folder, so the FP8
calibration pass runs: ``apart`` as the compiler runs it (in a forked child,
``util/forked.py``), ``here`` with the pass forced into this process (as before the child,
and as where a child cannot run).  Prints the build's seconds, this process's peak and
still-held resident memory, and how many weights are still to be made.  docs/benchmarks.md
(issue 22, eleventh session) has the siglip2-giant figures.
"""

from __future__ import annotations

import logging
import resource
import sys
import tempfile
import time

from ipu_stack.cli import parse_workload
from ipu_stack.util.forked import Forked
from ipu_stack.workloads import transformer
from ipu_stack.workloads.calibration import cache_folder


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[1] not in ("apart", "here"):
        print("usage: calibration_memory.py WORKLOAD apart|here", file=sys.stderr)
        return 2
    name, mode = argv
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(levelname)5s %(name)s: %(message)s")
    if mode == "here":
        transformer.call_forked = lambda work: Forked(failure="asked to run here")
    workload, params = parse_workload(name, [])
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder, cache_folder(folder):
        _, tensors = workload.build(params)
    with open("/proc/self/status") as status:
        held = next(line.split()[1] for line in status if line.startswith("VmRSS:"))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"{name} {mode}: build {time.perf_counter() - start:.1f} s, peak {peak / 1e9:.2f} GB, "
          f"held {int(held) * 1024 / 1e9:.2f} GB, weights still to be made "
          f"{getattr(tensors, 'pending', 0)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
