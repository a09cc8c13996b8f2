"""Kernel semantics on a fake tile memory, cycle costs and names."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from scipy import special
from tests.helpers import gelu_tanh, random_stored

from ipu_stack.ir.precision import F16, F32, Precision, f143, f152
from ipu_stack.kernels.base import KernelInstance
from ipu_stack.kernels.copy import copy_params
from ipu_stack.kernels.epilogue import epilogue_params
from ipu_stack.kernels.gemm import gemm_params
from ipu_stack.planning.costs import kernel_cost
from ipu_stack.testing.reference import gelu_tanh_half_loop

SENTINEL = 0xA5
MEM_BYTES = 8192


def fake_memory(tiles: int) -> np.ndarray:
    return np.full((tiles, MEM_BYTES), SENTINEL, dtype=np.uint8)


def put_matrix(mem: np.ndarray, tile: int, address: int, pitch: int, stored: np.ndarray) -> None:
    """Write a stored-dtype matrix row by row at ``address`` with ``pitch`` (independent code)."""
    raw = np.ascontiguousarray(stored).view(np.uint8)
    for r in range(raw.shape[0]):
        start = address + r * pitch
        mem[tile, start : start + raw.shape[1]] = raw[r]


def get_matrix(
    mem: np.ndarray, tile: int, address: int, pitch: int, rows: int, cols: int, dtype
) -> np.ndarray:
    item = np.dtype(dtype).itemsize
    out = [mem[tile, address + r * pitch : address + r * pitch + cols * item] for r in range(rows)]
    return np.stack(out).copy().view(dtype)


def touched_mask(address: int, pitch: int, rows: int, row_bytes: int) -> np.ndarray:
    mask = np.zeros(MEM_BYTES, dtype=bool)
    for r in range(rows):
        mask[address + r * pitch : address + r * pitch + row_bytes] = True
    return mask


def decode(p: Precision, stored: np.ndarray, fp8) -> np.ndarray:
    """float64 values of stored elements without ipu_stack's dequantize."""
    if p.is_fp8:
        return fp8.decode(p.kind)[stored.view(np.uint8)] * 2.0**p.scale_exponent
    return stored.astype(np.float64)


# ---------------------------------------------------------------------------------- GEMM


def fp16_pass_accumulate(av: np.ndarray, bv: np.ndarray, step: int = 32) -> np.ndarray:
    """The FP8 AMP's arithmetic, written out: 32-deep passes, each added to an FP16 partial."""
    partial = np.zeros((av.shape[0], bv.shape[1]), dtype=np.float64)
    for start in range(0, av.shape[1], step):
        dot = av[:, start : start + step] @ bv[start : start + step]
        partial = (partial + dot).astype(np.float16).astype(np.float64)
    return partial


@pytest.mark.parametrize(
    ("pa", "pb", "rows", "depth", "cols", "mode"),
    [
        (f143(-3), f143(-5), 7, 40, 19, "fp8"),
        (f143(-2), f152(-9), 12, 64, 32, "fp8"),
        (f143(-3), f143(-5), 7, 40, 19, "f16"),
        (F16, F16, 5, 24, 9, "f16"),
    ],
    ids=["f143xf143-fp8", "f143xf152-fp8", "f143xf143-f16cast", "f16xf16"],
)
def test_gemm_matches_float64_matmul_and_writes_only_its_output(
    fp8, pa: Precision, pb: Precision, rows: int, depth: int, cols: int, mode: str
) -> None:
    rng = np.random.default_rng(rows * depth + cols)
    tiles = np.array([1, 3, 4], dtype=np.int64)
    a_pitch = -(-depth * pa.itemsize // 4) * 4 + 4  # one spare word per row
    b_pitch = -(-cols * pb.itemsize // 4) * 4
    item = 2 if mode == "fp8" else 4
    out_pitch = cols * item + 8
    a_addr, b_addr, out_addr, scratch_addr = 64, 64 + rows * a_pitch + 32, 4096, 5120
    mem = fake_memory(6)
    expected = {}
    for t in tiles:
        a = random_stored(rng, pa, (rows, depth), std=2.0)
        b = random_stored(rng, pb, (depth, cols), std=2.0)
        put_matrix(mem, t, a_addr, a_pitch, a)
        put_matrix(mem, t, b_addr, b_pitch, b)
        av, bv = decode(pa, a, fp8), decode(pb, b, fp8)
        expected[int(t)] = (av, bv)
    before = mem.copy()
    params = gemm_params(pa, pb, rows, depth, cols, a_pitch, b_pitch, out_pitch, mode)
    inst = KernelInstance("gemm", params)
    work = inst.impl.run(params, mem, tiles, [a_addr, b_addr, out_addr, scratch_addr])
    passes = -(-depth // (32 if mode == "fp8" else 16)) * -(-cols // 16)
    assert work[0].kind == "amp" and work[0].counts == {"passes": passes, "rows": rows}
    cast = mode == "f16" and pa.is_fp8
    assert [w.kind for w in work[1:]] == (["cast_from_f8"] if cast else [])
    written = touched_mask(out_addr, out_pitch, rows, cols * item)
    if cast:  # the F16 copies of both operands, back to back
        written |= touched_mask(scratch_addr, 0, 1, 2 * (rows * depth + depth * cols))
    for t in range(mem.shape[0]):
        if t not in expected:
            np.testing.assert_array_equal(mem[t], before[t])
            continue
        av, bv = expected[t]
        if mode == "fp8":  # FP16 partials: the same passes and roundings, up to F32 order
            got = get_matrix(mem, t, out_addr, out_pitch, rows, cols, np.float16)
            want = fp16_pass_accumulate(av, bv)
            np.testing.assert_allclose(got.astype(np.float64), want,
                                       rtol=2.0**-10, atol=2.0**-24)
        else:  # F32 accumulation: error bounded by depth x eps32 x sum|a||b|
            got = get_matrix(mem, t, out_addr, out_pitch, rows, cols, np.float32)
            magnitude = np.abs(av) @ np.abs(bv)
            assert np.all(np.abs(got.astype(np.float64) - av @ bv)
                          <= 4 * depth * 2.0**-24 * magnitude + 1e-30)
        np.testing.assert_array_equal(mem[t, ~written], before[t, ~written])


def test_fp8_mode_rounds_partials_to_fp16_after_every_pass(fp8) -> None:
    """64 deep: two passes.  Pass one leaves 2048 + 1 in the partial, which FP16 stores as
    2048; pass two adds 1 again: FP16 partials give 2048 (F32 partials would give 2050)."""
    pa = pb = f143(0)
    a = np.zeros((1, 64), dtype=np.float32)
    a[0, 0], a[0, 1], a[0, 32] = 128.0, 1.0, 1.0
    b = np.zeros((64, 16), dtype=np.float32)
    b[0, :], b[1, :], b[32, :] = 16.0, 1.0, 1.0
    mem = fake_memory(1)
    put_matrix(mem, 0, 0, 64, pa.quantize(a))
    put_matrix(mem, 0, 256, 16, pb.quantize(b))
    params = gemm_params(pa, pb, 1, 64, 16, 64, 16, 32, "fp8")
    KernelInstance("gemm", params).impl.run(params, mem, np.array([0]), [0, 256, 4096, 0])
    got = get_matrix(mem, 0, 4096, 32, 1, 16, np.float16)
    assert np.all(got == 2048.0)
    params = gemm_params(pa, pb, 1, 64, 16, 64, 16, 64, "f16")
    KernelInstance("gemm", params).impl.run(params, mem, np.array([0]), [0, 256, 4096, 6000])
    assert np.all(get_matrix(mem, 0, 4096, 64, 1, 16, np.float32) == 2050.0)


def test_gemm_modes_are_checked() -> None:
    with pytest.raises(ValueError, match="FP8 GEMM mode needs FP8 operands"):
        gemm_params(F16, F16, 4, 16, 16, 32, 32, 32, "fp8")
    with pytest.raises(ValueError, match="unknown GEMM mode 'f32'"):
        gemm_params(F16, F16, 4, 16, 16, 32, 32, 32, "f32")


def test_gemm_cost_is_the_calibrated_formula_at_awkward_sizes() -> None:
    def cost(pa, rows, depth, cols, mode) -> int:
        params = gemm_params(pa, pa, rows, depth, cols, 256, 256, 256, mode)
        return kernel_cost(KernelInstance("gemm", params))

    # 13 rows (not a multiple of 6), 40 FP8 deep (2 passes), 20 columns (2 groups):
    # 294 + 2 x 2 x (4 x 13 + 160)
    assert cost(f143(), 13, 40, 20, "fp8") == 294 + 4 * 212
    # F16: 40 deep is 3 passes of 16
    assert cost(F16, 13, 40, 20, "f16") == 294 + 6 * 212
    # F16 mode on FP8 data adds the vendor's Cast1D of 13 x 40 + 40 x 20 = 1320 elements:
    # 220 a worker, 55 vectors of 4 at 1 cycle, 2 remainder tests: 12 + 6 (37 + 55 + 2)
    assert cost(f143(), 13, 40, 20, "f16") == 294 + 6 * 212 + 12 + 6 * (37 + 55 + 2)
    assert cost(f143(), 0, 40, 20, "fp8") == 0


@pytest.mark.parametrize("mode", ["fp8", "f16"])
def test_gemm_cost_grows_with_each_dimension(mode: str) -> None:
    pa = f143() if mode == "fp8" else F16
    base = (60, 128, 96)

    def cost(dims) -> int:
        return kernel_cost(KernelInstance("gemm", gemm_params(pa, pa, *dims, 256, 256, 256, mode)))

    c0 = cost(base)
    for axis in range(3):
        previous = c0
        for factor in (2, 4, 8):
            dims = list(base)
            dims[axis] *= factor
            assert cost(dims) > previous, (axis, factor)
            previous = cost(dims)


@pytest.mark.parametrize(("mode", "peak"), [("fp8", 128), ("f16", 64)])
def test_gemm_approaches_amp_peak_only_with_many_rows(mode: str, peak: int) -> None:
    pa = f143() if mode == "fp8" else F16

    def macs_per_cycle(rows: int, depth: int, cols: int) -> float:
        params = gemm_params(pa, pa, rows, depth, cols, 256, 256, 256, mode)
        return rows * depth * cols / kernel_cost(KernelInstance("gemm", params))

    assert 0.95 * peak < macs_per_cycle(6000, 512, 256) <= peak
    # 24 rows: a pass costs 4 x 24 + 160 = 256 cycles for 96 cycles of multiplies
    assert macs_per_cycle(24, 512, 256) < 0.4 * peak


def test_gemm_with_b_stored_transposed(fp8) -> None:
    """``b_transposed``: B is stored [cols, depth] (keys of Q.K^T); the result is A @ B^T."""
    rng = np.random.default_rng(17)
    pa, pb = f143(-4), f143(-6)
    rows, depth, cols = 6, 40, 10
    a_pitch, b_pitch, out_pitch = 40, 40, 40
    mem = fake_memory(2)
    a = random_stored(rng, pa, (rows, depth), std=2.0)
    bt = random_stored(rng, pb, (cols, depth), std=2.0)
    put_matrix(mem, 1, 0, a_pitch, a)
    put_matrix(mem, 1, 1024, b_pitch, bt)
    before = mem.copy()
    params = gemm_params(pa, pb, rows, depth, cols, a_pitch, b_pitch, out_pitch, "fp8",
                         b_transposed=True)
    inst = KernelInstance("gemm", params)
    assert inst.name == "gemm_f8_interleaved_bt_k40_c10_r1_r1"
    assert (1, (cols - 1) * b_pitch + depth, False) in inst.impl.accesses(params)
    inst.impl.run(params, mem, np.array([1]), [0, 1024, 4096, 0])
    av, bv = decode(pa, a, fp8), decode(pb, bt, fp8)
    got = get_matrix(mem, 1, 4096, out_pitch, rows, cols, np.float16).astype(np.float64)
    np.testing.assert_allclose(got, fp16_pass_accumulate(av, bv.T), rtol=2.0**-10, atol=2.0**-24)
    written = touched_mask(4096, out_pitch, rows, cols * 2)
    np.testing.assert_array_equal(mem[1, ~written], before[1, ~written])
    np.testing.assert_array_equal(mem[0], before[0])


def test_gemm_names() -> None:
    p = gemm_params(f143(), f143(), 13, 32, 16, 32, 16, 32, "fp8")
    assert KernelInstance("gemm", p).name == "gemm_f8_interleaved_k32_c16_r2_r3"
    p = gemm_params(F16, F16, 5, 16, 100, 32, 200, 400, "f16")
    assert KernelInstance("gemm", p).name == "gemm_f16_interleaved_k16_c100_r0_r1"
    p = gemm_params(f143(), f143(), 6, 16, 100, 32, 200, 400, "f16")
    assert KernelInstance("gemm", p).name == "gemm_f16cast_interleaved_k16_c100_r1_r1"


def test_kernel_instance_key_is_canonical() -> None:
    a = KernelInstance("copy", {"rows": 2, "row_bytes": 8, "src_pitch": 8, "dst_pitch": 8})
    b = KernelInstance("copy", {"dst_pitch": 8, "src_pitch": 8, "row_bytes": 8, "rows": 2})
    c = KernelInstance("copy", {"rows": 3, "row_bytes": 8, "src_pitch": 8, "dst_pitch": 8})
    assert a == b and hash(a) == hash(b) and a.key == b.key
    assert a != c and a.key != c.key
    text = json.dumps({"family": "copy", "params": a.params}, sort_keys=True)
    assert a.key == hashlib.sha256(text.encode()).hexdigest()


# ---------------------------------------------------------------------------- reduce / epilogue


def write_partials(
    mem, rng, tiles, own, recv, parts, rows, cols, pitch
) -> dict[int, np.ndarray]:
    total = {}
    for t in tiles:
        slices = [
            (rng.standard_normal((rows, cols)) * 1.5).astype(np.float32) for _ in range(parts)
        ]
        put_matrix(mem, t, own, pitch, slices[0])
        for k in range(1, parts):
            put_matrix(mem, t, recv + (k - 1) * rows * pitch, pitch, slices[k])
        total[int(t)] = np.sum([s.astype(np.float64) for s in slices], axis=0)
    return total


def test_reduce_sums_parts_adds_bias_applies_gelu_and_casts() -> None:
    rng = np.random.default_rng(3)
    parts, rows, cols = 3, 5, 7
    pitch, out_pitch = 32, 16  # partial rows 28 bytes + padding; F16 rows 14 bytes + padding
    own, recv, bias_addr, out = 0, 512, 1536, 2048
    tiles = np.array([0, 2], dtype=np.int64)
    mem = fake_memory(3)
    totals = write_partials(mem, rng, tiles, own, recv, parts, rows, cols, pitch)
    bias = {}
    for t in tiles:
        b = rng.standard_normal(cols).astype(np.float16)
        mem[t, bias_addr : bias_addr + 2 * cols] = b.view(np.uint8)
        bias[int(t)] = b.astype(np.float64)
    before = mem.copy()
    chain = [
        ["round", F32.to_json()],
        ["bias", F32.to_json()],
        ["gelu_tanh", F32.to_json()],
        ["cast", F16.to_json()],
    ]
    params = epilogue_params(parts, rows, cols, pitch, rows, chain, F16, F16, out_pitch)
    inst = KernelInstance("reduce", params)
    assert inst.name == "reduce3_round_bias_gelu_tanh_cast_f16_r5_c7"
    inst.impl.run(params, mem, tiles, [own, recv, bias_addr, out])
    written = touched_mask(out, out_pitch, rows, cols * 2)
    for t in tiles:
        # the sum and bias in float32, then the vendor's F16 GELU loop, then F16
        biased = (totals[int(t)] + bias[int(t)][None, :]).astype(np.float32)
        want = gelu_tanh_half_loop(biased)
        got = get_matrix(mem, t, out, out_pitch, rows, cols, np.float16).astype(np.float64)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_allclose(got, gelu_tanh(biased.astype(np.float64)), rtol=2.0**-8,
                                   atol=2.0**-10)
        np.testing.assert_array_equal(mem[t, ~written], before[t, ~written])
    np.testing.assert_array_equal(mem[1], before[1])


def test_reduce_rounds_where_the_chain_says_and_casts_to_fp8_exactly(fp8) -> None:
    """Dyadic partials sum exactly; the only roundings are F16 (after bias) and the FP8 cast."""
    rng = np.random.default_rng(9)
    parts, rows, cols = 2, 4, 6
    pitch, out_pitch = 24, 8
    own, recv, bias_addr, out = 0, 256, 1024, 1536
    tiles = np.array([0], dtype=np.int64)
    mem = fake_memory(1)
    a = (rng.integers(-4000, 4000, (rows, cols)) / 64.0).astype(np.float32)
    b = (rng.integers(-4000, 4000, (rows, cols)) / 64.0).astype(np.float32)
    put_matrix(mem, 0, own, pitch, a)
    put_matrix(mem, 0, recv, pitch, b)
    bias_prec = f152(-3)
    table = fp8.decode("F8F152") / 8.0
    choices = np.flatnonzero((np.abs(table) >= 0.125) & (np.abs(table) <= 16))
    bias_bytes = rng.choice(choices, cols).astype(np.uint8)
    bias = table[bias_bytes]  # F32 sums of these with the partials stay exact
    mem[0, bias_addr : bias_addr + cols] = bias_bytes
    out_prec = f143(-3)  # max 30: the larger sums saturate
    chain = [["round", F32.to_json()], ["bias", F16.to_json()], ["cast", out_prec.to_json()]]
    params = epilogue_params(parts, rows, cols, pitch, rows, chain, bias_prec, out_prec, out_pitch)
    KernelInstance("reduce", params).impl.run(params, mem, tiles, [own, recv, bias_addr, out])
    exact = a.astype(np.float64) + b + bias[None, :]
    f16 = exact.astype(np.float16).astype(np.float64)
    want = fp8.nearest("F8F143", f16, -3)
    got = get_matrix(mem, 0, out, out_pitch, rows, cols, np.uint8)
    np.testing.assert_array_equal(got, want)
    assert np.any(np.abs(exact) > 30) and np.any(np.abs(exact) < 30)  # saturates some


def test_reduce_single_part_without_bias_reads_no_received_slot() -> None:
    rng = np.random.default_rng(4)
    rows, cols, pitch = 3, 4, 16
    mem = fake_memory(1)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    put_matrix(mem, 0, 100 * 4, pitch, x)
    params = epilogue_params(1, rows, cols, pitch, rows, [["round", F32.to_json()]], None, F32, 16)
    KernelInstance("reduce", params).impl.run(params, mem, np.array([0]), [400, 0, 0, 4000])
    np.testing.assert_array_equal(get_matrix(mem, 0, 4000, 16, rows, cols, np.float32), x)


def test_reduce_scale_step_multiplies_then_rounds() -> None:
    rows, cols, pitch = 2, 4, 16
    mem = fake_memory(1)
    x = np.array([[1.0, -2.5, 3.0, 0.1], [1000.0, 7.0, -0.3, 2.0]], dtype=np.float32)
    put_matrix(mem, 0, 0, pitch, x)
    chain = [["round", F32.to_json()], ["scale", F16.to_json(), 0.125]]
    params = epilogue_params(1, rows, cols, pitch, rows, chain, None, F16, 8)
    assert KernelInstance("reduce", params).name == "reduce1_round_scale_f16_r2_c4"
    KernelInstance("reduce", params).impl.run(params, mem, np.array([0]), [0, 0, 0, 512])
    got = get_matrix(mem, 0, 512, 8, rows, cols, np.float16)
    np.testing.assert_array_equal(got, (x.astype(np.float64) * 0.125).astype(np.float16))


def test_reduce_cost_counts_parts_and_chain() -> None:
    def cost(parts: int, chain: list, partials=F32, rows: int = 6) -> int:
        p = epilogue_params(parts, rows, 16, 64, 6, chain, None, F16, 32, partials)
        return kernel_cost(KernelInstance("reduce", p))

    # F16 partials 64 bytes apart hold 32 bytes a row: not one dense region, so the
    # reference's measured reduce, 96 outputs in ceil(96 / 48) = 2 six-worker steps of 8:
    # 282 + 6 x 2 x (11 + 2 (P - 1))
    f16 = [["round", F16.to_json()]]
    assert cost(1, f16, F16) == 282 + 12 * 11
    assert cost(4, f16, F16) == 282 + 12 * (11 + 6)
    # F32 partials fill their rows: poplin's single-input ReduceAdd over 24 vectors of 4,
    # 4 a worker: 33 + 6 (20 + 4 (2 x 3 received + 7))
    assert cost(4, f16, F32) == 33 + 6 * (20 + 4 * (2 * 3 + 7))
    # one F32 partial is cast (Cast1D, FLOAT -> HALF): 16 a worker, 4 vectors of 4 at 2
    # cycles, 2 remainder tests: 12 + 6 (37 + 8 + 2)
    assert cost(1, f16, F32) == 12 + 6 * (37 + 8 + 2)
    # a ragged block (5 of the slots' 6 rows) or received partials over 32 KiB (99 of 384
    # bytes): the measured reduce, F32 partials 4 per worker step (assumed)
    assert cost(4, f16, F32, rows=5) == 282 + 6 * 4 * (11 + 6)
    assert cost(100, f16, F32) == 282 + 24 * (11 + 2 * 99)
    # the vendor's tanh GELU over 96 halves: 24 vectors, 4 a worker: 9 + 6 (20 + 4 + fill 2 +
    # 8, 3 loops of 8, flush 1 + 8); an FP8 result: Cast1D, 16 a worker = 2 vectors of 8 at
    # 2 cycles, 3 remainder tests: 12 + 6 (37 + 4 + 3)
    gelu = [["round", F16.to_json()], ["gelu_tanh", f143().to_json()]]
    assert cost(1, gelu, F16) == 282 + 12 * 11 + (9 + 6 * (20 + 4 + 10 + 24 + 9)) + (
        12 + 6 * (37 + 4 + 3))
    # the erf GELU: the reference's measured vertex, 330 + 462 per 96 elements
    erf = [["round", F16.to_json()], ["gelu_erf", F16.to_json()]]
    assert cost(1, erf, F16) == 282 + 12 * 11 + 330 + 462


def test_a_merged_bias_and_gelu_gives_the_same_values_and_lays_the_bias_out_side_by_side(
) -> None:
    """With the received partial slots summed, the bias is copied k times side by side into
    them and the fused vertex takes k contiguous rows as one (rows of k x cols): the values
    are those of the unmerged kernel and of an independent reference, the price is the
    measured vertex's formula on the longer rows plus the copy (288 + bytes / 8), and the
    planner's closed form and the device's pricing of the run's work agree."""
    from ipu_stack.device.pricing import price_work
    from ipu_stack.kernels.elementwise import bias_gelu_merge
    from ipu_stack.kernels.epilogue import bias_room

    rng = np.random.default_rng(21)
    parts, rows, cols = 3, 9, 24
    chain = [["round", F16.to_json()], ["bias", F16.to_json()],
             ["gelu_erf", f143(-4).to_json()]]
    results = {}
    for pitch in (2 * cols, 2 * cols + 16):  # contiguous rows, then padded ones
        mem = fake_memory(1)
        own, recv, bias_addr, out = 0, 1024, 3072, 4096
        rng = np.random.default_rng(21)  # the same values for both pitches
        slices = [(rng.standard_normal((rows, cols))).astype(np.float16) for _ in range(parts)]
        put_matrix(mem, 0, own, pitch, slices[0])
        for k in range(1, parts):
            put_matrix(mem, 0, recv + (k - 1) * rows * pitch, pitch, slices[k])
        bias = np.linspace(-1, 1, cols).astype(np.float16)
        mem[0, bias_addr:bias_addr + 2 * cols] = bias.view(np.uint8)
        params = epilogue_params(parts, rows, cols, pitch, rows, chain, F16, f143(-4), cols,
                                 F16)
        inst = KernelInstance("reduce", params)
        work = inst.impl.run(params, mem, np.array([0]), [own, recv, bias_addr, out])
        assert sum(price_work(w) for w in work) == kernel_cost(inst)
        room, _ = bias_room(params)
        merge = bias_gelu_merge(rows, cols, room)
        results[pitch] = (get_matrix(mem, 0, out, cols, rows, cols, np.uint8), work, merge,
                          mem[0, recv:recv + 2 * cols * merge].view(np.float16))
        total = sum(s.astype(np.float32) for s in slices).astype(np.float16)
        want_f16 = (total.astype(np.float32) + bias.astype(np.float32)).astype(np.float16)
        biased = want_f16.astype(np.float64)
        want = 0.5 * biased * (1 + special.erf(biased / np.sqrt(2)))
        got = f143(-4).dequantize(results[pitch][0]).astype(np.float64)
        # FP8 E4M3: within half a step (2^-4 relative) of the float64 reference
        np.testing.assert_allclose(got, want, rtol=2.0**-4, atol=2.0**-14)
    merged, apart = results[2 * cols], results[2 * cols + 16]
    assert merged[2] == 9 and apart[2] == 1  # the whole contiguous block as one row
    assert np.array_equal(merged[0], apart[0])
    assert np.array_equal(merged[3], np.tile(np.linspace(-1, 1, cols).astype(np.float16), 9))
    kinds = [w.kind for w in merged[1]]
    assert kinds == ["reduce", "copy", "bias_gelu", "cast_f8"]
    copy, fused = merged[1][1], merged[1][2]
    assert price_work(copy) == 288 + 9 * 24 * 2 // 8
    assert price_work(fused) == 1 * (228 + 90 * 9) + 222  # one row of 216 columns
    assert [w.kind for w in apart[1]] == ["reduce", "elementwise", "gelu", "cast_f8"]


def test_a_merged_bias_and_gelu_with_a_shorter_last_row_is_priced_alike_on_both_paths(
) -> None:
    """Room for four rows' bias: 10 rows run as two rows of 96 columns and one of 48."""
    from ipu_stack.device.pricing import price_work
    from ipu_stack.kernels.elementwise import bias_gelu_merge, chain_work
    from ipu_stack.planning.costs import estimate_bias_gelu, estimate_chain

    chain = [["round", F16.to_json()], ["bias", F16.to_json()], ["gelu_erf", F16.to_json()]]
    assert bias_gelu_merge(10, 24, 96) == 4
    work = chain_work(chain, 10, 24, room=96)
    assert [w.kind for w in work] == ["copy", "bias_gelu"]
    expected = 2 * (228 + 90 * 4) + (228 + 90 * 2) + 222 + 288 + 4 * 24 * 2 // 8
    assert sum(price_work(w) for w in work) == estimate_bias_gelu(10, 24, 4) == expected
    assert estimate_chain(chain, 10, 24, room=96) == expected
    # no room: row by row the fused vertex would cost 10 x (228 + 90) + 222 = 3402, so the
    # bias pass and the GELU vertex run instead
    assert estimate_chain(chain, 10, 24) == (330 + 24 * 5) + (330 + 462 * 3)


# ---------------------------------------------------------------------------------- copy


def test_copy_moves_rows_between_pitches_and_nothing_else() -> None:
    rng = np.random.default_rng(8)
    mem = fake_memory(4)
    mem[:] = rng.integers(0, 256, mem.shape, dtype=np.uint8)
    before = mem.copy()
    rows, row_bytes, src_pitch, dst_pitch = 5, 12, 20, 16
    src, dst = 100, 3000
    tiles = np.array([0, 3], dtype=np.int64)
    params = copy_params(rows, row_bytes, src_pitch, dst_pitch)
    inst = KernelInstance("copy", params)
    assert inst.name == "copy_r5_b12"
    inst.impl.run(params, mem, tiles, [src, dst])
    written = touched_mask(dst, dst_pitch, rows, row_bytes)
    for t in range(4):
        if t in (0, 3):
            for r in range(rows):
                s = before[t, src + r * src_pitch : src + r * src_pitch + row_bytes]
                np.testing.assert_array_equal(
                    mem[t, dst + r * dst_pitch : dst + r * dst_pitch + row_bytes], s
                )
            np.testing.assert_array_equal(mem[t, ~written], before[t, ~written])
        else:
            np.testing.assert_array_equal(mem[t], before[t])
    assert inst.impl.accesses(params) == [(0, 4 * 20 + 12, False), (1, 4 * 16 + 12, True)]


def test_a_bias_and_gelu_run_as_the_cheaper_vertex_sequence_for_the_block() -> None:
    """The fused bias + GELU vertex pays a row's setup per row (docs/machine.md: rows x
    (228 + 90 ceil(w / 24)) + 222); a bias pass (330 + 24 ceil(n / 48), assumed) and the GELU
    vertex (330 + 462 ceil(n / 96)) cost less on a narrow block.  The choice changes the
    price, never the values."""
    from ipu_stack.kernels.elementwise import apply_chain, chain_passes, fuses_bias_gelu
    from ipu_stack.planning.costs import estimate_chain

    chain = [["round", {"kind": "F16"}], ["bias", {"kind": "F16"}],
             ["gelu_erf", {"kind": "F16"}]]
    assert not fuses_bias_gelu(49, 128, gelu="gelu_erf")
    assert chain_passes(chain, 49, 128) == ["elementwise", "gelu"]
    assert estimate_chain(chain, 49, 128) == (330 + 24 * 131) + (330 + 462 * 66) == 34296
    assert 49 * (228 + 90 * 6) + 222 == 37854  # what the fused vertex would have cost
    assert fuses_bias_gelu(1, 2208, gelu="gelu_erf") and fuses_bias_gelu(8, 192, gelu="gelu_erf")
    assert chain_passes(chain, 1, 2208) == ["bias_gelu"]
    assert estimate_chain(chain, 1, 2208) == 8730  # the measured point
    # the tanh GELU runs as the vendor's loop (2208 halves: 92 vectors a worker), which with
    # the bias pass costs less than the measured fused vertex: 1,434 + 4,635 < 8,730
    tanh = [chain[0], chain[1], ["gelu_tanh", {"kind": "F16"}]]
    assert not fuses_bias_gelu(1, 2208)
    assert chain_passes(tanh, 1, 2208) == ["elementwise", "gelu_tanh"]
    assert estimate_chain(tanh, 1, 2208) == (330 + 24 * 46) + 9 + 6 * (20 + 4 + 10 + 91 * 8 + 9)
    assert chain_passes(chain) == ["bias_gelu"]  # shape unknown: the fused vertex
    rng = np.random.default_rng(3)
    values = rng.standard_normal((49, 128)).astype(np.float32)
    bias = rng.standard_normal(128).astype(np.float16)
    expected = (values.astype(np.float16).astype(np.float32) + bias.astype(np.float32))
    expected = expected.astype(np.float16).astype(np.float64)
    gelu = (0.5 * expected * (1 + special.erf(expected / np.sqrt(2)))).astype(np.float32)
    assert np.array_equal(apply_chain(values, chain, bias),
                          gelu.astype(np.float16).astype(np.float32))


@pytest.mark.parametrize("elements", [1, 2, 3, 4, 5, 23, 24, 25, 96, 97, 1001, 2208, 4304])
def test_the_vendor_gelu_loop_and_casts_are_priced_alike_by_the_planner_and_the_device(
        elements: int) -> None:
    """The tanh GELU (popnn's loop) and the Cast1D passes: the device's pricing of the work
    the kernel reports and the planner's closed form agree at every remainder, and follow
    the vendor's estimator structure worked out by hand at one size (2208 halves: 552
    vectors, 92 a worker; 368 elements a worker for the cast, 46 vectors of 8, no rest)."""
    from ipu_stack.device.pricing import price_work
    from ipu_stack.kernels.elementwise import chain_work
    from ipu_stack.planning.costs import estimate_chain

    chain = [["round", F16.to_json()], ["gelu_tanh", f143(-2).to_json()]]
    work = chain_work(chain, 1, elements)
    assert [w.kind for w in work] == ["gelu_tanh", "cast_f8"]
    assert sum(price_work(w) for w in work) == estimate_chain(chain, 1, elements)
    f32_in = [["round", F32.to_json()], ["gelu_tanh", F16.to_json()]]
    work = chain_work(f32_in, 1, elements)
    assert [w.kind for w in work] == ["cast_f16", "gelu_tanh"]
    assert sum(price_work(w) for w in work) == estimate_chain(f32_in, 1, elements)
    if elements == 2208:
        gelu, cast = (price_work(w) for w in chain_work(chain, 1, elements))
        assert gelu == 9 + 6 * (20 + 4 + (2 + 8) + 91 * 8 + (1 + 8))
        assert cast == 12 + 6 * (37 + 46 * 2 + 3)
