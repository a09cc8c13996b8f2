"""Token lookups on the device (popops MultiSlice over a column-split table): the output is
exactly the table's rows, the cycles do not depend on the ids' values, and the CLIP text
encoder built on it passes its verdict."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ipu_stack.ir.graph import GraphBuilder
from ipu_stack.ir.precision import F16, Precision
from ipu_stack.ir.types import TensorType
from ipu_stack.pipeline import CompileOptions, compile_workload
from ipu_stack.runtime.execute import run_package
from ipu_stack.runtime.session import load_package
from ipu_stack.workloads.base import Workload
from ipu_stack.workloads.text import bert_inputs, causal_mask, token_ids
from tests.helpers import bench

I32 = Precision("I32")


def _lookup_workload(vocab: int, width: int, count: int, seed: int) -> tuple[Workload, dict]:
    rng = np.random.default_rng(seed)
    table = rng.standard_normal((vocab, width)).astype(np.float32)
    b = GraphBuilder("lookup")
    ids = b.input("ids", TensorType((count, 1), I32))
    weight = b.weight("table", TensorType((vocab, width), F16))
    b.output(b.op("embedding", [ids, weight], F16, "rows"))
    graph = b.build()
    tensors = {"ids": rng.integers(0, vocab, (count, 1)).astype(np.float32),
               "table": F16.round_trip(table)}
    workload = Workload("lookup", "a lookup", (), lambda params: (graph, tensors),
                        lambda params: f"lookup-v{vocab}-d{width}-n{count}")
    return workload, tensors


def _run(tmp_path: Path, cache_dir: Path, vocab: int, width: int, count: int,
         ids: np.ndarray | None = None):
    workload, tensors = _lookup_workload(vocab, width, count, 0)
    result = compile_workload(workload, {}, tmp_path / "pkg",
                              CompileOptions(cache_dir=str(cache_dir)))
    ids = tensors["ids"] if ids is None else ids
    ran = run_package(load_package(result.package), result.graph, {**tensors, "ids": ids},
                      poison=True)
    return ran, ids


def test_the_device_copies_exactly_the_rows_the_ids_name(tmp_path, cache_dir) -> None:
    # 3,000 columns of F16 over 1,472 tiles: blocks of 4 (750 holders), the last one whole
    ran, ids = _run(tmp_path, cache_dir, 97, 3000, 23)
    assert ran.passed
    table = np.random.default_rng(0).standard_normal((97, 3000)).astype(np.float32)
    expected = F16.round_trip(table)[ids.astype(np.int64).ravel()]
    assert np.array_equal(ran.outputs["rows"].reshape(23, 3000), expected)


def test_the_cycles_do_not_depend_on_the_ids(tmp_path, cache_dir) -> None:
    """Two sets of ids, one all the same row and one all different: the same cycles."""
    same = np.full((40, 1), 5, np.float32)
    spread = np.arange(40, dtype=np.float32).reshape(40, 1) * 3
    first, _ = _run(tmp_path / "a", cache_dir, 130, 70, 40, same)
    second, _ = _run(tmp_path / "b", cache_dir, 130, 70, 40, spread)
    assert first.passed and second.passed
    assert first.run.cycles == second.run.cycles


def test_token_ids_and_the_causal_mask_are_clips() -> None:
    ids = token_ids(0, "ids", 3, 9, 49408)[..., 0]
    assert (ids[:, 0] == 49406).all()
    for row in ids:  # words, then end of text to the end
        end = int(np.argmax(row == 49407))
        assert end >= 1 and (row[end:] == 49407).all() and (row[1:end] < 49406).all()
    mask = causal_mask(2, 3, 4)
    assert mask.shape == (24, 4)
    assert np.array_equal(np.isneginf(mask[4:8]), np.triu(np.ones((4, 4), bool), 1))
    assert (mask[np.isfinite(mask)] == 0).all()


def test_a_small_clip_text_encoder_passes(tmp_path, cache_dir) -> None:
    run = bench("clip-text", "--layers", "2", "--vocab", "500", "--dim", "64", "--heads", "4",
                "--hidden", "128", "--tokens", "16", "--batch", "2", folder=tmp_path,
                cache_dir=cache_dir)
    record = run.record
    assert record["numericalTest"] == "PASS", record
    assert record["estimatedCycles"] == record["cycles"]
    # the tokens: 32 column blocks of 2; 32 row groups of 16 rows (as many as the 32 ids
    # allow, within the 46 tiles a block leaves): each zeroes 32 x 2 halves, then slices all
    # 32 ids. The pooled rows: 2 ids into the 32 hidden rows, 2 groups of 16 rows
    tokens = 6 * (30 + -(-32 // 6) * (19 + 2 * 1))
    pooled = 6 * (30 + 1 * (19 + 2 * 1))
    assert record["multisliceCycles"] == tokens + pooled
    # 11 and 1 halves a worker: 22 and 2 bytes at 8 a cycle (rounded down, as the vendor)
    assert record["fillCycles"] == 6 * (26 + 2) + 6 * (26 + 0)
    assert record["qpsWithHost"] < record["qps"]


def test_bert_inputs_are_squad_shaped() -> None:
    ids, types = (v[..., 0] for v in bert_inputs(0, "ids", 4, 32, 30522))
    for row, kind in zip(ids, types, strict=True):
        separators = np.flatnonzero(row == 102)
        assert row[0] == 101 and len(separators) == 2 and separators[1] == 31
        assert (kind[: separators[0] + 1] == 0).all() and (kind[separators[0] + 1:] == 1).all()


def test_small_bert_and_roberta_encoders_pass(tmp_path, cache_dir) -> None:
    """Post-norm layers and two lookups (BERT's words and token types; RoBERTa's words)."""
    for name, lookups in (("bert-base", 2), ("roberta-base", 1)):
        run = bench(name, "--layers", "2", "--vocab", "700", "--dim", "64", "--heads", "4",
                    "--hidden", "128", "--tokens", "24", "--batch", "2",
                    folder=tmp_path / name, cache_dir=cache_dir)
        record = run.record
        assert record["numericalTest"] == "PASS", record
        assert record["estimatedCycles"] == record["cycles"]
        assert record["inputBytes"] == lookups * 2 * 24 * 4  # I32 ids (and types)
