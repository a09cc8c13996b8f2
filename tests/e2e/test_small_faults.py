"""Small faults must FAIL in every end-to-end configuration (issue 15's list): softmax x 1.01,
an output scaled by 1.005, and one output row offset by 1 % of the output's maximum.

The output faults change the values the device hands back, after the last stage ran, so
only the verdict's judgement of that last stage (on the device's own inputs) stands between
them and a PASS; the old elementwise band let such errors through.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.e2e.test_layers import CASES
from tests.helpers import bench, small, softmax_times_1_01

MLP = {"mlp-fp8": [], "mlp-f16": ["--precision", "f16"], "mlp-biases": ["--biases"],
       "mlp-two-blocks": ["--blocks", "2"]}
MLP_SMALL = ["--tokens", "40", "--dim", "96", "--hidden", "160"]
CONFIGS = {**{k: (w, extra) for k, (w, extra, _) in CASES.items()},
           **{k: ("siglip-mlp", extra) for k, extra in MLP.items()}}


def _sizes(workload: str) -> list[str]:
    return MLP_SMALL if workload == "siglip-mlp" else small(workload)


def _change_outputs(monkeypatch, change) -> None:
    """The device's output reads (not the stage probes) come back changed."""
    from ipu_stack.device import simulator

    original = simulator.SimulatedIpu._host_read

    def read(self, step, layer=None):
        piece, precision = original(self, step, layer)  # storage codes
        if step.checkpoint is None:  # changed as values, stored back as the device would
            piece = precision.quantize(change(precision.dequantize(piece), step))
        return piece, precision

    monkeypatch.setattr(simulator.SimulatedIpu, "_host_read", read)


def _scaled(monkeypatch) -> None:
    _change_outputs(monkeypatch, lambda piece, step: piece * np.float32(1.005))


def _row_offset(monkeypatch) -> None:
    def change(piece, step):
        if step.origin[0] == 0:  # the piece holding row 0
            piece[0] += np.float32(0.01) * np.abs(piece).max()
        return piece
    _change_outputs(monkeypatch, change)


def _softmax(monkeypatch) -> None:
    softmax_times_1_01(monkeypatch, 0)


FAULTS = {"output-x1.005": _scaled, "row-offset-1pct": _row_offset, "softmax-x1.01": _softmax}


@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("config", list(CONFIGS))
def test_small_faults_fail_everywhere(tmp_path, cache_dir, monkeypatch, config, fault):
    workload, extra = CONFIGS[config]
    if fault == "softmax-x1.01" and workload == "siglip-mlp":
        pytest.skip("the MLP has no softmax")
    FAULTS[fault](monkeypatch)
    record = bench(workload, *_sizes(workload), *extra, folder=tmp_path, cache_dir=cache_dir).record
    assert record["numericalTest"] == "FAIL", record
    assert "stageAgreement" in record["failedParts"]
