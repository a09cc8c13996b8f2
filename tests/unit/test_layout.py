"""BlockLayout: block packing checked element by element against independent indexing."""

from __future__ import annotations

import numpy as np
import pytest
from tests.helpers import random_stored

from ipu_stack.ir.layout import BlockLayout
from ipu_stack.ir.precision import F16, F32, Precision, f143, f152
from ipu_stack.util.errors import CompileError

PRECISIONS = [f143(-2), f152(3), F16, F32]


def random_layout(rng: np.random.Generator, p: Precision) -> BlockLayout:
    rows, cols = int(rng.integers(1, 30)), int(rng.integers(1, 30))
    row_block = int(rng.integers(1, rows + 3))
    word_elems = 4 // p.itemsize if p.itemsize < 4 else 1
    if rng.random() < 0.3:
        col_block = int(rng.integers(cols, cols + 4))  # one column block, any width
    else:
        col_block = word_elems * int(rng.integers(1, max(2, -(-cols // word_elems) + 1)))
    grid = (-(-rows // row_block), -(-cols // col_block), int(rng.integers(1, 3)))
    tiles = rng.permutation(200)[: np.prod(grid)].reshape(grid).astype(np.int32)
    return BlockLayout(rows, cols, p, row_block, col_block, tiles)


@pytest.mark.parametrize("precision", PRECISIONS, ids=str)
def test_to_blocks_places_every_element_where_the_layout_says(precision: Precision) -> None:
    rng = np.random.default_rng(100 + precision.itemsize)
    for _ in range(25):
        layout = random_layout(rng, precision)
        stored = random_stored(rng, precision, (layout.rows, layout.cols))
        blocks = layout.to_blocks(stored)
        rb, cb = layout.grid
        item = precision.itemsize
        assert blocks.shape == (rb, cb, layout.block_bytes)
        assert blocks.dtype == np.uint8
        assert layout.pitch % 4 == 0
        assert layout.pitch >= layout.col_block * item
        assert layout.pitch - layout.col_block * item < 4
        raw = stored.view(np.uint8).reshape(layout.rows, layout.cols, item)
        written = np.zeros(blocks.shape, dtype=bool)
        for r in range(layout.rows):
            for c in range(layout.cols):
                i, j = r // layout.row_block, c // layout.col_block
                off = (r % layout.row_block) * layout.pitch + (c % layout.col_block) * item
                assert bytes(blocks[i, j, off : off + item]) == bytes(raw[r, c])
                written[i, j, off : off + item] = True
        # everything else (padding rows, columns and the word-alignment tail) is zero
        assert not blocks[~written].any()
        back = layout.from_blocks(blocks)
        assert back.dtype == precision.dtype
        np.testing.assert_array_equal(back.view(np.uint8), stored.view(np.uint8))


def test_from_blocks_ignores_padding_bytes() -> None:
    layout = BlockLayout(5, 6, F16, 2, 4, np.arange(6, dtype=np.int32).reshape(3, 2, 1))
    stored = np.arange(30, dtype=np.float16).reshape(5, 6)
    blocks = layout.to_blocks(stored)
    garbage = blocks.copy()
    # row 1 of block (2, 0) is beyond the 5 rows; columns 6..7 of column block 1 are padding
    garbage[2, 0, layout.pitch :] = 0xFF
    garbage[:, 1, 4:8] = 0xEE
    garbage[:, 1, layout.pitch + 4 : layout.pitch + 8] = 0xEE
    np.testing.assert_array_equal(layout.from_blocks(garbage), stored)


@pytest.mark.parametrize(
    ("precision", "col_block", "pitch"),
    [(f143(), 5, 8), (f143(), 8, 8), (F16, 3, 8), (F16, 2, 4), (F32, 3, 12), (f152(), 1, 4)],
)
def test_pitch_is_rounded_up_to_a_word(precision: Precision, col_block: int, pitch: int) -> None:
    tiles = np.zeros((1, 1, 1), dtype=np.int32)
    layout = BlockLayout(3, col_block, precision, 3, col_block, tiles)
    assert layout.pitch == pitch
    assert layout.block_bytes == 3 * pitch


def test_block_extent_and_valid_sizes_at_ragged_edges() -> None:
    layout = BlockLayout(10, 7, F32, 4, 3, np.arange(9, dtype=np.int32).reshape(3, 3, 1))
    assert layout.block_extent(0, 0) == (0, 4, 0, 3)
    assert layout.block_extent(2, 2) == (8, 10, 6, 7)
    assert layout.block_extent(1, 1) == (4, 8, 3, 6)
    np.testing.assert_array_equal(layout.valid_rows(), [4, 4, 2])
    np.testing.assert_array_equal(layout.valid_cols(), [3, 3, 1])


def test_empty_edge_block_and_used_tiles() -> None:
    tiles = np.array([[[7, -1]], [[3, 9]], [[4, -1]]], dtype=np.int32)
    layout = BlockLayout(5, 4, F16, 3, 4, tiles)  # 3 row blocks of 3 cover 9 >= 5 rows
    assert layout.block_extent(2, 0) == (6, 5, 0, 4)  # empty
    np.testing.assert_array_equal(layout.valid_rows(), [3, 2, 0])
    np.testing.assert_array_equal(layout.used_tiles(), [3, 4, 7, 9])
    assert layout.replicas == 2


@pytest.mark.parametrize(
    ("precision", "col_block"), [(F16, 3), (f143(), 6), (f152(), 2), (F16, 5)]
)
def test_unaligned_column_block_is_refused(precision: Precision, col_block: int) -> None:
    tiles = np.arange(-(-16 // col_block), dtype=np.int32).reshape(1, -1, 1)
    with pytest.raises(
        CompileError, match=f"column block {col_block} of {precision.kind} is not word aligned"
    ):
        BlockLayout(2, 16, precision, 2, col_block, tiles)


def test_grid_that_does_not_cover_the_tensor_is_refused() -> None:
    tiles = np.zeros((2, 1, 1), dtype=np.int32)
    with pytest.raises(CompileError, match="layout grid 2x1 of 2x4 blocks does not cover 5x4"):
        BlockLayout(5, 4, F32, 2, 4, tiles)


def test_to_json_and_describe() -> None:
    tiles = np.arange(12, dtype=np.int32).reshape(2, 3, 2)
    layout = BlockLayout(7, 9, F16, 4, 4, tiles)
    assert layout.to_json() == {
        "rows": 7,
        "cols": 9,
        "precision": {"kind": "F16", "scale_exponent": 0},
        "row_block": 4,
        "col_block": 4,
        "grid": [2, 3, 2],
    }
    text = layout.describe()
    assert "tile_count: 12, replicas: 2" in text
    assert "partitions: 2, block_size: 4" in text and "partitions: 3, block_size: 4" in text
