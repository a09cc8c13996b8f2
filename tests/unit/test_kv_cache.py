"""The decode step and its KV cache: the step's graph, run a position at a time, against an
independent numpy Llama forward pass over the whole prompt; the cache written in place at
the right rows, on the host and on the device; grouped-query heads read from the cache; a
step's cycles independent of the tokens and the position; a package's slot reads checked."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tests.helpers import cli, llama_forward, one_error_line

from ipu_stack.contract import from_manifest
from ipu_stack.device.pricing import host_cycles
from ipu_stack.generation import Compiled, Generation, generation_fields, run_generation
from ipu_stack.generation.command import GenerateRequest, micro_batches
from ipu_stack.ir.graph import state_writes
from ipu_stack.ir.interpret import evaluate_float64, write_rows
from ipu_stack.ir.rope_pairs import pair_order
from ipu_stack.pipeline import CompileOptions
from ipu_stack.runtime.execute import RunSettings
from ipu_stack.runtime.session import load_package
from ipu_stack.strategy import compile_strategy
from ipu_stack.target import get_target
from ipu_stack.util.errors import CompileError, PackageError
from ipu_stack.workloads import get_workload
from ipu_stack.workloads.decoder import prompt_inputs, step_inputs

CLOCK = get_target("ipu21").clock_hz
STEP = {"vocab": 50, "dim": 16, "hidden": 24, "layers": 2, "heads": 4, "kv_heads": 2,
        "tokens": 1, "context": 6, "batch": 2, "precision": "f16"}  # a cache of 32 positions


def _step(overrides: dict | None = None):
    workload = get_workload("smollm2-135m")
    params = workload.resolve({**STEP, **(overrides or {})})
    graph, tensors = workload.build(params)
    return params, graph, dict(tensors)


def rotate_half_order(tensors: dict, params: dict) -> dict:
    """The q and k projections as Llama defines them: the step's graph holds their columns
    with each rotation pair side by side (``ir.rope_pairs``), undone here."""
    d = params["dim"] // params["heads"]
    out = dict(tensors)
    for name in [n for n in tensors if n.endswith((".attn.q.w", ".attn.k.w"))]:
        held = np.asarray(tensors[name])
        order = (np.arange(held.shape[-1] // d)[:, None] * d + pair_order(d)).reshape(-1)
        out[name] = np.empty_like(held)
        out[name][:, order] = held
    return out


def test_decode_steps_are_llama_forward_over_the_prompt() -> None:
    """Each step's logits (float64, the cache carried from step to step) equal the numpy
    forward pass's logits at that position: the cache rows, the mask of later positions,
    RoPE at the step's position and the key/value head each query head reads are right."""
    params, graph, tensors = _step()
    batch, positions = params["batch"], params["context"]
    prompt = np.random.default_rng(3).integers(0, params["vocab"], (batch, positions))
    written = {graph.value(w).name: graph.value(s).name for s, w in state_writes(graph).items()}
    logits = []
    for position in range(positions):
        tensors.update(step_inputs(params, prompt[:, position], position))
        values = evaluate_float64(graph, tensors, keep={"logits", *written})
        logits.append(values["logits"].reshape(batch, -1))
        for name, state in written.items():
            tensors[state] = values[name]
    whole = llama_forward({**rotate_half_order(tensors, params),
                           "ids": prompt.reshape(batch, positions, 1)},
                          {**params, "tokens": positions})
    stepped = np.stack(logits, axis=1)
    assert np.abs(stepped - whole).max() < 1e-6 * np.abs(whole).max()


def test_cache_rows_are_written_at_their_slots() -> None:
    state = np.arange(24, dtype=np.float32).reshape(6, 4)
    rows = -np.ones((2, 4), np.float32)
    out = write_rows(state, rows, np.array([[1.0], [4.0]]))
    expected = state.copy()
    expected[[1, 4]] = -1
    assert np.array_equal(out, expected) and state[1, 0] == 4  # a copy, not in place
    with pytest.raises(ValueError, match="cache slot 6 is outside the state's 6 rows"):
        write_rows(state, rows, np.array([[0.0], [6.0]]))


def test_a_step_refuses_a_position_past_the_cache() -> None:
    params, _, _ = _step()
    with pytest.raises(Exception, match="position 6 is outside the KV cache's 6 positions"):
        step_inputs(params, np.zeros(2), 6)


@pytest.fixture(scope="module")
def small_generation(tmp_path_factory):
    """The small decode step (a cache of 32 positions) and its prompt's pass compiled once;
    two generations from two prompts of the same length a token a step, and the first
    prompt's again with the prompt's pass filling the cache."""
    params, _, _ = _step()
    out = tmp_path_factory.mktemp("decode")
    workload = get_workload("smollm2-135m")
    result = compile_strategy(workload, params, out, CompileOptions())
    decode = Compiled(result.package, result.graph, result.tensors)
    passing = {**params, "tokens": 3}
    compiled = compile_strategy(workload, passing, out / "prompt", CompileOptions())
    prompt_pass = Compiled(compiled.package, compiled.graph, compiled.tensors)
    runs = []
    for seed, whole in ((1, False), (2, False), (1, True)):
        prompt = np.random.default_rng(seed).integers(0, params["vocab"], (2, 3))
        generation = Generation(prompt, 4, lambda t, p, first: step_inputs(params, t, p, first),
                                lambda ids, image: prompt_inputs(passing, ids, image))
        run = run_generation(decode, generation, RunSettings(),
                             prompt_pass if whole else None)
        runs.append((run, generation_fields(run, {})))
    return params, result, runs


def test_generation_on_the_device_passes_and_matches(small_generation) -> None:
    params, result, runs = small_generation
    for run, record in runs:
        assert record["numericalTest"] == "PASS" and record["tokensMatch"]
        assert len(run.feed.chosen) == 4 and record["promptTokens"] == 3
        assert record["kvCacheBytes"] == 2 * 2 * (2 * 32) * 8 * 2  # layers, k/v, B x S, KV x d
    assert runs[2][1]["prefill"] == "one pass" and runs[0][1]["prefill"] == "a token a step"
    assert runs[2][1]["cacheHandoffBytes"] == 2 * 2 * (2 * 3) * 8 * 2  # the prompt's rows


def test_the_prompt_pass_fills_the_cache_the_steps_would(small_generation) -> None:
    """The prompt's pass and the prompt a token a step choose the same tokens and leave the
    same cache, to F16 rounding (the rows are computed by different programs)."""
    _, _, runs = small_generation
    steps, whole = runs[0][0], runs[2][0]
    assert [c.tolist() for c in steps.feed.chosen] == [c.tolist() for c in whole.feed.chosen]
    for name, cache in steps.feed.state.items():
        assert np.abs(cache - whole.feed.state[name]).max() <= 4e-3 * np.abs(cache).max()


def test_the_device_cache_holds_each_step_at_its_position(small_generation) -> None:
    """After 6 steps (3 prompt tokens, 3 generated fed back) the device's cache of every
    layer holds 6 of its 32 rows a sequence, each equal to the host's float64 cache from the
    same tokens within F16 rounding; the rows past them are still zero."""
    params, result, runs = small_generation
    feed = runs[0][0].feed
    graph, tensors = result.graph, dict(result.tensors)
    tokens = np.concatenate([feed.prompt, np.stack(feed.chosen[:-1], axis=1)], axis=1)
    written = {graph.value(w).name: graph.value(s).name for s, w in state_writes(graph).items()}
    for position in range(tokens.shape[1]):
        tensors.update(step_inputs(params, tokens[:, position], position))
        values = evaluate_float64(graph, tensors, keep=set(written))
        for name, state in written.items():
            tensors[state] = values[name]
    for state in written.values():
        device = feed.state[state].reshape(2, 32, -1)
        expected = np.asarray(tensors[state]).reshape(2, 32, -1)
        assert np.array_equal(device[:, 6:], np.zeros_like(device[:, 6:]))
        assert np.abs(device[:, :6] - expected[:, :6]).max() <= 4e-3 * np.abs(expected).max()


def test_step_cycles_do_not_depend_on_tokens_or_position(small_generation) -> None:
    _, _, runs = small_generation
    cycles = [sorted({r.cycles for r in run.decode.runs.values()}) for run, _ in runs[:2]]
    assert cycles[0] == cycles[1] and len(cycles[0]) == 1


def test_a_slot_read_outside_the_loop_slots_is_refused(small_generation) -> None:
    _, result, _ = small_generation
    package = load_package(result.package)
    run = package.manifest["programs"]["run"]
    reads = [s for s in run if s.get("kind") == "host_read" and s.get("slot") is not None]
    assert reads, "the layer loop's cache probes read their slot"
    reads[0]["slot"] = 99
    with pytest.raises(PackageError, match="reads slot 99, not one of the loop's"):
        from_manifest(package.manifest, package.arrays)
    assert any(info["role"] == "state" for info in package.manifest["tensors"].values())


@pytest.mark.parametrize("argv, message", [
    (["generate", "siglip-layer"], "siglip-layer is not a language model with a KV cache"),
    (["generate", "smollm2-135m", "--context", "3", "--prompt-tokens", "4"],
     "--context 3 holds fewer than the 11 positions"),
    (["generate", "smollm2-135m", "--prompt-tokens", "2000000", "--new-tokens", "4"],
     "--prompt-tokens 2000000 and --new-tokens 4 fill 2000003 positions; a cache holds at "
     "most 1048576"),
    # the model's trained positions, before anything is built
    (["generate", "smollm2-135m", "--prompt-tokens", "128", "--new-tokens", "9000"],
     "--prompt-tokens 128 and --new-tokens 9000 fill 9127 positions, past smollm2-135m's "
     "8192 (its configuration's max_position_embeddings)"),
    (["generate", "tinyllama-1.1b", "--context", "4096"], "--context 4096 holds more than "
     "tinyllama-1.1b's 2048"),
    (["generate", "smolvlm-256m", "--prompt-tokens", "8100", "--new-tokens", "30"],
     "fill 8193 positions, past smolvlm-256m's 8192"),
    (["generate", "smollm2-135m", "--tokens", "4"], "generate feeds one token a step"),
    # the one line is the reason, not a warning blaming the argmax before it
    (["generate", "smollm2-135m", "--layers", "2", "--prompt-tokens", "8", "--new-tokens",
      "4", "--chips", "3"], "cannot cut 2 layers into 3 groups"),
    (["generate", "smollm2-135m", "--new-tokens", "0"], "--new-tokens must be at least 1"),
    (["generate", "smollm2-135m", "--profile", "p"], "generate: unrecognised option '--profile'"),
    (["generate", "smollm2-135m", "--batch", "2", "--micro-batches", "3"],
     "--micro-batches 3 does not divide the batch of 2"),
    (["generate", "smollm2-135m", "--micro-batches", "0"], "--micro-batches must be at least 1"),
    # options generate would otherwise drop without a word
    (["generate", "smollm2-135m", "--groups", "2"], "--groups 2 is the pipeline strategy's"),
    (["generate", "smollm2-135m", "--groups", "0"], "--groups must be at least 1, got 0"),
    (["generate", "smollm2-135m", "--diagnostics"], "--diagnostics logs one program's stages: "
     "bench the decode step with it"),
    (["generate", "smollm2-135m", "--eps", "0"], "--eps must be a finite number above 0"),
    (["generate", "smollm2-135m", "--inputs", "ids.npz"], "generate's --inputs are an image "
     "program's pixels (with --image-program)"),
    # at once, before the image program's calibration
    (["generate", "smolvlm-256m", "--prompt-tokens", "8", "--new-tokens", "2", "--part",
      "vision"], "generate runs smolvlm-256m's decoder; --part vision is its image program "
     "alone (ipu-stack bench smolvlm-256m --part vision)"),
    # the cache, not the weights (0.2 GB), is what does not fit
    (["generate", "smollm2-135m", "--prompt-tokens", "16", "--new-tokens", "8000",
      "--batch", "1000"],
     "its weights and KV cache (the cache 185.06 GB) alone take at least 185.25 GB"),
])
def test_generate_refuses_in_one_line(argv, message) -> None:
    code, _, err = cli(argv)
    assert message in one_error_line(code, err)


def test_capacity_searches_the_longest_cache_and_names_the_fullest_tile() -> None:
    code, out, err = cli(["capacity", "smollm2-135m", "--vocab", "50", "--dim", "16",
                          "--hidden", "24", "--layers", "2", "--heads", "4", "--kv-heads", "2",
                          "--precision", "f16", "--max-context", "64", "--json"])
    record = json.loads(out)
    assert code == 0 and record["maximumContext"] == 64, err
    assert "kv cache" in record["fullestTile"] and "weights" in record["fullestTile"]
    # the cache is sized in blocks of 32 positions: one compile a block size, none between
    assert record["tried"] == {"32": "fits", "64": "fits"} and record["compiles"] == 2


def test_generation_over_two_chips_matches_one_chip(tmp_path, small_generation) -> None:
    """The layers pipelined over two linked chips (each group reads the step's host inputs,
    each chip holds its layers' caches): the same tokens as on one chip, every step the same
    cycles, a step crossing the link."""
    params, _, runs = small_generation
    workload = get_workload("smollm2-135m")
    options = CompileOptions(chips=2, strategy="pipeline")
    result = compile_strategy(workload, params, tmp_path / "decode", options)
    passing = {**params, "tokens": 3}
    compiled = compile_strategy(workload, passing, tmp_path / "prompt", options)
    prompt = np.random.default_rng(1).integers(0, params["vocab"], (2, 3))
    generation = Generation(prompt, 4, lambda t, p, first: step_inputs(params, t, p, first),
                            lambda ids, image: prompt_inputs(passing, ids, image))
    run = run_generation(Compiled(result.package, result.graph, result.tensors), generation,
                         RunSettings(engine="inprocess"),
                         Compiled(compiled.package, compiled.graph, compiled.tensors))
    record = generation_fields(run, {})
    assert record["numericalTest"] == "PASS" and record["chips"] == 2
    assert [c.tolist() for c in run.feed.chosen] == [c.tolist() for c in runs[2][0].feed.chosen]
    assert record["decodeCycles"] == record["decodeCyclesMin"] and record["handoffCycles"] > 0


def test_micro_batches_in_flight_fill_the_pipeline(tmp_path, small_generation) -> None:
    """The batch of 2 as 2 micro-batches of 1 over two chips: one decode program of one
    sequence whose cache holds both micro-batches' ranges (positions 0-31 and 32-63, the
    mask hiding the other's); the same tokens as the whole batch on one chip, each
    micro-batch's rows in its own range of the cache, and a sequence's next token two
    steps of the pipeline later (the slowest chip's step, the link, one call's host
    transfers)."""
    params, _, runs = small_generation
    workload = get_workload("smollm2-135m")
    options = CompileOptions(chips=2, strategy="pipeline")
    micro = {**params, "batch": 1, "context": 64}
    result = compile_strategy(workload, micro, tmp_path / "decode", options)
    passing = {**micro, "tokens": 3, "context": 32}
    compiled = compile_strategy(workload, passing, tmp_path / "prompt", options)
    prompt = np.random.default_rng(1).integers(0, params["vocab"], (2, 3))
    generation = Generation(prompt, 4, lambda t, p, first: step_inputs(micro, t, p, first),
                            lambda ids, image: prompt_inputs(passing, ids, image),
                            micro_batches=2, micro_positions=32)
    run = run_generation(Compiled(result.package, result.graph, result.tensors), generation,
                         RunSettings(engine="inprocess"),
                         Compiled(compiled.package, compiled.graph, compiled.tensors))
    record = generation_fields(run, {})
    assert record["numericalTest"] == "PASS" and record["tokensMatch"]
    assert record["batch"] == 2 and record["microBatches"] == 2
    assert [c.tolist() for c in run.feed.chosen] == [c.tolist() for c in runs[2][0].feed.chosen]
    # 3 prompt rows and 3 fed-back steps (positions 0-5) in each micro-batch's range
    whole = runs[2][0].feed.state
    for name, cache in run.feed.state.items():
        held = cache.reshape(2, 32, -1)  # [micro-batch range, position, KV x d]
        assert np.array_equal(held[:, 6:], np.zeros_like(held[:, 6:]))
        expected = whole[name].reshape(2, 32, -1)[:, :6]
        assert np.abs(held[:, :6] - expected).max() <= 4e-3 * np.abs(expected).max()
    decode = run.decode  # one group a chip: each chip's host link carries its own group's
    own = [max(host_cycles(r.host_bytes, CLOCK) for (g, _), r in decode.runs.items()
               if g == chip) for chip in (0, 1)]
    step = max(full + host for full, host in zip(decode.chip_full_cycles, own, strict=True))
    assert record["periodCycles"] == step + max(decode.link_cycles) > decode.steady_cycles
    assert record["decodeCycles"] == record["decodeCyclesMin"] > decode.steady_cycles
    assert record["tpotMicroseconds"] == pytest.approx(
        2 * record["periodCycles"] / CLOCK * 1e6, abs=1e-3)
    assert record["tokensPerSecond"] == pytest.approx(2e6 / record["tpotMicroseconds"],
                                                      rel=1e-4)


def test_a_prompt_pass_that_does_not_fit_goes_a_token_a_step(tmp_path, monkeypatch) -> None:
    """Where the prompt's pass does not compile (TinyLlama's at batch 32 on two chips), the
    prompt goes a token a step through the decode program, said in one warning line."""
    import ipu_stack.generation.command as command

    compile_any = command.compile_strategy

    def refusing(workload, params, out, options, *rest, **named):
        if params["tokens"] > 1:
            raise CompileError("does not fit: the prompt's pass, for this test")
        return compile_any(workload, params, out, options, *rest, **named)

    monkeypatch.setattr(command, "compile_strategy", refusing)
    sizes = ["--vocab", "50", "--dim", "16", "--hidden", "24", "--layers", "2", "--heads", "4",
             "--kv-heads", "2", "--precision", "f16", "--batch", "2"]
    code, out, err = cli(["generate", "smollm2-135m", *sizes, "--prompt-tokens", "3",
                          "--new-tokens", "2", "--out", str(tmp_path), "--json"])
    record = json.loads(out)
    assert code == 0 and record["numericalTest"] == "PASS", err
    assert record["prefill"] == "a token a step" and record["newTokens"] == 2
    # the positions a sequence's cache holds: 4 used, one block of 32
    assert record["context"] == 32
    assert "WARNING ipu_stack.generation: the prompt's pass does not fit: the prompt goes a token a " \
           "step reason=\"does not fit: the prompt's pass, for this test\"" in err


def test_a_decode_step_streams_over_pipeline_groups(tmp_path) -> None:
    """``bench`` streams a decode step's calls through two groups on one chip: each call
    varies its token ids and keeps the first call's mask, slots and angles, and passes."""
    code, out, err = cli(["bench", "smollm2-135m", "--vocab", "50", "--dim", "16", "--hidden",
                          "24", "--layers", "2", "--heads", "4", "--kv-heads", "2",
                          "--context", "6", "--tokens", "1", "--strategy", "pipeline",
                          "--groups", "2", "--out", str(tmp_path), "--json"])
    record = json.loads(out.strip().splitlines()[-1])
    assert code == 0 and record["numericalTest"] == "PASS", err
    assert record["pipelineGroups"] == 2 and record["images"] == record["imagesPassed"] > 1


def test_generate_over_two_chips_runs_a_micro_batch_a_chip(tmp_path) -> None:
    """With two chips and a batch they divide, generate runs a micro-batch on each by
    default: one group a chip, the caches in two ranges, every call checked."""
    sizes = ["--vocab", "50", "--dim", "16", "--hidden", "24", "--layers", "2", "--heads", "4",
             "--kv-heads", "2", "--precision", "f16", "--batch", "2"]
    code, out, err = cli(["generate", "smollm2-135m", *sizes, "--chips", "2", "--engine",
                          "inprocess", "--prompt-tokens", "3", "--new-tokens", "3", "--out",
                          str(tmp_path), "--json"])
    record = json.loads(out)
    assert code == 0 and record["numericalTest"] == "PASS" and record["tokensMatch"], err
    assert (record["chips"], record["microBatches"], record["batch"]) == (2, 2, 2)
    # both programs pipelined over the chips, the record saying so for each
    assert (record["strategy"], record["promptStrategy"]) == ("pipeline", "pipeline")
    assert record["periodCycles"] < record["decodeCycles"] < 2 * record["periodCycles"]
    assert record["workload"].endswith("-b1-t1-c64-v50-d16-h4-kv2-f24-n2-argmax")
    assert record["context"] == 32  # a sequence's range of the program's 64 positions


def test_micro_batches_on_one_program_are_said_to_run_one_after_another(tmp_path) -> None:
    """On one chip without a pipeline, ``--micro-batches 2`` runs both halves of the batch
    through the one program a step: PASS, a step twice a call, and one warning saying so."""
    sizes = ["--vocab", "50", "--dim", "16", "--hidden", "24", "--layers", "2", "--heads", "4",
             "--kv-heads", "2", "--precision", "f16", "--batch", "2"]
    code, out, err = cli(["generate", "smollm2-135m", *sizes, "--micro-batches", "2",
                          "--prompt-tokens", "3", "--new-tokens", "2", "--out", str(tmp_path),
                          "--json"])
    record = json.loads(out)
    assert code == 0 and record["numericalTest"] == "PASS" and record["tokensMatch"], err
    assert (record["pipelineGroups"], record["microBatches"]) == (1, 2)
    # a step is a call of each micro-batch: twice one call's cycles (at 1.5 GHz), and more
    assert record["tpotMicroseconds"] >= 2 * record["decodeCycles"] / 1500
    assert "WARNING ipu_stack.generation: --micro-batches has no pipeline to fill: the " \
           "micro-batches run one after another on the one program" in err


def test_the_device_chooses_the_hosts_tokens_and_sends_ids_not_logits(tmp_path) -> None:
    """``--choose device`` (generate's default) and ``--choose host`` generate the same
    tokens, each the host reference's; on the device the logits stay on the chip (an
    argmax sends 4 bytes a sequence), so a step's host bytes fall by the logits'."""
    sizes = ["--vocab", "30000", "--dim", "16", "--hidden", "24", "--layers", "2", "--heads",
             "4", "--kv-heads", "2", "--precision", "f16", "--batch", "2"]
    records = {}
    for choose in ("host", "device"):
        code, out, err = cli(["generate", "smollm2-135m", *sizes, "--prompt-tokens", "4",
                              "--new-tokens", "4", "--choose", choose,
                              "--out", str(tmp_path / choose), "--json"])
        records[choose] = json.loads(out)
        assert code == 0 and records[choose]["numericalTest"] == "PASS", err
        assert records[choose]["tokensMatch"] and records[choose]["tokensChosenOn"] == choose
    host, device = records["host"], records["device"]
    assert device["generated"] == host["generated"]
    assert device["workload"] == host["workload"] + "-argmax"
    # a step's time: the device's cycles and its host transfers; the logits were 2 x 30,000
    # halves a step, the tokens 2 x 4 bytes
    saved = host_cycles(2 * 30000 * 2, CLOCK) - host_cycles(2 * 4, CLOCK)
    argmax = device["decodeCycles"] - host["decodeCycles"]
    assert 0 < argmax < saved
    assert device["tpotMicroseconds"] < host["tpotMicroseconds"]


@pytest.mark.parametrize(("chips", "batch", "micro", "expected"), [
    (3, 32, None, (1, 1)),  # 32 does not divide over 3 chips: the batch steps together
    (2, 32, None, (2, 1)),  # a micro-batch a chip
    (1, 8, None, (1, None)),  # one chip: the planner's choice
    (2, 4, 4, (4, None)),  # micro-batches given: the planner's choice of groups
    (2, 4, 2, (2, 1)),  # no more than the chips: one group a chip, as without the option
])
def test_a_batch_stepping_together_runs_one_group_a_chip(chips, batch, micro,
                                                         expected) -> None:
    """Over several chips generate asks for one group a chip unless micro-batches fill
    more: a batch stepping together is in one group at a time, and more groups a chip (a
    planner's pipeline choice) would pass it through each chip's groups one after another,
    the other groups' tiles idle (TinyLlama at batch 32 on three chips: 2 groups a chip
    took 2,518,813 cycles a step against 1 group's 1,717,173)."""
    request = GenerateRequest("tinyllama-1.1b", 16, 8, chips=chips, batch=batch,
                              micro_batches=micro)
    assert micro_batches(request, vision=False) == expected


def test_where_the_argmax_does_not_fit_the_host_chooses(tmp_path, monkeypatch) -> None:
    """A prompt's pass whose argmax does not fit beside it (``--choose`` not given) is
    compiled with the logits to the host, said in one warning line; the decode steps still
    choose on the device, each feed reading its own program's output."""
    import ipu_stack.generation.command as command

    compile_any = command.compile_strategy

    def refusing(workload, params, out, options, *rest, **named):
        if params["tokens"] > 1 and params["choose"] == "device":
            raise CompileError("does not fit: the argmax, for this test")
        return compile_any(workload, params, out, options, *rest, **named)

    monkeypatch.setattr(command, "compile_strategy", refusing)
    sizes = ["--vocab", "50", "--dim", "16", "--hidden", "24", "--layers", "2", "--heads", "4",
             "--kv-heads", "2", "--precision", "f16"]
    code, out, err = cli(["generate", "smollm2-135m", *sizes, "--prompt-tokens", "3",
                          "--new-tokens", "3", "--out", str(tmp_path), "--json"])
    record = json.loads(out)
    assert code == 0 and record["numericalTest"] == "PASS" and record["tokensMatch"], err
    assert record["prefill"] == "one pass" and record["tokensChosenOn"] == "device"
    assert "WARNING ipu_stack.generation: the argmax on the device does not fit: the host " \
           "chooses the tokens reason=\"does not fit: the argmax, for this test\"" in err
    code, _, err = cli(["generate", "smollm2-135m", *sizes, "--prompt-tokens", "3",
                        "--new-tokens", "3", "--choose", "device", "--out",
                        str(tmp_path / "asked"), "--json"])
    assert code == 0 and "goes a token a step" in err  # asked for: no host fallback



def test_auto_weighs_a_pipeline_by_the_passes_in_flight(tmp_path) -> None:
    """A decode step waits for its own last token: through a pipeline of two groups on one
    chip, one micro-batch takes both groups' programs and the hand-off in turn, where
    streamed images would keep both busy. SmolLM2's widths over 2 layers: the pipeline's
    steady step beats the layers' program, one pass through it does not, and ``--strategy
    auto`` compiles the pipeline for a stream and the layers for a token a step."""
    from ipu_stack.strategy.compile import pipeline_rate

    workload = get_workload("smollm2-135m")
    params = workload.resolve({"layers": 2, "tokens": 1, "context": 32})
    streamed = compile_strategy(workload, params, tmp_path / "streamed",
                                CompileOptions(strategy="auto"))
    stepped = compile_strategy(workload, params, tmp_path / "stepped",
                               CompileOptions(strategy="auto"), in_flight=1)
    assert (streamed.strategy, stepped.strategy) == ("pipeline", "layers")
    assert stepped.reason.startswith("layers ") and "against pipeline" in stepped.reason
    estimate, work = streamed.estimate, params["batch"] * CLOCK
    one_pass = sum(estimate["group_cycles"]) + sum(estimate["handoff_cycles"]) + sum(
        estimate["link_cycles"])
    assert len(estimate["group_cycles"]) == 2
    assert pipeline_rate(estimate, work, None) == work / estimate["cycles"]
    assert pipeline_rate(estimate, work, 1) == work / one_pass
    assert pipeline_rate(estimate, work, 2) == 2 * work / max(one_pass, 2 * estimate["cycles"])
    assert pipeline_rate(estimate, work, 1) < work / stepped.estimate["cycles"] \
        < pipeline_rate(estimate, work, None)
