"""popnn's argmax vertices on fake tile memory (each worker's first largest value and its
column; a row's pairs reduced to the first largest), their price against the vendor's
estimators by hand, and the argmax stage compiled and run: the columns numpy chooses,
ties to the first, the planner's estimate equal to the device's cycles, a verdict that
fails on a wrong column."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ipu_stack.device.pricing import price_work
from ipu_stack.ir.graph import GraphBuilder, fidelity_values
from ipu_stack.ir.interpret import evaluate
from ipu_stack.ir.precision import Precision
from ipu_stack.ir.types import TensorType
from ipu_stack.kernels.argmax import gather_params, sparse_params
from ipu_stack.kernels.base import KernelInstance
from ipu_stack.pipeline import CompileOptions, compile_workload
from ipu_stack.planning.costs import kernel_cost
from ipu_stack.runtime.execute import run_package
from ipu_stack.runtime.session import load_package
from ipu_stack.target.timing import Work
from ipu_stack.util.errors import CompileError
from ipu_stack.verdict.judge import judge
from ipu_stack.workloads.base import Workload

F16, I32 = Precision("F16"), Precision("I32")


def _pairs(mem: np.ndarray, tile: int, at: int, rows: int, count: int, pitch: int
           ) -> tuple[np.ndarray, np.ndarray]:
    raw = np.stack([mem[tile, at + r * pitch: at + r * pitch + 8 * count] for r in range(rows)])
    words = raw.view("<u4").reshape(rows, count, 2)
    return words[..., 0].copy().view(np.float32), words[..., 1].copy().view(np.int32)


def test_gather_writes_each_workers_first_largest_value_and_its_column() -> None:
    rows, cols = 3, 20  # workers take 4 columns each: five pairs a row
    x = np.random.default_rng(1).standard_normal((rows, cols)).astype(np.float16)
    x[1, 5] = x[1, 6] = 9.0  # a tie inside worker 1's columns: the first is kept
    mem = np.zeros((2, 1024), dtype=np.uint8)
    for r in range(rows):
        mem[1, 40 * r: 40 * r + 2 * cols] = x[r].view(np.uint8)
    params = gather_params(rows, cols, F16, 40, 1000, 48)
    work = KernelInstance("argmax", params).impl.run(params, mem, np.array([1]), [0, 512])
    values, columns = _pairs(mem, 1, 512, rows, 5, 48)
    chunks = x.astype(np.float32).reshape(rows, 5, 4)
    assert (values == chunks.max(axis=2)).all()
    assert (columns == 1000 + np.arange(5) * 4 + chunks.argmax(axis=2)).all()
    assert columns[1, 1] == 1005
    assert not mem[0].any()
    assert work[0].counts == {"rows": 3, "busiest": 4}


def test_sparse_keeps_the_first_largest_pair_and_the_last_level_its_column() -> None:
    rows, count = 7, 9
    rng = np.random.default_rng(2)
    values = rng.standard_normal((rows, count)).astype(np.float32)
    values[4, 2] = values[4, 7] = 5.0
    columns = rng.integers(0, 50_000, (rows, count)).astype(np.int32)
    pairs = np.stack([values.view(np.uint32), columns.view(np.uint32)], axis=-1)
    mem = np.zeros((1, 4096), dtype=np.uint8)
    mem[0, : pairs.nbytes] = pairs.view(np.uint8).ravel()
    best = values.argmax(axis=1)
    for final, pitch in ((False, 8), (True, 4)):
        params = sparse_params(rows, count, 8 * count, pitch, final)
        KernelInstance("argmax", params).impl.run(params, mem, np.array([0]), [0, 2048])
        if final:
            chosen = mem[0, 2048: 2048 + 4 * rows].view("<i4")
        else:
            kept, chosen = _pairs(mem, 0, 2048, rows, 1, 8)
            assert (kept[:, 0] == values.max(axis=1)).all()
        assert (np.ravel(chosen) == columns[np.arange(rows), best]).all()
    assert best[4] == 2


@pytest.mark.parametrize(("rows", "busiest", "expected"), [
    (1, 19, 6 * (30 + 3 * 18) + 9),  # smollm2's LM head: a row of 112 columns a tile
    (32, 6, 32 * (6 * (30 + 3 * 5) + 9)),
])
def test_the_gather_price_is_the_vendors_estimator(rows, busiest, expected) -> None:
    assert price_work(Work("argmax_gather", {"rows": rows, "busiest": busiest})) == expected
    params = gather_params(rows, 6 * busiest, F16, 12 * busiest, 0, 48)
    assert kernel_cost(KernelInstance("argmax", params)) == expected


@pytest.mark.parametrize(("rows", "count", "expected"), [
    (1, 32, 6 * (27 + 3 * 31)),  # one vertex: one worker, the tile's six cycles a step
    (7, 5, 6 * 2 * (27 + 3 * 4)),  # seven rows over six workers: one worker runs two
])
def test_the_sparse_price_is_the_vendors_estimator(rows, count, expected) -> None:
    assert price_work(Work("argmax_sparse", {"rows": rows, "pairs": count})) == expected
    params = sparse_params(rows, count, 8 * count, 4, True)
    assert kernel_cost(KernelInstance("argmax", params)) == expected


def _workload(rows: int, dim: int, vocab: int, tie: bool = False) -> Workload:
    def build(params: dict) -> tuple:
        rng = np.random.default_rng(7)
        b = GraphBuilder("argmax")
        x = b.input("x", TensorType((rows, dim), F16))
        logits = b.op("matmul", [x, b.weight("w", TensorType((dim, vocab), F16))], F16,
                      "logits")
        b.output(b.op("argmax", [logits], I32, "next_token"))
        w = rng.standard_normal((dim, vocab)) / np.sqrt(dim)
        x = rng.standard_normal((rows, dim))
        if tie:  # two columns the same, every row's largest value twice (positive rows)
            w[:, vocab - 1] = w[:, 3] = 4.0
            x = np.abs(x)
        return b.build(), {"x": x.astype(np.float32), "w": w.astype(np.float32)}
    return Workload(name="argmax", description="an LM head and its argmax", parameters=(),
                    build=build, identifier=lambda p: f"argmax-{rows}-{dim}-{vocab}-{tie}")


@pytest.mark.parametrize(("rows", "dim", "vocab", "tie"), [
    (1, 64, 4000, False), (5, 32, 1003, False), (3, 16, 700, True)])
def test_the_stage_chooses_numpys_columns(rows, dim, vocab, tie, tmp_path: Path,
                                          lock_path: Path) -> None:
    result = compile_workload(_workload(rows, dim, vocab, tie), {}, tmp_path, CompileOptions())
    run = run_package(load_package(result.package), result.graph, result.tensors, lock_path)
    x = result.tensors["x"].astype(np.float16).astype(np.float64)
    w = result.tensors["w"].astype(np.float16).astype(np.float64)
    logits = x @ w  # float64, from the F16 operands
    chosen = run.outputs["next_token"].reshape(-1).astype(int)
    assert run.passed
    # the largest of numpy's logits, or within the F16 rounding of the device's of it
    assert (logits[np.arange(rows), chosen] >= logits.max(axis=1) - 2e-3 * np.abs(
        logits).max()).all()
    # and exactly the first largest of the host reference's F16 logits
    held = evaluate(result.graph, dict(result.tensors))["logits"].reshape(rows, vocab)
    assert (chosen == held.argmax(axis=1)).all()
    if tie:
        assert (chosen == 3).all()  # the first of the equal largest
    assert result.estimate["cycles"] == run.run.cycles
    assert run.run.host_cycles < 200  # 4 bytes a row back, not the logits
    assert fidelity_values(result.graph) == {"next_token": "logits"}


def test_a_wrong_column_fails_the_verdict(tmp_path: Path, lock_path: Path) -> None:
    result = compile_workload(_workload(2, 32, 900), {}, tmp_path, CompileOptions())
    reference = evaluate(result.graph, dict(result.tensors))
    device = {name: np.asarray(reference[name], np.float32) for name in ("logits", "next_token")}
    assert judge(result.graph, dict(result.tensors), device, reference).passed
    device["next_token"] = device["next_token"] + 1
    verdict = judge(result.graph, dict(result.tensors), device, reference)
    assert not verdict.passed and verdict.first_failure.stage == "next_token"


def test_argmax_of_ids_is_refused() -> None:
    b = GraphBuilder("ids")
    ids = b.input("ids", TensorType((2, 4), I32))
    with pytest.raises(CompileError, match="argmax takes values, not I32 ids"):
        b.op("argmax", [ids], I32, "chosen")


def test_a_hostile_worker_size_is_held_to_the_block() -> None:
    """A package's ``worker_size`` far above its block's columns (hostile input) sizes
    nothing larger than the block: one worker takes the whole block."""
    x = np.array([[1.0, 7.0, 3.0, 7.0]], np.float16)
    mem = np.zeros((1, 256), dtype=np.uint8)
    mem[0, :8] = x.view(np.uint8).ravel()
    params = {**gather_params(1, 4, F16, 8, 40, 8), "worker_size": 1 << 20}
    work = KernelInstance("argmax", params).impl.run(params, mem, np.array([0]), [0, 64])
    values, columns = _pairs(mem, 0, 64, 1, 1, 8)
    assert values[0, 0] == 7.0 and columns[0, 0] == 41
    assert work[0].counts == {"rows": 1, "busiest": 4}
