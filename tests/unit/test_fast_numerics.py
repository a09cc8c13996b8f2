"""The fast numerics are bit-identical to the numpy/ml_dtypes code they replaced.

``ir/rounding.py`` rounds with compiled loops and tables instead of ``astype`` passes, the
GEMM kernel folds its per-pass products into FP16 partials with one compiled loop, and every
kernel call now runs all its tiles as one batch with per-tile addresses.  The *legacy*
implementations below are the code that ran before (kept here, verbatim in behaviour, as the
oracle): each kernel family, in every mode, at odd sizes and with tiles at different
addresses, must leave the same bytes in tile memory through both paths.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ipu_stack.ir import precision as precision_module
from ipu_stack.ir import rounding
from ipu_stack.ir.precision import F16, F32, Precision, f143, f152
from ipu_stack.kernels import epilogue as epilogue_module
from ipu_stack.kernels import gemm as gemm_module
from ipu_stack.kernels import rowwise as rowwise_module
from ipu_stack.kernels.base import KernelInstance, read_shared_values, read_values
from ipu_stack.kernels.copy import copy_params
from ipu_stack.kernels.epilogue import epilogue_params
from ipu_stack.kernels.gemm import gemm_params
from ipu_stack.kernels.rowwise import row_params

FP8 = {"F8F143": (ml_dtypes.float8_e4m3fnuz, 240.0), "F8F152": (ml_dtypes.float8_e5m2fnuz, 57344.0)}


# ------------------------------------------------------------------ the legacy numerics

def legacy_quantize(self: Precision, values: np.ndarray) -> np.ndarray:
    data = np.asarray(values, dtype=np.float32)
    if self.is_fp8:
        limit = float(ml_dtypes.finfo(self.dtype).max)
        with np.errstate(all="ignore"):
            scaled = np.clip(np.ldexp(data, -self.scale_exponent), -limit, limit)
            return scaled.astype(self.dtype)
    with np.errstate(all="ignore"):
        return data.astype(self.dtype)


def legacy_dequantize(self: Precision, stored: np.ndarray) -> np.ndarray:
    data = np.asarray(stored).astype(np.float32)
    if self.is_fp8 and self.scale_exponent:
        data *= np.float32(2.0**self.scale_exponent)
    return data


def legacy_round_trip(self: Precision, values: np.ndarray) -> np.ndarray:
    return legacy_dequantize(self, legacy_quantize(self, values))


def legacy_pass_matmul(a: np.ndarray, b: np.ndarray, step: int) -> np.ndarray:
    """The kernel's old ``_fp16_passes``: a stacked matmul per pass, then two astype passes."""
    partial = np.zeros((a.shape[0], a.shape[1], b.shape[-1]), dtype=np.float16)
    for start in range(0, a.shape[-1], step):
        dot = np.matmul(a[:, :, start : start + step], b[:, start : start + step, :])
        with np.errstate(all="ignore"):
            partial = (partial.astype(np.float32) + dot).astype(np.float16)
    return partial.astype(np.float32)


def legacy_pass_codes(a: np.ndarray, b: np.ndarray, step: int,
                      a_of: np.ndarray | None = None) -> np.ndarray:
    return legacy_pass_matmul(a if a_of is None else a[a_of], b, step).astype(np.float16)


@pytest.fixture
def legacy(monkeypatch: pytest.MonkeyPatch):
    """Switch the numerics to the legacy code for the duration of a block."""
    def switch() -> None:
        monkeypatch.setattr(precision_module.Precision, "quantize", legacy_quantize)
        monkeypatch.setattr(precision_module.Precision, "dequantize", legacy_dequantize)
        monkeypatch.setattr(precision_module.Precision, "round_trip", legacy_round_trip)
        monkeypatch.setattr(gemm_module, "fp16_pass_codes", legacy_pass_codes)
    return switch


# ------------------------------------------------------------------ conversions

def f16_probe_values() -> np.ndarray:
    """Every FP16 value, the midpoints between neighbours (the ties) and the float32 values
    either side of each midpoint, and values beyond the range."""
    every = np.arange(65536, dtype=np.uint16).view(np.float16)
    finite = np.sort(every[np.isfinite(every)].astype(np.float64))
    mids = ((finite[:-1] + finite[1:]) / 2).astype(np.float32)
    above = np.nextafter(mids, np.float32(np.inf))
    below = np.nextafter(mids, np.float32(-np.inf))
    extra = np.array([65504, 65519.996, 65520, 1e9, -1e9, np.inf, -np.inf, np.nan, 0.0, -0.0,
                      2.0**-25, 2.0**-26, 3 * 2.0**-26, -(2.0**-25)], dtype=np.float32)
    return np.concatenate([every.astype(np.float32), mids, above, below, extra])


def test_round_f16_matches_numpy_on_every_tie_and_edge() -> None:
    values = f16_probe_values()
    with np.errstate(all="ignore"):
        expected = values.astype(np.float16).astype(np.float32)
    got = rounding.round_f16(values)
    assert got.dtype == np.float32 and got.shape == values.shape
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))


def test_f16_storage_matches_numpy_bit_for_bit() -> None:
    """Encoding rounds as numpy's cast does (NaN payloads included); decoding is exact."""
    rng = np.random.default_rng(3)
    nan_payloads = np.array([0x7FC00001, 0xFFA00000, 0x7F800001, 0x7F802000],
                            dtype=np.uint32).view(np.float32)
    values = np.concatenate([
        f16_probe_values(), nan_payloads,
        (rng.standard_normal(200000) * 2.0 ** rng.integers(-30, 20, 200000)).astype(np.float32)])
    with np.errstate(all="ignore"):
        expected = values.astype(np.float16)
    np.testing.assert_array_equal(rounding.encode_f16(values).view(np.uint16),
                                  expected.view(np.uint16))
    codes = np.arange(65536, dtype=np.uint16).view(np.float16).reshape(256, 256)
    decoded = rounding.decode_f16(codes)
    assert decoded.shape == (256, 256)
    np.testing.assert_array_equal(decoded.view(np.uint32),
                                  codes.astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("kind", sorted(FP8))
@pytest.mark.parametrize("scale", [-7, 0, 5])
def test_encode_fp8_matches_ml_dtypes(kind: str, scale: int) -> None:
    dtype, limit = FP8[kind]
    codes = np.arange(256, dtype=np.uint8).view(dtype).astype(np.float64)
    finite = np.sort(codes[np.isfinite(codes)])
    mids = ((finite[:-1] + finite[1:]) / 2 * 2.0**scale).astype(np.float32)
    rng = np.random.default_rng(scale + 40)
    with np.errstate(all="ignore"):  # beyond float32's range: inf, which encodes too
        probes = f16_probe_values() * np.float32(2.0**scale)
    values = np.concatenate([
        (finite * 2.0**scale).astype(np.float32), mids, np.nextafter(mids, np.float32(np.inf)),
        np.nextafter(mids, np.float32(-np.inf)), probes,
        (rng.standard_normal(20000) * 2.0 ** rng.integers(-20, 20, 20000)).astype(np.float32),
        # a sweep of every float32 bit pattern (each 4099th: every exponent, both signs,
        # NaNs, infinities and float32 subnormals), for the branch-free encoder's selects
        np.arange(0, 1 << 32, 4099, dtype=np.uint64).astype(np.uint32).view(np.float32),
    ])
    with np.errstate(all="ignore"):
        expected = np.clip(np.ldexp(values, -scale), -limit, limit).astype(dtype)
    got = rounding.encode_fp8(values, kind, scale)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got.view(np.uint8), expected.view(np.uint8))


@pytest.mark.parametrize("kind", sorted(FP8))
def test_decode_fp8_is_the_exact_value_of_every_code(kind: str) -> None:
    dtype, _ = FP8[kind]
    codes = np.arange(256, dtype=np.uint8).reshape(16, 16).view(dtype)
    for scale in (-9, 0, 4):
        expected = codes.astype(np.float32) * np.float32(2.0**scale)
        got = rounding.decode_fp8(codes, kind, scale)
        assert got.shape == (16, 16)
        np.testing.assert_array_equal(got, expected)


def fp8_integers(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Integers that FP8 (F143) holds exactly: 8 to 15 times 1 to 16, either sign."""
    mantissa = rng.integers(8, 16, size=shape)
    sign = rng.choice(np.array([-1, 1]), size=shape)
    return (sign * mantissa * 2 ** rng.integers(0, 5, size=shape)).astype(np.float32)


def through_fp8(values: np.ndarray) -> np.ndarray:
    """``values`` through FP8 (F143) and back: equal only when each is an FP8 value."""
    return values.astype(ml_dtypes.float8_e4m3fnuz).astype(np.float32)


def random_fp8_values(rng: np.random.Generator, shape: tuple[int, ...], scale: int) -> np.ndarray:
    raw = rng.integers(0, 256, size=shape, dtype=np.uint8)
    raw[raw == 0x80] = 0
    return raw.view(ml_dtypes.float8_e4m3fnuz).astype(np.float32) * np.float32(2.0**scale)


@pytest.mark.parametrize(("rows", "depth", "cols"), [
    (1, 5, 1), (7, 32, 19), (33, 45, 17), (3, 100, 64), (64, 16, 3), (5, 96, 33)])
@pytest.mark.parametrize("transposed", [False, True])
def test_fp16_pass_matmul_matches_the_legacy_passes(rows: int, depth: int, cols: int,
                                                    transposed: bool) -> None:
    rng = np.random.default_rng(rows * depth * cols)
    a = random_fp8_values(rng, (4, rows, depth), -3)
    b = random_fp8_values(rng, (4, cols, depth) if transposed else (4, depth, cols), -6)
    if transposed:
        b = b.transpose(0, 2, 1)
    got = rounding.fp16_pass_codes(a, b, 32).astype(np.float32)
    np.testing.assert_array_equal(got, legacy_pass_matmul(a, b, 32))
    # and the partial really is FP16 after the last pass
    np.testing.assert_array_equal(got, got.astype(np.float16).astype(np.float32))


@pytest.mark.parametrize("batch_bytes", [256 << 10, 600])
def test_pass_products_of_a_shared_a_are_the_per_item_ones(batch_bytes: int,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Items that share their A (``a_of``: runs) give the bits each item's own copy gives,
    whether a sub-batch holds a whole run or the runs are cut into sub-batches."""
    monkeypatch.setattr(rounding, "PASS_BATCH_BYTES", batch_bytes)
    rng = np.random.default_rng(5)
    shared = random_fp8_values(rng, (3, 6, 70), -3)
    run_of = np.array([0, 0, 0, 1, 2, 2, 2, 2])
    b = random_fp8_values(rng, (8, 70, 11), -6)
    got = rounding.fp16_pass_codes(shared, b, 32, run_of)
    want = rounding.fp16_pass_codes(np.ascontiguousarray(shared[run_of]), b, 32)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    np.testing.assert_array_equal(got.astype(np.float32), legacy_pass_matmul(shared[run_of], b, 32))


# ------------------------------------------------------------------ kernels, both paths

TILES = np.array([0, 2, 3, 5], dtype=np.int64)
MEM_BYTES = 16384


def random_memory(seed: int) -> np.ndarray:
    """Tile memory of random FP8-like bytes (no NaN code) and small F16/F32 values."""
    rng = np.random.default_rng(seed)
    mem = rng.integers(0, 256, size=(6, MEM_BYTES), dtype=np.uint8)
    mem[mem == 0x80] = 0
    return mem


def fill(mem: np.ndarray, address: int, nbytes: int, precision: Precision, seed: int) -> None:
    """Plausible stored values of ``precision`` in ``[address, address + nbytes)`` of every
    tile (F16/F32 bytes must not be NaN or huge for the comparison to mean anything)."""
    if precision.is_fp8:
        return
    rng = np.random.default_rng(seed)
    count = nbytes // precision.itemsize
    values = (rng.standard_normal((mem.shape[0], count)) * 3).astype(precision.dtype)
    mem[:, address : address + count * precision.itemsize] = values.view(np.uint8)


def both_paths(params: dict, family: str, addresses: list[list[int]], legacy,
               memory: np.ndarray) -> None:
    """Run ``family`` on each tile alone through the legacy numerics (``addresses[i]`` on
    ``TILES[i]``), then on all tiles at once with per-tile addresses; same bytes."""
    kernel = KernelInstance(family, params)
    old = memory.copy()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(precision_module.Precision, "quantize", legacy_quantize)
        patch.setattr(precision_module.Precision, "dequantize", legacy_dequantize)
        patch.setattr(precision_module.Precision, "round_trip", legacy_round_trip)
        patch.setattr(gemm_module, "fp16_pass_codes", legacy_pass_codes)
        old_works = [kernel.impl.run(params, old, TILES[i : i + 1], addresses[i])
                     for i in range(len(TILES))]
    new = memory.copy()
    per_operand = np.array(addresses, dtype=np.int64)
    with np.errstate(all="ignore"):
        new_works = kernel.impl.run(params, new, TILES, [per_operand[:, k] for k in
                                                          range(per_operand.shape[1])])
    np.testing.assert_array_equal(new, old)
    assert [(w.kind, w.counts) for w in new_works] == [(w.kind, w.counts) for w in old_works[0]]


@pytest.fixture(params=["whole", "chunked"])
def chunking(request, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the all-tiles path in one batch, or in chunks of one to three tiles with an
    uneven last chunk (the chunk sizes a tower's calls get, scaled to these small blocks)."""
    if request.param == "chunked":
        for module, name in ((rowwise_module, "CHUNK_BYTES"), (epilogue_module, "CHUNK_BYTES"),
                             (rounding, "PASS_BATCH_BYTES"), (gemm_module, "CHUNK_BYTES")):
            monkeypatch.setattr(module, name, 2600)
    return request.param


def shifted(base: list[int], step: int = 64) -> list[list[int]]:
    """Each tile's operands at its own addresses (a placement that differs per tile)."""
    return [[address + i * step if address > 0 else address for address in base]
            for i in range(len(TILES))]


@pytest.mark.parametrize(("pa", "pb", "rows", "depth", "cols", "mode", "transposed"), [
    (f143(-3), f143(-5), 7, 45, 19, "fp8", False),
    (f143(-2), f152(-9), 12, 64, 33, "fp8", False),
    (f143(-3), f143(-4), 9, 40, 17, "fp8", True),
    (f143(-3), f143(-5), 7, 40, 19, "f16", False),
    (F16, F16, 5, 24, 9, "f16", False),
])
def test_gemm_both_paths(pa, pb, rows, depth, cols, mode, transposed, legacy, chunking) -> None:
    a_pitch = -(-depth * pa.itemsize // 4) * 4 + 4
    b_rows, b_cols = (cols, depth) if transposed else (depth, cols)
    b_pitch = -(-b_cols * pb.itemsize // 4) * 4
    out_pitch = cols * (2 if mode == "fp8" else 4) + 8
    params = gemm_params(pa, pb, rows, depth, cols, a_pitch, b_pitch, out_pitch, mode,
                         b_transposed=transposed)
    memory = random_memory(rows + depth)
    fill(memory, 0, 4096, pa, 1)
    fill(memory, 4096, 4096, pb, 2)
    both_paths(params, "gemm", shifted([64, 4096, 9000, 12000]), legacy, memory)


def test_gemm_decodes_an_a_block_once_for_the_tiles_that_repeat_it(legacy, chunking) -> None:
    """A row block's column tiles hold the same A bytes: the kernel decodes them once a run
    of repeating tiles and gives every tile the product with its own B; a tile whose A
    differs in one byte of its last row is a run of its own.  The bytes written are the
    per-tile legacy path's."""
    pa, pb, rows, depth, cols = f143(-3), f143(-5), 9, 70, 21
    a_pitch, b_pitch, out_pitch = 72, 24, 2 * cols + 8
    params = gemm_params(pa, pb, rows, depth, cols, a_pitch, b_pitch, out_pitch, "fp8")
    addresses = shifted([64, 4096, 9000, 12000])
    memory = random_memory(11)
    extent = (rows - 1) * a_pitch + depth
    block = memory[TILES[0], 64 : 64 + extent].copy()
    for i in (1, 2, 3):  # the same A on tiles 2 and 3; on tile 5 with one byte changed
        memory[TILES[i], addresses[i][0] : addresses[i][0] + extent] = block
    memory[TILES[3], addresses[3][0] + extent - 1] ^= 0x01
    a_at = np.array([a[0] for a in addresses], dtype=np.int64)
    values, run_of = read_shared_values(memory, TILES, a_at, rows, depth, a_pitch, pa)
    assert run_of is not None and run_of.tolist() == [0, 0, 0, 1] and len(values) == 2
    each = read_values(memory, TILES, a_at, rows, depth, a_pitch, pa)
    np.testing.assert_array_equal(values[run_of], each)
    both_paths(params, "gemm", addresses, legacy, memory)


def test_an_operand_no_tile_repeats_is_read_per_tile() -> None:
    memory = random_memory(12)
    values, run_of = read_shared_values(memory, TILES, 64, 5, 16, 16, f143(0))
    assert run_of is None
    np.testing.assert_array_equal(values, read_values(memory, TILES, 64, 5, 16, 16, f143(0)))


@pytest.mark.parametrize(("partials", "chain", "bias", "out"), [
    (F16, [["round", F32.to_json()], ["bias", F32.to_json()], ["gelu_tanh", F16.to_json()],
           ["cast", f143(-2).to_json()]], F16, f143(-2)),
    (F32, [["round", F16.to_json()], ["scale", F32.to_json(), 0.125]], None, F16),
    (F32, [["bias", F32.to_json()], ["gelu_erf", F32.to_json()], ["cast", F16.to_json()]],
     F16, F16),
])
def test_reduce_both_paths(partials, chain, bias, out, legacy, chunking) -> None:
    rows, cols, parts = 11, 21, 3
    pitch = -(-cols * partials.itemsize // 4) * 4
    params = epilogue_params(parts, rows, cols, pitch, 12, chain, bias, out, 64, partials)
    memory = random_memory(7)
    fill(memory, 0, 6000, partials, 3)
    fill(memory, 6000, 256, F16, 4)
    both_paths(params, "reduce", shifted([16, 1200, 6000, 9000]), legacy, memory)


@pytest.mark.parametrize(("op", "extra", "aux", "out"), [
    ("layer_norm", {"eps": 1e-6}, F16, f143(-1)),
    ("softmax", {"scale": 0.125}, None, F16),
    ("add", {}, F16, F16),
    ("rope", {"head_dim": 8}, F32, F16),
    ("chain", {"chain": [["bias", F16.to_json()], ["gelu_tanh", F16.to_json()],
                         ["cast", f152(-3).to_json()]]}, F16, f152(-3)),
])
def test_row_both_paths(op, extra, aux, out, legacy, chunking) -> None:
    rows, cols = 9, 24
    params = row_params(op, rows, cols, F16, 64, out, 64, aux, 64, **extra)
    memory = random_memory(len(op))
    fill(memory, 0, 8000, F16, 5)
    if aux is not None:
        fill(memory, 8000, 2000, aux, 6)
    both_paths(params, "row", shifted([32, 8000, 9000, 11000]), legacy, memory)


def test_copy_both_paths(legacy) -> None:
    params = copy_params(13, 10, 16, 12)
    both_paths(params, "copy", shifted([100, 5000]), legacy, random_memory(9))


def legacy_partial_matmul(a: np.ndarray, b: np.ndarray, depth_block: int) -> np.ndarray:
    """The host reference's old ``fp16_partial_matmul``: per depth block, 32-deep passes."""
    total = np.zeros((a.shape[0], b.shape[1]), dtype=np.float32)
    for block in range(0, a.shape[1], depth_block):
        partial = np.zeros_like(total, dtype=np.float16)
        end = min(block + depth_block, a.shape[1])
        for start in range(block, end, 32):
            stop = min(start + 32, end)
            dot = a[:, start:stop] @ b[start:stop]
            partial = (partial.astype(np.float32) + dot).astype(np.float16)
        total += partial.astype(np.float32)
    return total


@pytest.mark.parametrize(("rows", "depth", "cols", "depth_block"), [
    (37, 100, 300, 48), (200, 96, 1000, 16), (129, 1152, 64, 1152), (5, 70, 33, 64)])
def test_reference_blocked_matmul_matches_the_legacy_reference(rows, depth, cols,
                                                                depth_block) -> None:
    """The column strips, passes, FP16 folds and block sums of the blocked product against
    the plain loops.  The operands are FP8 integers (8 to 240, either sign) times a power of
    two, so every pass's sum is exact in float32 whatever order BLAS adds it in (32
    products below 2^16 each): the two paths call BLAS on different shapes, and OpenBLAS's
    kernels for different shapes may add a pass in another order (with random FP8 values of
    every exponent, 4 of 200 000 elements differed on an AMD EPYC, none on the machines
    before).  The FP16 folds still round nearly every element: the sums pass 2^11."""
    from ipu_stack.ir.interpret import fp16_partial_matmul

    rng = np.random.default_rng(depth + cols)
    a = fp8_integers(rng, (rows, depth)) * np.float32(2.0**-2)
    b = fp8_integers(rng, (depth, cols)) * np.float32(2.0**-6)
    assert np.array_equal(a, through_fp8(a)) and np.array_equal(b, through_fp8(b))
    rounded = fp16_partial_matmul(a, b, depth_block)
    assert np.mean(rounded != a @ b) > 0.5  # the FP16 partials did round
    np.testing.assert_array_equal(rounded, legacy_partial_matmul(a, b, depth_block))


def test_compact_values_keep_codes_and_never_round() -> None:
    """Values representable in their precision are held as codes (a quarter of the bytes
    for FP8) and read back exactly; anything else is kept as float32, unchanged."""
    from ipu_stack.ir.values import CompactValues, StoredTensor

    rng = np.random.default_rng(5)
    fp8 = f143(-4)
    exact = fp8.round_trip(rng.standard_normal((6, 10)).astype(np.float32))
    inexact = rng.standard_normal((6, 10)).astype(np.float32)
    held = CompactValues()
    held.put("a", exact, fp8)
    held.put("b", inexact, fp8)
    held.put("c", F16.round_trip(inexact), F16)
    assert held.nbytes == 60 + 240 + 120
    np.testing.assert_array_equal(held["a"], exact)
    np.testing.assert_array_equal(held["b"], inexact)  # not FP8 values: not rounded
    assert "a" in held and "z" not in held and len(held) == 3
    del held["b"]
    assert held.nbytes == 180 and sorted(held) == ["a", "c"]
    stored = StoredTensor.of(exact, fp8)
    np.testing.assert_array_equal(np.asarray(stored, dtype=np.float64), exact)
    assert stored.shape == (6, 10) and stored.nbytes == 60
