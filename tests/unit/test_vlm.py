"""SmolVLM: the pixel shuffle against SmolVLM's own reshapes (a numpy transcription, and
transformers' connector where torch is installed), the connector as one product of the
shuffled rows, transformers' vision tower and connector imported as the builtin's program,
and a small VLM generating on the device."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tests.helpers import cli, one_error_line

from ipu_stack.ir.interpret import evaluate_float64
from ipu_stack.workloads import get_workload
from ipu_stack.workloads.vlm import image_prompt, shuffle_sources

SMALL = ["--image", "64", "--vision-layers", "1", "--layers", "2", "--dim", "64", "--heads",
         "4", "--kv-heads", "2", "--hidden", "128", "--vocab", "256", "--precision", "f16"]


def pixel_shuffle(x: np.ndarray, scale: int) -> np.ndarray:
    """SmolVLM's ``pixel_shuffle`` (modeling_smolvlm.py), its views and permutes in numpy."""
    batch, seq, dim = x.shape
    side = int(seq**0.5)
    x = x.reshape(batch, side, side, dim).reshape(batch, side, side // scale, dim * scale)
    x = x.transpose(0, 2, 1, 3).reshape(batch, side // scale, side // scale,
                                        dim * scale * scale)
    return x.transpose(0, 2, 1, 3).reshape(batch, seq // scale**2, dim * scale**2)


@pytest.mark.parametrize("side, scale", [(32, 4), (8, 2), (6, 3)])
def test_the_shuffle_sources_move_rows_as_smolvlm_does(side: int, scale: int) -> None:
    x = np.random.default_rng(3).standard_normal((1, side * side, 5))
    sources = shuffle_sources(side, scale)
    picked = x[0][sources].reshape(sources.shape[0], -1)  # each block's row side by side
    np.testing.assert_array_equal(picked, pixel_shuffle(x, scale)[0])


def test_the_shuffle_matches_transformers_connector() -> None:
    torch = pytest.importorskip("torch")
    smolvlm = pytest.importorskip("transformers.models.smolvlm.modeling_smolvlm")
    x = np.random.default_rng(4).standard_normal((2, 256, 3)).astype(np.float32)
    connector = smolvlm.SmolVLMConnector.__new__(smolvlm.SmolVLMConnector)
    connector.scale_factor = 4
    torch_shuffled = connector.pixel_shuffle(torch.from_numpy(x), 4).numpy()
    np.testing.assert_array_equal(torch_shuffled, pixel_shuffle(x, 4))


def test_the_connector_is_one_product_of_the_shuffled_rows() -> None:
    """The vision program's output in float64: the tower's last rows shuffled and multiplied
    by the connector's weight, as SmolVLM's connector computes it."""
    workload = get_workload("smolvlm-256m")
    params = workload.resolve({"image": 128, "vision_layers": 1, "dim": 64, "part": "vision",
                               "precision": "f16", "batch": 2})
    graph, tensors = workload.build(params)
    ideal = evaluate_float64(graph, dict(tensors))
    tower = np.asarray(ideal["post_ln.out"]).reshape(2, 64, 768)
    weight = np.asarray(tensors["connector.w"])
    expected = pixel_shuffle(tower, 4) @ weight
    out = graph.by_role("output")[0]
    np.testing.assert_allclose(np.asarray(ideal[out.name]).reshape(2, 4, 64), expected,
                               rtol=1e-9, atol=1e-12)
    assert image_prompt(params) == (4, 49190)  # SmolVLM's <image>


@pytest.mark.parametrize("chips", [1, 2])
def test_a_small_vlm_generates_on_the_device(tmp_path, chips) -> None:
    """The image program, the prompt's pass over the image's row and the text, then decode
    steps: every call PASS, the tokens the reference's, the time to the first token counting
    the image program.  Over two chips the decoder is pipelined and the image program stays
    one program on the first chip."""
    code, out, err = cli(["--quiet", "generate", "smolvlm-256m", *SMALL, "--prompt-tokens",
                          "4", "--new-tokens", "3", "--json", "--out", str(tmp_path),
                          "--chips", str(chips)])
    record = json.loads(out) if code == 0 else {}
    assert code == 0 and record["numericalTest"] == "PASS", (record, err)
    assert record["chips"] == chips
    assert record["imageTokens"] == 1 and record["promptTokens"] == 5
    assert record["tokensMatch"] and len(record["generated"]) == 3
    clock = 1.5e9
    assert record["ttftMicroseconds"] * 1e-6 * clock > record["imageCycles"] + \
        record["prefillCycles"]


def test_a_vlm_refuses_a_prompt_a_token_a_step() -> None:
    code, _, err = cli(["generate", "smolvlm-256m", *SMALL, "--prompt-by-steps"])
    assert "reads its image in the prompt's pass" in one_error_line(code, err)


def test_the_vision_parts_footprint_is_a_lower_bound_of_its_graph() -> None:
    workload = get_workload("smolvlm-256m")
    params = workload.resolve({"image": 64, "vision_layers": 1, "part": "vision"})
    graph, _ = workload.build(params)
    weights = sum(v.type.nbytes for v in graph.by_role("weight") if len(v.type.shape) == 2)
    assert 0.9 * weights <= workload.footprint(params).weight_bytes <= weights


def test_image_programs_of_other_depths_are_named_apart() -> None:
    """Their packages go to folders named by the identifier: one must not replace another."""
    workload = get_workload("smolvlm-256m")
    names = {workload.identifier(workload.resolve({"part": "vision", "vision_layers": n}))
             for n in (1, 2)}
    assert len(names) == 2
