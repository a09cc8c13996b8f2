"""What limits a pipeline's steady step, from a compile alone: the step by kind of work, and
the images/s the measured prices allow without each overhead.

Usage: ``python benchmarks/pipeline_limits.py WORKLOAD GROUPS [workload options]``, e.g.
``python benchmarks/pipeline_limits.py siglip-vision 9``.

The planner prices each group's supersteps as the device executes them and merges the
groups' sequences as the chip runs them side by side (``strategy.compile._step_estimate``),
so its step is the executed one (docs/architecture.md, "The planner's step"); this script
needs no simulation.  Each merged superstep is put down to the kind of work of the group
superstep that sets its length (its name's last part: ``gemm`` is the AMP, ``reduce`` the
epilogue that sums partials and applies bias, GELU and casts, ``operands`` / ``right`` /
``rows`` / ``reduce`` exchanges move A operands, B operands, whole rows and partials).
The limits below the table replace terms of the step: the AMP at 128 MAC a tile a cycle
(no pass overhead: each group's MACs over its tiles), no exchange, and both.
"""

from __future__ import annotations

import logging
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from ipu_stack.cli import parse_workload
from ipu_stack.ir.graph import gemm_macs
from ipu_stack.pipeline import CompileOptions
from ipu_stack.runtime.alignment import merge
from ipu_stack.strategy import compile_pipeline
from ipu_stack.strategy.compile import PipelineResult
from ipu_stack.target import get_target

COMPUTE = {"gemm": "AMP (GEMM)", "reduce": "epilogues (reduce, bias, GELU, casts)",
           "softmax": "softmax", "biased_softmax": "softmax", "layer_norm": "layer norms",
           "rms_norm": "layer norms", "copy": "on-tile copies", "add": "residual adds",
           "rope": "RoPE"}
EXCHANGE = {"operands": "exchange: A operands", "right": "exchange: B operands",
            "reduce": "exchange: partials (reduce-scatter)", "rows": "exchange: whole rows"}


def kind_of(name: str, kind: str) -> str:
    last = name.rsplit(".", 1)[-1]
    if kind == "exchange":
        return EXCHANGE.get(last, "exchange: other")
    return COMPUTE.get(last, last)


def step_by_kind(result: PipelineResult) -> Counter[str]:
    """The planner's steady step of a one-chip pipeline, each merged superstep put down to
    the kind of work that sets its length, and the hand-off; the values add up to the
    step."""
    programs = [result.program_of(g) for g in result.groups]
    merged = merge([(p.superstep_kinds, p.superstep_cycles) for p in programs])
    by_kind: Counter[str] = Counter()
    for j, cycles in enumerate(merged.cycles.tolist()):
        longest = max((g for g in range(len(programs)) if merged.members[g, j] >= 0),
                      key=lambda g: programs[g].superstep_cycles[merged.members[g, j]])
        k = int(merged.members[longest, j])
        by_kind[kind_of(programs[longest].superstep_names[k],
                        programs[longest].superstep_kinds[k])] += cycles
    by_kind["hand-off between groups"] += max(result.estimate["handoff_cycles"], default=0)
    return by_kind


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
