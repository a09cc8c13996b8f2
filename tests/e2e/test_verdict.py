"""The two-part numerical verdict on stacked layers: correct runs pass at any depth, and
injected faults fail at 1 and at 4 layers with the part and the stage that broke.

Small sizes (17 tokens, 64 dims, 4 heads of 16, MLP 96) keep each run to a few seconds; the
faults are the issue's: softmax x 1.01, one head's output dropped, one layer's (square)
attention output projection transposed, a 1 % scale on one layer's layer-norm gamma.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from tests.helpers import bench, small, softmax_times_1_01

SMALL = small("siglip-layer")


@pytest.mark.parametrize("precision", ["fp8", "f16"])
@pytest.mark.parametrize("blocks", [1, 2, 4])
def test_correct_stacks_pass_both_parts(tmp_path, lock_path, cache_dir, blocks, precision):
    record = bench("siglip-layer", *SMALL, "--blocks", str(blocks), "--precision", precision,
                   folder=tmp_path, cache_dir=cache_dir, lock=lock_path).record
    assert record["numericalTest"] == "PASS" and record["failedParts"] == "none"
    assert record["stageAgreement"] <= 4 and record["stageMismatch"] <= 2.0**-7
    assert record["noiseRatio"] <= 1.5 and record["tailRatio"] <= 2.0


# ---------------------------------------------------------------------------- the faults
def _host_weight(monkeypatch, name: str, change) -> None:
    """The host writes ``change(weight)`` instead of the weight ``name``."""
    from ipu_stack.device import simulator

    original = simulator.SimulatedIpu._host_write

    def write(self, step, tensors):
        if step.tensor == name:
            tensors = {**tensors, name: change(np.asarray(tensors[name]))}
        return original(self, step, tensors)

    monkeypatch.setattr(simulator.SimulatedIpu, "_host_write", write)


def _o_projection_transposed(monkeypatch, layer: int) -> str:
    _host_weight(monkeypatch, f"layer{layer}.attn.o.w", lambda w: w.T.copy())
    return f"layer{layer}.attn.o.out"


def _gamma_scaled(monkeypatch, layer: int) -> str:
    _host_weight(monkeypatch, f"layer{layer}.ln1.gamma", lambda g: g * np.float32(1.01))
    return f"layer{layer}.ln1.out"


def _head_dropped(monkeypatch, layer: int) -> str:
    """After the P.V GEMM of ``layer``, head 1's partials are zeros (a lost kernel call); in
    a layer loop, on that layer's pass only."""
    from ipu_stack.device import simulator

    original = simulator.SimulatedIpu._compute

    def compute(self, step, trace=None, on_pass=0):
        busy = original(self, step, trace, on_pass)
        plans = self.package.manifest["plans"]
        looped = any(s.kind == "loop" for s in self.program.run)
        stage = _pv_stage(self.package.manifest, 0 if looped else layer)
        if step.name == f"stage{stage}.gemm" and (not looped or on_pass == layer):
            tiles_used = _tiles(plans[_gemm_index(self.package.manifest, stage)])
            # the heads' grids lie side by side from the stage's first tile: head 1's is the
            # second run of tiles_used tiles
            ordered = sorted({int(t) for call in step.calls for t in call.tiles})
            second = np.array(ordered[tiles_used:2 * tiles_used])
            for call in step.calls:
                kernel = self.program.kernels[call.kernel]
                tiles, addresses = call.tiles, call.addresses
                head = np.isin(tiles, second)
                rows, pitch = kernel.params["rows"], kernel.params["out_pitch"]
                for tile, address in zip(tiles[head], addresses[head, 2], strict=True):
                    start = int(address) - self.base
                    self.memory[tile, start : start + rows * pitch] = 0
        return busy

    monkeypatch.setattr(simulator.SimulatedIpu, "_compute", compute)
    return f"layer{layer}.attn.context8"


def _pv_stage(manifest: dict, layer: int) -> int:
    """The stage index of ``layer``'s P.V GEMM: the GEMM step after its softmax step."""
    names = [s["name"] for s in manifest["programs"]["run"] if s["kind"] == "compute"]
    softmaxes = [n for n in names if n.endswith(".softmax")]
    after = int(softmaxes[layer].split(".")[0][5:])
    return min(int(n.split(".")[0][5:]) for n in names
               if n.endswith(".gemm") and int(n.split(".")[0][5:]) > after)


def _gemm_index(manifest: dict, stage: int) -> int:
    """The stage's index among the GEMM stages (whose plans the manifest lists in order); a
    fused compute set names several (``stage1.gemm+stage2.gemm+stage3.gemm``)."""
    names = [s["name"] for s in manifest["programs"]["run"] if s["kind"] == "compute"]
    gemms = sorted({int(part.split(".")[0][5:]) for n in names for part in n.split("+")
                    if part.endswith(".gemm")})
    return gemms.index(stage)


def _tiles(plan: str) -> int:
    r, c, d = (int(x) for x in re.match(r"R(\d+)xC(\d+)xD(\d+)", plan).groups())
    return r * c * d


FAULTS = {
    "softmax-x1.01": softmax_times_1_01,
    "head-dropped": _head_dropped,
    "o-projection-transposed": _o_projection_transposed,
    "ln-gamma-1pct": _gamma_scaled,
}


@pytest.mark.parametrize("blocks", [1, 4])
@pytest.mark.parametrize("fault", list(FAULTS))
def test_injected_faults_fail_and_name_the_part_and_stage(tmp_path, lock_path, cache_dir,
                                                          monkeypatch, fault, blocks):
    layer = blocks // 2  # layer 0 of one, layer 2 of four
    stage = FAULTS[fault](monkeypatch, layer)
    record = bench("siglip-layer", *SMALL, "--blocks", str(blocks), folder=tmp_path,
                   cache_dir=cache_dir, lock=lock_path).record
    assert record["numericalTest"] == "FAIL"
    assert "stageAgreement" in record["failedParts"].split(",")
    assert record["firstFailingStage"] == stage
