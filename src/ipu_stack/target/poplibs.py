"""The vendor's cycle estimate for the AMP GEMM vertex, transcribed from poplibs.

Why this module exists
----------------------
:mod:`ipu_stack.target.timing` prices an AMP GEMM call with a closed form fitted to kernels the
reference implementation measured on an ipu21.  This module is an *independent cross-check* of
that price: Graphcore's own estimator for the same vertex (``poplin::ConvPartial1x1Out``, the
1x1 convolution partial that a matrix multiply lowers to), written out again in Python.  The
tests compare the two over many shapes, so a change to ``timing`` that drifts far from what the
vendor believes is noticed.  **Nothing here is used for pricing**: the vendor estimate is 2-6%
high for F16 and 15-45% high for FP8 on the measured kernels, and the measured figures win.

Source
------
graphcore/poplibs, HEAD ``7eac0f26`` (2023-08-11):

* ``lib/poplin/PerformanceEstimation.hpp``

  - 46-58: ``conv1x1WorkerRetentionSavings`` (worker state retained across passes);
  - 397-491: ``getConvPartial1x1SupervisorInnerLoopCycleEstimateHalfFloat``;
  - 493-541: ``getConvPartial1x1SupervisorInnerLoopCycleEstimateQuarter``;
  - 558-572: ``getConvPartialAmpSupervisorWeightLoadCycleEstimate``;
  - 574-615: ``getConvPartial1x1SupervisorOuterLoopCycleEstimateHalfFloat``;
  - 617-647: ``getConvPartial1x1SupervisorOuterLoopCycleEstimateQuarter``;
  - 672-691: ``getConvPartial1x1SupervisorCycleEstimate`` (inner loop twice, with and without
    output zeroing, then the outer loop).

* ``lib/poplin/poplinCycleEstimators.cpp`` 180-221: the ``ConvPartial1x1Out`` estimator, which
  builds one work-list item (the field rows) per worker context and derives the weight-load
  size and rate.

The constants that live in Poplar's ``Target`` (not in poplibs) are **inferred**, marked so
below: 6 worker contexts, 16 conv units, 32 weight bytes per conv unit per pass and a
coefficient load rate of 16 bytes per cycle (halved with 64-bit loads).  Together they give
``numLoads`` = 16 x 32 / 16 = 32 cycles with 128-bit weight loads, or 64 with 64-bit loads: the
32 ``ld128putcs`` / 64 ``ld64putcs`` that load one 512-byte CWEI block.

Mapping a GEMM onto the vertex
------------------------------
``rows`` (the output rows on the tile) are the convolution field, split over the workers as
``rows // 6 + (w < rows % 6)``; one conv group; ``ceil(cols / 16)`` output-channel groups of 16;
``ceil(depth / 32)`` input-channel groups for FP8 (the quarter path: F143 activations, F16
partials) or ``ceil(depth / 16)`` for F16 (the half-activation path).
"""

from __future__ import annotations

from collections.abc import Sequence

# Poplar Target values (inferred: not in poplibs; see the module docstring).
WORKER_CONTEXTS = 6
"""Inferred: ``target.getNumWorkerContexts()`` on ipu21."""
CONV_UNITS = 16
"""Inferred: AMP conv units per tile (16 output channels per pass)."""
WEIGHT_BYTES_PER_CONV_UNIT = 32
"""Inferred: conv chain length 4 x load elements (4 half or 8 quarter) x element size."""
COEFF_LOAD_BYTES_PER_CYCLE = 16
"""Inferred: ``target.getConvUnitCoeffLoadBytesPerCycle()`` with 128-bit loads (8 with 64-bit)."""

# Vertex-level constants (poplibs).
OUT_CHANS_PER_GROUP = 16
"""poplinCycleEstimators.cpp: one output group is one pass of the 16 conv units."""
F16_DEPTH_PER_GROUP = 16
"""One input-channel group of half activations (the AMP's F16 input width per pass)."""
FP8_DEPTH_PER_GROUP = 32
"""One input-channel group of quarter activations ("32 QUARTER inputs")."""


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def worker_partitions(rows: int, workers: int = WORKER_CONTEXTS) -> list[int]:
    """Rows given to each worker context: the first ``rows % workers`` take one extra."""
    base, extra = divmod(rows, workers)
    return [base + (1 if w < extra else 0) for w in range(workers)]


def _paced_by_slowest(worker_cycles: Sequence[int], workers: int) -> int:
    """The supervisor's view of one pass: workers run round robin, so a worker needing ``t`` of its
    own cycles occupies ``workers * t`` tile cycles; the slowest worker sets the pace, and the
    supervisor's 14-cycle tag is charged to the fastest (``max(max, min + 14)``).

    When fewer work lists than contexts were given, an idle context counts as zero cycles."""
    scaled = [workers * t for t in worker_cycles]
    slowest = max(scaled, default=0)
    fastest = 0 if len(worker_cycles) < workers else min(scaled)
    return max(slowest, fastest + 14)


def retention_savings(float_activations: bool, float_partials: bool,
                      num_conv_units: int = CONV_UNITS) -> tuple[int, int]:
    """Worker cycles saved by retaining state between passes (PerformanceEstimation.hpp 46-58):
    (total saving per worker call, part of it due to input-channel state)."""
    if not float_activations and (float_partials or num_conv_units == 16):
        return 7, 3
    return 0, 0


def inner_loop_quarter(partitions: Sequence[int], output_zeroing: bool,
                       workers: int = WORKER_CONTEXTS) -> int:
    """Tile cycles of one pass of the FP8 (quarter) worker over its rows
    (PerformanceEstimation.hpp 493-541).

    ``output_zeroing`` is true on the first input-channel group, where the worker writes the
    partials instead of accumulating into them, which saves 5 cycles per worker."""
    core = 4  # cycles per field row: "Core loop cycles for AMP vertex - 32 QUARTER inputs"
    overhead = 17
    zeroing_saving = 5 if output_zeroing else 0
    cycles = []
    for n in partitions:
        if n == 0:
            t = overhead + 4
        elif n == 1:
            t = overhead + 18 - zeroing_saving
        elif n == 2:
            t = overhead + 23 - zeroing_saving
        else:
            t = overhead + 27 - zeroing_saving + (n - 3) * core
        cycles.append(t)
    return _paced_by_slowest(cycles, workers)


def _half_float_worker(n: int, output_zeroing: bool, float_activations: bool, float_partials: bool,
                       num_conv_units: int) -> int:
    """One worker's own cycles for ``n`` field rows, F16 or F32 activations (before retention)."""
    z = 1 if output_zeroing else 0
    if float_activations:
        core = 8
        zero_per_group = 8 if num_conv_units == 16 else (4 if float_partials else 2)
        if n == 0:
            return 24
        if n == 1:
            return 47 + (2 + zero_per_group) * z
        if n == 2:
            return 46 + (2 + zero_per_group * 2) * z
        return 46 + (2 + zero_per_group * n) * z + (n - 3) * core

    core = 4
    # Half activations with 16 conv units share their code with float partials on 8 units.
    if num_conv_units == 16 or float_partials:
        ending = 1 if output_zeroing else 2
        if n == 0:
            return 20 + ending
        if n == 1:
            return 31 + ending
        if n == 2:
            return 40 + ending
        return (37 if output_zeroing else 38) + (n - 3) * core

    zero_per_group = 2  # half partials on 8 conv units
    if n == 0:
        return 24
    if n == 1:
        return 39 + (2 + zero_per_group) * z
    if n == 2:
        return 40 + (2 + zero_per_group * 2) * z
    return 41 + (2 + zero_per_group * n) * z + (n - 3) * core


def inner_loop_half_float(partitions: Sequence[int], output_zeroing: bool, float_activations: bool,
                          float_partials: bool, num_conv_units: int = CONV_UNITS,
                          workers: int = WORKER_CONTEXTS) -> int:
    """Tile cycles of one pass of the F16/F32-activation worker (PerformanceEstimation.hpp
    397-491): each worker's cycles less its retention saving, paced by the slowest."""
    saving, _ = retention_savings(float_activations, float_partials, num_conv_units)
    cycles = [_half_float_worker(n, output_zeroing, float_activations, float_partials, num_conv_units)
              - saving for n in partitions]
    return _paced_by_slowest(cycles, workers)


def weight_load_cycles(weight_bytes_per_conv_unit: int = WEIGHT_BYTES_PER_CONV_UNIT,
                       num_conv_units: int = CONV_UNITS,
                       coeff_load_bytes_per_cycle: int = COEFF_LOAD_BYTES_PER_CYCLE,
                       filter_height: int = 1) -> int:
    """Supervisor cycles to load one pass's weights into the conv units (PerformanceEstimation.hpp
    558-572).  A 1x1 vertex has filter height 1; only the nx1 vertex with height 4 is forced onto
    64-bit loads."""
    if filter_height == 4 and coeff_load_bytes_per_cycle > 8:
        coeff_load_bytes_per_cycle //= 2
    return num_conv_units * weight_bytes_per_conv_unit // coeff_load_bytes_per_cycle


def outer_loop_quarter(inner_zeroing: int, inner_accumulating: int, conv_groups: int,
                       in_groups: int, out_groups: int, num_loads: int,
                       workers: int = WORKER_CONTEXTS) -> int:
    """Supervisor cycles of the FP8 vertex (PerformanceEstimation.hpp 617-647).

    For every output group: the first input group zeroes the partials, each later input group
    waits for the workers (the CWEI are shared), reloads the weights and runs the workers again."""
    worker_call = workers * 6
    non_loop = 46
    conv_group_loop = workers * 2 + 9
    out_group_loop = workers * 6 + 10
    first_in_group = workers * 14 + 11 + worker_call
    later_in_group = workers * 11 + 6 + worker_call
    per_out_group = (out_group_loop
                     + first_in_group + num_loads + inner_zeroing
                     + (in_groups - 1) * (later_in_group + num_loads + inner_accumulating))
    return non_loop + conv_groups * (conv_group_loop + out_groups * per_out_group)


def outer_loop_half_float(inner_zeroing: int, inner_accumulating: int, conv_groups: int,
                          in_groups: int, out_groups: int, out_chans_per_group: int, num_loads: int,
                          float_activations: bool, float_partials: bool,
                          num_conv_units: int = CONV_UNITS, workers: int = WORKER_CONTEXTS) -> int:
    """Supervisor cycles of the F16/F32-activation vertex (PerformanceEstimation.hpp 574-615).

    Unlike the quarter vertex this one loops input groups outside output groups; the first input
    group (zeroing) is costed separately from the ``in_groups - 1`` accumulating ones."""
    passes_per_out_group = _cdiv(out_chans_per_group, num_conv_units)
    saving, in_chan_saving = retention_savings(float_activations, float_partials, num_conv_units)
    common = 1 if (not float_activations and num_conv_units == 16) or float_partials else 0
    non_loop = 50
    out_pass_overhead = 7
    excess_in_chan_overhead = 1
    retention = workers * (saving + in_chan_saving * (in_groups * conv_groups - 1))
    accumulating_groups = (in_groups - 1) * (
        15 - common + excess_in_chan_overhead
        + out_groups * (19 + passes_per_out_group * (6 + num_loads + inner_accumulating)))
    zeroing_group = (10 + excess_in_chan_overhead
                     + out_groups * (19 - common
                                     + passes_per_out_group * (out_pass_overhead + num_loads
                                                               + inner_zeroing)))
    return non_loop + retention + conv_groups * (12 + common + accumulating_groups + zeroing_group)


def conv_partial_1x1_cycles(partitions: Sequence[int], conv_groups: int, in_groups: int,
                            out_groups: int, activations: str, float_partials: bool,
                            weights_128bit: bool = True,
                            out_chans_per_group: int = OUT_CHANS_PER_GROUP,
                            workers: int = WORKER_CONTEXTS) -> int:
    """The whole ``ConvPartial1x1Out`` estimate (PerformanceEstimation.hpp 672-691 with the
    arguments of poplinCycleEstimators.cpp 180-221).

    ``activations`` is ``"quarter"`` (FP8), ``"half"`` or ``"float"``; ``weights_128bit`` says the
    weights are loaded with 128-bit loads (which needs them in interleaved memory)."""
    if activations not in ("quarter", "half", "float"):
        raise ValueError(f"unknown activation type {activations!r}")
    coeff_rate = COEFF_LOAD_BYTES_PER_CYCLE if weights_128bit else COEFF_LOAD_BYTES_PER_CYCLE // 2
    num_loads = weight_load_cycles(WEIGHT_BYTES_PER_CONV_UNIT, CONV_UNITS, coeff_rate, 1)
    if activations == "quarter":
        zeroing = inner_loop_quarter(partitions, True, workers)
        accumulating = inner_loop_quarter(partitions, False, workers)
        return outer_loop_quarter(zeroing, accumulating, conv_groups, in_groups, out_groups, num_loads,
                                  workers)
    float_acts = activations == "float"
    zeroing = inner_loop_half_float(partitions, True, float_acts, float_partials, CONV_UNITS, workers)
    accumulating = inner_loop_half_float(partitions, False, float_acts, float_partials, CONV_UNITS,
                                         workers)
    return outer_loop_half_float(zeroing, accumulating, conv_groups, in_groups, out_groups,
                                 out_chans_per_group, num_loads, float_acts, float_partials,
                                 CONV_UNITS, workers)


def vendor_gemm_cycles(rows: int, depth: int, cols: int, fp8: bool, weights_128bit: bool = True) -> int:
    """The vendor's estimate of one AMP GEMM call on one tile: ``rows`` x ``depth`` times
    ``depth`` x ``cols``.

    FP8 uses the quarter path (F143 activations, F16 partials, 32 input channels per group); F16
    uses half activations with float partials, 16 input channels per group (with 16 conv units
    the half-partials path gives the same figure).  An empty shape makes no call and costs 0.

    >>> vendor_gemm_cycles(244, 128, 64, fp8=True)
    21279
    """
    if rows <= 0 or depth <= 0 or cols <= 0:
        return 0
    in_groups = _cdiv(depth, FP8_DEPTH_PER_GROUP if fp8 else F16_DEPTH_PER_GROUP)
    out_groups = _cdiv(cols, OUT_CHANS_PER_GROUP)
    return conv_partial_1x1_cycles(worker_partitions(rows), 1, in_groups, out_groups,
                                   "quarter" if fp8 else "half", float_partials=not fp8,
                                   weights_128bit=weights_128bit)
