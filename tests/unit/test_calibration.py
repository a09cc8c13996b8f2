"""The AMP GEMM price against hardware measurements and against the vendor's estimator.

Three kinds of evidence, best first (docs/calibration-table.md):

* ``MEASURED``: the 11 AMP GEMM kernels the reference implementation timed on an ipu21.  Both
  of our entry points (the planner's ``estimate_gemm`` and the simulator's ``price_work``) must
  land within 3% of each, and never more than 3% below one (no kernel may be cheaper than
  measured without evidence).
* hand arithmetic at awkward sizes, written out here independently of ``target.timing``;
* ``CROSS_SHAPES``: shapes nobody measured, compared with the poplibs estimator transcribed in
  ``ipu_stack.target.poplibs``.  The vendor is known to be pessimistic, so the check is a band
  on ours / vendor, justified below, not equality.

``docs/calibration-table.md`` tabulates the same data; it is generated from this module.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import pytest

from ipu_stack.device.pricing import price_work
from ipu_stack.planning.costs import amp_passes, estimate_gemm
from ipu_stack.target import poplibs
from ipu_stack.target.poplibs import vendor_gemm_cycles
from ipu_stack.target.timing import Work

_FP8_SOURCE = ("reference kernel/cost.rs (index id 69533640428), ipu21 hardware table of 2026-09-13 "
               "(FP8 depth given as the true K, i.e. twice the table's halved extent)")
_F16_SOURCE = ("reference kernel/cost.rs (index ids 67244763768, 67459726989), test "
               "gemm_tracks_hardware_across_row_and_group_counts")


class Kernel(NamedTuple):
    """One AMP GEMM call timed on an ipu21: rows x depth times depth x cols, weights interleaved."""

    kind: str  # "fp8" or "f16"
    rows: int
    depth: int  # true K (FP8 included)
    cols: int
    cycles: int  # measured
    source: str

    @property
    def fp8(self) -> bool:
        return self.kind == "fp8"


MEASURED: tuple[Kernel, ...] = (
    Kernel("fp8", 244, 128, 64, 18_576, _FP8_SOURCE),
    Kernel("fp8", 82, 192, 160, 29_508, _FP8_SOURCE),
    Kernel("fp8", 122, 160, 128, 26_232, _FP8_SOURCE),
    Kernel("fp8", 81, 160, 80, 12_402, _FP8_SOURCE),
    Kernel("fp8", 146, 96, 48, 7_122, _FP8_SOURCE),
    Kernel("fp8", 56, 128, 80, 8_076, _FP8_SOURCE),
    Kernel("f16", 184, 288, 48, 48_654, _F16_SOURCE),
    Kernel("f16", 182, 288, 48, 48_180, _F16_SOURCE),
    Kernel("f16", 184, 288, 32, 32_538, _F16_SOURCE),
    Kernel("f16", 146, 576, 32, 53_718, _F16_SOURCE),
    Kernel("f16", 120, 80, 272, 55_344, _F16_SOURCE),
)

BAND = 0.03  # the measured kernels' tolerance; the formula reaches -1.85% (FP8 146x96x48)


def _simulated(rows: int, depth: int, cols: int, fp8: bool, interleaved: bool = True) -> int:
    """The simulator's price of the same call: the work record an AMP kernel reports."""
    work = Work("amp", {"passes": amp_passes(depth, cols, fp8), "rows": rows}, weights=1)
    return price_work(work, interleaved)


def _ids(kernels) -> list[str]:
    return [f"{k.kind}-{k.rows}x{k.depth}x{k.cols}" for k in kernels]


# ------------------------------------------------------------------ hardware measurements
@pytest.mark.parametrize("kernel", MEASURED, ids=_ids(MEASURED))
def test_planner_price_within_band_of_measurement(kernel: Kernel) -> None:
    ours = estimate_gemm(kernel.rows, kernel.depth, kernel.cols, kernel.fp8)
    assert abs(ours - kernel.cycles) <= BAND * kernel.cycles, (ours, kernel)


@pytest.mark.parametrize("kernel", MEASURED, ids=_ids(MEASURED))
def test_simulator_price_within_band_of_measurement(kernel: Kernel) -> None:
    simulated = _simulated(kernel.rows, kernel.depth, kernel.cols, kernel.fp8)
    assert abs(simulated - kernel.cycles) <= BAND * kernel.cycles, (simulated, kernel)


def test_no_measured_kernel_priced_below_its_measurement() -> None:
    """No kernel may be cheaper than measured without evidence.  The fitted formula is up to
    1.85% below a measurement (noise of the fit); anything past the 3% band is a price cut."""
    for k in MEASURED:
        floor = (1 - BAND) * k.cycles
        assert estimate_gemm(k.rows, k.depth, k.cols, k.fp8) >= floor, k
        assert _simulated(k.rows, k.depth, k.cols, k.fp8) >= floor, k


def test_vendor_estimate_is_pessimistic_on_every_measured_kernel() -> None:
    """The poplibs transcription over-estimates all 11 kernels, by 2.4-5.7% for F16 and by
    14.6-44.9% for FP8 (research report, section 5); a transcription error would move these."""
    for k in MEASURED:
        ratio = vendor_gemm_cycles(k.rows, k.depth, k.cols, k.fp8) / k.cycles
        low, high = (1.14, 1.46) if k.fp8 else (1.02, 1.06)
        assert low <= ratio <= high, (ratio, k)


# ------------------------------------------------------------------ hand arithmetic
# Each case: (rows, depth, cols, fp8, interleaved, cycles written out by hand).  The price is
# 294 per call + (16-column groups) x (depth groups of 16 F16 / 32 FP8) x (4 x rows + L), with
# L = 160 for interleaved weights and 266 for weights in standard memory.
HAND = (
    # 13 rows (not a multiple of 6), 40 F16 deep = 2 full groups + 8, 20 columns = 16 + 4:
    # 294 + ceil(40/16) * ceil(20/16) * (4*13 + 160) = 294 + 3*2*212 = 1,566
    (13, 40, 20, False, True, 294 + 3 * 2 * 212),
    # 7 rows, 200 FP8 deep = 6 groups of 32 + 8, 40 columns = 2 x 16 + 8:
    # 294 + 7*3*(28 + 160) = 294 + 21*188 = 4,242
    (7, 200, 40, True, True, 294 + 21 * 188),
    # the smallest call: 294 + 1*1*(4 + 160) = 458
    (1, 1, 1, False, True, 458),
    (1, 1, 1, True, True, 458),
    # 511 rows, 33 FP8 deep (one over a group), 17 columns (one over a group):
    # 294 + 2*2*(2044 + 160) = 294 + 4*2204 = 9,110
    (511, 33, 17, True, True, 9_110),
    # 100 rows, 100 F16 deep (6 groups + 4), 40 columns, weights in standard memory:
    # 294 + 7*3*(400 + 266) = 294 + 21*666 = 14,280
    (100, 100, 40, False, False, 14_280),
    # 5 rows (one worker idle), 48 F16 deep = exactly 3 groups, 16 columns: 294 + 3*(20 + 160) = 834
    (5, 48, 16, False, True, 834),
)


@pytest.mark.parametrize("rows,depth,cols,fp8,interleaved,expected", HAND)
def test_price_matches_hand_arithmetic(rows: int, depth: int, cols: int, fp8: bool, interleaved: bool,
                                       expected: int) -> None:
    assert estimate_gemm(rows, depth, cols, fp8, weights_interleaved=interleaved) == expected
    assert _simulated(rows, depth, cols, fp8, interleaved) == expected


def test_passes_count_partial_groups() -> None:
    assert amp_passes(40, 20, fp8=False) == 3 * 2
    assert amp_passes(200, 40, fp8=True) == 7 * 3
    assert amp_passes(32, 16, fp8=True) == 1
    assert amp_passes(32, 16, fp8=False) == 2


def test_empty_call_costs_nothing() -> None:
    assert estimate_gemm(0, 64, 64, fp8=True) == 0
    assert estimate_gemm(64, 0, 64, fp8=False) == 0
    assert vendor_gemm_cycles(0, 64, 64, fp8=True) == 0


# ------------------------------------------------------------------ the vendor transcription
def test_vendor_worked_example_fp8() -> None:
    """(244, 128 FP8, 64): workers [41]*4 + [40]*2, 4 input groups, 4 output groups.
    Inner with zeroing 6*(17+27-5+38*4) = 1,146; without 6*(17+27+38*4) = 1,176;
    46 + 21 + 4*(46 + 131 + 32 + 1146 + 3*(108 + 32 + 1176)) = 67 + 4*5303 = 21,279."""
    parts = poplibs.worker_partitions(244)
    assert parts == [41, 41, 41, 41, 40, 40]
    assert poplibs.inner_loop_quarter(parts, output_zeroing=True) == 1146
    assert poplibs.inner_loop_quarter(parts, output_zeroing=False) == 1176
    assert poplibs.weight_load_cycles() == 32
    assert poplibs.weight_load_cycles(coeff_load_bytes_per_cycle=8) == 64
    assert vendor_gemm_cycles(244, 128, 64, fp8=True) == 21_279
    # 64-bit weight loads: 16 passes x 32 more load cycles.
    assert vendor_gemm_cycles(244, 128, 64, fp8=True, weights_128bit=False) == 21_279 + 16 * 32 == 21_791


def test_vendor_worked_example_f16() -> None:
    """(244, 128 F16, 64): 8 input groups, 4 output groups, retention savings (7, 3), common path.
    Inner with zeroing: n=41: 37 + 38*4 - 7 = 182, x6 = 1,092 (n=40: 1,068 + 14 < 1,092);
    without: n=41: 38 + 38*4 - 7 = 183, x6 = 1,098.
    Outer: 50 + 6*(7 + 3*7) = 218, plus 13 + 7*(15 + 4*(19 + 6 + 32 + 1098))
    + (11 + 4*(18 + 7 + 32 + 1092)) = 13 + 32,445 + 4,607 = 37,065; total 37,283."""
    parts = poplibs.worker_partitions(244)
    assert poplibs.inner_loop_half_float(parts, True, float_activations=False, float_partials=True) == 1092
    assert poplibs.inner_loop_half_float(parts, False, float_activations=False, float_partials=True) == 1098
    assert vendor_gemm_cycles(244, 128, 64, fp8=False) == 37_283


def test_vendor_f16_partials_type_does_not_matter_with_16_conv_units() -> None:
    for rows, depth, cols in ((244, 128, 64), (13, 40, 20), (1, 16, 16), (97, 100, 40)):
        parts = poplibs.worker_partitions(rows)
        groups = (math.ceil(depth / 16), math.ceil(cols / 16))
        half = poplibs.conv_partial_1x1_cycles(parts, 1, *groups, activations="half", float_partials=False)
        assert half == vendor_gemm_cycles(rows, depth, cols, fp8=False)


# ------------------------------------------------------------------ cross-check with poplibs
# Ours / vendor on shapes nobody measured.  Both models charge 4 cycles per tile row per pass
# (vendor: a 4-cycle core loop per worker row, six workers round robin), so they differ only in
# fixed costs: ours is 294 per call + 160 per pass; the vendor's is ~280 (FP8) or ~170 (F16) per
# call, and per pass ~330-390 for FP8 (supervisor 108-177 + 32 weight-load cycles + 6 x ~32 worker
# entry) or ~170-200 for F16.  The ratio therefore depends on rows and on the number of passes P;
# for P -> infinity it tends to (4 rows + 160) / (vendor pass), which the sweep test reaches with
# 2,000 depth or column groups.  Two regimes:
#
# * "measured-like": rows >= 48 and P >= 4, where all 11 measured kernels lie (56-244 rows, 9-85
#   passes).  There the measurements say vendor/measured = 1.02-1.06 (F16) and 1.15-1.45 (FP8), so
#   ours/vendor is 0.95-0.97 (F16) and 0.68-0.87 (FP8) on those kernels.  Over rows 48..512 and any
#   P the FP8 ratio stays below 1 (0.61 at 49 rows with only column groups, 0.95 at 509 rows) and
#   the F16 ratio stays near 1 (0.85 at 49 rows with only depth groups, 1.09 at 53 rows and 4
#   passes, where our 294 per call outweighs the vendor's ~170).
#   Bands, extremes plus ~0.02 margin: FP8 [0.58, 0.97], F16 [0.82, 1.11].
# * "small": rows < 48 or P < 4.  Nothing was measured here and the fixed costs dominate.  FP8 at
#   1 row with many passes: ours is down to 0.42 of the vendor (our 164-cycle pass against its
#   ~390: a worker's 30-cycle entry x 6 contexts plus the supervisor); a single pass is within
#   1.04 either way.  F16: ours reaches 1.47 of the vendor for one pass (294 + 160 against ~320)
#   and falls to 0.63 at 7 rows with many depth groups (the worker holding 2 rows paces the pass).
#   Bands: FP8 [0.40, 1.08], F16 [0.60, 1.52].
# These extremes come from test_vendor_ratio_bands_hold_over_a_sweep's grid; the small-FP8 floor
# says the vendor thinks tiny-row FP8 passes cost over twice our price, with no measurement to
# settle it (docs/calibration-table.md).
BANDS: dict[tuple[str, str], tuple[float, float]] = {
    ("fp8", "measured-like"): (0.58, 0.97),
    ("f16", "measured-like"): (0.82, 1.11),
    ("fp8", "small"): (0.40, 1.08),
    ("f16", "small"): (0.60, 1.52),
}


def regime(rows: int, depth: int, cols: int, fp8: bool) -> str:
    """Which band a shape falls in: like the measured kernels, or small / few passes."""
    return "measured-like" if rows >= 48 and amp_passes(depth, cols, fp8) >= 4 else "small"


def band(rows: int, depth: int, cols: int, fp8: bool) -> tuple[float, float]:
    return BANDS[("fp8" if fp8 else "f16", regime(rows, depth, cols, fp8))]


# (rows, depth, cols, fp8): rows 1..512, rows not multiples of 6, partial 16-column groups (20, 40,
# 17), partial depth groups (100 / 40 F16, 200 / 33 FP8), single and many passes, both modes.
CROSS_SHAPES: tuple[tuple[int, int, int, bool], ...] = (
    (1, 32, 16, True),
    (1, 1152, 272, True),
    (3, 32, 8, True),
    (5, 64, 40, True),
    (7, 200, 40, True),
    (13, 100, 20, True),
    (24, 128, 64, True),
    (47, 200, 40, True),
    (50, 256, 64, True),
    (61, 200, 17, True),
    (97, 200, 40, True),
    (128, 1152, 64, True),
    (200, 33, 160, True),
    (333, 64, 160, True),
    (511, 200, 40, True),
    (512, 256, 272, True),
    (1, 16, 16, False),
    (2, 100, 40, False),
    (5, 16, 8, False),
    (6, 288, 64, False),
    (7, 576, 32, False),
    (13, 40, 20, False),
    (23, 100, 40, False),
    (48, 288, 48, False),
    (61, 100, 40, False),
    (100, 1152, 16, False),
    (146, 576, 32, False),
    (250, 100, 272, False),
    (384, 16, 64, False),
    (389, 40, 20, False),
    (511, 288, 40, False),
    (512, 1152, 272, False),
)


def _cross_ids() -> list[str]:
    return [f"{'fp8' if f else 'f16'}-{r}x{k}x{c}" for r, k, c, f in CROSS_SHAPES]


@pytest.mark.parametrize("rows,depth,cols,fp8", CROSS_SHAPES, ids=_cross_ids())
def test_price_within_band_of_vendor_estimate(rows: int, depth: int, cols: int, fp8: bool) -> None:
    ratio = estimate_gemm(rows, depth, cols, fp8) / vendor_gemm_cycles(rows, depth, cols, fp8)
    low, high = band(rows, depth, cols, fp8)
    assert low <= ratio <= high, (ratio, regime(rows, depth, cols, fp8))


def test_cross_shapes_cover_the_awkward_cases() -> None:
    rows = {r for r, _, _, _ in CROSS_SHAPES}
    assert min(rows) == 1 and max(rows) == 512 and len(CROSS_SHAPES) >= 20
    for fp8 in (True, False):
        shapes = [(r, k, c) for r, k, c, f in CROSS_SHAPES if f == fp8]
        step = 32 if fp8 else 16
        assert any(r % 6 for r, _, _ in shapes)
        assert any(c % 16 for _, _, c in shapes)
        assert any(k % step for _, k, _ in shapes)
        assert {regime(r, k, c, fp8) for r, k, c in shapes} == {"measured-like", "small"}


def test_measured_kernels_lie_in_the_measured_like_band() -> None:
    for k in MEASURED:
        assert regime(k.rows, k.depth, k.cols, k.fp8) == "measured-like"
        ratio = estimate_gemm(k.rows, k.depth, k.cols, k.fp8) / vendor_gemm_cycles(k.rows, k.depth, k.cols,
                                                                                    k.fp8)
        low, high = band(k.rows, k.depth, k.cols, k.fp8)
        assert low <= ratio <= high, (ratio, k)


def test_vendor_ratio_bands_hold_over_a_sweep() -> None:
    """The bands are a property of the domain (rows 1..512), not of the shapes picked above."""
    for fp8 in (True, False):
        step = 32 if fp8 else 16
        # 2,000 groups stand for the limit of many passes of one kind (all depth or all columns).
        depths = (1, step, step + 1, 2 * step, 3 * step + 8, 4 * step, 20 * step - 4, 36 * step, 2000 * step)
        for rows in range(1, 513):
            for depth in depths:
                for cols in (1, 16, 17, 40, 64, 160, 274, 16 * 2000):
                    ratio = estimate_gemm(rows, depth, cols, fp8) / vendor_gemm_cycles(rows, depth, cols, fp8)
                    low, high = band(rows, depth, cols, fp8)
                    assert low <= ratio <= high, (ratio, rows, depth, cols, fp8)
