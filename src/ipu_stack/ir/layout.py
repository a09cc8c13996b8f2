"""Block layouts: how a 2-D tensor view is split into blocks and spread over tiles.

A tensor (leading dimensions flattened into rows) is padded to a grid of
``row_blocks x col_blocks`` blocks of ``row_block x col_block`` elements.  Block ``(i, j)``
is stored row major on every tile of ``tiles[i, j, :]`` (its replicas) with a row pitch
rounded up to a whole exchange word (4 bytes), so every row starts word aligned.  This is the
reference's ``TensorTiling`` with two ``AxisTiling`` entries (``partitions``, ``block_size``,
``padding``) and ``replicas``; the logical element ``(r, c)`` lives on tile ``tiles[r //
row_block, c // col_block, k]`` at byte ``(r % row_block) * pitch + (c % col_block) *
itemsize`` from the block's address.  Elements beyond the tensor edge are padding that no
kernel reads (kernels take the valid extent of their block).

A ``transposed`` layout stores each block's transpose: ``col_block`` rows of ``row_block``
elements, the pitch a whole word of ``row_block``.  A swapped GEMM plan keeps its weight
blocks so (``planning.gemm``): the AMP streams rows that run along the depth.  Only the host
writes or reads such a layout; no exchange moves it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ipu_stack.ir.precision import Precision
from ipu_stack.util.errors import CompileError

WORD = 4


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@dataclass(frozen=True, eq=False)
class BlockLayout:
    """A 2-D block tiling of a ``rows x cols`` tensor with replicas over tiles."""

    rows: int
    cols: int
    precision: Precision
    row_block: int
    col_block: int
    tiles: np.ndarray  # int32 [row_blocks, col_blocks, replicas]
    transposed: bool = False  # each block stored as its transpose (module docstring)

    def __post_init__(self) -> None:
        rb, cb = self.grid
        if rb * self.row_block < self.rows or cb * self.col_block < self.cols:
            raise CompileError(
                f"layout grid {rb}x{cb} of {self.row_block}x{self.col_block} blocks "
                f"does not cover {self.rows}x{self.cols}"
            )
        if not self.transposed and self.col_block < self.cols and (
                self.col_block * self.precision.itemsize) % WORD:
            raise CompileError(
                f"column block {self.col_block} of {self.precision.kind} is not word aligned"
            )

    @property
    def grid(self) -> tuple[int, int]:
        return int(self.tiles.shape[0]), int(self.tiles.shape[1])

    @property
    def replicas(self) -> int:
        return int(self.tiles.shape[2])

    @property
    def stored_block(self) -> tuple[int, int]:
        """``(rows, elements a row)`` of a block as stored: the block, or its transpose."""
        if self.transposed:
            return self.col_block, self.row_block
        return self.row_block, self.col_block

    @property
    def pitch(self) -> int:
        """Bytes per stored block row (word aligned)."""
        return round_up(self.stored_block[1] * self.precision.itemsize, WORD)

    @property
    def block_bytes(self) -> int:
        return self.stored_block[0] * self.pitch

    def block_extent(self, i: int, j: int) -> tuple[int, int, int, int]:
        """Valid ``(row0, row1, col0, col1)`` of block ``(i, j)`` (may be empty at the edge)."""
        r0 = i * self.row_block
        c0 = j * self.col_block
        return r0, min(r0 + self.row_block, self.rows), c0, min(c0 + self.col_block, self.cols)

    def valid_rows(self) -> np.ndarray:
        """Valid rows of each row block: int64 ``[row_blocks]``."""
        starts = np.arange(self.grid[0]) * self.row_block
        return np.clip(self.rows - starts, 0, self.row_block)

    def valid_cols(self) -> np.ndarray:
        starts = np.arange(self.grid[1]) * self.col_block
        return np.clip(self.cols - starts, 0, self.col_block)

    def used_tiles(self) -> np.ndarray:
        t = self.tiles.ravel()
        return np.unique(t[t >= 0])

    def to_blocks(self, stored: np.ndarray) -> np.ndarray:
        """Stored-dtype tensor ``[rows, cols]`` -> bytes ``[row_blocks, col_blocks, block_bytes]``."""
        rb, cb = self.grid
        item = self.precision.itemsize
        padded = np.zeros((rb * self.row_block, cb * self.col_block), dtype=self.precision.dtype)
        padded[: self.rows, : self.cols] = stored.reshape(self.rows, self.cols)
        blocks = padded.reshape(rb, self.row_block, cb, self.col_block).transpose(
            (0, 2, 3, 1) if self.transposed else (0, 2, 1, 3))
        lines, width = self.stored_block
        raw = np.ascontiguousarray(blocks).view(np.uint8).reshape(rb, cb, lines, -1)
        out = np.zeros((rb, cb, lines, self.pitch), dtype=np.uint8)
        out[..., : width * item] = raw
        return out.reshape(rb, cb, self.block_bytes)

    def from_blocks(self, blocks: np.ndarray) -> np.ndarray:
        """Inverse of :meth:`to_blocks`: bytes per block -> stored-dtype ``[rows, cols]``."""
        rb, cb = self.grid
        item = self.precision.itemsize
        lines, width = self.stored_block
        raw = blocks.reshape(rb, cb, lines, self.pitch)[..., : width * item]
        data = np.ascontiguousarray(raw).view(self.precision.dtype).reshape(rb, cb, lines, width)
        full = data.transpose((0, 3, 1, 2) if self.transposed else (0, 2, 1, 3))
        return full.reshape(rb * self.row_block, cb * self.col_block)[: self.rows, : self.cols]

    def describe(self) -> str:
        rb, cb = self.grid
        return (
            f"TensorTiling {{ tile_count: {len(self.used_tiles())}, replicas: {self.replicas}, "
            f"axes: [AxisTiling {{ axis: FromEnd(1), partitions: {rb}, block_size: "
            f"{self.row_block}, padding: Zero }}, AxisTiling {{ axis: FromEnd(0), partitions: "
            f"{cb}, block_size: {self.col_block}, padding: Zero }}] }}"
        )

    def human(self) -> str:
        """The layout as a person reads it on the placement page, ``[729, 1152] FP8 F143 ×
        2^-4, 4 × 4 blocks of 184 × 288 over 1,440 tiles, 90 replicas``: shape, precision
        (an FP8 scale exponent of 0 left out), block grid and block size, tiles used, copies
        of each block.  :meth:`describe` stays the reference's log format, which the logs
        and placement failures keep."""
        p = self.precision
        precision = f"FP8 {p.kind[2:]}" if p.is_fp8 else p.kind
        if p.scale_exponent:
            precision += f" × 2^{p.scale_exponent}"
        rb, cb = self.grid
        blocks = "1 block" if rb * cb == 1 else f"{rb} × {cb} blocks"
        tiles, replicas = len(self.used_tiles()), self.replicas
        return (f"[{self.rows}, {self.cols}] {precision}, {blocks} of {self.row_block} × "
                f"{self.col_block} over {tiles:,} tile{'s' * (tiles != 1)}, "
                f"{replicas:,} replica{'s' * (replicas != 1)}"
                + (", each block stored transposed" if self.transposed else ""))

    def to_json(self) -> dict:
        return {
            "rows": self.rows,
            "cols": self.cols,
            "precision": self.precision.to_json(),
            "row_block": self.row_block,
            "col_block": self.col_block,
            "grid": [*self.tiles.shape],
            **({"transposed": True} if self.transposed else {}),
        }
