"""What limits a pipeline's steady step, from a compile alone: the step by kind of work, and
the images/s the measured prices allow without each overhead.

Usage: ``python benchmarks/pipeline_limits.py WORKLOAD GROUPS [workload options]``, e.g.
``python benchmarks/pipeline_limits.py siglip-vision 9``.

The planner's step is the executed one (docs/architecture.md, "The planner's step"), so
this script needs no simulation.  The table puts each merged superstep down to the kind of
work that sets its length (``ipu_stack.testing.steps.step_by_kind``).  The limits below
the table replace terms of the step: the AMP at 128 MAC a tile a cycle (no pass overhead:
each group's MACs over its tiles), no exchange, and both.
"""

from __future__ import annotations

import logging
import sys
import tempfile
import time
from pathlib import Path

from ipu_stack.cli import parse_workload
from ipu_stack.ir.graph import gemm_macs
from ipu_stack.pipeline import CompileOptions
from ipu_stack.strategy import compile_pipeline
from ipu_stack.target import get_target
from ipu_stack.testing.steps import step_by_kind


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: pipeline_limits.py WORKLOAD GROUPS [workload options]", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(levelname)5s %(name)s: %(message)s")
    workload, params = parse_workload(argv[0], argv[2:])
    chip = get_target(CompileOptions().target)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        result = compile_pipeline(workload, params, Path(folder), CompileOptions(),
                                  groups=int(argv[1]))
    seconds = time.perf_counter() - started
    estimate = result.estimate
    if len(estimate["chip_cycles"]) != 1:
        print("error: one chip only (--chips spreads groups over cards)", file=sys.stderr)
        return 2
    by_kind = step_by_kind(result)
    step = int(estimate["cycles"])
    tiles = result.group_tiles
    amp_roofline = max(gemm_macs(g.graph) for g in result.groups) \
        // (tiles * int(chip.amp_f8_macs_per_cycle))
    amp = by_kind["AMP (GEMM)"]
    exchange = sum(v for k, v in by_kind.items() if k.startswith(("exchange", "hand-off")))
    macs = gemm_macs(result.graph)
    roofline = chip.tiles * float(chip.amp_f8_macs_per_cycle) * chip.clock_hz / macs
    print(f"workload={workload.identifier(params)} groups={len(result.groups)} "
          f"tiles={tiles} layers={','.join(str(g.layers) for g in result.groups)} "
          f"step={step} alignment={estimate['alignment_cycles'][0]} "
          f"compileSeconds={seconds:.1f}")
    print("\n| kind of work | cycles | share of the step |\n|---|---|---|")
    for kind, cycles in by_kind.most_common():
        print(f"| {kind} | {cycles} | {100 * cycles / step:.1f} % |")

    def rate(cycles: int) -> str:
        return f"{chip.clock_hz / cycles:.1f}"

    print("\n| the step | cycles | images/s |\n|---|---|---|")
    print(f"| as planned (= executed) | {step} | {rate(step)} |")
    print(f"| the AMP at 128 MAC a tile a cycle | {step - amp + amp_roofline} | "
          f"{rate(step - amp + amp_roofline)} |")
    print(f"| no exchange | {step - exchange} | {rate(step - exchange)} |")
    print(f"| both | {step - amp + amp_roofline - exchange} | "
          f"{rate(step - amp + amp_roofline - exchange)} |")
    print(f"| the FP8 roofline (every tile's AMP, nothing else) | - | {roofline:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
