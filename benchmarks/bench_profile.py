"""What recording an execution profile costs, and how big its files are.

Usage: ``python benchmarks/bench_profile.py [WORKLOAD [workload options]]`` (default
siglip-layer).  Compiles once, then runs the package on the simulator without and with
recording (alternating, ``--repeats`` times each) and reports the simulate seconds of each,
the overhead, and the sizes of profile.json, trace.json and report.html.  The limit:
recording may slow a run by at most 20 %.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path

from ipu_stack.cli import parse_workload
from ipu_stack.pipeline import CompileOptions, compile_workload
from ipu_stack.profile import write_profile_files
from ipu_stack.profile.capture import profile_of
from ipu_stack.runtime.execute import run_package
from ipu_stack.runtime.groups import read_system
from ipu_stack.runtime.record import run_record
from ipu_stack.runtime.session import load_package


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    args, rest = parser.parse_known_args()
    name, extra = (rest[0], rest[1:]) if rest else ("siglip-layer", [])
    logging.disable(logging.CRITICAL)
    workload, params = parse_workload(name, extra)
    with tempfile.TemporaryDirectory() as out, contextlib.redirect_stderr(io.StringIO()):
        compiled = compile_workload(workload, params, Path(out), CompileOptions())
        package = load_package(compiled.package)
        seconds: dict[bool, list[float]] = {False: [], True: []}
        writing: list[float] = []
        sizes: dict[str, int] = {}
        for _ in range(args.repeats):
            for record in (False, True):
                result = run_package(package, compiled.graph, compiled.tensors,
                                     Path(out) / "lock", record=record)
                seconds[record].append(result.simulate_seconds)
                if record:
                    started = time.perf_counter()
                    fields = run_record(result, package, read_system(package), compiled.graph, {},
                                        compiled.package, None)
                    sizes = write_profile_files(Path(out) / "profile",
                                                profile_of(result, compiled.package, fields))
                    writing.append(time.perf_counter() - started)
    plain, recorded = statistics.median(seconds[False]), statistics.median(seconds[True])
    write = statistics.median(writing)
    print(json.dumps({"workload": workload.identifier(params), "simulateSeconds": round(plain, 2),
                      "recordedSimulateSeconds": round(recorded, 2),
                      "writeSeconds": round(write, 2),
                      "overheadPercent": round(100 * (recorded + write - plain) / plain, 1),
                      **sizes}))


if __name__ == "__main__":
    main()
