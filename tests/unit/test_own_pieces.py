"""GEMM grids kept off the operand pieces their tiles hold (``lowering.own_pieces``).

A tile that holds a piece of the block its cell reads would copy it across on its own tile
(a tile cannot send to itself): a superstep of its own on a decode step's critical path. The
trade moves such tiles to cells they hold nothing of; the grid keeps its tiles, every cell
still has one, pairs stay pairs, and the lowered program reads every operand block whole.
"""

from __future__ import annotations

import numpy as np
import pytest

from ipu_stack.lowering import gemm_stage
from ipu_stack.lowering.driver import lower
from ipu_stack.lowering.own_pieces import OperandNeed, keep_off_own_pieces
from ipu_stack.pipeline import stage_shape
from ipu_stack.planning.gemm import gemm_candidates
from ipu_stack.planning.stages import GemmStage, find_stages
from ipu_stack.target import IPU21
from ipu_stack.workloads import get_workload


def _depth_need(depth_block: int):
    """Cell ``(g, r, c, d)`` of a one-row GEMM reads row 0, columns of depth block ``d``."""
    return lambda cell: (0, 1, cell[3] * depth_block, (cell[3] + 1) * depth_block)


def _reads_own_piece(grid: np.ndarray, need: OperandNeed) -> list[int]:
    clashes = []
    for r, c, d in np.ndindex(grid.shape):
        tile = int(grid[r, c, d])
        wanted = need.need((0, r, c, d))
        for rect in need.held.get(tile, ()):
            if rect[0] < wanted[1] and wanted[0] < rect[1] and rect[2] < wanted[3] \
                    and wanted[2] < rect[3]:
                clashes.append(tile)
    return clashes


@pytest.mark.parametrize("paired", [False, True])
def test_tiles_trade_cells_off_the_pieces_they_hold(paired: bool) -> None:
    """A [1 x 64] row in depth blocks of 16 on a 1 x 4 x 4 grid: tiles 0..3 read depth 0
    when column blocks are innermost; tiles 0, 1 and 2 hold columns of depth block 0."""
    grid = np.arange(16, dtype=np.int32).reshape(1, 4, 4).transpose(0, 2, 1).copy()
    need = OperandNeed({0: [(0, 1, 0, 4)], 1: [(0, 1, 4, 8)], 2: [(0, 1, 8, 12)]},
                       _depth_need(16))
    assert _reads_own_piece(grid, need) == [0, 1, 2]
    (traded,) = keep_off_own_pieces([grid], [need], paired)
    assert _reads_own_piece(traded, need) == []
    assert sorted(traded.ravel().tolist()) == list(range(16))  # the same tiles, a cell each
    moved = np.flatnonzero(traded.ravel() != grid.ravel())
    assert 0 < len(moved) <= 8  # the clashing tiles and their partners only
    if paired:  # a pair of tiles reads one depth block from two adjacent column blocks
        for r, d, c in np.ndindex(1, 4, 2):
            a, b = traded[r, 2 * c, d], traded[r, 2 * c + 1, d]
            assert a % 2 == 0 and b == a + 1


def test_a_grid_with_no_free_cell_is_left_as_it_is() -> None:
    """Every tile holds a piece of every depth block: no trade helps, none is made."""
    grid = np.arange(4, dtype=np.int32).reshape(1, 2, 2)
    need = OperandNeed({t: [(0, 1, 0, 32)] for t in range(4)}, _depth_need(16))
    (kept,) = keep_off_own_pieces([grid], [need], False)
    assert kept is grid


def _decode_copies(workload: str, trade: bool, monkeypatch) -> tuple[list[str], object]:
    if not trade:
        monkeypatch.setattr(gemm_stage, "keep_off_own_pieces", lambda grids, needs, p: grids)
    model = get_workload(workload)
    graph, _ = model.build(model.resolve({"layers": 1, "tokens": 1, "context": 32,
                                          "batch": 1}))
    stages = find_stages(graph)
    plans = [gemm_candidates(stage_shape(graph, s), IPU21)[0] if isinstance(s, GemmStage)
             else None for s in stages]
    program = lower(graph, list(zip(stages, plans, strict=True)), IPU21, paired=True)
    monkeypatch.undo()
    return [c.name for c in program.compute_sets() if c.name.endswith(".copy")], program


def test_a_decode_layer_reads_its_gemm_operands_without_copies(monkeypatch) -> None:
    """TinyLlama's decode layer at one row: without the trade the key and value caches, the
    attention context and SwiGLU's output sit on tiles of the grids that read them (five
    on-tile copy supersteps); with it, and the embedding's holders off the tiles its row
    lands on, no tile copies anything across."""
    before, _ = _decode_copies("tinyllama-1.1b", False, monkeypatch)
    after, program = _decode_copies("tinyllama-1.1b", True, monkeypatch)
    gemm_copies = [n for n in before if ".operands.copy" in n or ".right.copy" in n]
    assert len(gemm_copies) >= 5
    assert not [n for n in after if ".operands.copy" in n or ".right.copy" in n]
    assert after == []
    for step in program.exchanges():  # and no tile sends to itself
        for k in range(step.transfers):
            lo, hi = step.dst_offsets[k], step.dst_offsets[k + 1]
            assert step.src_tile[k] not in step.dst_tile[lo:hi]
