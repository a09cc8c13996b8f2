"""Each chip's program of a tower cut into given layer shares, halves cutting inside a layer.

Usage: ``python benchmarks/mid_layer_cuts.py WORKLOAD LAYERS_PER_CHIP [workload options]``,
e.g. ``python benchmarks/mid_layer_cuts.py pe-giant 12.5,12.5,12.5,12.5``.

The pipeline strategy cuts chips whose layers do not divide evenly into equal half-layer
shares itself (``planning.groups.half_layer_bounds``); this script compiles any shares
(``12,13,12.5,12.5``, say) to compare, each chip's range as a group alone on its chip is
compiled (all its tiles, the placed slack planned for).  The step is the slowest chip plus
the link's estimate for the largest hand-off: the compiler's costed figures, which for
pe-giant equal the simulator's count (docs/benchmarks.md, issue 22's twelfth session).
"""

from __future__ import annotations

import logging
import sys
import tempfile
import time
from pathlib import Path

from ipu_stack.cli import parse_workload
from ipu_stack.pipeline import CompileOptions, compile_workload
from ipu_stack.planning.costs import estimate_link_phase
from ipu_stack.planning.groups import PipelineError, half_layer_bounds, split_at_stages
from ipu_stack.strategy.compile import group_workload
from ipu_stack.target import get_target


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: mid_layer_cuts.py WORKLOAD LAYERS_PER_CHIP [workload options]",
              file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(levelname)5s %(name)s: %(message)s")
    workload, params = parse_workload(argv[0], argv[2:])
    shares = [float(x) for x in argv[1].split(",")]
    graph, tensors = workload.build(params)
    try:
        groups = split_at_stages(graph, half_layer_bounds(graph, shares))
    except PipelineError as why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    chip = get_target(CompileOptions().target)
    cycles = []
    with tempfile.TemporaryDirectory() as folder:
        for group in groups:
            started = time.perf_counter()
            result = compile_workload(group_workload(workload, group, tensors), params,
                                      Path(folder) / f"chip{group.index}", CompileOptions())
            cycles.append(int(result.estimate["cycles"]))
            print(f"chip={group.index} input={group.input_name} output={group.output_name} "
                  f"cycles={cycles[-1]} peakBytes={result.peak_bytes} "
                  f"compileSeconds={time.perf_counter() - started:.1f}", flush=True)
    # the largest hand-off over a link (each group after the first reads one activation)
    link = max((estimate_link_phase(g.graph.by_role("input")[0].type.nbytes, chip.clock_hz)
                for g in groups[1:]), default=0)
    step = max(cycles) + link
    print(f"workload={workload.identifier(params)} shares={argv[1]} chipCycles={cycles} "
          f"linkCycles={link} stepCycles={step} balance={min(cycles) / max(cycles):.4f} "
          f"imagesPerSecond={chip.clock_hz / step:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
