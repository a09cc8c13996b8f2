"""The timing model: what each piece of work costs on an ipu21, and where each price comes from.

Every cycle the planner estimates or the simulator counts is priced here, so a price changes
in one place.  The prices come from (best first) kernels measured on an ipu21 by the reference
implementation, the vendor's estimators (poplibs), or the seed logs; a price with none of these
behind it says "assumed" and how far siglip-mlp moves when it doubles (``docs/machine.md``).

Two entry points, kept apart on purpose:

* ``estimate_*`` are the planner's closed forms over a kernel's shape (rows, depth, columns,
  elements);
* :func:`price_work` prices a :class:`Work` record that a kernel *reports after it ran*
  (passes it looped over, rows, per-worker element counts, where its operands really sat),
  which is what the simulator times.

They share the constants below and nothing else, so the benchmark's ``estimateError`` (their
disagreement) is evidence, not a tautology.
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
    "gelu_call": Fact(330, f"{_REF}: GELU F16, n=1,408 7,260; n=2,208 10,956"),
    "gelu_step": Fact(462, f"{_REF}: 462 cycles per 96 elements (16 per worker)"),
    "bias_gelu_row": Fact(228, f"{_REF}: bias + GELU F16 (rows, width): (1,2208) 8,730; "
                               "(3,2152) 25,206 = rows (450 + 90 ceil(w/24) - 222) + 222"),
    "bias_gelu_step": Fact(90, f"{_REF}: 90 cycles per 24 columns (4 per worker)"),
    "bias_gelu_call": Fact(222, f"{_REF}: bias + GELU call overhead"),
    "cast_call": Fact(330, f"{_REF}: cast F16 -> FP8 linear loop, 330 + 24 ceil(n/48): "
                           "8,320 elements 4,506 against 4,638 measured (the 2,706 pipelined "
                           "loop needs operands in separate 32 KiB groups: not assumed)"),
    "cast_f8_step": Fact(24, f"{_REF}: cast F16 -> FP8 24 cycles per 48 elements"),
    "cast_f16_step": Fact(48, f"{_CODE}: stream_cycles model, cast F32 -> F16 48 cycles per "
                              "12 elements (no measured point)"),
    "cast_from_f8_step": Fact(
        24, "assumed: FP8 -> F16 costs what the measured F16 -> FP8 cast costs (same "
        "f8v4 conversion pipe); used only by F16-mode GEMMs on FP8 data"),
    "elementwise_step": Fact(
        24, "assumed: a bias add or scale pass over F16 costs what the measured F16 -> FP8 "
        "cast costs (one f16v4 operation per 4 elements); siglip-mlp has none"),
    "copy_call": Fact(288, f"{_REF}: local copy, one six-worker call: 288 + bytes/8"),
    "copy_bytes_per_cycle": Fact(8, f"{_REF}: local copy 8 bytes per cycle"),
    "launch": Fact(11, f"{_VENDOR} basicOpSupervisorOverhead(false): vertex launch"),
    # Exchange, sync and host link.
    "exchange_phase": Fact(
        237, "shared/CALIBRATION.md, from the reference's profile notes: three attention "
        "phases measured at scheduled horizon + 237 (33,542/36,987/37,377 -> "
        "33,780/37,224/37,614); covers the receive-mux latency (52 + 2 x physical row) and "
        "the pipeline drain. Unverified: our search did not find the note's text in the code "
        "index (the reference itself charges + 600 per phase)"),
    "send_words": Fact(64, f"{_CODE}: the send instruction's 6-bit word count; longer "
                           "messages continue with sendoff"),
    "send_alignment_events": Fact(
        2, f"{_CODE}: sendpicp is a two-word instruction that starts 8-byte aligned; a send "
        "on an odd event is shifted one event later"),
    "sync": Fact(90, f"{_VENDOR} syncCycles = 90: the sync ending a compute superstep"),
    "host_bytes_per_second": Fact(32e9, "C600 datasheet: PCIe Gen4 x16, 32 GB/s"),
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
    "binary_step": Fact(
        48, "assumed: a residual add (two F16 inputs, one F16 output) streams like the "
        "reference's F32 -> F16 stream, 330 + 48 ceil(n/12); siglip-mlp has none"),
    "rope_step": Fact(
        96, "assumed: RoPE (two multiplies and an add per element, cos/sin loads) at twice "
        "the residual add's price; only pe-block uses it"),
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
        1.0, "assumed: an RMS norm costs what the measured layer norm of the same shape costs "
        "(it skips the mean and the shift, so this is an upper bound); siglip-mlp has none"),
})

# the vendor vertices an activation runs as, in order (``silu`` = x * sigma(x): a SIGMOID
# then a MULTIPLY; ``quick_gelu`` scales by 1.702 first, priced as one more MULTIPLY;
# ``swiglu`` = silu(a) * b is one MULTIPLY more than ``silu``; ``add_bias`` is the ADD of an
# attention bias or mask table before a softmax)
ACTIVATION_VERTICES: dict[str, tuple[str, ...]] = {
    "sigmoid": ("sigmoid",),
    "tanh": ("tanh",),
    "silu": ("sigmoid", "multiply"),
    "quick_gelu": ("multiply", "sigmoid", "multiply"),
    "swiglu": ("sigmoid", "multiply", "multiply"),
    "mul": ("multiply",),
    "add_bias": ("add",),
}


def p(name: str) -> int:
    """An integer price by name."""
    return int(PRICES[name].value)


def cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


# ---------------------------------------------------------------------------- the planner
def amp_passes(depth: int, cols: int, fp8: bool) -> int:
    """AMP passes of one call: 16-column groups x depth groups."""
    step = p("amp_f8_depth") if fp8 else p("amp_f16_depth")
    return cdiv(cols, p("amp_out_columns")) * cdiv(depth, step)


def estimate_gemm(rows: int, depth: int, cols: int, fp8: bool, weights_interleaved: bool = True,
                  cast_elements: int = 0) -> int:
    """One AMP call on one tile: 294 + passes x (4 x rows + weight load), plus the FP8 -> F16
    cast of its operands in F16 mode (``cast_elements``)."""
    if rows == 0 or depth == 0 or cols == 0:
        return 0
    load = p("amp_pass_interleaved") if weights_interleaved else p("amp_pass_standard")
    cycles = p("amp_call") + amp_passes(depth, cols, fp8) * (p("amp_row") * rows + load)
    if cast_elements:
        cycles += p("cast_call") + p("cast_from_f8_step") * cdiv(cast_elements, 48)
    return cycles


def estimate_reduce(outputs: int, parts: int, f32_partials: bool) -> int:
    """Summing ``parts`` partials into ``outputs`` values (also the copy out when parts=1)."""
    if outputs == 0:
        return 0
    vector = p("reduce_f32_vector") if f32_partials else p("reduce_vector")
    step = p("reduce_step") + p("reduce_partial") * (parts - 1)
    return p("reduce_call") + 6 * cdiv(outputs, 6 * vector) * step


def estimate_gelu(elements: int) -> int:
    return p("gelu_call") + p("gelu_step") * cdiv(elements, 96) if elements else 0


def estimate_bias_gelu(rows: int, width: int) -> int:
    if rows == 0 or width == 0:
        return 0
    return rows * (p("bias_gelu_row") + p("bias_gelu_step") * cdiv(width, 24)) + p("bias_gelu_call")


def _vertex_cycles(vertex: str, per_worker: int) -> int:
    """One popops supervisor vertex over ``per_worker`` halves on the busiest worker."""
    if vertex in ("multiply", "add"):  # ADD HALF {1, true} is priced as MULTIPLY HALF
        return 6 * (p("multiply_worker") + p("multiply_loop") * cdiv(per_worker, 4))
    return 6 * (p("unary_worker") + p(f"{vertex}_loop") * cdiv(per_worker, 4)) + p("unary_tail")


def activation_cycles(function: str, per_worker: int) -> int:
    """An activation (or ``mul``/``swiglu``) whose busiest worker has ``per_worker`` elements:
    its vendor vertices back to back, one launch each."""
    return sum(p("launch") + _vertex_cycles(v, per_worker)
               for v in ACTIVATION_VERTICES[function])


def estimate_activation(elements: int, function: str) -> int:
    """The planner's form: elements dealt evenly over the six workers."""
    return activation_cycles(function, cdiv(elements, 6)) if elements else 0


def estimate_rms_norm(rows: int, width: int) -> int:
    """RMS norm over ``rows`` rows of ``width`` (assumed: the measured layer norm's price)."""
    return int(estimate_layer_norm(rows, width) * float(PRICES["rms_norm_fraction"].value))


def estimate_cast(elements: int, to_fp8: bool) -> int:
    """F16/F32 -> FP8 (24 per 48) or F32 -> F16 (48 per 12)."""
    if elements == 0:
        return 0
    if to_fp8:
        return p("cast_call") + p("cast_f8_step") * cdiv(elements, 48)
    return p("cast_call") + p("cast_f16_step") * cdiv(elements, 12)


def estimate_elementwise(elements: int) -> int:
    """A bias add or scale pass over F16 elements (assumed: priced as the measured cast)."""
    return p("cast_call") + p("elementwise_step") * cdiv(elements, 48) if elements else 0


def estimate_layer_norm(rows: int, width: int) -> int:
    """F16 layer norm over ``rows`` rows of ``width`` (the reference's measured kernel)."""
    if rows == 0 or width == 0:
        return 0
    return p("layer_norm_call") + rows * _layer_norm_row(width)


def _layer_norm_row(width: int) -> int:
    aligned = width >= 96 and width % 8 == 0
    setup = 1329 if aligned else 1200
    if aligned:
        stats = cdiv(width, 48) * 12 + cdiv(width, 24) * 30 + 24
    else:
        stats = cdiv(width, 12) * 48
    apply = 66 + cdiv(width, 24) * 72 if width % 4 == 0 else cdiv(width, 12) * 60
    return stats + apply + setup


def estimate_softmax(rows: int, keys: int) -> int:
    """F16 softmax of ``rows`` rows over ``keys`` (padded to 16): the cheaper of the
    whole-row and (for 128 keys or more) the three-segment split kernel."""
    if rows == 0 or keys == 0:
        return 0
    padded = cdiv(keys, 16) * 16
    whole = _softmax_whole(rows, keys, padded)
    if keys < 128:
        return whole
    split = (p("softmax_split_call") + cdiv(rows, 2) * 6 * (
        p("softmax_panel") * cdiv(padded, 48) + p("softmax_segment"))
        + p("softmax_wave") * cdiv(rows, 6))
    return min(whole, split)


def _softmax_whole(rows: int, keys: int, padded: int) -> int:
    full = keys // 16
    row = 31 + 2 * (full != 0) + 41 * full
    if keys == padded:
        row += 7
        launch = 216
    else:
        pairs = (keys % 16) // 2
        zero_pairs = 8 - cdiv(keys % 16, 2)
        zero_panels = max(0, padded // 16 - full - 1)
        row += 5 + 6 * (full != 0) + 21 + (4 if full else 2) + 2 * (pairs != 0) + 12 * pairs
        row += 12 * (keys % 2) + (zero_pairs != 0) + 2 * zero_pairs + (zero_panels != 0)
        row += 10 * zero_panels
        launch = 234
    return launch + cdiv(rows, 6) * 6 * row


def estimate_binary(elements: int, step: str = "binary_step") -> int:
    """A two-input F16 elementwise pass (residual add; RoPE with ``rope_step``)."""
    return p("cast_call") + p(step) * cdiv(elements, 12) if elements else 0


def estimate_copy(nbytes: int) -> int:
    return p("copy_call") + cdiv(nbytes, p("copy_bytes_per_cycle")) if nbytes else 0


def estimate_exchange_phase(horizon: int) -> int:
    """One exchange phase: its (instruction-level) horizon plus the measured phase cost."""
    return int(horizon) + p("exchange_phase")


def host_cycles(nbytes: int, clock_hz: float) -> int:
    """Cycles the host link needs for ``nbytes`` at 32 GB/s."""
    return cdiv(int(nbytes) * int(clock_hz), int(PRICES["host_bytes_per_second"].value))


# ---------------------------------------------------------------------------- the simulator
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


def _busiest_steps(per_worker: list[int], vector: int) -> int:
    return max((cdiv(n, vector) for n in per_worker), default=0)


def price_work(work: Work, weights_interleaved: bool = True) -> int:
    """Cycles of one executed kernel call on one tile (six workers round robin: a worker
    step of ``k`` cycles costs the tile ``6 k``, and the busiest worker sets the pace)."""
    c = work.counts
    kind = work.kind
    if kind == "amp":
        if c["passes"] == 0 or c["rows"] == 0:
            return 0
        load = p("amp_pass_interleaved") if weights_interleaved else p("amp_pass_standard")
        return p("amp_call") + c["passes"] * (p("amp_row") * c["rows"] + load)
    if kind == "reduce":
        vector = p("reduce_f32_vector") if c["f32_partials"] else p("reduce_vector")
        step = p("reduce_step") + p("reduce_partial") * (c["parts"] - 1)
        return p("reduce_call") + 6 * _busiest_steps(c["per_worker"], vector) * step
    if kind == "gelu":
        return p("gelu_call") + p("gelu_step") * _busiest_steps(c["per_worker"], 16)
    if kind == "bias_gelu":
        row = p("bias_gelu_row") + p("bias_gelu_step") * _busiest_steps(c["cols_per_worker"], 4)
        return c["rows"] * row + p("bias_gelu_call")
    if kind in ("cast_f8", "cast_from_f8", "elementwise"):
        step = {"cast_f8": "cast_f8_step", "cast_from_f8": "cast_from_f8_step",
                "elementwise": "elementwise_step"}[kind]
        return p("cast_call") + p(step) * _busiest_steps(c["per_worker"], 8)
    if kind == "cast_f16":
        return p("cast_call") + p("cast_f16_step") * _busiest_steps(c["per_worker"], 2)
    if kind == "copy":
        return p("copy_call") + cdiv(c["bytes"], p("copy_bytes_per_cycle"))
    if kind == "layer_norm":  # rows one after another, each over all six workers
        return p("layer_norm_call") + sum(_layer_norm_row(c["width"]) for _ in range(c["rows"]))
    if kind == "softmax":
        return estimate_softmax(c["rows"], c["keys"])
    if kind in ACTIVATION_VERTICES:
        return activation_cycles(kind, max(c["per_worker"], default=0))
    if kind == "rms_norm":
        layer_norm = p("layer_norm_call") + c["rows"] * _layer_norm_row(c["width"])
        return int(layer_norm * float(PRICES["rms_norm_fraction"].value))
    if kind in ("add", "rope"):
        step = "binary_step" if kind == "add" else "rope_step"
        return p("cast_call") + p(step) * _busiest_steps(c["per_worker"], 2)
    raise ValueError(f"no price for work {kind!r}")
