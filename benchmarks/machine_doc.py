"""Write docs/machine.md: every machine fact and every price, with its source, and how far the
siglip-mlp and siglip-layer estimates move when an assumed price doubles.

Usage: ``python benchmarks/machine_doc.py [--out docs/machine.md]``.  The sensitivity column is
measured, not guessed: for each price whose source says "assumed" the whole compile of siglip-mlp
and of siglip-layer (planning included, so the planner may pick other plans) runs again with
that price doubled, and the table gives the change in the compiler's costed cycles.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import tempfile
from pathlib import Path

from ipu_stack.kernels.elementwise import gelu_loop_cycles, merged_bias_gelu_cycles
from ipu_stack.kernels.norm import normce_cycles
from ipu_stack.pipeline import CompileOptions, compile_workload
from ipu_stack.planning.costs import (
    estimate_cast1d,
    estimate_elementwise,
    estimate_layer_norm,
    estimate_reduce,
)
from ipu_stack.target import IPU21, timing
from ipu_stack.target.machine import Fact
from ipu_stack.util.files import write_bytes_atomic
from ipu_stack.workloads import get_workload

# Measured in the reference notes, whose source text is not in the public code; its
# sensitivity is shown too.
UNVERIFIED = ("exchange_phase",)
# Vendor estimates (never measured on an ipu21) that price the builtins' residual adds and
# RoPE (the ADD and MULTIPLY HALF vertices): their sensitivity is shown too.
VENDOR_SHOWN = ("multiply_worker", "multiply_loop")
WORKLOADS = ("siglip-mlp", "siglip-layer")


def costed_cycles(name: str) -> int:
    """The compiler's costed cycles for a workload at its defaults (no simulation)."""
    workload = get_workload(name)
    params = workload.defaults()
    with tempfile.TemporaryDirectory() as out, contextlib.redirect_stderr(io.StringIO()):
        result = compile_workload(workload, params, Path(out), CompileOptions(cache_dir=None))
    return int(result.estimate["cycles"])


def sensitivity(name: str, bases: dict[str, int]) -> str:
    """Change of each workload's costed cycles when price ``name`` doubles."""
    original = timing.PRICES[name]
    timing.PRICES[name] = Fact(original.value * 2, original.source)
    try:
        moved = {w: costed_cycles(w) - base for w, base in bases.items()}
    finally:
        timing.PRICES[name] = original
    return " | ".join(f"{m:+d} ({100 * m / bases[w]:+.2f} %)" for w, m in moved.items())


def vendor_kernel_rows() -> list[str]:
    """The vector kernels that run as the vendor's code, priced both ways at the sizes the
    calibration evidence names: the reference's measured kernel (kept as evidence) and the
    vendor's, as the compiler prices it."""
    n, cast_n = 4304, 8320
    measured_gelu = timing.p("gelu_call") + timing.p("gelu_step") * timing.cdiv(n, 96)
    measured_bias_gelu = merged_bias_gelu_cycles(1, n, 1)
    vendor_gelu = gelu_loop_cycles(n)
    bias_pass = estimate_elementwise(n)
    measured_cast = timing.p("cast_call") + timing.p("cast_f8_step") * timing.cdiv(cast_n, 48)
    rows = [
        ("GELU, tanh form, 4 304 halves", measured_gelu, vendor_gelu,
         "popnn's loop (`gelu_loop`, `nonlinearity_*`)"),
        ("bias + GELU, 1 x 4 304", measured_bias_gelu, bias_pass + vendor_gelu,
         "a bias pass (assumed, `elementwise_step`) then popnn's loop"),
        ("cast F16 -> FP8, 8 320 elements", measured_cast, estimate_cast1d("cast_f8", cast_n),
         "popops Cast1D (`cast1d_*`)"),
        ("cast F32 -> F16, 8 320 elements", None, estimate_cast1d("cast_f16", cast_n),
         "popops Cast1D; the reference had no measured point"),
        ("cast FP8 -> F16, 8 320 elements", None, estimate_cast1d("cast_from_f8", cast_n),
         "popops Cast1D; the reference's price was assumed"),
        ("layer norm, 1 row of 1 152 on a tile", estimate_layer_norm(1, 1152),
         normce_cycles(1, 1152), "PopTransformer's NormCE, the row split over six workers"),
        ("layer norm, 3 rows of 1 152", estimate_layer_norm(3, 1152), normce_cycles(3, 1152),
         "NormCE, split, two workers a row"),
        ("layer norm, 6 rows of 1 152", estimate_layer_norm(6, 1152), normce_cycles(6, 1152),
         "NormCE, a row a worker (its C++ wrapper assumed)"),
        ("reduce of 15 F16 partials, 576 outputs", estimate_reduce(576, 15, False),
         estimate_reduce(576, 15, False, dense=True), "poplin's ReduceAdd, single input "
         "(`reduce_add_*`)"),
        ("reduce of 6 F32 partials, 320 outputs", estimate_reduce(320, 6, True),
         estimate_reduce(320, 6, True, dense=True), "ReduceAdd, single input; the F32 "
         "measured price assumed (`reduce_f32_vector`)"),
        ("one F32 partial to F16, 1 392 outputs", estimate_reduce(1392, 1, True),
         estimate_reduce(1392, 1, True, dense=True), "popops Cast1D, as poplin's reduction "
         "casts a lone partial"),
    ]
    lines = [
        "",
        "## Vector kernels that run as the vendor's code",
        "",
        "The tanh GELU and the casts run as the vendor's kernels (poplibs at `7eac0f26`), priced",
        "by the vendor's estimator structure (the GELU with its shipped loop's 8 bundles per 4",
        "halves); layer norms of F16 rows run as the fused layer norm Graphcore ships for the",
        "C600 (PopTransformer at `1314598f`, `custom_ops/NormCE*`), priced from its assembly's",
        "bundle counts (`normce_*`). The reference's measured kernels stay in the table above as",
        "evidence and still price the erf GELU, the fused bias + GELU vertex where it is",
        "cheaper, the bias pass and other layer norms. The values follow the vendor's kernels",
        "(docs/architecture.md): the GELU rounds every instruction to F16; NormCE takes the",
        "variance in one pass (E[x^2] - mean^2 in FP32, the mean rounded to F16) and normalises",
        "in F16, which the host reference computes the same way. A GEMM's depth partials are",
        "summed as poplin's convolution reduction sums them (`lib/poplin/ConvReduce.cpp`):",
        "where the tile's partials and result are dense regions, by the single-input ReduceAdd",
        "(the tile's own partial, then the received ones in order, in F32, rounded once: the",
        "values the device computed before) or, for one F32 partial, a Cast1D; elsewhere at the",
        "reference's measured reduce.",
        "",
        "| kernel | reference, measured | the vendor's, as priced | ratio | runs as |",
        "|---|---|---|---|---|",
    ]
    for name, measured, vendor, how in rows:
        ratio = f"{vendor / measured:.2f}" if measured else "-"
        lines.append(f"| {name} | {measured if measured else '-'} | {vendor} | {ratio} | {how} |")
    return lines


def render() -> str:
    logging.disable(logging.CRITICAL)
    bases = {w: costed_cycles(w) for w in WORKLOADS}
    lines = [
        "# Machine facts and prices (`src/ipu_stack/target/`)",
        "",
        "Generated by `python benchmarks/machine_doc.py`; a change to any value changes every",
        "benchmark. Sources, best first: kernels measured on an ipu21 by the reference",
        "implementation (`osmarks/ipu-stack`, September 2026 files), the vendor's estimators",
        "(poplibs), the reference logs, datasheets. \"assumed\" marks a figure with none of these; its",
        "sensitivity is measured by compiling siglip-mlp and siglip-layer again with the price",
        f"doubled (base: {bases['siglip-mlp']} and {bases['siglip-layer']} costed cycles).",
        "",
        "## Machine (`target/machine.py`)",
        "",
        "| fact | value | source |",
        "|---|---|---|",
    ]
    lines += [f"| `{k}` | {f.value} | {f.source} |" for k, f in IPU21.facts.items()]
    lines += [
        "",
        "## Prices (`target/timing.py`)",
        "",
        "| price | value | source | siglip-mlp if doubled | siglip-layer if doubled |",
        "|---|---|---|---|---|",
    ]
    for name, fact in timing.PRICES.items():
        moved = (sensitivity(name, bases) if "assumed" in fact.source or name in UNVERIFIED + VENDOR_SHOWN
                 else "- | -")
        lines.append(f"| `{name}` | {fact.value} | {fact.source} | {moved} |")
    lines += vendor_kernel_rows()
    lines += [
        "",
        "The activation prices (`unary_*`, `sigmoid_loop`, `tanh_loop`, `multiply_*`) are the",
        "vendor's popops estimates, never measured on an ipu21; `rms_norm_fraction` and",
        "`rms_norm_normce_fraction` are assumed. An RMS norm of F16 rows runs on NormCE's loops",
        "with the sum and the subtraction left out (`kernels/norm.py`; the vendor ships no RMS",
        "norm kernel) and is priced at NormCE's bundles, an upper bound; its values are that",
        "kernel's (the squares summed in FP32 lanes, the inverse root rounded to F16, two F16",
        "products), which the host reference computes the same way. A row of 512 columns or",
        "more sums its squares in blocks (`ir/one_pass.py` `rms_blocks`: up to 16 runs of",
        "whole 8-lane vectors, each block's lanes combined, the blocks added in order;",
        "`normce_block` bundles a further block a row, assumed), so a decode step's few rows",
        "can be split by columns a block a tile with the same bits: NormCE's split loops in two",
        "calls, the sums (`normce_split_stats`, a merge) and, after an exchange of every",
        "block's sums, the scaling (a merge, the blocks' sums, `normce_split_normalise`),",
        "each with the split kernel's supervisor.",
        "The builtins' residual adds run as one ADD HALF vertex and RoPE as three (x cos and",
        "rot(x) sin as MULTIPLY vertices, the rotation a view of x with its sign folded into the",
        "ADD/SUBTRACT, then the ADD), each priced at these estimates. The vision builtins have no",
        "sigmoid, tanh or RMS norm, hence +0 for those. The decoders' RMS norms: one decode step",
        "of `smollm2-135m` (`bench smollm2-135m --context 160 --tokens 1`, 829 386 cycles at",
        "`207652a`) took 981 459 cycles with every RMS norm at the measured layer norm's price.",
        "An argmax (a greedy step's token chosen where the LM head leaves its logits) runs as",
        "popnn's `ReduceMaxClassGather` on every tile holding a block of the logits, then levels",
        "of `ReduceMaxClassSparse`, 32 pairs a vertex, as `popnn::argMax` composes them",
        "(`lib/popnn/Loss.cpp`), each at the vendor's estimator (`argmax_*`). Assumed: a sparse",
        "level's vertices on one tile are dealt evenly to its six workers (the busiest runs",
        "`ceil(rows / 6)` of them; were all on one worker, `smollm2-135m`'s decode step at",
        "batch 32 would take 2 880 cycles more, +0.21 %, and at batch 1 none), and the two",
        "vertices' code is 512 bytes.",
        "",
        "Also assumed: `planning/fit.py` `SUPPORT_RESERVE` = 64 KiB per tile for support memory",
        "and activations carried between stages, for a first plan; a compile whose placement leaves",
        "8 KiB or more free on its fullest tile plans again with the reserve it measured",
        "(docs/architecture.md, \"the placed slack\"), so for those programs the room is measured,",
        "less `pipeline.SLACK_MARGIN` = 4 KiB (assumed: it only decides how much of the measured room",
        "the second plan may take; plans that do not place are dropped, so it can forgo a gain but",
        "not make a figure worse); `memory/support.py` host code and data bytes",
        "(620 and 404, reference log 004). For the layer loop: loading a pass's per-layer weight",
        "addresses is assumed to cost 0 cycles (not measured); counted in the 27-layer siglip-vision",
        "package, a tile loads at most 13 addresses per pass, so at 6 cycles a load it would add",
        "under 100 cycles a layer (0.04 % of siglip-vision's 236 083). The address table is "
        "counted in memory:",
        "`memory/support.py` `LAYER_ADDRESS_BYTES` = 4 bytes (one 32-bit address) per layer and",
        "per-layer weight on a tile (assumed).",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="docs/machine.md")
    args = parser.parse_args()
    write_bytes_atomic(Path(args.out), render().encode())
    print(f"wrote {args.out}")
