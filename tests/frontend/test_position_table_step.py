"""A decoder step whose positions index a learned table (GPT-2's ``wpe``), exported with a
static KV cache: the table is looked up on the device at positions the host computes
before each call, as the token table is at the ids (popops MultiSlice), and generation is
refused in one line before it would run past the table."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("transformers.integrations.executorch")

from ipu_stack.cli import main  # noqa: E402
from ipu_stack.frontend import imported_workload  # noqa: E402
from ipu_stack.testing.models import static_cache_step  # noqa: E402
from tests.helpers import one_error_line  # noqa: E402

CONTEXT = 32
TABLE = 16  # wpe's rows: fewer than the cache's positions, so the table is the bound


@pytest.fixture(scope="module")
def gpt2_step(tmp_path_factory):
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=128, n_positions=TABLE, n_embd=32, n_layer=2,
                                     n_head=4, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config)
    program = static_cache_step(model, CONTEXT).export(
        input_ids=torch.zeros((1, 1), dtype=torch.long), cache_position=torch.tensor([0]))
    path = tmp_path_factory.mktemp("gpt2") / "gpt2_step.pt2"
    torch.export.save(program, str(path))
    return path, model


def test_gpt2_looks_its_positions_up_on_the_device_and_generates_as_torch(
        gpt2_step, tmp_path, capsys) -> None:
    path, model = gpt2_step
    assert main(["ops", str(path)]) == 0
    listing = capsys.readouterr().out.splitlines()
    assert any("aten.embedding" in line and "wpe" in line and line.endswith("mapped")
               for line in listing), listing
    code = main(["--quiet", "generate", str(path), "--prompt-tokens", "4", "--new-tokens", "6",
                 "--precision", "f16", "--json", "--out", str(tmp_path / "out")])
    record = json.loads(capsys.readouterr().out)
    assert code == 0 and record["numericalTest"] == "PASS", record
    assert record["tokensMatch"] and record["torchTokenMatch"], record
    assert record["decodeCycles"] == record["decodeCyclesMin"]
    # the device's lookup reads the id the host computes for each call's position
    workload, params = imported_workload(path)
    graph, tensors = workload.build(workload.resolve({**params, "precision": "f16"}))
    lookups = [op for op in graph.operations if op.kind == "embedding"]
    assert len(lookups) == 2  # the tokens' and the positions'
    inputs = workload.step_inputs(params, np.array([3]), 9)
    ids = [name for name in inputs if "wpe" in name and name.endswith(".ids")]
    assert len(ids) == 1 and inputs[ids[0]].reshape(-1).tolist() == [9.0]
    table = model.transformer.wpe.weight.detach().numpy()
    stored = [v for v in graph.values if v.name.endswith("wpe.weight")]
    assert len(stored) == 1
    np.testing.assert_allclose(np.asarray(tensors[stored[0].name], np.float32),
                               table.astype(np.float16), rtol=0, atol=0)


def test_positions_past_the_table_are_refused_before_a_run(gpt2_step, tmp_path,
                                                           capsys) -> None:
    path, _ = gpt2_step
    code = main(["--quiet", "generate", str(path), "--prompt-tokens", "8", "--new-tokens",
                 "10", "--out", str(tmp_path / "out")])
    assert one_error_line(code, capsys.readouterr().err) == (
        f"error: the prompt and the new tokens fill 17 positions; {path}'s position table "
        f"holds {TABLE}")
