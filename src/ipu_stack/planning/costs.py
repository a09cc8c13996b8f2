"""The planner's closed forms: what a kernel of a given shape should cost, before it runs.

These price a kernel from its parameters (rows, depth, columns, elements) with the price
table of :mod:`ipu_stack.target.timing`.  The simulator never calls them: it prices the work
each kernel reports after it ran (:mod:`ipu_stack.device.pricing`), so the benchmark's
``estimateError`` compares two code paths that share only the table.
"""

from __future__ import annotations

from typing import Any

from ipu_stack.ir.precision import Precision
from ipu_stack.kernels.base import KernelInstance
from ipu_stack.kernels.elementwise import (
    ACTIVATIONS,
    bias_gelu_merge,
    chain_passes,
    gelu_cycles,
    merged_bias_gelu_cycles,
)
from ipu_stack.kernels.epilogue import bias_room, contiguous
from ipu_stack.kernels.gemm import b_shape, scratch_bytes
from ipu_stack.kernels.norm import normce_applies, normce_cycles, rms_block_cycles, rms_part_cycles
from ipu_stack.target.timing import ACTIVATION_VERTICES, CAST_VECTORS, PRICES, cdiv, p


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
        cycles += estimate_cast1d("cast_from_f8", cast_elements)
    return cycles


def estimate_reduce(outputs: int, parts: int, f32_partials: bool, dense: bool = False) -> int:
    """Summing ``parts`` partials into ``outputs`` values (also the copy out when parts=1).
    A ``dense`` region (``kernels.epilogue.contiguous``) runs as poplin's convolution
    reduction runs it: one F32 partial a Cast1D, several a single-input ReduceAdd when the
    region is whole vectors and the received partials fit its limit; else the measured
    reduce."""
    if outputs == 0:
        return 0
    vector, item = (4, 4) if f32_partials else (8, 2)
    if dense and parts == 1 and f32_partials:
        return estimate_cast1d("cast_f16", outputs)
    if dense and parts > 1 and outputs % vector == 0 \
            and outputs * (parts - 1) * item <= p("reduce_add_received_limit"):
        outer = p("reduce_add_outer_f32") if f32_partials else p("reduce_add_outer_f16")
        return p("reduce_add_supervisor") + 6 * (p("reduce_add_worker") + cdiv(
            outputs // vector, 6) * (p("reduce_add_loop") * (parts - 1) + outer))
    vector = p("reduce_f32_vector") if f32_partials else p("reduce_vector")
    step = p("reduce_step") + p("reduce_partial") * (parts - 1)
    return p("reduce_call") + 6 * cdiv(outputs, 6 * vector) * step


def estimate_cast1d(kind: str, elements: int) -> int:
    """The vendor's Cast1D over ``elements`` (``kind``: ``cast_f8`` F16 -> FP8, ``cast_f16``
    F32 -> F16, ``cast_from_f8`` FP8 -> F16): ``ceil(n / 6)`` a worker."""
    if elements == 0:
        return 0
    width, price = CAST_VECTORS[kind]
    vectors, remainder = divmod(cdiv(elements, 6), width)
    bits = {8: 3, 4: 2}[width]
    tail = bits + 2 * sum(1 for bit in range(bits) if remainder >> bit & 1)
    return p("cast1d_call") + 6 * (p("cast1d_worker") + p(price) * vectors + tail)


def estimate_bias_gelu(rows: int, width: int, merge: int = 1, bias_itemsize: int = 2) -> int:
    """The fused bias + GELU vertex over ``rows`` rows of ``width``, taken ``merge`` rows at
    a time (the last merged row shorter when ``merge`` does not divide ``rows``), with the
    copy of the bias ``merge`` times side by side when ``merge > 1``."""
    if rows == 0 or width == 0:
        return 0
    return merged_bias_gelu_cycles(rows, width, merge, bias_itemsize)


def estimate_cast(elements: int, to_fp8: bool) -> int:
    """A cast to FP8 (from F16) or to F16 (from F32), as the vendor's Cast1D."""
    return estimate_cast1d("cast_f8" if to_fp8 else "cast_f16", elements)


def estimate_elementwise(elements: int) -> int:
    """A bias add or scale pass over F16 elements (assumed: priced as the measured cast)."""
    return p("cast_call") + p("elementwise_step") * cdiv(elements, 48) if elements else 0


def estimate_layer_norm(rows: int, width: int) -> int:
    """F16 layer norm over ``rows`` rows of ``width`` (the reference's measured kernel)."""
    if rows == 0 or width == 0:
        return 0
    aligned = width >= 96 and width % 8 == 0
    if aligned:
        stats = (cdiv(width, 48) * p("layer_norm_stats_per_48")
                 + cdiv(width, 24) * p("layer_norm_stats_per_24") + p("layer_norm_stats_base"))
        setup = p("layer_norm_setup_aligned")
    else:
        stats = cdiv(width, 12) * p("layer_norm_stats_per_12")
        setup = p("layer_norm_setup")
    if width % 4 == 0:
        apply = p("layer_norm_apply_base") + cdiv(width, 24) * p("layer_norm_apply_per_24")
    else:
        apply = cdiv(width, 12) * p("layer_norm_apply_per_12")
    return p("layer_norm_call") + rows * (stats + apply + setup)


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
    row = p("softmax_row") + p("softmax_row_panels") * (full != 0) + p("softmax_panel16") * full
    if keys == padded:
        row += p("softmax_row_exact")
        launch = p("softmax_launch_exact")
    else:
        pairs = (keys % 16) // 2
        zero_pairs = 8 - cdiv(keys % 16, 2)
        zero_panels = max(0, padded // 16 - full - 1)
        mask = p("softmax_tail_mask") if full else p("softmax_tail_mask") // 2
        row += (p("softmax_tail_row") + p("softmax_tail_full") * (full != 0) + mask
                + p("softmax_tail_pairs") * (pairs != 0) + p("softmax_tail_pair") * pairs)
        row += (p("softmax_tail_odd") * (keys % 2) + (zero_pairs != 0)
                + p("softmax_zero_pair") * zero_pairs + (zero_panels != 0))
        row += p("softmax_zero_panel") * zero_panels
        launch = p("softmax_launch_tail")
    return launch + cdiv(rows, 6) * 6 * row


def _vertex_cycles(vertex: str, per_worker: int) -> int:
    """One popops supervisor vertex over ``per_worker`` halves on the busiest worker."""
    if vertex in ("multiply", "add"):  # ADD HALF {1, true} is priced as MULTIPLY HALF
        return 6 * (p("multiply_worker") + p("multiply_loop") * cdiv(per_worker, 4))
    return 6 * (p("unary_worker") + p(f"{vertex}_loop") * cdiv(per_worker, 4)) + p("unary_tail")


def estimate_activation(elements: int, function: str) -> int:
    """An activation (or ``mul``/``swiglu``/``add_bias``, a residual ``add``, ``rope``) over
    ``elements`` dealt evenly to the six workers: its vendor vertices back to back, one
    launch each."""
    if not elements:
        return 0
    per_worker = cdiv(elements, 6)
    return sum(p("launch") + _vertex_cycles(v, per_worker) for v in ACTIVATION_VERTICES[function])


def estimate_rms_norm(rows: int, width: int) -> int:
    """RMS norm over ``rows`` rows of ``width`` (assumed: the measured layer norm's price)."""
    return int(estimate_layer_norm(rows, width) * float(PRICES["rms_norm_fraction"].value))


def estimate_copy(nbytes: int) -> int:
    return p("copy_call") + cdiv(nbytes, p("copy_bytes_per_cycle")) if nbytes else 0


def estimate_exchange_phase(horizon: int) -> int:
    """One exchange phase: the sync before it, its (instruction-level) horizon and the
    measured phase cost."""
    return p("sync") + int(horizon) + p("exchange_phase")


def estimate_link_phase(nbytes: int, clock_hz: float) -> int:
    """A pipeline hand-off over the IPU-Link to the next card: the bytes at the cable's rate
    (the sending tiles together far outrun it), the hop, and the sync across cards."""
    return (cdiv(int(nbytes) * int(clock_hz), int(PRICES["link_bytes_per_second"].value))
            + p("link_hop_cycles") + p("link_sync"))


def estimate_chain(chain: list[list[Any]], rows: int, cols: int, room: int = 0,
                   bias_itemsize: int = 2) -> int:
    """A fused elementwise chain over a ``rows x cols`` block, pass by pass (``room``: spare
    bias elements for the copies of a merged bias + GELU, ``bias_gelu_merge``)."""
    elements = rows * cols
    merge = bias_gelu_merge(rows, cols, room, bias_itemsize) if room else 1
    prices = {
        "bias_gelu": lambda: estimate_bias_gelu(rows, cols, merge, bias_itemsize),
        "gelu": lambda: gelu_cycles("gelu_erf", elements),
        "gelu_tanh": lambda: gelu_cycles("gelu_tanh", elements),
        **{name: lambda name=name: estimate_activation(elements, name) for name in ACTIVATIONS},
        "elementwise": lambda: estimate_elementwise(elements),
        "cast_f8": lambda: estimate_cast(elements, to_fp8=True),
        "cast_f16": lambda: estimate_cast(elements, to_fp8=False),
    }
    return sum(prices[kind]()
               for kind in chain_passes(chain, rows, cols, room, bias_itemsize))


# ---------------------------------------------------------------------------- kernel instances
def _gemm(params: dict[str, Any]) -> int:
    cast = 0
    if scratch_bytes(params):
        b_rows, b_cols = b_shape(params)
        cast = params["rows"] * params["depth"] + b_rows * b_cols
    return estimate_gemm(params["rows"], params["depth"], params["cols"],
                         params["mode"] == "fp8", cast_elements=cast)


def _epilogue(params: dict[str, Any]) -> int:
    elements = params["rows"] * params["cols"]
    if elements == 0:
        return 0
    f32 = Precision.from_json(params.get("partials", {"kind": "F32"})).kind == "F32"
    return (estimate_reduce(elements, params["parts"], f32, contiguous(params))
            + estimate_chain(params["chain"], params["rows"], params["cols"],
                             *bias_room(params)))


def _row(params: dict[str, Any]) -> int:
    rows, cols, op = params["rows"], params["cols"], params["op"]
    if rows * cols == 0:
        return 0
    aux = params.get("aux")
    width = int(params.get("group", cols))  # a row of heads: rows of one head's width
    if op in ("layer_norm", "rms_norm") and normce_applies(Precision.from_json(params["x"]),
                                             None if aux is None else Precision.from_json(aux),
                                             width, float(params["eps"])):
        heads = rows * (cols // width)
        cycles = normce_cycles(rows, cols) if op == "layer_norm" else int(
            (normce_cycles(heads, width) + rms_block_cycles(heads, width))
            * float(PRICES["rms_norm_normce_fraction"].value))
    elif op in ("rms_sums", "rms_scale"):
        cycles = int(rms_part_cycles("sums" if op == "rms_sums" else "scale", rows, cols,
                                     int(params["width"]))
                     * float(PRICES["rms_norm_normce_fraction"].value))
    elif op == "layer_norm":
        cycles = estimate_layer_norm(rows, cols)
    elif op == "rms_norm":
        cycles = estimate_rms_norm(rows * (cols // width), width)
    elif op in ("mul", "swiglu"):
        cycles = estimate_activation(rows * cols, op)
    elif op == "softmax":
        cycles = estimate_softmax(rows, cols)
    elif op == "biased_softmax":
        cycles = estimate_softmax(rows, cols) + int(params.get("tables", 1)) * \
            estimate_activation(rows * cols, "add_bias")
    elif op in ("add", "rope"):
        cycles = estimate_activation(rows * cols, op)
    else:
        cycles = estimate_chain(params["chain"], rows, cols)
    if op != "chain" and Precision.from_json(params["out"]).is_fp8:
        cycles += estimate_cast(rows * cols, to_fp8=True)  # row kernels store F16, then cast
    return cycles


def _copy(params: dict[str, Any]) -> int:
    return estimate_copy(params["rows"] * params["row_bytes"])


def _slice_estimate(call: str, offsets: int, elements: int, itemsize: int) -> int:
    """A slice vertex over six workers whose busiest copies ``offsets`` rows of
    ``elements`` (vectors of 2 halves or floats at 2 cycles, of 4 bytes at 3)."""
    width, cycles = (4, 3) if itemsize == 1 else (2, p("multislice_vector_cycles"))
    return p("multislice_workers") * (p(call) + offsets * (
        p("multislice_offset") + cycles * cdiv(elements, width)))


def estimate_multislice(offsets: int, elements: int, itemsize: int) -> int:
    """popops MultiSlice over a column block holding every row: each worker copies
    ceil(N/6) rows of ``elements`` (the vendor's planner model, DynamicSlice.cpp)."""
    return _slice_estimate("multislice_call", cdiv(offsets, p("multislice_workers")),
                           elements, itemsize)


def estimate_fill(elements: int, itemsize: int) -> int:
    """popops Fill over six workers (zeroing a lookup's candidate rows), the vendor's
    estimator of each worker's share."""
    call = {1: "fill_byte_call", 2: "fill_half_call"}.get(itemsize, "fill_float_call")
    return 6 * (p(call) + cdiv(elements, 6) * itemsize // p("fill_bytes_per_cycle"))


def _multislice(params: dict[str, Any]) -> int:
    elements = cdiv(params["region_bytes"], params["itemsize"])
    fill = (estimate_fill(params["offsets"] * elements, params["itemsize"])
            if params.get("fill") else 0)
    return fill + estimate_multislice(params["offsets"], elements, params["itemsize"])


def _multiupdate(params: dict[str, Any]) -> int:
    """popops MultiUpdate at its vertex estimator: every offset in range, all on the worker
    that owns the rows (PerformanceEstimation.cpp:49-122 with isUpdate)."""
    return _slice_estimate("multiupdate_call", params["offsets"],
                           cdiv(params["region_bytes"], params["itemsize"]), params["itemsize"])


def _argmax(params: dict[str, Any]) -> int:
    """popnn's argmax vertices at their estimators (``kernels.argmax``): a gather's rows one
    after another, each over its busiest worker's columns; a sparse call's rows dealt to
    the six workers, each over its pairs."""
    rows = params["rows"]
    if params["op"] == "gather":
        busiest = min(params["worker_size"], params["cols"])
        worker = p("argmax_gather_worker") + p("argmax_element") * (busiest - 1)
        return rows * (6 * worker + p("argmax_gather_supervisor"))
    vertex = p("argmax_sparse_vertex") + p("argmax_element") * (params["count"] - 1)
    return 6 * cdiv(rows, 6) * vertex


KERNEL_COSTS = {"gemm": _gemm, "reduce": _epilogue, "row": _row, "copy": _copy,
                "multislice": _multislice, "multiupdate": _multiupdate, "argmax": _argmax}


def kernel_cost(instance: KernelInstance) -> int:
    """The planner's cycles for one call of ``instance`` on one tile."""
    if instance.family not in KERNEL_COSTS:
        raise ValueError(f"no closed form for kernel family {instance.family!r}")
    return KERNEL_COSTS[instance.family](instance.params)
