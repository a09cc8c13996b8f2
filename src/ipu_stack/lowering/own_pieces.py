"""Keeping a GEMM grid's tiles off the operand pieces they already hold.

A tile cannot send to itself: where a tile of a GEMM's grid holds a piece of the operand
block it needs (the previous stage's output landed there), the exchange leaves that piece
out and the tile copies it across in a compute set of its own, an on-tile copy superstep
(the reference's measured six-worker copy, 288 cycles for a few bytes) on the critical path
of a decode step. Which cell of the grid a tile takes is free: every cell holds one block of
the same size, and the exchange costs the same wherever the cells lie. So before a grid is
laid out, each tile holding a piece of the block its cell needs trades cells with the
nearest tile that holds nothing either of them needs; paired tiles trade as pairs, so a
broadcast still reaches whole pairs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from ipu_stack.lowering.base import Piece

Rect = tuple[int, int, int, int]  # rows [r0, r1), columns [c0, c1) of a tensor
Cell = tuple[int, int, int, int]  # (group, row block, column block, depth block)


@dataclass(frozen=True)
class OperandNeed:
    """One operand of a grid: the blocks each tile holds, and the block each cell reads."""

    held: dict[int, list[Rect]]
    need: Callable[[Cell], Rect]


def held_blocks(pieces: list[Piece], tiles: set[int]) -> dict[int, list[Rect]]:
    """The blocks of a value (its pieces) that ``tiles`` hold, in tensor coordinates."""
    held: dict[int, list[Rect]] = {}
    wanted = np.fromiter(sorted(tiles), dtype=np.int64)
    for piece in pieces:
        layout = piece.layout
        hits = np.isin(layout.tiles, wanted)
        for i, j, k in zip(*np.nonzero(hits), strict=True):
            r0, r1, c0, c1 = layout.block_extent(int(i), int(j))
            if r1 > r0 and c1 > c0:
                held.setdefault(int(layout.tiles[i, j, k]), []).append(
                    (r0 + piece.row0, r1 + piece.row0, c0 + piece.col0, c1 + piece.col0))
    return held


def _overlaps(a: Rect, b: Rect) -> bool:
    return a[0] < b[1] and b[0] < a[1] and a[2] < b[3] and b[2] < a[3]


def _units(tile_of: dict[Cell, int], paired: bool) -> list[tuple[Cell, ...]]:
    """The cells that move together, in tile order: a tile pair's two cells where tiles are
    paired, else one cell."""
    by_tile = sorted((tile, cell) for cell, tile in tile_of.items())
    if not paired:
        return [(cell,) for _, cell in by_tile]
    units: dict[int, list[Cell]] = {}
    for tile, cell in by_tile:
        units.setdefault(tile // 2, []).append(cell)
    return [tuple(cells) for _, cells in sorted(units.items())]


def keep_off_own_pieces(grids: list[np.ndarray], operands: list[OperandNeed],
                        paired: bool) -> list[np.ndarray]:
    """``grids`` (one ``[rows, cols, depth]`` array of tiles a group) with the cells of
    tiles that hold a piece of their own block traded away (module docstring); the same
    arrays where no tile does."""
    operands = [op for op in operands if op.held]
    if not operands:
        return grids
    tile_of = {(g, *map(int, index)): int(grid[index])
               for g, grid in enumerate(grids) for index in np.ndindex(grid.shape)}

    def clash(tile: int, cell: Cell) -> bool:
        return any(_overlaps(op.need(cell), rect)
                   for op in operands for rect in op.held.get(tile, ()))

    def unit_clashes(unit: tuple[Cell, ...], tiles: list[int]) -> bool:
        return any(clash(tile, cell) for tile, cell in zip(tiles, unit, strict=True))

    units = _units(tile_of, paired)
    moved = False
    for i, unit in enumerate(units):
        tiles = [tile_of[cell] for cell in unit]
        if not unit_clashes(unit, tiles):
            continue
        for j in _nearest(i, len(units)):
            other = units[j]
            if len(other) != len(unit):
                continue
            others = [tile_of[cell] for cell in other]
            if unit_clashes(other, tiles) or unit_clashes(unit, others):
                continue
            for cell, tile in zip(other, tiles, strict=True):
                tile_of[cell] = tile
            for cell, tile in zip(unit, others, strict=True):
                tile_of[cell] = tile
            units[i], units[j] = other, unit
            moved = True
            break
    if not moved:
        return grids
    swapped = [grid.copy() for grid in grids]
    for (g, r, c, d), tile in tile_of.items():
        swapped[g][r, c, d] = tile
    return swapped


def _nearest(i: int, n: int) -> Iterator[int]:
    """Indices other than ``i`` in ``range(n)``, nearest first (ties: the later one)."""
    for step in range(1, n):
        if i + step < n:
            yield i + step
        if i - step >= 0:
            yield i - step
