"""End to end on the transformer workloads, through the real CLI, checked against an
independent float64 forward pass (``tests/e2e/transformer_forward.py``) of the saved tensors.

Sizes are small (17 tokens = CLS + a 4 x 4 patch grid, 64 dims, 4 heads of 16, MLP 96) so the
whole module runs in seconds; the structure (heads, RoPE, residuals, FP8 activations) is that
of the full-size layers.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest

from ipu_stack.cli import main
from ipu_stack.verdict.tolerance import compare
from tests.e2e.transformer_forward import transformer_forward
from tests.helpers import Bench, bench, cli, small

HEADS = 4  # of the small sizes (``tests.helpers.small``)
EPS = {"siglip-layer": 1e-6, "pe-block": 1e-5, "siglip-attention": 1e-6, "attention": 1e-6,
       "vit-layer": 1e-6}
GELU = {"siglip-layer": "tanh", "pe-block": "erf", "siglip-attention": "tanh", "attention": "tanh",
        "vit-layer": "erf"}  # each workload's default, as its public model defines it

# id -> (workload, extra options, GELU form)
CASES = {
    "siglip-layer": ("siglip-layer", [], "tanh"),
    "pe-block": ("pe-block", [], "erf"),
    "siglip-attention": ("siglip-attention", [], "tanh"),
    "attention": ("attention", [], "tanh"),
    "vit-layer": ("vit-layer", [], "erf"),
    "vit-layer-gelu-tanh": ("vit-layer", ["--gelu", "tanh"], "tanh"),
    "siglip-layer-blocks2": ("siglip-layer", ["--blocks", "2"], "tanh"),
    "siglip-layer-batch2": ("siglip-layer", ["--batch", "2"], "tanh"),
    "siglip-layer-f16": ("siglip-layer", ["--precision", "f16"], "tanh"),
    "pe-block-batch2": ("pe-block", ["--batch", "2"], "erf"),
    "attention-f16": ("attention", ["--precision", "f16"], "tanh"),
    "siglip-layer-paired": ("siglip-layer", ["--paired-exchange"], "tanh"),
    # q, k, v and the probabilities in FP8: both attention products in the FP8 mode
    "siglip-layer-attention-fp8": ("siglip-layer", ["--attention", "fp8"], "tanh"),
    "pe-block-attention-fp8": ("pe-block", ["--attention", "fp8"], "erf"),
}


def _layer_bench(folder: Path, lock_path: Path, cache_dir: Path, workload: str,
                 *extra: str) -> Bench:
    """``bench`` at this file's small sizes with two finalists, the tensors saved in
    ``folder/tensors``."""
    return bench(workload, *small(workload), *extra, "--save-tensors", str(folder / "tensors"),
                 folder=folder, cache_dir=cache_dir, lock=lock_path, finalists=2)


def _load(run: Bench) -> tuple[dict[str, np.ndarray], np.ndarray]:
    saved = dict(np.load(run.folder / "tensors" / "inputs_weights.npz"))
    outputs = dict(np.load(run.folder / "tensors" / "outputs.npz"))
    (name,) = outputs
    return saved, outputs[name].reshape(-1, outputs[name].shape[-1])


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_layer_passes_and_matches_float64(tmp_path, lock_path, cache_dir, capsys,
                                          record_property, case):
    workload, extra, gelu = CASES[case]
    run = _layer_bench(tmp_path, lock_path, cache_dir, workload, *extra)
    assert run.code == 0
    assert run.record["numericalTest"] == "PASS"
    assert run.record["cycles"] > 0
    assert run.record["heads"] == HEADS and run.record["tokens"] == 17
    assert run.record["diagnosticCheckpoints"] == 0

    saved, device = _load(run)
    batch = int(extra[extra.index("--batch") + 1]) if "--batch" in extra else 1
    assert device.shape == (batch * 17, 64)
    assert np.isfinite(device).all()

    rounded = transformer_forward(saved, HEADS, EPS[workload], gelu, rounded=True)
    result = compare(device, rounded)
    assert result.passed, result

    ideal = compare(device, transformer_forward(saved, HEADS, EPS[workload], gelu, rounded=False))
    record_property("rounded_max_abs_error", result.max_abs_error)
    record_property("ideal_max_abs_error", ideal.max_abs_error)
    print(f"{case}: rounded float64 max error {result.max_abs_error:.3g} "
          f"(atol {result.atol:.3g}); ideal float64 max error {ideal.max_abs_error:.3g}")
    scale = float(np.abs(rounded).max())
    # Report, not a tight bound: FP8 activations put the ideal answer a few % away.
    assert ideal.max_abs_error < 0.1 * scale
    if "f16" in case:
        assert ideal.passed, ideal  # without FP8 only F16 rounding separates them


def test_rope_tables_and_rope_matter(tmp_path, lock_path, cache_dir, capsys):
    """The saved 2D RoPE tables follow PE's grid (patch positions from 1 after CLS), and the
    check sees RoPE: the device output does not agree with a forward pass without it."""
    run = _layer_bench(tmp_path, lock_path, cache_dir, "pe-block")
    saved, device = _load(run)
    cos, sin = saved["rope.cos"], saved["rope.sin"]
    head_dim = 64 // HEADS
    pairs, half = head_dim // 2, head_dim // 4
    assert cos.shape == sin.shape == (17, pairs)
    patch = np.arange(16)
    xs = np.concatenate([[0], patch % 4 + 1])
    ys = np.concatenate([[0], patch // 4 + 1])
    angles = np.concatenate([xs[:, None] * 10000.0 ** (-np.arange(half) / half),
                             ys[:, None] * 10000.0 ** (-np.arange(half) / half)], axis=1)
    np.testing.assert_allclose(cos, np.cos(angles), atol=1e-6)
    np.testing.assert_allclose(sin, np.sin(angles), atol=1e-6)
    assert (cos[0] == 1).all() and (sin[0] == 0).all()  # CLS is not rotated
    assert not (sin[1] == 0).all()  # the first patch is (1, 1), not CLS's zero rotation

    assert compare(device, transformer_forward(saved, HEADS, 1e-5, "erf")).passed
    assert not compare(device, transformer_forward(saved, HEADS, 1e-5, "erf", rope=False)).passed


@pytest.mark.parametrize("tokens", ["15", "18"])
def test_pe_block_rejects_token_counts_without_a_grid(tmp_path, capsys, tokens):
    code = main(["--quiet", "compile", "pe-block", "--tokens", tokens, "--dim", "64", "--heads", "4",
                 "--hidden", "96", "-o", str(tmp_path / "pkg")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err == [f"error: --tokens {tokens} forms no patch grid for 2D RoPE: it must be g*g or "
                   "1 + g*g (a CLS token and g x g patches), e.g. 576 or 577"]


def test_gelu_form_is_visible(tmp_path, lock_path, cache_dir, capsys):
    """``--gelu erf`` agrees with the erf forward better than with the tanh one, and the
    tanh form the other way round: the check tells the two apart."""
    run = _layer_bench(tmp_path, lock_path, cache_dir, "vit-layer", "--gelu", "erf")
    saved, device = _load(run)
    erf = compare(device, transformer_forward(saved, HEADS, 1e-6, "erf"))
    tanh = compare(device, transformer_forward(saved, HEADS, 1e-6, "tanh"))
    assert erf.passed
    assert erf.max_abs_error <= tanh.max_abs_error


def test_forward_sees_the_head_split(tmp_path, lock_path, cache_dir, capsys):
    """The float64 check is not vacuous: splitting into 2 or 8 heads instead of 4 fails it."""
    run = _layer_bench(tmp_path, lock_path, cache_dir, "siglip-attention", "--precision", "f16")
    saved, device = _load(run)
    assert compare(device, transformer_forward(saved, HEADS, 1e-6)).passed
    for heads in (2, 8):
        assert not compare(device, transformer_forward(saved, heads, 1e-6)).passed, heads


CHECKPOINT = re.compile(
    r'diagnostic checkpoint checkpoint=(\d+) tensor="?([^"\s]+)"? layer="?([^"\s]+)"? '
    r"ulps=(\d+) mismatch=\S+ samples=\d+ passed=(true|false)"
)
SUMMARY = re.compile(
    r"diagnostic checkpoints checked diagnosticCheckpoints=(\d+) numericalTest=(PASS|FAIL)"
)


def _checkpoint_lines(stderr: str) -> tuple[list[tuple[int, str, str, int, str]], list[tuple]]:
    """``(index, tensor, layer, ulps, passed)`` per stage line, and the summary lines."""
    checkpoints = [(int(a), b, c, int(d), e) for a, b, c, d, e in CHECKPOINT.findall(stderr)]
    return checkpoints, SUMMARY.findall(stderr)


def test_diagnostics_are_shown_without_verbose(tmp_path) -> None:
    """``--diagnostics`` asks for its lines: they appear at the default log level, and
    nothing else of the INFO log does."""
    code, _, err = cli(["bench", "siglip-mlp", "--tokens", "16", "--dim", "64", "--hidden",
                        "64", "--finalists", "1", "--out", str(tmp_path / "pkg"), "--lock",
                        str(tmp_path / "lock"), "--record", "--diagnostics"])
    checkpoints, summary = _checkpoint_lines(err)
    assert code == 0 and checkpoints and summary == [(str(len(checkpoints)), "PASS")], err
    assert all(line.startswith(" INFO ipu_stack.diagnostics: diagnostic checkpoint")
               for line in err.splitlines()), err


@pytest.mark.parametrize("workload", ["siglip-layer", "pe-block"])
def test_diagnostics_checkpoints(tmp_path, lock_path, cache_dir, capsys, workload):
    """``--diagnostics`` logs every stage's agreement with the host's rerun of that stage on
    the device's own inputs: all within limits on a correct run."""
    run = _layer_bench(tmp_path, lock_path, cache_dir, workload, "--diagnostics")
    assert run.code == 0 and run.record["numericalTest"] == "PASS"
    count = run.record["diagnosticCheckpoints"]
    assert count > 0
    checkpoints, summary = _checkpoint_lines(run.stderr)
    assert [c[0] for c in checkpoints] == list(range(count))
    assert all(passed == "true" for *_, passed in checkpoints)
    assert all(layer == "layer0" for _, _, layer, _, _ in checkpoints)
    names = {c[1] for c in checkpoints}
    assert {"layer0.ln1.out", "layer0.attn.scores", "layer0.attn.probs", "layer0.attn.q.out",
            "layer0.gelu", "layer0.residual2"} <= names
    if workload == "pe-block":
        assert {"layer0.attn.q.rope", "layer0.attn.k.rope"} <= names
    assert summary == [(str(count), "PASS")]
    saved, device = _load(run)  # diagnostics change nothing about the outputs
    assert compare(device, transformer_forward(saved, HEADS, EPS[workload], GELU[workload])).passed


def _corrupt_softmax(monkeypatch) -> None:
    """Replace the row kernel's softmax: no max subtraction and probabilities scaled by 1.01."""
    from ipu_stack.ir.precision import Precision
    from ipu_stack.kernels.base import FAMILIES, read_values, write_rows

    original = FAMILIES["row"]

    def run(p, mem, tiles, addresses):
        if p["op"] != "softmax":
            return original.run(p, mem, tiles, addresses)
        x = read_values(mem, tiles, addresses[0], p["rows"], p["cols"], p["x_pitch"],
                        Precision.from_json(p["x"]))
        work = original.run(p, mem, tiles, addresses)  # the corruption costs what the kernel costs
        e = np.exp(x * np.float32(p["scale"]))
        result = np.float32(1.01) * e / e.sum(axis=-1, keepdims=True)
        out = Precision.from_json(p["out"])
        write_rows(mem, tiles, addresses[3], p["out_pitch"], out.quantize(result).view(np.uint8))
        return work

    monkeypatch.setitem(FAMILIES, "row", dataclasses.replace(original, run=run))


@pytest.mark.parametrize("workload", ["siglip-layer", "attention"])
def test_corrupted_softmax_fails_numerical_test(tmp_path, lock_path, cache_dir, capsys,
                                                monkeypatch, workload):
    _corrupt_softmax(monkeypatch)
    run = _layer_bench(tmp_path, lock_path, cache_dir, workload)
    assert run.record["numericalTest"] == "FAIL"
    assert run.code == 1
    saved, device = _load(run)
    assert not compare(device, transformer_forward(saved, HEADS, EPS[workload], GELU[workload])).passed


def test_corrupted_softmax_fails_diagnostics(tmp_path, lock_path, cache_dir, capsys,
                                             monkeypatch):
    _corrupt_softmax(monkeypatch)
    run = _layer_bench(tmp_path, lock_path, cache_dir, "siglip-layer", "--diagnostics")
    assert run.code == 1 and run.record["numericalTest"] == "FAIL"
    checkpoints, summary = _checkpoint_lines(run.stderr)
    assert summary == [(str(run.record["diagnosticCheckpoints"]), "FAIL")]
    by_name = {name: passed for _, name, _, _, passed in checkpoints}
    # judged on its own inputs, every stage but the softmax agrees: the fault is named
    assert [name for name, passed in by_name.items() if passed == "false"] == [
        "layer0.attn.probs"]
    assert "stage agreement broke layer=layer0 stage=layer0.attn.probs" in run.stderr
    assert run.record["failedParts"] == "stageAgreement"
    assert run.record["firstFailingStage"] == "layer0.attn.probs"


def test_corrupted_layer_norm_gamma_fails_numerical_test(tmp_path, lock_path, cache_dir,
                                                         capsys, monkeypatch):
    """Negate ``layer0.ln1.gamma`` on the one tile that holds row 0 (its F16 sign bits)."""
    from ipu_stack.device import simulator

    original = simulator.SimulatedIpu._host_write
    hit = []

    def corrupt(self, step, tensors):
        written = original(self, step, tensors)
        if step.tensor == "layer0.ln1.gamma":
            tiles = step.tiles.ravel()
            addresses = step.addresses.ravel() - self.base
            self.memory[tiles[0], addresses[0] + 1 : addresses[0] + 128 : 2] ^= 0x80
            hit.append(int(tiles[0]))
        return written

    monkeypatch.setattr(simulator.SimulatedIpu, "_host_write", corrupt)
    run = _layer_bench(tmp_path, lock_path, cache_dir, "siglip-layer")
    assert hit == [hit[0]]
    assert run.record["numericalTest"] == "FAIL"
    assert run.code == 1
    saved, device = _load(run)
    expected = transformer_forward(saved, HEADS, 1e-6)
    assert not compare(device, expected).passed
    # the damage is in row 0 (the row the corrupted tile normalises) and there first
    assert not compare(device[:1], expected[:1], scale=float(np.abs(expected).max())).passed


@pytest.mark.parametrize("workload", ["attention", "pe-block"])
def test_depth_split_plans_pass(tmp_path, lock_path, cache_dir, capsys, monkeypatch, workload):
    """Force depth-split GEMM plans (reduce exchanges inside the head stages too): the
    result must still pass and match the float64 forward pass."""
    from ipu_stack.phases import stages as pipeline  # where the stages look gemm_search up
    from ipu_stack.runtime.session import load_package

    def split_first(found):
        return [p for p in found if p.depth_splits > 1] + [p for p in found if p.depth_splits == 1]

    if hasattr(pipeline, "gemm_search"):  # (cheapest plans, memory/cycles front)
        search = pipeline.gemm_search

        def patched(shape, target, keep=4, mode="auto", min_col_block=0):
            found, front = search(shape, target, keep=100, mode=mode,
                                  min_col_block=min_col_block)
            return split_first(found)[:keep], front

        monkeypatch.setattr(pipeline, "gemm_search", patched)
    else:
        candidates = pipeline.gemm_candidates
        monkeypatch.setattr(pipeline, "gemm_candidates", lambda shape, target, keep=4:
                            split_first(candidates(shape, target, keep=100))[:keep])
    run = _layer_bench(tmp_path, lock_path, cache_dir, workload)
    assert run.code == 0 and run.record["numericalTest"] == "PASS"
    plans = load_package(Path(run.record["package"])).manifest["plans"]
    assert any(re.search(r"xD[2-9]", plan) for plan in plans), plans
    saved, device = _load(run)
    assert compare(device, transformer_forward(saved, HEADS, EPS[workload], GELU[workload])).passed
    # the reference adds the depth tiles' partials in the order their reduce does: every
    # stage agrees bit for bit (before, an F16-mode GEMM's float32 sums differed in a few)
    assert run.record["stageMismatch"] == 0 and run.record["stageAgreement"] == 0, run.record


@pytest.mark.parametrize("attention", ["fp8", "f16"])
def test_softmax_in_place_on_whole_row_scores_passes(tmp_path, lock_path, cache_dir, capsys,
                                                     monkeypatch, attention):
    """Force Q.K^T plans of one column block, so the softmax runs where the scores lie (no
    gather): every stage still equals the device-precision reference bit for bit and the
    output matches the float64 forward pass."""
    from ipu_stack.phases import stages as pipeline
    from ipu_stack.planning.gemm import cost_plan
    from ipu_stack.runtime.session import load_package

    search = pipeline.gemm_search

    def patched(shape, target, keep=4, mode="auto", min_col_block=0):
        found, front = search(shape, target, keep=keep, mode=mode, min_col_block=min_col_block)
        if not shape.rows_read_in_place:
            return found, front
        whole = cost_plan(shape, shape.rows, 1, 1, target, mode=found[0].mode)
        return [whole], front

    monkeypatch.setattr(pipeline, "gemm_search", patched)
    run = _layer_bench(tmp_path, lock_path, cache_dir, "siglip-layer", "--attention", attention)
    assert run.code == 0 and run.record["numericalTest"] == "PASS", run.record
    plans = load_package(Path(run.record["package"])).manifest["plans"]
    assert any(plan.startswith("R17xC1xD1") for plan in plans), plans
    saved, device = _load(run)
    assert compare(device, transformer_forward(saved, HEADS, EPS["siglip-layer"],
                                               GELU["siglip-layer"])).passed
    # every stage equals the reference bit for bit, the forced F16-mode Q.K^T (17 rows on a
    # tile, its depth partials summed in F32 as poplin's ReduceAdd sums them) included
    assert run.record["stageMismatch"] == 0 and run.record["stageAgreement"] == 0, run.record


def test_paired_exchange_uses_two_lanes_and_fewer_cycles(tmp_path, lock_path, cache_dir, capsys):
    """The paired-tiles option (the default) lays GEMM grids out so that operand broadcasts
    reach whole tile pairs: the package carries two-lane chunks (the simulator verified them
    at load), the answer is unchanged, and exchange takes fewer cycles than without the
    option (``--no-paired-exchange``)."""
    from ipu_stack.package import read_package

    plain = _layer_bench(tmp_path / "plain", lock_path, cache_dir, "siglip-layer",
                         "--no-paired-exchange")
    paired = _layer_bench(tmp_path / "paired", lock_path, cache_dir, "siglip-layer")
    assert plain.code == paired.code == 0
    assert paired.record["exchangeCycles"] < plain.record["exchangeCycles"]
    package = read_package(tmp_path / "paired" / "pkg" / "model.ipuexe")
    steps = [s for s in package.manifest["programs"]["run"] if s["kind"] == "exchange"]
    lanes = [package.arrays[s["chunk_lanes"]] for s in steps]
    assert all(set(np.unique(x).tolist()) <= {1, 2} for x in lanes)
    assert any((x == 2).any() for x in lanes)
    assert package.manifest["options"]["paired_exchange"] is True
    unpaired = read_package(tmp_path / "plain" / "pkg" / "model.ipuexe")
    assert unpaired.manifest["options"]["paired_exchange"] is False
    assert all("chunk_lanes" not in s for s in unpaired.manifest["programs"]["run"]
               if s["kind"] == "exchange")
