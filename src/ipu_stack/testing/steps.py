"""A one-chip pipeline's planned steady step put down to the kinds of work that set it
(``benchmarks/pipeline_limits.py`` prints it; the pipeline strategy's tests check that it
adds up to the step).

The planner prices each group's supersteps as the device executes them and merges the
groups' sequences as the chip runs them side by side, so its step is the executed one.  Each
merged superstep is put down to the kind of work of the group superstep that sets its length
(its name's last part: ``gemm`` is the AMP, ``reduce`` the epilogue that sums partials and
applies bias, GELU and casts, ``operands`` / ``right`` / ``rows`` / ``reduce`` exchanges move
A operands, B operands, whole rows and partials).
"""

from __future__ import annotations

from collections import Counter

from ipu_stack.device.alignment import merge
from ipu_stack.strategy.compile import StrategyResult

COMPUTE = {"gemm": "AMP (GEMM)", "reduce": "epilogues (reduce, bias, GELU, casts)",
           "softmax": "softmax", "biased_softmax": "softmax", "layer_norm": "layer norms",
           "rms_norm": "layer norms", "copy": "on-tile copies", "add": "residual adds",
           "rope": "RoPE"}
EXCHANGE = {"operands": "exchange: A operands", "right": "exchange: B operands",
            "reduce": "exchange: partials (reduce-scatter)", "rows": "exchange: whole rows"}


def kind_of(name: str, kind: str) -> str:
    """The kind of work of a superstep, from its name's last part and its kind."""
    last = name.rsplit(".", 1)[-1]
    if kind == "exchange":
        return EXCHANGE.get(last, "exchange: other")
    return COMPUTE.get(last, last)


def step_by_kind(result: StrategyResult) -> Counter[str]:
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
