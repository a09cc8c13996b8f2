"""An RMS norm split by columns over tiles (a decode step's few wide rows): each tile's sums
of squares of its blocks, an exchange, each tile's scaling of its columns.  The split gives
the bits the whole row on one tile gives (both sum the same blocks in the same order), the
host reference follows them, the planner and the device price the two calls alike, and a
decode step lowered so runs fewer cycles with the same logits."""

from __future__ import annotations

import numpy as np
import pytest
from tests.helpers import bench

from ipu_stack.ir.graph import GraphBuilder
from ipu_stack.ir.interpret import evaluate
from ipu_stack.ir.one_pass import rms_blocks
from ipu_stack.ir.precision import F16, F32
from ipu_stack.ir.types import TensorType
from ipu_stack.kernels.base import KernelInstance
from ipu_stack.kernels.rowwise import row_params
from ipu_stack.lowering import base as lowering_base
from ipu_stack.phases import stages as stage_phases
from ipu_stack.planning.costs import kernel_cost

WIDTH, ROWS, EPS = 2048, 2, 1e-5


def test_rms_blocks_split_only_wide_rows_into_whole_vectors() -> None:
    """16 blocks of a 2,048-wide row (128 columns each), 9 of SmolLM2's 576, none below 512
    columns or of a width that is not whole 8-lane vectors."""
    assert rms_blocks(2048) == 16 and rms_blocks(1024) == 16 and rms_blocks(4096) == 16
    assert rms_blocks(576) == 9 and rms_blocks(512) == 8
    assert rms_blocks(1000) == 5 and rms_blocks(1004) == 1 and rms_blocks(504) == 1
    for width in (512, 576, 960, 1024, 1152, 2048, 3072, 5120):
        blocks = rms_blocks(width)
        assert width % blocks == 0 and (width // blocks) % 8 == 0 and width // blocks >= 64


def _run(params: dict, mem: np.ndarray, tiles: np.ndarray, addresses: list) -> list:
    return KernelInstance("row", params).impl.run(params, mem, tiles, addresses)


def _split(x: np.ndarray, gamma: np.ndarray, pieces: int) -> np.ndarray:
    """The two calls on ``pieces`` simulated tiles, the sums' exchange done by hand."""
    cols = WIDTH // pieces
    tiles = np.arange(pieces)
    mem = np.zeros((pieces, 40000), dtype=np.uint8)
    sums_at, gamma_at, out_at = 20000, 24000, 30000
    for tile in tiles:
        piece = x[:, tile * cols:(tile + 1) * cols]
        mem[tile, :piece.size * 2] = np.ascontiguousarray(piece).view(np.uint8).ravel()
        mem[tile, gamma_at:gamma_at + cols * 2] = gamma[tile * cols:(tile + 1) * cols].view(
            np.uint8)
    here = rms_blocks(WIDTH) // pieces
    sums = row_params("rms_sums", ROWS, cols, F16, cols * 2, F32, 4 * ROWS, width=WIDTH)
    work = _run(sums, mem, tiles, [0, -1, -1, sums_at + tiles * here * 4 * ROWS])
    assert work[0].kind == "rms_sums" and work[0].counts["blocks_here"] == here
    gathered = np.zeros(rms_blocks(WIDTH) * 4 * ROWS, dtype=np.uint8)
    for tile in tiles:  # every tile's sums to every tile
        at = sums_at + tile * here * 4 * ROWS
        gathered[tile * here * 4 * ROWS:(tile + 1) * here * 4 * ROWS] = \
            mem[tile, at:at + here * 4 * ROWS]
    mem[:, sums_at:sums_at + gathered.size] = gathered
    scale = row_params("rms_scale", ROWS, cols, F16, cols * 2, F16, cols * 2, F16, cols * 2,
                       eps=EPS, width=WIDTH)
    _run(scale, mem, tiles, [0, gamma_at, sums_at, out_at])
    out = mem[:, out_at:out_at + ROWS * cols * 2].view(np.float16).reshape(pieces, ROWS, cols)
    return np.concatenate(list(out), axis=1)


def test_a_split_rms_norm_gives_the_whole_rows_bits() -> None:
    """Over 16, 4 and 2 tiles the halves are those of the whole row on one tile and of the
    host reference at device precision, within F16 rounding of float64's RMS norm."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((ROWS, WIDTH)) * 3 + 0.5).astype(np.float16)
    gamma = (1 + 0.1 * rng.standard_normal(WIDTH)).astype(np.float16)
    mem = np.zeros((1, 24000), dtype=np.uint8)
    mem[0, :x.size * 2] = x.view(np.uint8).ravel()
    mem[0, 9000:9000 + WIDTH * 2] = gamma.view(np.uint8)
    whole = row_params("rms_norm", ROWS, WIDTH, F16, WIDTH * 2, F16, WIDTH * 2, F16, WIDTH * 2,
                       eps=EPS)
    _run(whole, mem, np.array([0]), [0, 9000, -1, 14000])
    one_tile = mem[0, 14000:14000 + x.size * 2].view(np.float16).reshape(ROWS, WIDTH)
    b = GraphBuilder("rms")
    xi = b.input("x", TensorType((ROWS, WIDTH), F16))
    g = b.weight("g", TensorType((WIDTH,), F16))
    b.output(b.op("rms_norm", [xi, g], F16, "out", eps=EPS))
    reference = evaluate(b.build(), {"x": x.astype(np.float32), "g": gamma.astype(np.float32)})
    np.testing.assert_array_equal(one_tile.astype(np.float32), reference["out"])
    for pieces in (16, 4, 2):
        np.testing.assert_array_equal(_split(x, gamma, pieces), one_tile)
    x64 = x.astype(np.float64)
    exact = x64 / np.sqrt((x64 * x64).mean(axis=-1, keepdims=True) + EPS) * gamma
    assert np.abs(one_tile - exact).max() <= 4 * np.spacing(np.float16(np.abs(exact).max()))


@pytest.mark.parametrize("rows", [1, 2, 3, 4])
def test_split_calls_are_priced_alike_by_the_planner_and_the_device(rows: int) -> None:
    """NormCE's split loops over a tile's 128 columns of a 2,048-wide row: the sums' call
    (partial sums, a merge, a block) and the scaling call (a merge, 15 further blocks'
    sums, the normalise), each with the supervisor's 180; by hand at one row."""
    from ipu_stack.device.pricing import price_work

    cols = 128
    mem = np.zeros((1, 8000), dtype=np.uint8)
    sums = row_params("rms_sums", rows, cols, F16, cols * 2, F32, 4 * rows, width=WIDTH)
    scale = row_params("rms_scale", rows, cols, F16, cols * 2, F16, cols * 2, F16, cols * 2,
                       eps=EPS, width=WIDTH)
    priced = []
    for params, addresses in ((sums, [0, -1, -1, 4000]), (scale, [0, 2000, 4000, 6000])):
        work = _run(params, mem, np.array([0]), addresses)
        assert price_work(work[0]) == kernel_cost(KernelInstance("row", params))
        priced.append(price_work(work[0]))
    if rows == 1:  # chunk 24 a worker: 6 (24/4 + 52 + 35) + 180; 6 (35 + 15 x 4 + 24 + 38) + 180
        assert priced == [738, 1122]
    if rows == 4:  # three rows, then one row (no sync between the calls)
        assert priced[0] > 738 + 738 - 6 * 35


def test_a_decode_step_splits_its_wide_rows_by_columns(tmp_path, monkeypatch) -> None:
    """A 1,024-wide decode step at batch 1: its norms, adds and casts split over 16 tiles
    take fewer cycles than whole rows on one tile, with the same logits to the bit, and the
    planner's estimate is the device's count."""
    args = ["--dim", "1024", "--hidden", "256", "--layers", "2", "--heads", "8",
            "--kv-heads", "2", "--vocab", "64", "--context", "6", "--tokens", "1",
            "--finalists", "1"]
    # one finalist, the planner's cheapest: the same GEMM plans (so the same partial sums)
    # in both runs, whichever the lowered programs' schedules would have preferred
    monkeypatch.setattr(stage_phases, "side_by_side_choice", lambda build, plans: [])
    runs = {}
    for split in (3, 0):
        monkeypatch.setattr(lowering_base, "SPLIT_ROWS", split)
        folder = tmp_path / f"split{split}"
        run = bench("smollm2-135m", *args, "--save-tensors", str(folder / "tensors"),
                    folder=folder, cache_dir=folder / "cache")
        assert run.record["numericalTest"] == "PASS" and run.record["estimateError"] == 0.0
        runs[split] = run.record["cycles"], np.load(folder / "tensors" / "outputs.npz")["logits"]
    assert runs[3][0] < runs[0][0] - 8000
    np.testing.assert_array_equal(runs[3][1], runs[0][1])


def test_a_row_of_heads_is_normalised_head_by_head() -> None:
    """Qwen3's QK-norm: each 64-wide head of a 256-wide row normalised on its own (``group``),
    one head's scale for every head.  The device kernel, the host reference at device
    precision and the scalar model of NormCE's loops over rows of one head give the same
    halves; the planner and the device price it as that many 64-wide rows; a group that
    does not divide the row is refused before anything runs."""
    from ipu_stack.device.pricing import price_work
    from ipu_stack.testing.reference import rms_norm_normce
    from ipu_stack.util.errors import CompileError

    rows, head, heads = 3, 64, 4
    cols = head * heads
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((rows, cols)) * np.array([0.2, 1, 4, 9]).repeat(head)
         ).astype(np.float16)  # heads of different scales: one row-wide norm would not do
    one_head = (1 + 0.1 * rng.standard_normal(head)).astype(np.float16)
    gamma = np.tile(one_head, heads)
    mem = np.zeros((1, 8000), dtype=np.uint8)
    mem[0, :x.size * 2] = x.view(np.uint8).ravel()
    mem[0, 2000:2000 + cols * 2] = gamma.view(np.uint8)
    params = row_params("rms_norm", rows, cols, F16, cols * 2, F16, cols * 2, F16, cols * 2,
                        eps=EPS, group=head)
    work = _run(params, mem, np.array([0]), [0, 2000, -1, 4000])
    device = mem[0, 4000:4000 + x.size * 2].view(np.float16).reshape(rows, cols)
    b = GraphBuilder("qk_norm")
    xi = b.input("x", TensorType((rows, cols), F16))
    g = b.weight("g", TensorType((cols,), F16))
    b.output(b.op("rms_norm", [xi, g], F16, "out", eps=EPS, group=head))
    reference = evaluate(b.build(), {"x": x.astype(np.float32), "g": gamma.astype(np.float32)})
    model = rms_norm_normce(x.reshape(-1, head), one_head, EPS).reshape(rows, cols)
    np.testing.assert_array_equal(device.astype(np.float32), reference["out"])
    np.testing.assert_array_equal(device.astype(np.float64), model)
    assert work[0].kind == "normce_rms" and work[0].counts["width"] == head
    heads_as_rows = row_params("rms_norm", rows * heads, head, F16, head * 2, F16, head * 2,
                               F16, head * 2, eps=EPS)
    assert price_work(work[0]) == kernel_cost(KernelInstance("row", params)) == \
        kernel_cost(KernelInstance("row", heads_as_rows))
    with pytest.raises(ValueError, match="group 48 does not divide its 256 columns"):
        _run({**params, "group": 48}, mem, np.array([0]), [0, 2000, -1, 4000])
    b = GraphBuilder("bad")
    xi = b.input("x", TensorType((rows, cols), F16))
    g = b.weight("g", TensorType((cols,), F16))
    with pytest.raises(CompileError, match="group 48 does not divide its 256 columns"):
        b.op("rms_norm", [xi, g], F16, "out", eps=EPS, group=48)
