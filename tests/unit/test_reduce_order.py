"""The host reference adds a depth-split GEMM's partials in the order the device's reduce
adds them, so the two agree bit for bit (``ir.interpret.split_depth_matmul``,
``rounding.fp16_blocked_matmul(owners=...)``).

The device side here is the real kernels: each of three depth tiles runs the F16-mode GEMM
kernel on its depth block, the partials' row sub-slices move as the lowering's
reduce-scatter moves them (slot ``d_src - (d_src > d_dst)`` on tile ``d_dst``), and each
tile's reduce kernel finishes its own sub-slice.  The data spans many binades, so float32
sums depend on their order: a plain sum in depth order differs."""

from __future__ import annotations

import numpy as np

from ipu_stack.ir.interpret import depth_owners, fp16_partial_matmul, split_depth_matmul
from ipu_stack.ir.precision import F16, F32, f143
from ipu_stack.ir.rounding import add_in_owner_order
from ipu_stack.kernels.base import KernelInstance
from ipu_stack.kernels.epilogue import epilogue_params
from ipu_stack.kernels.gemm import gemm_params

SPLITS, ROWS, BLOCK, COLS = 3, 12, 40, 16  # row block 12: sub-slices of 4 rows
A_AT, B_AT, P_AT, RECV_AT, OUT_AT = 0, 4096, 8192, 12288, 16384


def device_sum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` through the device's GEMM and reduce kernels on three depth tiles."""
    mem = np.zeros((SPLITS, 20000), dtype=np.uint8)
    tiles = np.arange(SPLITS, dtype=np.int64)
    for d in range(SPLITS):
        block = slice(d * BLOCK, (d + 1) * BLOCK)
        mem[d, A_AT : A_AT + ROWS * BLOCK * 2] = a[:, block].astype(np.float16).view(np.uint8).ravel()
        mem[d, B_AT : B_AT + BLOCK * COLS * 2] = b[block].astype(np.float16).view(np.uint8).ravel()
    gemm = gemm_params(F16, F16, ROWS, BLOCK, COLS, BLOCK * 2, COLS * 2, COLS * 4, "f16")
    KernelInstance("gemm", gemm).impl.run(gemm, mem, tiles, [A_AT, B_AT, P_AT, 0])
    sub, slot = ROWS // SPLITS, ROWS // SPLITS * COLS * 4
    for src in range(SPLITS):  # the reduce-scatter: sub-slice dst of src's partial to dst
        for dst in range(SPLITS):
            if src != dst:
                at = RECV_AT + (src - (src > dst)) * slot
                mem[dst, at : at + slot] = mem[src, P_AT + dst * slot : P_AT + (dst + 1) * slot]
    reduce = epilogue_params(SPLITS, sub, COLS, COLS * 4, sub, [], None, F32, COLS * 4, F32)
    kernel = KernelInstance("reduce", reduce)
    out = np.empty((ROWS, COLS), dtype=np.float32)
    for d in range(SPLITS):
        kernel.impl.run(reduce, mem, tiles[d : d + 1], [P_AT + d * slot, RECV_AT, 0, OUT_AT])
        out[d * sub : (d + 1) * sub] = mem[d, OUT_AT : OUT_AT + slot].view(np.float32).reshape(
            sub, COLS)
    return out


def wide_values(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """F16 values over many binades (sums of their products round differently by order)."""
    values = rng.standard_normal(shape) * 2.0 ** rng.integers(-12, 12, shape)
    return values.astype(np.float16).astype(np.float32)


def test_the_reference_adds_depth_partials_as_the_device_reduce_does() -> None:
    rng = np.random.default_rng(11)
    a, b = wide_values(rng, (ROWS, SPLITS * BLOCK)), wide_values(rng, (SPLITS * BLOCK, COLS))
    split = {"depth_block": BLOCK, "depth_splits": SPLITS, "row_chunks": [[0, ROWS, ROWS]]}
    device = device_sum(a, b)
    np.testing.assert_array_equal(split_depth_matmul(a, b, split), device)
    in_depth_order = sum(a[:, k : k + BLOCK] @ b[k : k + BLOCK]
                         for k in range(0, SPLITS * BLOCK, BLOCK))
    assert not np.array_equal(in_depth_order, device)  # the order matters for this data


def test_depth_owners_follow_row_chunks_and_sub_slices() -> None:
    split = {"depth_splits": 2, "row_chunks": [[0, 10, 6], [10, 7, 4]]}
    assert depth_owners(17, split).tolist() == [0, 0, 0, 1, 1, 1, 0, 0, 0, 1,
                                                0, 0, 1, 1, 0, 0, 1]
    assert depth_owners(16, split) is None  # planned over other rows: depth order
    assert depth_owners(17, {"depth_splits": 1, "row_chunks": [[0, 17, 17]]}) is None


def test_owner_order_and_its_bounds() -> None:
    big, one = np.float32(1e8), np.float32(1.0)
    parts = [np.full((3, 1), big), np.full((3, 1), one), np.full((3, 1), -big)]
    total = add_in_owner_order(parts, np.array([0, 1, 2]))
    assert total[:, 0].tolist() == [0.0, 0.0, 1.0]  # (1e8 + 1) - 1e8 rounds; -1e8 + 1e8 + 1
    try:
        add_in_owner_order(parts, np.array([0, 3, 1]))
    except ValueError as error:
        assert str(error) == "rows owned by depth blocks 0..3 of 3"
    else:
        raise AssertionError("an owner past the last block was accepted")


def test_fp8_blocks_added_in_owner_order() -> None:
    """FP8 mode: each block's FP16 partial as before, then the owner order."""
    rng = np.random.default_rng(5)
    fp8 = f143(-2)
    a = fp8.round_trip(wide_values(rng, (ROWS, 96)) / 64)
    b = fp8.round_trip(wide_values(rng, (96, COLS)) / 64)
    split = {"depth_block": 32, "depth_splits": 3, "row_chunks": [[0, ROWS, ROWS]]}
    blocks = [fp16_partial_matmul(a[:, k : k + 32], b[k : k + 32], 32) for k in (0, 32, 64)]
    want = add_in_owner_order(blocks, depth_owners(ROWS, split))
    np.testing.assert_array_equal(fp16_partial_matmul(a, b, 32, split), want)


def test_tile_products_cover_every_row_chunk_and_column_block() -> None:
    """Made tile by tile (row chunks of their own row blocks, ragged column blocks), the
    products land where the wide product puts them (small integers: every order exact)."""
    rng = np.random.default_rng(2)
    a = rng.integers(-4, 5, (12, 30)).astype(np.float32)
    b = rng.integers(-4, 5, (30, 13)).astype(np.float32)
    split = {"depth_block": 11, "depth_splits": 3, "col_block": 5,
             "row_chunks": [[0, 7, 6], [7, 5, 3]]}
    np.testing.assert_array_equal(split_depth_matmul(a, b, split), a @ b)
