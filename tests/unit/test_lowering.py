"""Lowering: layout-conversion transfers replayed on an independent byte-level memory model."""

from __future__ import annotations

import numpy as np
import pytest

from ipu_stack.ir.layout import BlockLayout
from ipu_stack.ir.precision import F16, F32, Precision, f143, f152
from ipu_stack.lowering.lower import landing_layout
from ipu_stack.lowering.transfers import TransferBuilder, add_layout_transfers
from ipu_stack.target import IPU21
from ipu_stack.util.errors import CompileError

SRC_BUF, DST_BUF = 3, 8
POOL = 40  # tiles the random layouts draw from (so source and destination tiles overlap)


def pitch_of(cols: int, item: int) -> int:
    return -(-cols * item // 4) * 4


def random_layout(
    rng: np.random.Generator, rows: int, cols: int, p: Precision
) -> BlockLayout:
    item = p.itemsize
    word = max(1, 4 // item)
    row_block = int(rng.integers(1, rows + 1))
    if rng.random() < 0.25:
        col_block = cols + int(rng.integers(0, 3))  # one column block of any width
    else:
        col_block = word * int(rng.integers(1, -(-cols // word) + 1))
    grid = (-(-rows // row_block), -(-cols // col_block))
    replicas = int(rng.integers(1, 4))
    if grid[0] * grid[1] * replicas > POOL:
        replicas = 1
    if grid[0] * grid[1] > POOL:
        row_block, col_block = rows, cols + (-cols) % word
        grid = (1, 1)
    tiles = rng.permutation(POOL)[: grid[0] * grid[1] * replicas]
    return BlockLayout(rows, cols, p, row_block, col_block,
                       tiles.reshape(*grid, replicas).astype(np.int32))


def pack(layout: BlockLayout, stored: np.ndarray, buf: int, memory: dict) -> None:
    """Write every element to every replica by the layout's formula (uint8 per tile, buffer)."""
    item = layout.precision.itemsize
    raw = stored.view(np.uint8).reshape(layout.rows, layout.cols, item)
    for r in range(layout.rows):
        for c in range(layout.cols):
            i, j = r // layout.row_block, c // layout.col_block
            off = (r % layout.row_block) * layout.pitch + (c % layout.col_block) * item
            for tile in layout.tiles[i, j]:
                memory[(int(tile), buf)][off : off + item] = raw[r, c]


def unpack(layout: BlockLayout, buf: int, memory: dict, replica: int) -> np.ndarray:
    item = layout.precision.itemsize
    out = np.zeros((layout.rows, layout.cols, item), dtype=np.uint8)
    for r in range(layout.rows):
        for c in range(layout.cols):
            i, j = r // layout.row_block, c // layout.col_block
            off = (r % layout.row_block) * layout.pitch + (c % layout.col_block) * item
            tile = int(layout.tiles[i, j, replica % layout.replicas])
            out[r, c] = memory[(tile, buf)][off : off + item]
    return out


def replay(builder: TransferBuilder, sizes: dict[int, int], memory: dict) -> None:
    """Run the exchange (all reads before writes, BSP) and then the on-tile copies.

    ``sizes`` maps each buffer id to its block bytes; every access must stay inside.
    """
    ex = builder.build()
    assert ex.dst_offsets[0] == 0 and ex.dst_offsets[-1] == len(ex.dst_tile)
    payloads = []
    for i in range(ex.transfers):
        tile, buf, off, words = (int(ex.src_tile[i]), int(ex.src_buf[i]), int(ex.src_off[i]),
                                 int(ex.words[i]))
        assert buf != DST_BUF and words > 0
        assert 0 <= off and off + 4 * words <= sizes[buf], "read outside the source block"
        payloads.append(memory[(tile, buf)][off : off + 4 * words].copy())
    for i in range(ex.transfers):
        for k in range(int(ex.dst_offsets[i]), int(ex.dst_offsets[i + 1])):
            tile, buf, off = int(ex.dst_tile[k]), int(ex.dst_buf[k]), int(ex.dst_off[k])
            assert buf == DST_BUF and tile != int(ex.src_tile[i]), "a tile sends to itself"
            assert off % 4 == 0 and off + len(payloads[i]) <= sizes[buf], "write outside block"
            memory[(tile, buf)][off : off + len(payloads[i])] = payloads[i]
    for copy in builder.local:
        assert copy.dst_buf == DST_BUF and copy.src_buf != DST_BUF
        for r in range(copy.rows):
            s = copy.src_off + r * copy.src_pitch
            d = copy.dst_off + r * copy.dst_pitch
            assert s + copy.row_bytes <= sizes[copy.src_buf]
            assert d + copy.row_bytes <= sizes[DST_BUF]
            memory[(copy.tile, DST_BUF)][d : d + copy.row_bytes] = (
                memory[(copy.tile, copy.src_buf)][s : s + copy.row_bytes]
            )


def fresh_memory(sizes: dict[int, int]) -> dict:
    """Sentinel-filled buffers on every tile of the pool."""
    return {
        (t, buf): np.full(n, 0xDD if buf == DST_BUF else 0xEE, dtype=np.uint8)
        for t in range(POOL)
        for buf, n in sizes.items()
    }


def random_raw(rng: np.random.Generator, rows: int, cols: int, p: Precision) -> np.ndarray:
    raw = rng.integers(0, 256, size=(rows, cols * p.itemsize), dtype=np.uint8)
    if p.is_fp8:
        raw[raw == 0x80] = 0
    return raw


@pytest.mark.parametrize("precision", [f143(1), f152(-2), F16, F32], ids=str)
def test_layout_transfers_deliver_every_element_to_every_replica(precision: Precision) -> None:
    rng = np.random.default_rng(40 + precision.itemsize + len(precision.kind))
    local_copies = multicasts = 0
    for _ in range(30):
        rows, cols = int(rng.integers(1, 14)), int(rng.integers(1, 14))
        src = random_layout(rng, rows, cols, precision)
        dst = random_layout(rng, rows, cols, precision)
        raw = random_raw(rng, rows, cols, precision)
        sizes = {SRC_BUF: src.block_bytes, DST_BUF: dst.block_bytes}
        memory = fresh_memory(sizes)
        pack(src, raw.view(precision.dtype), SRC_BUF, memory)
        builder = TransferBuilder("convert")
        add_layout_transfers(builder, "x", src, SRC_BUF, dst, DST_BUF)
        replay(builder, sizes, memory)
        for replica in range(dst.replicas):
            got = unpack(dst, DST_BUF, memory, replica)
            np.testing.assert_array_equal(got.reshape(rows, -1), raw)
        local_copies += len(builder.local)
        ex = builder.build()
        multicasts += int(np.sum(np.diff(ex.dst_offsets) > 1))
    assert local_copies > 0 and multicasts > 0  # both paths were exercised


@pytest.mark.parametrize("precision", [F16, F32], ids=str)
def test_window_assembled_from_two_source_pieces(precision: Precision) -> None:
    """A destination window of the tensor filled from a left and a right source piece."""
    rng = np.random.default_rng(77 + precision.itemsize)
    unit = 4 // precision.itemsize  # keep column splits word aligned
    left_buf, right_buf = 3, 4
    for _ in range(25):
        rows, cols = int(rng.integers(1, 12)), unit * int(rng.integers(2, 8))
        split = unit * int(rng.integers(1, cols // unit))
        raw = random_raw(rng, rows, cols, precision)
        r0 = int(rng.integers(0, rows))
        c0 = unit * int(rng.integers(0, cols // unit))
        h = int(rng.integers(1, rows - r0 + 1))
        w = unit * int(rng.integers(1, (cols - c0) // unit + 1))
        left = random_layout(rng, rows, split, precision)
        right = random_layout(rng, rows, cols - split, precision)
        dst = random_layout(rng, h, w, precision)
        sizes = {left_buf: left.block_bytes, right_buf: right.block_bytes,
                 DST_BUF: dst.block_bytes}
        memory = fresh_memory(sizes)
        pack(left, raw[:, : split * precision.itemsize].copy().view(precision.dtype),
             left_buf, memory)
        pack(right, raw[:, split * precision.itemsize :].copy().view(precision.dtype),
             right_buf, memory)
        builder = TransferBuilder("window")
        add_layout_transfers(builder, "x", left, left_buf, dst, DST_BUF, (0, 0), (r0, c0))
        add_layout_transfers(builder, "x", right, right_buf, dst, DST_BUF, (0, split), (r0, c0))
        replay(builder, sizes, memory)
        want = raw[r0 : r0 + h, c0 * precision.itemsize : (c0 + w) * precision.itemsize]
        for replica in range(dst.replicas):
            got = unpack(dst, DST_BUF, memory, replica)
            np.testing.assert_array_equal(got.reshape(h, -1), want)


def test_window_at_the_origin_from_a_larger_source() -> None:
    rows, cols = 4, 8
    raw = np.arange(rows * cols * 4, dtype=np.uint8).reshape(rows, cols * 4)
    src = BlockLayout(rows, cols, F32, 2, 4, np.arange(4, dtype=np.int32).reshape(2, 2, 1))
    dst = BlockLayout(2, 4, F32, 2, 4, np.array([[[9]]], dtype=np.int32))  # top-left 2x4
    sizes = {SRC_BUF: src.block_bytes, DST_BUF: dst.block_bytes}
    memory = fresh_memory(sizes)
    pack(src, raw.view(np.float32), SRC_BUF, memory)
    builder = TransferBuilder("window")
    add_layout_transfers(builder, "x", src, SRC_BUF, dst, DST_BUF, (0, 0), (0, 0))
    replay(builder, sizes, memory)
    np.testing.assert_array_equal(unpack(dst, DST_BUF, memory, 0).reshape(2, -1), raw[:2, :16])


def test_whole_row_transfers_are_merged() -> None:
    tiles_src = np.array([[[0]], [[1]]], dtype=np.int32)  # 2 row blocks of 4 rows, full width
    tiles_dst = np.array([[[5]]], dtype=np.int32)  # one block of 8 rows, same width
    src = BlockLayout(8, 6, F16, 4, 6, tiles_src)
    dst = BlockLayout(8, 6, F16, 8, 6, tiles_dst)
    builder = TransferBuilder("merge")
    add_layout_transfers(builder, "x", src, 0, dst, 1)
    ex = builder.build()
    assert ex.transfers == 2  # one per source block, not one per row
    np.testing.assert_array_equal(ex.words, [4 * 12 // 4, 4 * 12 // 4])
    np.testing.assert_array_equal(ex.src_tile, [0, 1])
    np.testing.assert_array_equal(ex.dst_off, [0, 4 * 12])


def test_conversion_that_changes_precision_is_refused() -> None:
    tiles = np.zeros((1, 1, 1), dtype=np.int32)
    a = BlockLayout(4, 4, F16, 4, 4, tiles)
    with pytest.raises(CompileError, match="layout conversion of w changes precision"):
        add_layout_transfers(TransferBuilder("x"), "w", a, 0,
                             BlockLayout(4, 4, F32, 4, 4, tiles), 1)


def test_only_the_overlap_of_a_smaller_source_is_moved() -> None:
    raw = np.arange(4 * 8 * 2, dtype=np.uint8).reshape(4, 16)
    src = BlockLayout(4, 8, F16, 2, 8, np.array([[[0]], [[1]]], dtype=np.int32))
    dst = BlockLayout(6, 8, F16, 6, 4, np.array([[[2, 3], [4, 5]]], dtype=np.int32))
    sizes = {SRC_BUF: src.block_bytes, DST_BUF: dst.block_bytes}
    memory = fresh_memory(sizes)
    pack(src, raw.view(np.float16), SRC_BUF, memory)
    builder = TransferBuilder("overlap")
    add_layout_transfers(builder, "x", src, SRC_BUF, dst, DST_BUF)
    replay(builder, sizes, memory)
    for replica in range(2):
        got = unpack(dst, DST_BUF, memory, replica).reshape(6, 16)
        np.testing.assert_array_equal(got[:4], raw)
        assert np.all(got[4:] == 0xDD)  # rows 4..5 are not in the source: untouched


def test_empty_builder_builds_an_empty_phase() -> None:
    ex = TransferBuilder("nothing").build()
    assert ex.transfers == 0 and list(ex.dst_offsets) == [0]


def test_missing_source_replica_is_never_chosen_as_sender() -> None:
    # Block (0, 0) has one real replica (tile 2) and an absent one (-1), which BlockLayout
    # allows (used_tiles and host streams skip -1).  Destination block (0, 1) picks replica
    # (0 + 1) % 2 = 1 of the source block, i.e. tile -1.
    src = BlockLayout(2, 8, F16, 2, 8, np.array([[[2, -1]]], dtype=np.int32))
    dst = BlockLayout(2, 8, F16, 2, 4, np.array([[[5], [6]]], dtype=np.int32))
    builder = TransferBuilder("x")
    add_layout_transfers(builder, "x", src, 0, dst, 1)
    assert np.all(builder.build().src_tile >= 0)


@pytest.mark.parametrize(("rows", "cols"), [(1, 8), (1471, 4), (1472, 2), (5000, 16), (3, 7)])
def test_landing_layout_spreads_whole_rows_over_distinct_tiles(rows: int, cols: int) -> None:
    layout = landing_layout(rows, cols, F16, IPU21)
    tiles = layout.tiles.ravel()
    assert layout.col_block == cols and layout.replicas == 1
    assert layout.grid[0] * layout.row_block >= rows
    assert (layout.grid[0] - 1) * layout.row_block < rows
    assert len(set(tiles.tolist())) == len(tiles)
    assert tiles.min() >= 0 and tiles.max() < 1472
    assert layout.row_block == -(-rows // 1472)


def _one_block(rows: int, cols: int, p: Precision, tiles, row_block=None, col_block=None):
    tiles = np.asarray(tiles, dtype=np.int32)
    return BlockLayout(rows, cols, p, row_block or rows, col_block or cols, tiles)


@pytest.mark.parametrize(("src", "dst", "origins", "message"), [
    # every replica of the source block absent
    (lambda: _one_block(2, 8, F16, [[[-1]]]), lambda: _one_block(2, 8, F16, [[[5]]]),
     ((0, 0), (0, 0)), "layout conversion of x: block 0,0 is stored nowhere"),
    # a window that starts one F16 column into the source: half a word
    (lambda: _one_block(2, 8, F16, [[[1]]]), lambda: _one_block(2, 4, F16, [[[5]]]),
     ((0, 0), (0, 1)), r"layout conversion of x is not word aligned \(offset 2\)"),
    # a destination window that ends 2 FP8 bytes into a source word that goes on
    (lambda: _one_block(1, 8, f143(0), [[[1]]]),
     lambda: _one_block(1, 6, f143(0), [[[5], [6]]], col_block=4), ((0, 0), (0, 0)),
     "layout conversion of x splits a word"),
])
def test_layout_conversions_the_walk_refuses(src, dst, origins, message) -> None:
    with pytest.raises(CompileError, match=message):
        add_layout_transfers(TransferBuilder("x"), "x", src(), 0, dst(), 1, *origins)


def test_on_tile_copies_where_the_source_is_a_destination() -> None:
    """Tile 5 holds the source and is one of two replicas of the destination: it gets an
    on-tile copy, tile 6 a transfer from it."""
    src = _one_block(2, 8, F16, [[[5]]])
    dst = _one_block(2, 8, F16, [[[5, 6]]])
    builder = TransferBuilder("x")
    add_layout_transfers(builder, "x", src, 0, dst, 1)
    ex = builder.build()
    assert ex.src_tile.tolist() == [5] and ex.dst_tile.tolist() == [6]
    assert ex.words.tolist() == [2 * 8 * 2 // 4]  # whole rows in both: one merged transfer
    assert [(c.tile, c.rows, c.row_bytes) for c in builder.local] == [(5, 1, 32)]


def test_calls_on_one_tile_add_up_in_the_compute_estimate() -> None:
    """A tile runs its calls of a compute set one after another (the simulator adds them
    per tile), so the planner's estimate of a copy set is its busiest tile's sum, not its
    largest call: two copies on tile 0 (288 + 1024/8 and 288 + 2048/8) and one on tile 1."""
    from ipu_stack.kernels.base import KernelInstance
    from ipu_stack.kernels.copy import copy_params
    from ipu_stack.lowering.program import Call, ComputeSet, Program
    from ipu_stack.phases.costing import row_stage_cycles
    from ipu_stack.target import IPU21

    def copy(nbytes: int, tiles: list[int]) -> Call:
        instance = KernelInstance("copy", copy_params(1, nbytes, nbytes, nbytes))
        at = np.zeros(len(tiles), dtype=np.int64)
        return Call(instance, np.array(tiles, dtype=np.int32), [(0, at), (1, at)])

    program = Program(run=[ComputeSet("copies", [copy(1024, [0, 1]), copy(2048, [0])])])
    # no sync of its own: a compute set's sync belongs to the exchange phase after it
    assert row_stage_cycles(program, IPU21) == (288 + 128) + (288 + 256)
