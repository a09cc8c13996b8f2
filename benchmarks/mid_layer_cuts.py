"""What cutting a tower's chips inside a layer would give: each chip's program compiled.

Usage: ``python benchmarks/mid_layer_cuts.py WORKLOAD LAYERS_PER_CHIP [workload options]``,
e.g. ``python benchmarks/mid_layer_cuts.py pe-giant 12.5,12.5,12.5,12.5``.

The pipeline strategy cuts a tower between layers, so 50 layers on 4 chips are 12, 13, 13,
12 and the 13-layer chips set the step.  A pre-norm layer can also be cut after attention's
residual add, where one activation alone crosses (``planning.groups.mid_layer_cuts``): a
half in ``LAYERS_PER_CHIP`` cuts there.  Each chip's range is cut out
(``planning.groups.split_at_stages``) and compiled in full as a group alone on its chip is
(all its tiles, the placed slack planned for); the step is the slowest chip plus the link's
estimate for the largest hand-off.  The runtime does not run such packages yet: these are
the compiler's costed figures (for pe-giant's whole-layer chips they equal the simulator's
cycles exactly).
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
from ipu_stack.planning.groups import mid_layer_cuts, split_at_stages, tower_loop
from ipu_stack.planning.stages import find_stages
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
    stages = find_stages(graph)
    loop = tower_loop(graph, stages)
    if sum(shares) != loop.count or any(2 * x != int(2 * x) for x in shares):
        print(f"error: the shares must be halves summing to the {loop.count} layers",
              file=sys.stderr)
        return 2
    offsets = mid_layer_cuts(graph)
    bounds, done = [], 0.0
    for share in shares[:-1]:
        done += share
        whole = int(done)
        if done != whole and not offsets:
            print("error: no layer of this tower can be cut inside", file=sys.stderr)
            return 2
        bounds.append(loop.start + whole * loop.length + (offsets[0] if done != whole else 0))
    groups = split_at_stages(graph, bounds, stages)
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
