"""Whole towers and stacked layers: one loop body against every layer lowered on its own.

For each size it compiles (and, with ``--run``, runs) the workload twice, looped and with
``--unroll-layers``, and prints one line each: cycles, cycles per layer, peak tile bytes,
bytes one more layer costs a tile, compile seconds and the compile stages' split.  The
figures in docs/benchmarks.md come from it.

    python benchmarks/bench_towers.py siglip-layer --blocks 1 2 4 [--run]
    python benchmarks/bench_towers.py siglip-vision --layers 27 --run --looped-only
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from ipu_stack.cli import main, parse_workload
from ipu_stack.package import read_package
from ipu_stack.pipeline import CompileOptions, compile_workload


def compile_once(workload: str, count_option: str, count: int, extra: list[str],
                 unroll: bool, out: Path) -> dict:
    w, params = parse_workload(workload, [f"--{count_option}", str(count), *extra])
    started = time.perf_counter()
    result = compile_workload(w, params, out, CompileOptions(share_layers=not unroll))
    seconds = time.perf_counter() - started
    manifest = read_package(result.package).manifest
    loop = manifest.get("layer_loop", {})
    return {"workload": workload, count_option: count, "looped": not unroll,
            "estimatedCycles": result.estimate["cycles"], "peakTileBytes": result.peak_bytes,
            "bytesPerLayer": loop.get("bytes_per_layer_max", 0),
            "byCategory": manifest["memory"].get("peak_tile_by_category", {}),
            "compileSeconds": round(seconds, 1),
            "runSteps": len(manifest["programs"]["run"])}


def run_once(workload: str, count_option: str, count: int, extra: list[str], unroll: bool,
             out: Path) -> dict:
    argv = ["--quiet", "bench", workload, f"--{count_option}", str(count), *extra, "--json",
            "--out", str(out)] + (["--unroll-layers"] if unroll else [])
    from contextlib import redirect_stdout
    from io import StringIO

    buffer = StringIO()
    with redirect_stdout(buffer):
        code = main(argv)
    record = json.loads(buffer.getvalue().strip().splitlines()[-1])
    record["exitCode"] = code
    return record


def main_(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--blocks", type=int, nargs="+")
    group.add_argument("--layers", type=int, nargs="+")
    parser.add_argument("--run", action="store_true", help="also run and check each package")
    parser.add_argument("--looped-only", action="store_true")
    args, extra = parser.parse_known_args(argv)
    option = "blocks" if args.blocks else "layers"
    for count in args.blocks or args.layers:
        for unroll in ((False,) if args.looped_only else (False, True)):
            with tempfile.TemporaryDirectory(prefix="bench-towers-") as folder:
                if args.run:
                    record = run_once(args.workload, option, count, extra, unroll, Path(folder))
                    keep = ("numericalTest", "cycles", "estimatedCycles", "estimateError",
                            "loopLayers", "layerCycles", "bytesPerLayer", "peakTileBytes",
                            "imagesPerSecond", "noiseRatio", "tailRatio", "stageAgreement",
                            "compileSeconds", "simulateSeconds", "verdictSeconds")
                    line = {option: count, "looped": not unroll,
                            **{k: record.get(k) for k in keep}}
                else:
                    line = compile_once(args.workload, option, count, extra, unroll,
                                        Path(folder))
            print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main_(sys.argv[1:]))
