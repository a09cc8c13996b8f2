"""Helpers more than one test file needs: the CLI in-process, a ``bench`` run and its record,
an independent tanh GELU, an independent numpy Llama forward pass, random stored tensors,
the entries of an on-disk cache, the small layer sizes and an injected softmax fault.

One copy each, so that a change to how the suite drives the command line (or what a random
FP8 operand looks like) is made once.  ``cli`` and ``gelu_tanh`` are those of
``ipu_stack.testing`` (shared with the benchmarks).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

# both import nothing from the stack at module level: the float64 references stay independent
from ipu_stack.testing.reference import gelu_tanh
from ipu_stack.testing.runner import cli

if TYPE_CHECKING:
    from ipu_stack.ir.precision import Precision

__all__ = ["Bench", "bench", "cache_entries", "cli", "gelu_tanh", "llama_forward", "one_error_line",
           "placement_fails_on_call", "random_stored", "small", "snapshot",
           "softmax_times_1_01", "stages_left_at_finish"]

SMALL_LAYER = ["--tokens", "17", "--dim", "64", "--heads", "4", "--hidden", "96"]


def small(workload: str) -> list[str]:
    """The small layer sizes (17 tokens = CLS + a 4 x 4 patch grid, 64 dims, 4 heads of 16,
    MLP 96); the attention block has no MLP, so no ``--hidden``."""
    return SMALL_LAYER[:-2] if workload == "attention" else SMALL_LAYER


def one_error_line(code: int, stderr: str) -> str:
    """The single ``error:`` line of a command that failed the documented way (exit 2, one
    line, no traceback); asserts that it did."""
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert code == 2, (code, stderr)
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


@dataclass
class Bench:
    """One ``ipu-stack -v bench --json`` run: its exit code, record, log (stderr) and the folder
    it was given (the package is ``folder/pkg/model.ipuexe``)."""

    code: int
    record: dict
    stderr: str
    folder: Path


def bench(workload: str, *extra: str, folder: Path, cache_dir: Path, lock: Path | None = None,
          finalists: int = 1, check_exit: bool = True) -> Bench:
    """``ipu-stack bench WORKLOAD EXTRA... --json`` with its package in ``folder/pkg``, a
    private device lock (``folder/lock`` unless given) and the session's cache.

    ``check_exit``: assert the exit code is the one the record's verdict calls for (0 on PASS,
    1 on FAIL), as every caller that reads the record wants.
    """
    code, out, err = cli([
        "-v", "bench", workload, *extra, "--json", "--out", str(folder / "pkg"),
        "--lock", str(lock or folder / "lock"), "--cache-dir", str(cache_dir),
        "--finalists", str(finalists),
    ])
    assert out.strip(), (code, err[-2000:])
    record = json.loads(out.strip().splitlines()[-1])
    if check_exit:
        assert code == (0 if record["numericalTest"] == "PASS" else 1), (code, record)
    return Bench(code, record, err, folder)


def random_stored(rng: np.random.Generator, p: Precision, shape: tuple[int, ...],
                  std: float = 1.0, offset: float = 0.0) -> np.ndarray:
    """Random elements stored in ``p``: FP8 from random bytes (every code but NaN can appear,
    so the kernels meet subnormals and the largest values); otherwise normal values
    ``* std + offset`` rounded to ``p`` by numpy (not ipu_stack's own rounding, which the
    tests judge)."""
    if p.is_fp8:
        raw = rng.integers(0, 256, size=shape, dtype=np.uint8)
        raw[raw == 0x80] = 0  # no NaN operands
        return raw.view(p.dtype)
    return (rng.standard_normal(shape) * std + offset).astype(p.dtype)


def cache_entries(cache: Path, kind: str) -> list[Path]:
    """The entries of one kind (``calibration``, ``exchange``) of the on-disk cache."""
    return sorted((Path(cache) / kind).glob("*.json"))


def stages_left_at_finish(monkeypatch) -> list[int]:  # type: ignore[no-untyped-def]
    """A list that gets, each time a verdict finishes in this process, how many stages it
    still had to judge then (a host side that ran on a thread here)."""
    from ipu_stack.verdict.judge import StageJudge

    left: list[int] = []
    finish = StageJudge.finish

    def counting_finish(self, ideal=None):  # type: ignore[no-untyped-def]
        left.append(len(self.pending))
        return finish(self, ideal)

    monkeypatch.setattr(StageJudge, "finish", counting_finish)
    return left


def placement_fails_on_call(monkeypatch, number: int, why: str) -> None:  # type: ignore[no-untyped-def]
    """The compile's ``number``-th placement (1 is the first) fails with ``why``; every
    other placement is the real one."""
    import ipu_stack.phases.stages as stages_module
    from ipu_stack.util.errors import PlacementError

    original = stages_module.place_storage
    calls: list[int] = []

    def failing(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == number:
            raise PlacementError(why)
        return original(*args, **kwargs)

    monkeypatch.setattr(stages_module, "place_storage", failing)


def snapshot(folder: Path) -> dict[str, int]:
    """Relative path -> size of every file under ``folder`` (to prove nothing new appeared)."""
    return {str(p.relative_to(folder)): p.stat().st_size for p in folder.rglob("*") if p.is_file()}


def softmax_times_1_01(monkeypatch, layer: int) -> str:  # type: ignore[no-untyped-def]
    """Every softmax's probabilities scaled by 1.01 before they are stored (the row kernel
    is shared by all layers, so the first layer is the first to break); returns the first
    stage that breaks.  Scaled before the rounding: a stored FP8 probability (3 mantissa
    bits) scaled by 1.01 rounds back to the same code, a fault that would change nothing."""
    from ipu_stack.ir.precision import Precision
    from ipu_stack.kernels.base import FAMILIES, read_values, write_rows

    original = FAMILIES["row"]

    def run(p, mem, tiles, addresses):  # type: ignore[no-untyped-def]
        work = original.run(p, mem, tiles, addresses)
        if p["op"] == "softmax":
            x = read_values(mem, tiles, addresses[0], p["rows"], p["cols"], p["x_pitch"],
                            Precision.from_json(p["x"])) * np.float32(p["scale"])
            e = np.exp(x - x.max(axis=-1, keepdims=True))
            out = e / e.sum(axis=-1, keepdims=True)
            stored = Precision.from_json(p["out"]).quantize(out * np.float32(1.01))
            write_rows(mem, tiles, addresses[3], p["out_pitch"], stored.view(np.uint8))
        return work

    monkeypatch.setitem(FAMILIES, "row", dataclasses.replace(original, run=run))
    return "layer0.attn.probs"


def _rms_norm(x: np.ndarray, gamma: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * gamma


def _rotate_half(x: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], -1)


def llama_forward(t: dict[str, np.ndarray], p: dict) -> np.ndarray:
    """transformers' LlamaForCausalLM, written from its definition in numpy (float64)."""
    b, n, d = p["batch"], p["tokens"], p["dim"] // p["heads"]
    w = {k: np.asarray(v, np.float64) for k, v in t.items()}
    x = w["token_embedding"][t["ids"].reshape(b, n).astype(int)]
    angles = np.outer(np.arange(n), 1.0 / p["theta"] ** (np.arange(0, d, 2) / d))
    cos, sin = (np.concatenate([f(angles)] * 2, -1) for f in (np.cos, np.sin))
    causal = np.triu(np.full((n, n), -np.inf), 1)
    for i in range(p["layers"]):
        h = _rms_norm(x, w[f"layer{i}.ln1.gamma"], p["eps"])

        def heads(y: np.ndarray, count: int) -> np.ndarray:
            return y.reshape(b, n, count, d).transpose(0, 2, 1, 3)

        q = heads(h @ w[f"layer{i}.attn.q.w"], p["heads"])
        k = heads(h @ w[f"layer{i}.attn.k.w"], p["kv_heads"])
        v = heads(h @ w[f"layer{i}.attn.v.w"], p["kv_heads"])
        q, k = (y * cos + _rotate_half(y) * sin for y in (q, k))
        repeat = p["heads"] // p["kv_heads"]
        k, v = np.repeat(k, repeat, axis=1), np.repeat(v, repeat, axis=1)
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d) + causal
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        context = (probs @ v).transpose(0, 2, 1, 3).reshape(b, n, p["dim"])
        x = x + context @ w[f"layer{i}.attn.o.w"]
        h = _rms_norm(x, w[f"layer{i}.ln2.gamma"], p["eps"])
        gate, up = h @ w[f"layer{i}.gate.w"], h @ w[f"layer{i}.up.w"]
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[f"layer{i}.down.w"]
    return _rms_norm(x, w["final_norm.gamma"], p["eps"]) @ w["lm_head.w"]
