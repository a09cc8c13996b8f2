"""The device's pricing of executed work: cycles of what the simulator actually ran.

The simulator hands this module the :class:`Work` each kernel call reports after its loops
ran (AMP passes and rows, per-worker element counts, rows and keys of a softmax, where the
weights really sat) and the chunks each exchange phase moved; it reads only the price table
of :mod:`ipu_stack.target.timing`.  The planner's closed forms (``planning.costs``) price
the same kernels from their parameters before anything runs; the two share the table and
nothing else (``tests/unit/test_imports.py`` enforces it), so their difference, the
benchmark's ``estimateError``, is evidence.

Six workers run round robin: a worker step of ``k`` cycles costs the tile ``6 k``, and the
busiest worker sets the pace.
"""

from __future__ import annotations

import numba
import numpy as np

from ipu_stack.target.timing import ACTIVATION_VERTICES, CAST_VECTORS, PRICES, Work, cdiv, p


def _steps(per_worker: list[int], vector: int) -> int:
    """Steps of the busiest worker, ``vector`` items a step."""
    return max((cdiv(n, vector) for n in per_worker), default=0)


def _layer_norm_row(width: int) -> int:
    """One row of the measured layer norm: setup, statistics pass, apply pass."""
    if width >= 96 and width % 8 == 0:  # the aligned statistics path
        setup = p("layer_norm_setup_aligned")
        stats = (cdiv(width, 48) * p("layer_norm_stats_per_48")
                 + cdiv(width, 24) * p("layer_norm_stats_per_24") + p("layer_norm_stats_base"))
    else:
        setup = p("layer_norm_setup")
        stats = cdiv(width, 12) * p("layer_norm_stats_per_12")
    if width % 4 == 0:
        apply = p("layer_norm_apply_base") + cdiv(width, 24) * p("layer_norm_apply_per_24")
    else:
        apply = cdiv(width, 12) * p("layer_norm_apply_per_12")
    return setup + stats + apply


def _softmax_row_whole(keys: int, panels: int) -> int:
    """One row of the whole-row vertex over ``keys`` keys in ``panels`` 16-key panels."""
    full = keys // 16
    cycles = p("softmax_row") + p("softmax_panel16") * full
    if full:
        cycles += p("softmax_row_panels")
    tail = keys - 16 * full
    if tail == 0:
        return cycles + p("softmax_row_exact")
    pairs, odd = tail // 2, tail % 2
    zeroed_pairs = 8 - pairs - odd
    padding_panels = max(0, panels - full - 1)
    cycles += p("softmax_tail_row") + p("softmax_tail_pair") * pairs + p("softmax_tail_odd") * odd
    cycles += (p("softmax_tail_full") + p("softmax_tail_mask")) if full else (
        p("softmax_tail_mask") // 2)
    if pairs:
        cycles += p("softmax_tail_pairs")
    if zeroed_pairs:
        cycles += 1 + p("softmax_zero_pair") * zeroed_pairs
    if padding_panels:
        cycles += 1 + p("softmax_zero_panel") * padding_panels
    return cycles


def _softmax(rows: int, keys: int, panels: int) -> int:
    """The softmax a tile ran: the whole-row vertex, or for 128 keys or more the measured
    three-segment split kernel when it is faster (the codelet the vertex selects)."""
    waves = cdiv(rows, 6)  # rows go to the six workers in waves
    launch = p("softmax_launch_exact") if keys == 16 * panels else p("softmax_launch_tail")
    whole = launch + 6 * waves * _softmax_row_whole(keys, panels)
    if keys < 128:
        return whole
    segments = 6 * cdiv(rows, 2)  # row pairs, three segments each, two passes
    split = (p("softmax_split_call") + p("softmax_wave") * waves
             + segments * (p("softmax_panel") * cdiv(16 * panels, 48) + p("softmax_segment")))
    return min(whole, split)


def _vertex(vertex: str, per_worker: int) -> int:
    """A popops supervisor vertex (launch included) whose busiest worker had ``per_worker``
    halves: six worker slots of setup plus 4-half loop steps, and a unary vertex's tail."""
    steps = cdiv(per_worker, 4)
    if vertex in ("multiply", "add"):  # the binary vertex; ADD is priced as MULTIPLY
        return p("launch") + 6 * (p("multiply_worker") + p("multiply_loop") * steps)
    return p("launch") + 6 * (p("unary_worker") + p(f"{vertex}_loop") * steps) + p("unary_tail")


def _reduce_add(c: dict) -> int | None:
    """The reduce as poplin's convolution reduction would run it (``reduce_add_*``): one
    F32 partial cast to F16 by Cast1D; several summed by the single-input ReduceAdd, where
    the tile's region is contiguous, a whole number of accumulator vectors, and its received
    partials small enough; None where poplin would run neither (the measured reduce)."""
    elements, parts, f32 = sum(c["per_worker"]), c["parts"], c["f32_partials"]
    if not c.get("contiguous"):
        return None
    if parts == 1:
        return _cast1d("cast_f16", c["per_worker"]) if f32 else None
    vector, item = (4, 4) if f32 else (8, 2)
    if elements % vector or elements * (parts - 1) * item > p("reduce_add_received_limit"):
        return None
    outer = p("reduce_add_outer_f32") if f32 else p("reduce_add_outer_f16")
    loops = cdiv(elements // vector, 6)
    return p("reduce_add_supervisor") + 6 * (
        p("reduce_add_worker") + loops * (p("reduce_add_loop") * (parts - 1) + outer))


def _cast1d(kind: str, per_worker: list[int]) -> int:
    """The vendor's Cast1D as it ran: the busiest worker's vectors at the conversion's
    rate, a test for each remainder bit and two cycles for each bit set, six worker slots
    and the call."""
    width, price = CAST_VECTORS[kind]
    vectors, remainder = divmod(max(per_worker, default=0), width)
    tail = (width.bit_length() - 1) + 2 * bin(remainder).count("1")
    return p("cast1d_call") + 6 * (p("cast1d_worker") + p(price) * vectors + tail)


def _gelu_loop(vectors_per_worker: list[int], remainder: int) -> int:
    """The vendor's tanh GELU as it ran: the busiest worker's pipeline fill, loop and
    flush over its 4-half vectors, and the last pair or half of the tensor."""
    busiest = max(vectors_per_worker, default=0)
    fill = p("gelu_fill")
    worker = p("nonlinearity_worker") + p("nonlinearity_remainder")
    if busiest:
        worker += 3 + 2 * fill + (busiest - 1) * p("gelu_loop")
    worker += (2 + fill) * ((remainder >> 1) & 1) + (3 + fill) * (remainder & 1)
    return p("nonlinearity_supervisor") + 6 * worker


def _normce_call(kind: str, rows: int, width: int) -> int:
    """One ``NormCE`` compute set as it ran: ``rows`` rows one a worker, or a split call
    whose six workers share one to three rows (their chunk of each row, the merge of the
    partial sums, the normalise, the supervisor's launches)."""
    eight_lanes = width % 8 == 0 and width >= 576
    if kind == "rows":
        fixed = p("normce_row_fixed") if eight_lanes else p("normce_row_fixed_unaligned")
        row = (width * 5 // 4 if eight_lanes else width * 3 // 2) + fixed
        return 6 * (rows // 6 * (row + p("normce_row_wrapper")) + p("normce_call_wrapper"))
    chunk = _worker_chunk(width, rows, eight_lanes)
    bundles = _partial_sums(chunk, eight_lanes) + p(f"normce_merge_{rows}") + \
        _normalised(chunk, rows)
    return 6 * bundles + p("normce_split_supervisor")


def _worker_chunk(cols: int, rows: int, eight_lanes: bool) -> int:
    """The halves of a row's ``cols`` each worker of NormCE's split kernel took."""
    grain = 8 if eight_lanes else 4
    return cdiv(cdiv(cols, grain), 6 // rows) * grain


def _partial_sums(chunk: int, eight_lanes: bool) -> int:
    return (chunk // 4 + p("normce_split_stats")) if eight_lanes else (
        chunk // 2 + p("normce_split_stats_unaligned"))


def _normalised(chunk: int, rows: int) -> int:
    return chunk + (p("normce_split_normalise") if rows == 1 else
                    p("normce_split_normalise_rows"))


def _rms_split_part(kind: str, c: dict) -> int:
    """A tile's share of an RMS norm split by columns as it ran: calls of up to three rows
    on NormCE's split loops over the tile's ``cols``, one after another; the sums' call gathers
    the partial sums of its blocks and merges them, the scaling call merges every block's
    sums and normalises its columns."""
    eight_lanes = c["width"] % 8 == 0 and c["width"] >= 576
    further = (c["blocks_here"] if kind == "rms_sums" else c["blocks"]) - 1
    cycles = 0
    for first in range(0, c["rows"], 3):
        rows = min(3, c["rows"] - first)
        chunk = _worker_chunk(c["cols"], rows, eight_lanes)
        bundles = p(f"normce_merge_{rows}") + further * p("normce_block") + (
            _partial_sums(chunk, eight_lanes) if kind == "rms_sums" else _normalised(chunk, rows))
        cycles += 6 * bundles + p("normce_split_supervisor")
    return cycles


def _slice_vertex(call: str, share: int, hits: int, elements: int, itemsize: int) -> int:
    """A MultiSlice or MultiUpdate vertex over six workers, its busiest worker's ``share`` of
    the offsets ``hits`` of them in range: each in-range offset copies ``elements`` (vectors
    of 2 halves or floats at 2 cycles, of 4 bytes at 3), each other one only tests."""
    width, cycles = (4, 3) if itemsize == 1 else (2, p("multislice_vector_cycles"))
    per_hit = p("multislice_offset") + cycles * cdiv(elements, width)
    return p("multislice_workers") * (p(call) + hits * per_hit
                                      + (share - hits) * p("multislice_offset_out_of_range"))


def _multislice(offsets: int, in_range: int, elements: int, itemsize: int) -> int:
    """The vendor's MultiSlice as it ran: the busiest worker's share of the offsets, the
    tile's in-range ones first (its busiest worker can hold only in-range ones)."""
    share = cdiv(offsets, p("multislice_workers"))
    return _slice_vertex("multislice_call", share, min(share, in_range), elements, itemsize)


def _multiupdate(offsets: int, in_range: int, elements: int, itemsize: int) -> int:
    """The vendor's MultiUpdate as it ran: each worker owns a range of the tile's rows and
    scans every offset (``MultiSliceUpdateCommon.cpp:86-124``), so the busiest worker may
    write all the tile's in-range rows; the vertex estimator charges every offset in range."""
    return _slice_vertex("multiupdate_call", offsets, in_range, elements, itemsize)


def price_work(work: Work, weights_interleaved: bool = True) -> int:
    """Cycles of one executed kernel call on one tile."""
    c = work.counts
    kind = work.kind
    if kind == "amp":
        if c["passes"] == 0 or c["rows"] == 0:
            return 0
        load = p("amp_pass_interleaved") if weights_interleaved else p("amp_pass_standard")
        return p("amp_call") + c["passes"] * (p("amp_row") * c["rows"] + load)
    if kind == "reduce":
        vendor = _reduce_add(c)
        if vendor is not None:
            return vendor
        vector = p("reduce_f32_vector") if c["f32_partials"] else p("reduce_vector")
        step = p("reduce_step") + p("reduce_partial") * (c["parts"] - 1)
        return p("reduce_call") + 6 * _steps(c["per_worker"], vector) * step
    if kind == "gelu":
        return p("gelu_call") + p("gelu_step") * _steps(c["per_worker"], 16)
    if kind == "bias_gelu":  # rows of equal width, then a shorter merged last row if any
        row = p("bias_gelu_row") + p("bias_gelu_step") * _steps(c["cols_per_worker"], 4)
        tail = c.get("tail_cols_per_worker", [])
        last = p("bias_gelu_row") + p("bias_gelu_step") * _steps(tail, 4) if any(tail) else 0
        return c["rows"] * row + last + p("bias_gelu_call")
    if kind == "gelu_tanh":
        return _gelu_loop(c["vectors_per_worker"], c["remainder"])
    if kind in CAST_VECTORS:
        return _cast1d(kind, c["per_worker"])
    if kind == "elementwise":  # assumed: priced as the reference's measured cast loop
        return p("cast_call") + p("elementwise_step") * _steps(c["per_worker"], 8)
    if kind == "copy":
        return p("copy_call") + cdiv(c["bytes"], p("copy_bytes_per_cycle"))
    if kind == "multislice":
        in_range = c["offsets"] if p("multislice_all_in_range") else c["in_range"]
        return _multislice(c["offsets"], in_range, c["elements"], c["itemsize"])
    if kind == "multiupdate":
        in_range = c["offsets"] if p("multislice_all_in_range") else c["in_range"]
        return _multiupdate(c["offsets"], in_range, c["elements"], c["itemsize"])
    if kind == "fill":  # six workers, each a Fill vertex over its share of the bytes
        call = {1: "fill_byte_call", 2: "fill_half_call"}.get(c["itemsize"], "fill_float_call")
        share = cdiv(c["elements"], 6) * c["itemsize"]
        return 6 * (p(call) + share // p("fill_bytes_per_cycle"))
    if kind in ("normce", "normce_rms"):  # its compute sets one after another
        calls = [("rows", n) for n in c["row_calls"]] + [("split", n) for n in c["split_calls"]]
        cycles = sum(_normce_call(k, n, c["width"]) for k, n in calls)
        if kind == "normce":
            return cycles
        rows = sum(c["row_calls"]) + sum(c["split_calls"])  # each block's lanes added in
        cycles += 6 * rows * (c["blocks"] - 1) * p("normce_block")
        return int(cycles * float(PRICES["rms_norm_normce_fraction"].value))
    if kind in ("rms_sums", "rms_scale"):
        return int(_rms_split_part(kind, c) * float(PRICES["rms_norm_normce_fraction"].value))
    if kind == "layer_norm":  # rows one after another, each over all six workers
        return p("layer_norm_call") + sum(_layer_norm_row(w) for w in c["row_widths"])
    if kind == "softmax":
        return _softmax(c["rows"], c["keys"], c["panels"]) if c["rows"] else 0
    if kind == "rms_norm":  # assumed: priced as the measured layer norm of the same rows
        layer_norm = p("layer_norm_call") + sum(_layer_norm_row(w) for w in c["row_widths"])
        return int(layer_norm * float(PRICES["rms_norm_fraction"].value))
    if kind == "argmax_gather":  # a supervisor vertex a row, one after another
        worker = p("argmax_gather_worker") + p("argmax_element") * (c["busiest"] - 1)
        return c["rows"] * (6 * worker + p("argmax_gather_supervisor"))
    if kind == "argmax_sparse":  # a worker vertex a row, the rows dealt to six workers
        vertex = p("argmax_sparse_vertex") + p("argmax_element") * (c["pairs"] - 1)
        return 6 * cdiv(c["rows"], 6) * vertex
    if kind in ACTIVATION_VERTICES:
        busiest = max(c["per_worker"], default=0)
        return sum(_vertex(v, busiest) for v in ACTIVATION_VERTICES[kind]) if busiest else 0
    raise ValueError(f"no price for work {kind!r}")


def host_cycles(nbytes: int, clock_hz: float) -> int:
    """Cycles the host link needs for ``nbytes`` at its rate (32 GB/s)."""
    return cdiv(int(nbytes) * int(clock_hz), int(PRICES["host_bytes_per_second"].value))


# ---------------------------------------------------------------------------- exchange
@numba.njit(cache=True, nogil=True)
def _issue(tile, start, duration, order, align):  # pragma: no cover - compiled
    """Issue send instructions tile by tile in scheduled order: an instruction starts when
    both its scheduled event and its tile's previous send have come, moved to the next
    aligned event.  Returns (last event, instructions that had to move)."""
    end = 0
    moved = 0
    current = -1
    free = 0
    for k in range(order.shape[0]):
        i = order[k]
        if tile[i] != current:
            current = tile[i]
            free = 0
        at = start[i] if start[i] > free else free
        late = at % align
        if late:
            at += align - late
            moved += 1
        free = at + duration[i]
        if free > end:
            end = free
    return end, moved


def exchange_cycles(src_tile: np.ndarray, chunk_transfer: np.ndarray, chunk_start: np.ndarray,
                    chunk_words: np.ndarray, chunk_lanes: np.ndarray | None
                    ) -> tuple[int, int, int]:
    """``(cycles, instruction horizon, moved sends)`` of a phase from the chunks it moved.

    Each chunk is issued as send instructions of at most ``send_words`` words
    (``ceil(words / lanes)`` events each); a send is a two-word instruction that starts on
    an event aligned to ``send_alignment_events``.  The phase ends at the last send's last
    event, plus the measured per-phase cost (receive-mux latency and pipeline drain)."""
    if chunk_words.size == 0:
        return 0, 0, 0
    limit = p("send_words")
    sends = _up_array(chunk_words, limit)
    chunk = np.repeat(np.arange(chunk_words.size), sends)
    first = np.cumsum(sends) - sends
    index = np.arange(chunk.size) - first[chunk]  # which send of its chunk
    words = np.minimum(chunk_words[chunk] - index * limit, limit)
    lanes = np.ones_like(words) if chunk_lanes is None else np.maximum(chunk_lanes[chunk], 1)
    duration = -(-words // lanes)
    # scheduled event of each send: the chunk's start plus the sends before it in the chunk
    before = np.cumsum(duration) - duration
    start = chunk_start[chunk] + before - before[first[chunk]]
    tile = src_tile[chunk_transfer[chunk]].astype(np.int64)
    order = np.lexsort((start, tile)).astype(np.int64)
    end, moved = _issue(tile, start.astype(np.int64), duration.astype(np.int64), order,
                        p("send_alignment_events"))
    return int(end) + p("exchange_phase"), int(end), int(moved)


def _up_array(values: np.ndarray, by: int) -> np.ndarray:
    return -(-values.astype(np.int64) // by)


def link_cycles(src_tile: np.ndarray, dst_offsets: np.ndarray, dst_tile: np.ndarray,
                words: np.ndarray, clock_hz: float) -> tuple[int, int]:
    """``(cycles, bytes over the cable)`` of a hand-off to the next card, from the transfers
    it moved: each transfer crosses the cable once (its copies fan out on the receiving
    card), so the phase lasts as long as the slowest of the cable at its rate, the busiest
    sending tile and the busiest receiving tile (a tile sends or receives a word a cycle),
    plus the hop and the sync across cards."""
    if words.size == 0:
        return 0, 0
    moved = int(words.sum()) * 4  # words of 4 bytes
    cable = cdiv(moved * int(clock_hz), int(PRICES["link_bytes_per_second"].value))
    sender = int(np.bincount(src_tile, weights=words).max())
    copies = np.diff(dst_offsets)
    receiver = int(np.bincount(dst_tile, weights=np.repeat(words, copies)).max()) \
        if dst_tile.size else 0
    return max(cable, sender, receiver) + p("link_hop_cycles") + p("link_sync"), moved
