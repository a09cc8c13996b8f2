"""Elementwise operation semantics shared by the device kernels.

A *chain* is a list of ``[kind, precision_json]`` steps applied to an F32 tensor; after each
step the value is rounded to that step's output precision, exactly as the graph stores it.
Kinds: ``round`` (the matmul's own output rounding), ``bias`` (add the bias row), ``gelu_tanh``,
``gelu_erf``, the activations ``sigmoid``, ``tanh``, ``silu``, ``quick_gelu``, and ``cast``.
The tanh GELU is the vendor's F16 loop (:func:`gelu_tanh_f16`), since that is the kernel it is
priced as; the erf GELU and the activations are evaluated in F32 (SciPy's ``expit`` for the
logistic function).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
from scipy import special

from ipu_stack.ir.precision import Precision
from ipu_stack.target.timing import Work, cdiv, p, split_over_workers

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


F16_MAX = 65504.0
GELU_ALPHA = float(np.float16(SQRT_2_OVER_PI))  # the constants as the loop loads them (F16)
GELU_ALPHA_BETA = float(np.float16(SQRT_2_OVER_PI * 0.044715))


def _f16(x: np.ndarray) -> np.ndarray:
    """One F16 instruction's result from its exact value: rounded once to F16 and saturated
    at its largest finite value (the loop clears the overflow exception so results
    saturate), kept as float64."""
    return np.clip(x, -F16_MAX, F16_MAX).astype(np.float16).astype(np.float64)


@functools.cache
def f16_tanh_table() -> np.ndarray:
    """``f16v2tanh`` as a function of its F16 operand: tanh of every F16 value, rounded to
    F16, from the scalar libm (vectorised tanh differs by an ulp between array layouts,
    which an F16 rounding near a tie would turn into a different half)."""
    halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float64)
    return np.array([math.tanh(v) for v in halves.tolist()]).astype(np.float16)


def gelu_tanh_f16(x: np.ndarray) -> np.ndarray:
    """The tanh GELU as popnn's F16 loop computes it (``NonLinearityLoop_gelu.S``), each
    instruction's exact result rounded once to F16: ``x2 = x*x``, ``x3 = x*x2``
    (``f16v4mul``), ``phi = alpha x + alpha beta x3`` (``f16v4mix``), ``t = tanh(phi)``
    (``f16v2tanh``, :func:`f16_tanh_table`), ``u = (t + 1) * 0.5`` (``f16v4add``,
    ``f16v4mul``), ``y = u * x``.  The constants are the model's (``sqrt(2/pi)`` and
    ``0.044715``), not the vendor's gradient-tuned ones.  Returns float32."""
    x = _f16(np.asarray(x, dtype=np.float64))
    cube = _f16(x * _f16(x * x))
    phi = np.clip(GELU_ALPHA * x + GELU_ALPHA_BETA * cube, -F16_MAX, F16_MAX).astype(np.float16)
    tanh = f16_tanh_table()[phi.view(np.uint16)].astype(np.float64)
    half = _f16(_f16(tanh + 1.0) * 0.5)
    return _f16(half * x).astype(np.float32)


def gelu_erf(x: np.ndarray) -> np.ndarray:
    """GELU, exact (erf) form, in float32 (SciPy's erf on float64)."""
    x64 = x.astype(np.float64)
    erf = special.erf(x64 / math.sqrt(2.0))
    return (0.5 * x64 * (1.0 + erf)).astype(np.float32)


def activation(x: np.ndarray, function: str) -> np.ndarray:
    """One of the ``activation`` functions in float32: sigma(x), tanh(x), x sigma(x) (SiLU),
    x sigma(1.702 x) (quick GELU)."""
    x = x.astype(np.float32, copy=False)
    if function == "tanh":
        return np.tanh(x).astype(np.float32)
    if function == "sigmoid":
        return special.expit(x).astype(np.float32)
    if function == "silu":
        return (x * special.expit(x)).astype(np.float32)
    if function == "quick_gelu":
        return (x * special.expit(np.float32(1.702) * x)).astype(np.float32)
    raise ValueError(f"unknown activation {function!r}")


ACTIVATIONS = ("sigmoid", "tanh", "silu", "quick_gelu")


def apply_chain(
    values: np.ndarray, chain: list[list[Any]], bias: np.ndarray | None
) -> np.ndarray:
    """Apply the chain to F32 ``values`` (bias broadcast over rows), rounding after each step."""
    out = values.astype(np.float32, copy=False)
    for step in chain:
        kind, precision = step[0], Precision.from_json(step[1])
        if kind == "scale":
            out = out * np.float32(step[2])
        elif kind == "bias":
            if bias is None:
                raise ValueError("bias step without a bias operand")
            out = out + bias.astype(np.float32)
        elif kind == "gelu_tanh":
            out = gelu_tanh_f16(out)
        elif kind == "gelu_erf":
            out = gelu_erf(out)
        elif kind in ACTIVATIONS:
            out = activation(out, kind)
        elif kind not in ("round", "cast"):
            raise ValueError(f"unknown elementwise step {kind!r}")
        out = precision.round_trip(out)
    return out


GELUS = ("gelu_tanh", "gelu_erf")


def gelu_loop_cycles(elements: int) -> int:
    """The vendor's tanh GELU vertex over ``elements`` halves (popnn ``NonLinearity1D``): its
    4-half vectors dealt to six workers; the busiest worker's setup, the loop's fill, body and
    flush, and the tail of fewer than 4 halves; six worker slots and the supervisor."""
    if elements <= 0:
        return 0
    vectors, tail = divmod(int(elements), 4)
    fill = p("gelu_fill")
    worker = p("nonlinearity_worker") + p("nonlinearity_remainder")
    if vectors:
        worker += 2 + fill + (cdiv(vectors, 6) - 1) * p("gelu_loop") + 1 + fill
    worker += (2 + fill) * (tail // 2) + (3 + fill) * (tail % 2)
    return p("nonlinearity_supervisor") + 6 * worker


def gelu_cycles(kind: str, elements: int) -> int:
    """A GELU pass: the vendor's loop for the tanh form, the reference's measured vertex for
    the erf form."""
    if kind == "gelu_tanh":
        return gelu_loop_cycles(elements)
    return p("gelu_call") + p("gelu_step") * cdiv(elements, 96) if elements else 0


def _bias_gelu_row(width: int) -> int:
    """One row of the measured fused bias + GELU vertex (its setup, then 24 columns a step)."""
    return p("bias_gelu_row") + p("bias_gelu_step") * cdiv(width, 24)


def merged_bias_gelu_cycles(rows: int, cols: int, merge: int, bias_itemsize: int = 2) -> int:
    """The fused vertex over a contiguous ``rows x cols`` block whose rows it takes
    ``merge`` at a time (rows of ``merge * cols``, the last one shorter when ``merge`` does
    not divide ``rows``), plus the six-worker copy that lays the bias out ``merge`` times
    side by side when ``merge > 1``."""
    full, tail = divmod(rows, merge)
    cycles = full * _bias_gelu_row(merge * cols) + p("bias_gelu_call")
    if tail:
        cycles += _bias_gelu_row(tail * cols)
    if merge > 1:
        cycles += p("copy_call") + cdiv(merge * cols * bias_itemsize, p("copy_bytes_per_cycle"))
    return cycles


@functools.lru_cache(maxsize=8192)
def bias_gelu_merge(rows: int, cols: int, room: int, bias_itemsize: int = 2) -> int:
    """How many rows of a contiguous ``rows x cols`` block one row of the fused bias + GELU
    vertex covers (1: row by row).

    The measured vertex pays a row's setup (228 cycles) per row and rounds each row up to
    24 columns, so on a GEMM tile's narrow block (81 x 80) most of its time is setup.  The
    vertex reads a bias row as long as its data row; with the bias copied ``k`` times side by
    side into ``room`` spare elements (an epilogue's received partial slots, dead once they
    are summed), ``k`` consecutive rows of a contiguous block are one row of ``k * cols``,
    priced by the same measured formula (its measured points are rows of 2,152 and 2,208).
    ``k`` is the cheapest with the copy counted; ``room = 0`` keeps rows apart."""
    best, best_cycles = 1, merged_bias_gelu_cycles(rows, cols, 1, bias_itemsize)
    for merge in range(2, min(rows, room // cols if cols else 0) + 1):
        cycles = merged_bias_gelu_cycles(rows, cols, merge, bias_itemsize)
        if cycles < best_cycles:
            best, best_cycles = merge, cycles
    return best


def fuses_bias_gelu(rows: int, cols: int, room: int = 0, bias_itemsize: int = 2,
                    gelu: str = "gelu_tanh") -> bool:
    """Whether a bias followed by GELU over a ``rows x cols`` block runs as the fused vertex.

    The fused vertex (measured) walks the block row by row and pays a row's setup each time,
    so on a narrow block (a GEMM tile's 49 x 128 output) a bias pass and the GELU vertex
    (``gelu``: the vendor's loop for the tanh form) over the whole block cost less unless
    the rows can be merged
    (:func:`bias_gelu_merge`, with ``room`` spare elements for the bias copies); the kernel
    takes whichever of the two vertex sequences the price table makes cheaper for the
    block's shape, as poplibs picks a vertex by shape.  ``rows = cols = 0`` (shape unknown)
    keeps the fused vertex."""
    if rows <= 0 or cols <= 0:
        return True
    elements = rows * cols
    merge = bias_gelu_merge(rows, cols, room, bias_itemsize)
    fused = merged_bias_gelu_cycles(rows, cols, merge, bias_itemsize)
    apart = p("cast_call") + p("elementwise_step") * cdiv(elements, 48) + gelu_cycles(gelu,
                                                                                       elements)
    return fused <= apart


def chain_passes(chain: list[list[Any]], rows: int = 0, cols: int = 0, room: int = 0,
                 bias_itemsize: int = 2) -> list[str]:
    """The kernel passes a chain takes over a ``rows x cols`` block: ``bias_gelu`` (a bias
    immediately followed by GELU is one fused pass with its own measured price, where
    :func:`fuses_bias_gelu` with ``room`` spare elements), ``gelu_tanh`` (the vendor's F16
    loop, after a ``cast_f16`` when its input is F32) or ``gelu`` (the erf form), one pass
    named after each activation (priced from the vendor's popops vertices), ``elementwise``
    (bias, scale), ``cast_f8`` (any rounding to FP8) and ``cast_f16`` (F32 -> F16).
    Rounding to the precision a value already has, or the producing kernel's own store,
    costs nothing."""
    passes: list[str] = []
    previous = "F32"
    index = 0
    while index < len(chain):
        kind = chain[index][0]
        out = Precision.from_json(chain[index][1])
        if kind == "bias" and index + 1 < len(chain) and chain[index + 1][0] in GELUS \
                and fuses_bias_gelu(rows, cols, room, bias_itemsize, chain[index + 1][0]):
            passes.append("bias_gelu")
            index += 1
            out = Precision.from_json(chain[index][1])
        elif kind == "gelu_tanh":
            if previous == "F32":
                passes.append("cast_f16")
            passes.append("gelu_tanh")
            previous = "F16"
        elif kind == "gelu_erf":
            passes.append("gelu")
        elif kind in ACTIVATIONS:
            passes.append(kind)
        elif kind in ("bias", "scale"):
            passes.append("elementwise")
        if out.is_fp8:
            passes.append("cast_f8")
        elif out.kind == "F16" and previous == "F32" and kind != "round":
            passes.append("cast_f16")
        previous = "F32" if out.kind == "F32" else "F16"
        index += 1
    return passes


def chain_work(chain: list[list[Any]], rows: int, cols: int, room: int = 0,
               bias_itemsize: int = 2) -> list[Work]:
    """The work records of a chain over a ``rows x cols`` block, dealt to the six workers
    as the kernel deals them (elements, or the columns of each row for the fused pass; with
    ``room`` spare elements a contiguous block's rows merged, :func:`bias_gelu_merge`, after
    the copy that lays the bias out side by side)."""
    per_worker = split_over_workers(rows * cols)
    work = []
    for kind in chain_passes(chain, rows, cols, room, bias_itemsize):
        if kind == "bias_gelu":
            merge = bias_gelu_merge(rows, cols, room, bias_itemsize)
            full, tail = divmod(rows, merge)
            if merge > 1:
                work.append(Work("copy", {"bytes": merge * cols * bias_itemsize}))
            work.append(Work(kind, {"rows": full,
                                    "cols_per_worker": split_over_workers(merge * cols),
                                    "tail_cols_per_worker": split_over_workers(tail * cols)}))
        elif kind == "gelu_tanh":  # 4-half vectors dealt to the workers, then the tail
            work.append(Work(kind, {"vectors_per_worker": split_over_workers(rows * cols // 4),
                                    "remainder": rows * cols % 4}))
        else:
            work.append(Work(kind, {"per_worker": per_worker}))
    return work
