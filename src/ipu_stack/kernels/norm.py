"""The layer norm Graphcore ships for the C600: PopTransformer's fused ``NormCE``, and an
RMS norm written on its loops.

One pass gathers a row's sum and sum of squares in FP32 accumulators (``f16v8acc``,
``f16v8sqacc``: eight lanes, lane ``k`` summing elements ``8i + k``, when the width is a
multiple of 8 and at least 576; four lanes otherwise), combined as ``((L0 + L2) + (L4 + L6))
+ ((L1 + L3) + (L5 + L7))``.  The mean is the sum times the FP32 reciprocal of the width,
rounded to F16; the variance is ``E[x^2] - mean_h^2`` in FP32, clamped at 0, plus eps; the
inverse deviation ``1 / sqrt(var)`` in FP32 is rounded to F16; then ``((x - mean) * r) *
gamma + beta`` runs in F16, rounding after every operation (``NormCE.S:471-699``).

The kernel runs rows as the vendor's code does (``NormCEImpl.cpp:331-413``): six or more rows
of a tile one a worker, fewer split over the workers.  The statistics are summed in the
one-row-a-worker order on every tile (the split kernel's per-worker partial sums differ
from it in FP32 rounding only); the host reference follows this form.  It applies to F16
rows and F16 scale and shift of a width that is a multiple of 4 below 8192, with an epsilon
that keeps ``1 / sqrt(eps)`` within F16 (BEiT's 1e-12 does not); other layer norms run the
reference's measured kernel.

An RMS norm of the same precisions and widths runs on NormCE's loops with two of their
steps left out (the sum and the mean's subtraction, :func:`normce_rms_norm`), its squares
summed in blocks where the row is 512 or more wide (``ir.one_pass.rms_blocks``), so that a
decode step can split the row by columns over tiles (:func:`rms_part_cycles`): the vendor
ships no RMS norm kernel (PopTransformer composes it from popart operations,
``poptransformer/layers/rms_layer_norm.py``), so its price is assumed to be NormCE's
bundles, an upper bound for a kernel that does less (docs/machine.md).
"""

from __future__ import annotations

import numpy as np

from ipu_stack.ir.one_pass import rms_blocks
from ipu_stack.ir.precision import Precision
from ipu_stack.target.timing import cdiv, p

# NormCE rounds 1 / sqrt(var + eps) to F16: a row of equal values would overflow it (an
# infinite deviation, NaN outputs) unless 1 / sqrt(eps) is at most F16's largest, 65504
SMALLEST_EPS = 1.0 / 65504.0**2


def normce_applies(x: Precision, aux: Precision | None, width: int, eps: float) -> bool:
    """Whether a layer norm of these precisions, width and epsilon runs as ``NormCE``."""
    return (x.kind == "F16" and aux is not None and aux.kind == "F16"
            and width % 4 == 0 and 0 < width < 8192 and eps >= SMALLEST_EPS)


def interleaved(width: int) -> bool:
    """Eight accumulator lanes (and 128-bit loads) rather than four."""
    return width % 8 == 0 and width >= 576


def _lane_sums(values: np.ndarray, lanes: int) -> np.ndarray:
    """FP32 accumulators, lane ``k`` adding elements ``lanes * i + k`` in order."""
    shaped = values.reshape(*values.shape[:-1], values.shape[-1] // lanes, lanes)
    total = np.zeros((*values.shape[:-1], lanes), dtype=np.float32)
    for index in range(shaped.shape[-2]):
        total += shaped[..., index, :]
    return total


def _combine(lanes: np.ndarray) -> np.ndarray:
    if lanes.shape[-1] == 8:
        return ((lanes[..., 0] + lanes[..., 2]) + (lanes[..., 4] + lanes[..., 6])) + (
            (lanes[..., 1] + lanes[..., 3]) + (lanes[..., 5] + lanes[..., 7]))
    return (lanes[..., 0] + lanes[..., 2]) + (lanes[..., 1] + lanes[..., 3])


def normce_layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float
                      ) -> np.ndarray:
    """``NormCE``'s values for F16 rows ``x`` (float32 holding F16 values, last axis the
    row), as F16 values in float32."""
    width = x.shape[-1]
    lanes = 8 if interleaved(width) else 4
    x32 = x.astype(np.float32)
    total = _combine(_lane_sums(x32, lanes))
    squares = _combine(_lane_sums(x32 * x32, lanes))
    reciprocal = np.float32(1.0) / np.float32(width)
    mean = (total * reciprocal).astype(np.float16)
    mean32 = mean.astype(np.float32)
    variance = np.maximum(squares * reciprocal - mean32 * mean32, np.float32(0.0))
    variance = variance + np.float32(eps)
    inverse = (np.float32(1.0) / np.sqrt(variance)).astype(np.float16)
    x16 = x.astype(np.float16)
    centred = x16 - mean[..., None]
    normal = centred * inverse[..., None]
    scaled = normal * gamma.astype(np.float16)
    return (scaled + beta.astype(np.float16)).astype(np.float32)


def rms_partials(x: np.ndarray, width: int) -> np.ndarray:
    """The blocks' sums of squares of ``x`` (F16 values in float32, the last axis a run of
    whole blocks of a ``width``-wide row): FP32 lanes a block, combined as the kernel
    combines them; ``[..., blocks here]``."""
    block = width // rms_blocks(width)
    lanes = 8 if interleaved(width) else 4
    x32 = x.astype(np.float32)
    blocks = x32.reshape(*x.shape[:-1], x.shape[-1] // block, block)
    return _combine(_lane_sums(blocks * blocks, lanes))


def rms_scale(x: np.ndarray, gamma: np.ndarray, partials: np.ndarray, width: int,
              eps: float) -> np.ndarray:
    """The RMS norm of ``x`` (some or all of a row's columns) from every block's sum of
    squares (``partials``, ``[..., blocks]``): the blocks added in order in FP32, times the
    FP32 reciprocal of the width, plus eps; ``1 / sqrt`` in FP32 rounded to F16; then ``(x *
    r) * gamma`` in F16, rounding after each product."""
    squares = partials[..., 0].astype(np.float32)
    for block in range(1, partials.shape[-1]):
        squares = squares + partials[..., block]
    power = squares * (np.float32(1.0) / np.float32(width)) + np.float32(eps)
    inverse = (np.float32(1.0) / np.sqrt(power)).astype(np.float16)
    normal = x.astype(np.float16) * inverse[..., None]
    return (normal * gamma.astype(np.float16)).astype(np.float32)


def normce_rms_norm(x: np.ndarray, gamma: np.ndarray, eps: float) -> np.ndarray:
    """An RMS norm written on ``NormCE``'s loops, as F16 values in float32: the sum of
    squares in FP32 lanes (``f16v8sqacc``) over each of the row's blocks (:func:`rms_blocks`),
    the blocks added in order (:func:`rms_scale`).  No mean and no shift: NormCE's loops less
    two of their steps."""
    width = x.shape[-1]
    return rms_scale(x, gamma, rms_partials(x, width), width, eps)


def normce_calls(rows: int) -> list[tuple[str, int]]:
    """The vendor's compute sets for ``rows`` rows of a tile: ``("rows", n)`` runs ``n``
    rows (a multiple of 6) one a worker, ``("split", t)`` runs ``t <= 3`` rows split over
    the workers; four or five rows left are three, then the rest."""
    calls: list[tuple[str, int]] = []
    left = rows
    while left > 0:
        if left >= 6:
            take = 6 * (left // 6)
            calls.append(("rows", take))
        else:
            take = 3 if left in (4, 5) else left
            calls.append(("split", take))
        left -= take
    return calls


def split_chunk(cols: int, rows: int, aligned: bool) -> int:
    """Halves each worker takes of a row's ``cols`` in the split kernel (6, 3 or 2 workers a
    row), in whole accumulator vectors (eight lanes where ``aligned``, else four)."""
    grain = 8 if aligned else 4
    return cdiv(cdiv(cols, grain), 6 // rows) * grain


def _split_stats(chunk: int, aligned: bool) -> int:
    """A worker's partial sums over its chunk in the split kernel, in bundles."""
    return chunk // 4 + p("normce_split_stats") if aligned else \
        chunk // 2 + p("normce_split_stats_unaligned")


def _split_normalise(chunk: int, rows: int) -> int:
    """A worker's normalise of its chunk in the split kernel, in bundles."""
    return chunk + p("normce_split_normalise" if rows == 1 else "normce_split_normalise_rows")


def normce_call_cycles(kind: str, rows: int, width: int) -> int:
    """One compute set of ``NormCE`` on a tile, in tile cycles (six workers, a bundle
    every 6 cycles)."""
    aligned = interleaved(width)
    if kind == "rows":
        per_row = (5 if aligned else 6) * width // 4 + p(
            "normce_row_fixed" if aligned else "normce_row_fixed_unaligned")
        return 6 * ((rows // 6) * (per_row + p("normce_row_wrapper")) + p("normce_call_wrapper"))
    chunk = split_chunk(width, rows, aligned)
    bundles = _split_stats(chunk, aligned) + p(f"normce_merge_{rows}") + \
        _split_normalise(chunk, rows)
    return 6 * bundles + p("normce_split_supervisor")


def normce_cycles(rows: int, width: int) -> int:
    """``NormCE`` over a tile's ``rows`` rows of ``width``: its compute sets one after
    another (no exchange between them, so no sync)."""
    return sum(normce_call_cycles(kind, n, width) for kind, n in normce_calls(rows))


def rms_block_cycles(rows: int, width: int) -> int:
    """What summing an RMS norm's squares in :func:`rms_blocks` costs beyond the one-pass
    loops on a tile's ``rows`` rows: a block's lanes combined and added to the row's sum,
    ``normce_block`` bundles a further block a row, charged as if one worker did them."""
    return 6 * rows * (rms_blocks(width) - 1) * p("normce_block")


def rms_part_cycles(part: str, rows: int, cols: int, width: int) -> int:
    """One tile's share of an RMS norm split by columns (``cols`` of a ``width``-wide row,
    whole blocks of it), as ``NormCE``'s split kernel runs a row over its workers, in calls
    of at most three rows one after another: ``part`` ``"sums"`` gathers the blocks' sums of
    squares (the split kernel's partial sums and merge); ``"scale"`` adds every block's
    sum, takes the inverse root and scales the columns (the merge and the normalise)."""
    aligned = interleaved(width)
    blocks = rms_blocks(width)
    further = (cols * blocks // width if part == "sums" else blocks) - 1
    cycles = 0
    for start in range(0, rows, 3):
        count = min(3, rows - start)
        chunk = split_chunk(cols, count, aligned)
        bundles = p(f"normce_merge_{count}") + further * p("normce_block") + (
            _split_stats(chunk, aligned) if part == "sums" else _split_normalise(chunk, count))
        cycles += 6 * bundles + p("normce_split_supervisor")
    return cycles
