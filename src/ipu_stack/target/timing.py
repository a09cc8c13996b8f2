"""The price table: what each piece of work costs on an ipu21, and where each price comes from.

Every cycle the planner estimates or the simulator counts starts from a price here, so a
price changes in one place.  The prices come from (best first) kernels measured on an ipu21
by the reference implementation, the vendor's estimators (poplibs), or the seed logs; a price
with none of these behind it says "assumed" and how far siglip-mlp moves when it doubles
(``docs/machine.md``).

Two users read the table, and share nothing else:

* ``planning.costs`` holds the planner's closed forms over a kernel's shape (rows, depth,
  columns, elements);
* ``device.pricing`` prices the :class:`Work` a kernel *reports after it ran* (passes it
  looped over, rows, per-worker element counts, where its operands really sat) and the
  chunks an exchange phase moved, which is what the simulator times.

The imports enforce it (``tests/unit/test_imports.py``): ``device`` imports nothing from
``planning`` and ``planning`` nothing from ``device``, so the benchmark's ``estimateError``
(their disagreement) is evidence, not a tautology.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ipu_stack.target.machine import Fact

_REF = "reference implementation, kernels measured on an ipu21 (2026-09-13)"
_CODE = "reference implementation (osmarks/ipu-stack, September 2026 sources)"
_VENDOR = "poplibs"

PRICES: dict[str, Fact] = {
    # AMP GEMM (ConvPartial1x1Out): per call + per (16 columns x 16 F16 / 32 FP8 depth) pass.
    "amp_call": Fact(294, f"{_REF}: 294 cycles per call (fn interleaved_f16_gemm_cycles)"),
    "amp_row": Fact(4, f"{_REF}: 4 cycles per tile row per pass (rows split over 6 workers)"),
    "amp_pass_interleaved": Fact(
        160, f"{_REF}: 160 per pass with weights in interleaved memory (128-bit CWEI loads, "
        "worker sync, launch); fits 9 measured kernels within 2%"),
    "amp_pass_standard": Fact(
        266, f"{_REF}: IPU21_AMP_KERNEL_COSTS, 1,063 per 4 passes with weights in standard "
        "memory (64-bit loads)"),
    "amp_out_columns": Fact(16, f"{_VENDOR} convUnits: 16 output columns per pass"),
    "amp_f16_depth": Fact(16, f"{_CODE}: a pass covers 16 F16 input channels (f16v4hihov4amp)"),
    "amp_f8_depth": Fact(32, f"{_CODE}: 'FP8 K extents are halved': a pass covers 32 FP8 "
                             "channels (f8v8hihov4amp, GEMM_INNER_MICRO_DIMENSION 32)"),
    # Reduce of depth partials: 282 + 6 ceil(n/48) (11 + 2 (P - 1)).
    "reduce_call": Fact(282, f"{_REF}: reduce F16 partials, (576,15) 3,090; (2208,28) 18,222"),
    "reduce_vector": Fact(8, f"{_REF}: 48 outputs per 6-worker step = 8 F16 per worker"),
    "reduce_step": Fact(11, f"{_REF}: 11 cycles per step plus 2 per extra partial"),
    "reduce_partial": Fact(2, f"{_REF}: 2 cycles per extra partial per step"),
    "reduce_f32_vector": Fact(
        4, "assumed: F32 partials reduce 4 per worker step (f32v2 x 2) instead of 8 F16; "
        "used only by F16-mode GEMMs (siglip-mlp does not move)"),
    # Elementwise kernels (n elements, 6 workers x 16 / 8 / 2 per step).
    "gelu_call": Fact(330, f"{_REF}: GELU F16, n=1,408 7,260; n=2,208 10,956 (the erf GELU; "
                           "the tanh GELU runs as the vendor's loop, gelu_loop)"),
    "gelu_step": Fact(462, f"{_REF}: 462 cycles per 96 elements (16 per worker)"),
    "bias_gelu_row": Fact(228, f"{_REF}: bias + GELU F16 (rows, width): (1,2208) 8,730; "
                               "(3,2152) 25,206 = rows (450 + 90 ceil(w/24) - 222) + 222"),
    "bias_gelu_step": Fact(90, f"{_REF}: 90 cycles per 24 columns (4 per worker)"),
    "bias_gelu_call": Fact(222, f"{_REF}: bias + GELU call overhead"),
    "cast_call": Fact(330, f"{_REF}: cast F16 -> FP8 linear loop, 330 + 24 ceil(n/48): "
                           "8,320 elements 4,506 against 4,638 measured (the 2,706 pipelined "
                           "loop needs operands in separate 32 KiB groups: not assumed)"),
    "cast_f8_step": Fact(24, f"{_REF}: cast F16 -> FP8 24 cycles per 48 elements (evidence: "
                             "casts run as the vendor's Cast1D, cast1d_*)"),
    "elementwise_step": Fact(
        24, "assumed: a bias add or scale pass over F16 costs what the measured F16 -> FP8 "
        "cast costs (one f16v4 operation per 4 elements); siglip-mlp has none"),
    "copy_call": Fact(288, f"{_REF}: local copy, one six-worker call: 288 + bytes/8"),
    "copy_bytes_per_cycle": Fact(8, f"{_REF}: local copy 8 bytes per cycle"),
    "launch": Fact(11, f"{_VENDOR} basicOpSupervisorOverhead(false): vertex launch"),
    # Exchange, sync and host link.
    "exchange_phase": Fact(
        237, "reference notes 'Layout and barrier diagnosis, 2026-09-05' (osmarks/ipu-stack "
        "docs/PROFILE_LAYOUT_DIAGNOSIS.md at a53fce39, section Attention): hardware profile "
        "of the projected attention program, exchange phases 6/7/8 scheduled 33,542 / 36,987 "
        "/ 37,377 cycles, measured 33,780 / 37,224 / 37,614 after the last arrival (+238, "
        "+237, +237); covers the receive-mux latency (52 + 2 x physical row) and the "
        "boundary overhead (the reference's own model charges + 600 per phase)"),
    "send_words": Fact(64, f"{_CODE}: the send instruction's 6-bit word count; longer "
                           "messages continue with sendoff"),
    "send_alignment_events": Fact(
        2, f"{_CODE}: sendpicp is a two-word instruction that starts 8-byte aligned; a send "
        "on an odd event is shifted one event later"),
    "sync": Fact(90, f"{_VENDOR} syncCycles = 90, the sync before an exchange phase "
                     "(lib/popops/reduction/ReductionPlan.cpp:110-179 counts one a phase). "
                     "Two compute sets with no exchange between them take 'a local tile sync "
                     "... rather than a full IPU sync' (lib/popops/reduction/"
                     "ReductionConnection.hpp:282-284): none is charged"),
    "host_bytes_per_second": Fact(32e9, "C600 datasheet: PCIe Gen4 x16, 32 GB/s"),
    # IPU-Links between neighbouring C600 cards (target.links has the system's facts).
    "link_bytes_per_second": Fact(
        31.25e9, "derived: 4 IPU-Links per C600 carry 1 Tbps bidirectional in all (ByteMLPerf "
        "IPU backend README), so one link 250 Gbps bidirectional; the cable between "
        "neighbouring cards carries 2 links: 500 Gbps bidirectional, 31.25 GB/s each way"),
    "link_hop_cycles": Fact(
        1500, "assumed (not public): 1 us from the first byte leaving a card to its arrival "
        "on the next; a hand-off pays it once a step (docs/multichip.md: sensitivity)"),
    "link_sync": Fact(
        3000, "assumed (not public): 2 us for the sync across cards that ends a pipeline "
        "step before the link hand-off (the on-chip sync is 90); docs/multichip.md: "
        "sensitivity"),
}

PRICES.update({
    # Row kernels.
    "layer_norm_call": Fact(132, f"{_REF}: layernorm_cycles = 132 + rows (stats + apply + "
                                 "setup); (1,1152) 6,732 and (3,1152) 19,938 measured"),
    "softmax_split_call": Fact(
        408, f"{_REF}: split softmax 408 + ceil(rows/2) 6 (43 ceil(pk/48) + 128) + "
        "126 ceil(rows/6); 729 keys (768 padded), 8 rows: 20,244 measured (20,226-20,244). "
        "The September kernel's 41/130 model (19,524) has no measurement, so the measured "
        "kernel's constants are used"),
    "softmax_panel": Fact(43, f"{_REF}: 43 cycles per 48-key panel per row segment"),
    "softmax_segment": Fact(128, f"{_REF}: 128 cycles per row segment"),
    "softmax_wave": Fact(126, f"{_REF}: 126 cycles per six-row wave (rows over 128 keys "
                              "use this split kernel; the whole-row kernel for fewer keys is "
                              "the reference's model, _softmax_whole)"),
})

# The measured layer norm's cost of one row of ``width`` (after ``layer_norm_call``): a
# setup, the statistics pass and the apply pass, each with an aligned fast path (width >= 96
# and a multiple of 8 for the statistics, a multiple of 4 for the apply).
_LN = f"{_REF}: layernorm row = stats + apply + setup, fitted to (1,1152) 6,732 and (3,1152) 19,938"
PRICES.update({
    "layer_norm_setup_aligned": Fact(1329, _LN),
    "layer_norm_setup": Fact(1200, _LN),
    "layer_norm_stats_per_48": Fact(12, _LN),
    "layer_norm_stats_per_24": Fact(30, _LN),
    "layer_norm_stats_base": Fact(24, _LN),
    "layer_norm_stats_per_12": Fact(48, f"{_LN}; unaligned widths"),
    "layer_norm_apply_base": Fact(66, _LN),
    "layer_norm_apply_per_24": Fact(72, _LN),
    "layer_norm_apply_per_12": Fact(60, f"{_LN}; widths not a multiple of 4"),
})

# The whole-row softmax (fewer than 128 keys, or when cheaper than the split kernel): the
# reference's per-row instruction count of its softmax vertex, per 16-key panel, the
# launch, and the padding tail when keys are not a multiple of 16.
_SM = f"{_CODE}: whole-row softmax vertex model (no measured point; the split kernel is measured)"
PRICES.update({
    "softmax_row": Fact(31, _SM),
    "softmax_row_panels": Fact(2, f"{_SM}: once when there is a full panel"),
    "softmax_panel16": Fact(41, f"{_SM}: per full 16-key panel"),
    "softmax_row_exact": Fact(7, f"{_SM}: keys a multiple of 16"),
    "softmax_launch_exact": Fact(216, _SM),
    "softmax_launch_tail": Fact(234, _SM),
    "softmax_tail_row": Fact(26, f"{_SM}: 5 + 21 per row with a partial panel"),
    "softmax_tail_full": Fact(6, f"{_SM}: partial panel after a full one"),
    "softmax_tail_mask": Fact(4, f"{_SM}: masking after full panels (2 without)"),
    "softmax_tail_pairs": Fact(2, f"{_SM}: once when the tail has key pairs"),
    "softmax_tail_pair": Fact(12, f"{_SM}: per key pair of the tail"),
    "softmax_tail_odd": Fact(12, f"{_SM}: an odd last key"),
    "softmax_zero_pair": Fact(2, f"{_SM}: per zeroed pair of the padded panel (+1 once)"),
    "softmax_zero_panel": Fact(10, f"{_SM}: per fully padded panel (+1 once)"),
})


_POPOPS = ("poplibs lib/popops/popopsCycleEstimators.hpp (unaryOpPerfInfo / binaryOpPerfInfo, "
           "HALF) and popopsCycleEstimators.cpp (UnaryOp1D / BinaryOp1D supervisor estimators)")
PRICES.update({
    # Elementwise activations: the vendor's popops estimators (never measured on an ipu21).
    # A supervisor vertex costs 6 x (worker setup + loops over ceil(n/6) elements) + its tail.
    "unary_worker": Fact(17, f"{_POPOPS}: UnaryOp1D worker setup, 17 cycles"),
    "unary_tail": Fact(9, f"{_POPOPS}: UnaryOp1D supervisor tail, + 9 after the workers"),
    "sigmoid_loop": Fact(6, f"{_POPOPS}: SIGMOID HALF {{6, false, 4}}: 6 cycles per 4 halves"),
    "tanh_loop": Fact(4, f"{_POPOPS}: TANH HALF {{4, false, 4}}: 4 cycles per 4 halves"),
    "multiply_worker": Fact(26, f"{_POPOPS}: BinaryOp1D worker setup for HALF, 26 cycles"),
    "multiply_loop": Fact(3, f"{_POPOPS}: MULTIPLY (and ADD) HALF {{1, true}} + 2 loop "
                             "overhead (external codelet): 3 cycles per 4-half vector"),
    "rms_norm_fraction": Fact(
        1.0, "assumed: an RMS norm off NormCE's precisions and widths costs what the measured "
        "layer norm of the same shape costs (it skips the mean and the shift, so this is an "
        "upper bound); siglip-mlp has none"),
    "rms_norm_normce_fraction": Fact(
        1.0, "assumed: an RMS norm of F16 rows on NormCE's loops (kernels/norm.py) costs "
        "NormCE's bundles (it leaves out the sum and the subtraction, so an upper bound); the "
        "vendor ships no RMS norm kernel (PopTransformer 1314598f "
        "poptransformer/layers/rms_layer_norm.py composes popart operations)"),
})

_GELU_LOOP = "poplibs lib/popnn/codelets/asm/NonLinearityLoop_gelu.S:80-134"
_NL_EST = "poplibs lib/popnn/popnnCycleEstimators.cpp:78-140 (nonLinearity1DCycleEstimator)"
_CAST1D = ("poplibs lib/popops/PerformanceEstimation.cpp:206-364 (castWorkerCycles, "
           "getCast1DCycleEstimate): aux-pipeline casts, loads and stores overlapped in "
           "separate memory elements, as the estimator assumes")
PRICES.update({
    # The vendor's tanh GELU (popnn NonLinearity1D, HALF): the shipped loop's bundles per
    # 4 halves inside the estimator's structure (supervisor + six workers' setup, the
    # pipeline's fill and flush, the 32-/16-bit remainder).
    "gelu_loop": Fact(8, f"{_GELU_LOOP}: 8 bundles per 4 halves (f16v4mul x3, f16v4mix, "
                         "f16v2tanh x2, f16v4add, f16v4mul), loads and stores co-issued; the "
                         "estimator's 5 is marked 'TODO: verify'"),
    "gelu_fill": Fact(8, f"assumed: the pipeline's fill and its flush cost one loop body (8 "
                         f"bundles) each, where {_NL_EST} charges opCycles 5 ('TODO: "
                         "verify') for each"),
    "nonlinearity_supervisor": Fact(9, f"{_NL_EST}: supervisor vertex overhead 9"),
    "nonlinearity_worker": Fact(20, f"{_NL_EST}: worker overhead 3 + 5 + 2 + 2 + 5 + 3"),
    "nonlinearity_remainder": Fact(4, f"{_NL_EST}: remainder tests and branches 2 + 1 + 1"),
    # Cast1D: 12 + 6 (worker + 18), worker = 19 + vectors + remainder bits.
    "cast1d_call": Fact(12, f"{_CAST1D}: 12 + 6 x (worker + 18)"),
    "cast1d_worker": Fact(37, f"{_CAST1D}: prologue 19 + per-worker call 18"),
    "cast1d_f16_to_f8": Fact(2, f"{_CAST1D}: HALF -> QUARTER, 8 a vector, 2 cycles (two "
                                "64-bit loads, one store; f16v8tof8)"),
    "cast1d_f32_to_f16": Fact(2, f"{_CAST1D}: FLOAT -> HALF, 4 a vector, 2 cycles (f32v4tof16)"),
    "cast1d_f8_to_f16": Fact(1, f"{_CAST1D}: QUARTER -> HALF, 4 a vector, 1 cycle (the "
                                "64-bit store bounds it)"),
})

# poplin's ReduceAdd as poplin's convolution reduction runs it: the tile's own partial on one
# edge, the received partials gathered contiguous on another ("single input"), where the
# region is a whole number of accumulator vectors and the received bytes, in whole memory
# elements, take under a sixteenth of the tile; one partial is cast (popops::cast, Cast1D).
_REDUCE_ADD = ("poplibs lib/poplin/PerformanceEstimation.hpp:1560-1597 (getReduceCycleEstimate, "
               "singleInput, partials not constrained to interleaved memory)")
_CONV_REDUCE = "poplibs lib/poplin/ConvReduce.cpp:64-120, ConvReducePlan.hpp:16-31"
PRICES.update({
    "reduce_add_supervisor": Fact(33, f"{_REDUCE_ADD}: supervisorCycles 33"),
    "reduce_add_worker": Fact(20, f"{_REDUCE_ADD}: 20 a worker, then its vectors"),
    "reduce_add_loop": Fact(2, f"{_REDUCE_ADD}: 2 cycles a received partial a vector (8 halves "
                               "or 4 floats; 64-bit loads carry half of one a cycle)"),
    "reduce_add_outer_f32": Fact(7, f"{_REDUCE_ADD}: outer loop 7 a vector, float partials, "
                                    "half out"),
    "reduce_add_outer_f16": Fact(9, f"{_REDUCE_ADD}: outer loop 9 a vector, half partials, "
                                    "half out"),
    "reduce_add_received_limit": Fact(
        32768, f"{_CONV_REDUCE}: single input where the received partials' bytes, rounded up "
        "to whole memory elements (16 KiB banks, ../shared/MACHINE.md), stay under a "
        "sixteenth of the 638,976-byte tile: two elements"),
})

# The fused layer norm Graphcore ships for the C600 (PopTransformer custom_ops, NormCE):
# bundle counts of its assembly; a bundle is one worker issue slot, 6 tile cycles.
_NORMCE = "PopTransformer 1314598f custom_ops"
PRICES.update({
    "normce_row_fixed": Fact(65, f"{_NORMCE}/NormCE.S:471-699 (normInfKernelAligned16): "
                                 "71 fixed bundles less the loops' -6: 1.25 W + 65 a row"),
    "normce_row_fixed_unaligned": Fact(60, f"{_NORMCE}/NormCE.S:242-457 (normInfKernel): "
                                           "1.5 W + 60 a row"),
    "normce_row_wrapper": Fact(10, "assumed: the compiled C++ loop of NormCEInfVertex "
                                   "(NormCECodelets.cpp:408-433) costs 10 bundles a row; not "
                                   "in the source"),
    "normce_call_wrapper": Fact(30, "assumed: NormCEInfVertex's call costs 30 bundles; the "
                                    "compiled C++ is not in the source"),
    "normce_split_stats": Fact(52, f"{_NORMCE}/NormCE_half_split.S:186-307, 475-507: partial "
                                   "sums C/4 + 52 (C/2 + 47 without interleave)"),
    "normce_split_stats_unaligned": Fact(47, f"{_NORMCE}/NormCE_half_split.S:65-173, 475-507"),
    "normce_split_normalise": Fact(38, f"{_NORMCE}/NormCE_half_split.S:316-406, 692-738: C + 38 "
                                       "(one row a call; C + 44 for two or three)"),
    "normce_split_supervisor": Fact(180, f"{_NORMCE}/NormCE_half_split.S:424-472: 30 supervisor "
                                         "instructions, 3 launches and syncs, at poplibs' 6 "
                                         "cycles an instruction (poplin PerformanceEstimation.hpp"
                                         ":1100-1120)"),
})
PRICES.update({  # the split kernel's merge of the workers' partial sums, by rows in the call
    f"normce_merge_{rows}": Fact(bundles, f"{_NORMCE}/NormCE_half_split.S:509-690: {bundles} "
                                          f"bundles with {rows} row(s) a call")
    for rows, bundles in ((1, 35), (2, 32), (3, 30))})
PRICES["normce_block"] = Fact(
    4, "assumed: an RMS norm's block (ir/one_pass.py rms_blocks) costs 4 bundles more a "
    "row: its eight FP32 lanes combined in pairs (f32v2add) and added to the row's sum; "
    "sensitivity: 16 blocks of a 2,048-wide row, 360 cycles a row on one tile")
PRICES["normce_split_normalise_rows"] = Fact(
    44, f"{_NORMCE}/NormCE_half_split.S:692-738: C + 44 with two or three rows a call")


# Cast1D's vector width and cycles a vector, by conversion.
CAST_VECTORS: dict[str, tuple[int, str]] = {
    "cast_f8": (8, "cast1d_f16_to_f8"),
    "cast_f16": (4, "cast1d_f32_to_f16"),
    "cast_from_f8": (4, "cast1d_f8_to_f16"),
}


# the vendor vertices an activation runs as, in order (``silu`` = x * sigma(x): a SIGMOID
# then a MULTIPLY; ``quick_gelu`` scales by 1.702 first, priced as one more MULTIPLY;
# ``swiglu`` = silu(a) * b is one MULTIPLY more than ``silu``; ``add_bias`` is the ADD of an
# attention bias or mask table before a softmax (two tables, a bias and a mask: two ADDs, the
# tables summed, then added); ``add`` is a residual add, the same ADD HALF
# vertex; ``rope`` is x cos + rot(x) sin as popops runs it: two MULTIPLY vertices, the
# rotation a view of x with its sign folded into the ADD/SUBTRACT, then the ADD.  Both are
# priced by the vendor's estimators for these vertices (``_POPOPS``), never measured on an
# ipu21; docs/machine.md gives the sensitivity)
ACTIVATION_VERTICES: dict[str, tuple[str, ...]] = {
    "sigmoid": ("sigmoid",),
    "tanh": ("tanh",),
    "silu": ("sigmoid", "multiply"),
    "quick_gelu": ("multiply", "sigmoid", "multiply"),
    "swiglu": ("sigmoid", "multiply", "multiply"),
    "mul": ("multiply",),
    "add_bias": ("add",),
    "add": ("add",),
    "rope": ("multiply", "multiply", "add"),
}


def p(name: str) -> int:
    """An integer price by name."""
    return int(PRICES[name].value)


def cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


# ---------------------------------------------------------------------------- work records
@dataclass(frozen=True)
class Work:
    """What one kernel call did on each tile of its batch, as counted while it ran.

    ``kind`` names the priced primitive; ``counts`` are the quantities the kernel loop
    actually iterated (AMP passes and rows, per-worker element counts, ...).  ``weights`` is
    the operand whose memory class changes the price (AMP weights), or -1.
    """

    kind: str
    counts: dict[str, Any] = field(default_factory=dict)
    weights: int = -1


def split_over_workers(total: int, workers: int = 6) -> list[int]:
    """How a kernel deals ``total`` items to its workers (first workers take one more)."""
    base, extra = divmod(int(total), workers)
    return [base + (1 if w < extra else 0) for w in range(workers)]

# popops MultiSlice (a token lookup; offsets split over the six workers), the vendor's own
# model of the split vertex: 6 (30 + ceil(N/6) (19 + cpv ceil(R / vw))), every offset in
# range (a column-split table holds every row). The vertex's assembly copies at the same
# rate (1 cycle an F16 element) with about 23 cycles an offset (notes in docs/machine.md).
_SLICE = "poplibs 7eac0f26 lib/popops"
PRICES.update({
    "multislice_call": Fact(30, f"{_SLICE}/PerformanceEstimation.cpp:49-122: "
                                "proAndEpilogueCycles 30 (29 for MultiUpdate)"),
    "multiupdate_call": Fact(29, f"{_SLICE}/PerformanceEstimation.cpp:49-122: "
                                 "proAndEpilogueCycles 29 with isUpdate"),
    "multislice_offset": Fact(19, f"{_SLICE}/PerformanceEstimation.cpp:49-122: "
                                  "cyclesOverheadPerOffsetInRange 19"),
    "multislice_offset_out_of_range": Fact(8, f"{_SLICE}/PerformanceEstimation.cpp:49-122: "
                                              "cyclesOverheadPerOffsetOutOfRange 8"),
    "multislice_vector_cycles": Fact(2, f"{_SLICE}/PerformanceEstimation.cpp:49-122: 2 cycles "
                                        "a vector of 2 halves or 2 floats (3 a vector of 4 "
                                        "bytes)"),
    "multislice_workers": Fact(6, f"{_SLICE}/DynamicSlice.cpp:4360-4392: the planner's model "
                                  "splits the offsets over the six workers (maxOffsetsPerWorker"
                                  " = ceil(N/6)), as MultiSliceUpdateCommon.cpp:86-124 does"),
})
PRICES.update({
    "multislice_all_in_range": Fact(1, f"{_SLICE}/popopsCycleEstimators.cpp:2126-2149: the "
                                       "vertex estimator charges every offset as in range "
                                       "('Assume worst case scenario where every index is in "
                                       "range'), so a step's cycles do not depend on the ids"),
    # popops Fill (zeroing a lookup's candidate rows before MultiSlice writes its hits)
    "fill_half_call": Fact(26, f"{_SLICE}/PerformanceEstimation.cpp:370-440: HALF Fill "
                               "26 + size / (dataPathWidth / 16), a worker's share"),
    "fill_float_call": Fact(23, f"{_SLICE}/PerformanceEstimation.cpp:370-440: FLOAT Fill "
                                "16 + size / 2 + 6 + 1"),
    "fill_byte_call": Fact(39, f"{_SLICE}/PerformanceEstimation.cpp:370-440: 8-bit Fill of "
                               "64 bytes or more: 39 + size / 8"),
    "fill_bytes_per_cycle": Fact(8, f"{_SLICE}/PerformanceEstimation.cpp:370-440: a 64-bit "
                                    "data path, 8 bytes a cycle (size / width, rounded down)"),
})

# popnn's argmax (``popnn::argMax``: Loss.cpp's maxMinArgMaxMin), the vendor's estimators:
# ReduceMaxClassGather (a supervisor vertex, a row's block over six workers) costs
# 6 (30 + 3 (w - 1)) + 9 for the busiest worker's w elements; ReduceMaxClassSparse (a worker
# vertex, up to 32 pairs a row) 27 + 3 (n - 1).
_ARGMAX = "poplibs 7eac0f26 lib/popnn/popnnCycleEstimators.cpp"
PRICES.update({
    "argmax_gather_worker": Fact(30, f"{_ARGMAX}:463-500: ReduceMaxClassGather, F16 or F32: "
                                     "pointers, worker id and region 12, setup 5, tail 3, "
                                     "index 6, stores 4"),
    "argmax_gather_supervisor": Fact(9, f"{_ARGMAX}:466-467: vertex overhead 5, supervisor "
                                        "call and sync 4"),
    "argmax_element": Fact(3, f"{_ARGMAX}:490 and 604: 3 cycles an element after the first "
                              "(the compare loop, both vertices)"),
    "argmax_sparse_vertex": Fact(27, f"{_ARGMAX}:589-611: ReduceMaxClassSparse, F32: vertex "
                                     "overhead 5, pointers and count 5, setup 4, tail 3, "
                                     "index 6, stores 4"),
})
