"""Run a generation: a VLM's image program, the prompt's pass and the decode steps, each
through the one run loop (``runtime.stream``), the caches handed from one program to the next
through the host."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ipu_stack.generation.feed import PromptFeed, StepInputs, TokenFeed
from ipu_stack.ir.graph import Graph, state_writes
from ipu_stack.package import Package
from ipu_stack.runtime.execute import RunSettings, run_package
from ipu_stack.runtime.groups import read_system
from ipu_stack.runtime.session import RunResult, hold_weights, load_package
from ipu_stack.runtime.stream import StreamRun, run_stream
from ipu_stack.util.errors import UsageError
from ipu_stack.util.log import Progress, event

LOG = logging.getLogger("ipu_stack.generation")


@dataclass(frozen=True)
class Compiled:
    """A compiled program to run: its package, graph and tensors, and the strategy it was
    compiled with (``--strategy auto`` chooses each program's)."""

    path: Path
    graph: Graph
    tensors: Mapping[str, Any]
    strategy: str = "layers"


@dataclass(frozen=True)
class Generation:
    """What ``generate`` asks for: the prompt, how many tokens to generate, how to make a
    decode step's inputs, and the prompt's pass's (``None``: the prompt a token a step)."""

    prompt: np.ndarray
    new_tokens: int
    step_inputs: StepInputs
    # the prompt's pass's inputs: ``(ids, image rows or None)``
    prompt_inputs: Callable[[np.ndarray, np.ndarray | None], dict[str, np.ndarray]] | None \
        = None
    on_token: Callable[[np.ndarray], None] | None = None  # each new token, as chosen
    image: Compiled | None = None  # a VLM's image program, run before the prompt's pass
    # the batch as micro-batches in flight, each holding this many positions of the caches
    micro_batches: int = 1
    micro_positions: int = 0


@dataclass
class GenerationRun:
    """The runs of a generation: the prompt's pass (if any) and the decode steps (none when
    the prompt's pass chose the only new token)."""

    feed: TokenFeed
    package: Package
    graph: Graph
    decode: StreamRun | None
    prompt_run: StreamRun | None = None
    image_run: RunResult | None = None  # a VLM's tower and connector


def run_generation(decode: Compiled, generation: Generation, settings: RunSettings,
                   prompt_pass: Compiled | None = None, model: Any = None) -> GenerationRun:
    """Every step of ``generation``, judged step by step: the prompt's pass first when
    given (its caches, as the device wrote them, are the decode program's initial state:
    handed over through the host), then the decode steps."""
    graph = decode.graph
    states = {graph.value(s).name for s in state_writes(graph)}
    if not states:
        raise UsageError("generate needs a decode step's package (a KV cache: --context)")
    state = {name: np.asarray(decode.tensors[name], np.float32) for name in states}
    prompt_feed, prompt_run, image_run, rows = None, None, None, None
    prefill = Progress("prefill", generation.prompt.shape[1] - 1) \
        if generation.on_token is not None and prompt_pass is None else None
    if generation.image is not None:  # the image's rows, as the device computed them
        image_run, rows = run_image(generation.image, settings)
    micro = {"micro_batches": generation.micro_batches,
             "micro_positions": generation.micro_positions}
    if generation.micro_batches > 1 and generation.image is not None:
        raise UsageError("a VLM's image program runs for the whole batch: generate it "
                         "without --micro-batches")
    if prompt_pass is not None:
        share_weights(decode, prompt_pass)
        made = generation.prompt_inputs
        assert made is not None
        prompt_feed = PromptFeed(generation.prompt, generation.new_tokens,
                                 generation.step_inputs, prompt_pass.graph, {}, True, **micro,
                                 on_token=generation.on_token,
                                 prompt_inputs=lambda ids: made(ids, rows))
        prompt_run = run_stream(load_package(prompt_pass.path), prompt_pass.graph,
                                prompt_pass.tensors, prompt_feed, settings, model)
        place_prompt_caches(state, prompt_feed.filled,
                            generation.prompt.shape[0] // generation.micro_batches)
    feed = TokenFeed(generation.prompt, generation.new_tokens, generation.step_inputs, graph,
                     dict(state), prompt_pass is not None, **micro, on_token=generation.on_token,
                     prefill=prefill)
    if prompt_feed is not None:  # the first token's choice opens the generation's
        feed.chosen, feed.expected = list(prompt_feed.chosen), list(prompt_feed.expected)
        feed.margins, feed.tied = list(prompt_feed.margins), list(prompt_feed.tied)
    package = load_package(decode.path)
    groups = len(read_system(package).groups)
    if 1 < generation.micro_batches < groups:
        raise UsageError(f"--micro-batches {generation.micro_batches} is fewer than the "
                         f"decode program's {groups} groups: a micro-batch's next step "
                         "would wait for its last one to leave the pipeline")
    tensors = decode.tensors
    for name, values in state.items():  # the decode program starts from these caches
        tensors[name] = values  # type: ignore[index]
    run = run_stream(package, graph, tensors, feed, settings, model) if len(feed) else None
    return GenerationRun(feed, package, graph, run, prompt_run, image_run)


def place_prompt_caches(state: dict[str, np.ndarray], filled: list[dict[str, np.ndarray]],
                        sequences: int) -> None:
    """The prompt's pass's caches (one a micro-batch of ``sequences``, each
    ``[sequences x S', KV x d]``) placed in the decode program's
    (``[sequences x M S', KV x d]``): micro-batch ``m``'s sequences hold positions
    ``m S' .. (m + 1) S' - 1`` of theirs."""
    for name in filled[0] if filled else ():
        whole = np.array(state[name], np.float32)
        view = whole.reshape(sequences, len(filled), -1, whole.shape[-1])
        for micro, caches in enumerate(filled):
            view[:, micro] = caches[name].reshape(sequences, -1, whole.shape[-1])
        state[name] = whole


def run_image(image: Compiled, settings: RunSettings) -> tuple[RunResult, np.ndarray]:
    """A VLM's image program run once and judged: the connector's rows the prompt's pass
    reads (its one output, as the device wrote it)."""
    result = run_package(load_package(image.path), image.graph, image.tensors,
                         settings.lock_path, wait=settings.wait, poison=settings.poison)
    output = next(v.name for v in image.graph.values if v.role == "output")
    event(LOG, "image program ran", cycles=result.run.cycles, passed=result.passed)
    return result, np.asarray(result.outputs[output], np.float32)


def share_weights(decode: Compiled, prompt_pass: Compiled) -> None:
    """One copy of the weights for both programs: the decode step's, made and held in their
    stored precisions, also serve the prompt's pass (every weight of the same name and
    type; the pass's own constants, its masks and angle tables, stay its own)."""
    hold_weights(decode.graph, decode.tensors)
    types = {v.name: v.type for v in decode.graph.by_role("weight")}
    for value in prompt_pass.graph.by_role("weight"):
        if types.get(value.name) == value.type and value.name in decode.tensors:
            prompt_pass.tensors[value.name] = decode.tensors[value.name]  # type: ignore[index]


__all__ = ["Compiled", "Generation", "GenerationRun", "place_prompt_caches", "run_generation",
           "run_image", "share_weights"]
