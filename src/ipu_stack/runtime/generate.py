"""Greedy generation: a decode step's package run once a token, its KV cache kept on the device.

The package is a decode step (``--context S``: one token a sequence in, logits out, each
layer's keys and values written into a cache that stays in tile memory from call to call).
The prompt is fed a token a step (the time to the first token says so: it is the prompt's
steps), then each step's input is the token the device chose at the step before (greedy:
the largest logit).  Every step runs through the one run loop (``runtime.stream``) as a call
that waits for the one before.  The device's state is its own memory.  The verdict judges
every stage of every step from the device's own inputs, as it judges any run: a step's host
side starts from the cache the device wrote at the step before (its probe reads), so a
stage's error is its own and is not compounded from step to step.

``tokensMatch`` is true when every generated token equals the host reference's choice at
device precision from the same prefix and cache, or ties with it there: the device's choice
is within the logits' own device-to-reference difference of the reference's best (random
weights make near-ties common; ``tokensTied`` counts them, ``firstDifferingMargin`` gives the
reference's top-two gap at the first token that differs).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ipu_stack.device.pricing import host_cycles
from ipu_stack.ir.graph import Graph, state_writes
from ipu_stack.package import Package
from ipu_stack.runtime.execute import RunSettings, run_package
from ipu_stack.runtime.groups import read_system
from ipu_stack.runtime.record import verdict_fields
from ipu_stack.runtime.session import RunResult, hold_weights, load_package
from ipu_stack.runtime.stream import StepFeed, StreamOptions, StreamRun, run_stream
from ipu_stack.target import get_target
from ipu_stack.util.errors import UsageError
from ipu_stack.util.log import Progress, event

LOG = logging.getLogger("ipu_stack.runtime")

StepInputs = Callable[[np.ndarray, int, int], dict[str, np.ndarray]]
"""A decode step's inputs: ``(tokens, position, first)``, ``first`` the cache position the
micro-batch's range begins at."""


@dataclass
class TokenFeed(StepFeed):
    """The decode steps of a greedy generation: the prompt's tokens a step (unless a prompt's
    pass filled the cache: ``prefilled``), then the device's own choices; the cache the
    device wrote at each step is the next step's host state.

    With ``micro_batches`` M the batch is M micro-batches of ``B / M`` sequences, each its own
    call of the one program: call ``n`` is micro-batch ``n mod M``'s step ``n // M``, whose
    sequences hold positions ``m x micro_positions ..`` of their caches (the step's mask
    hides the other micro-batches' ranges).  A step's choices are kept for the whole batch
    once its last micro-batch is judged."""

    prompt: np.ndarray  # [batch, prompt tokens] ids
    new_tokens: int
    step_inputs: StepInputs
    graph: Graph
    state: dict[str, np.ndarray]  # the device's cache before the next step, by state name
    prefilled: bool = False
    micro_batches: int = 1
    micro_positions: int = 0  # a micro-batch's cache positions (when micro_batches > 1)
    chosen: list[np.ndarray] = field(default_factory=list)  # the device's, each generated step
    expected: list[np.ndarray] = field(default_factory=list)  # the reference's choices
    margins: list[np.ndarray] = field(default_factory=list)  # the reference's top-2 gaps
    tied: list[np.ndarray] = field(default_factory=list)  # differing, but a tie (see judged)
    states: dict[str, str] = field(default_factory=dict)  # written value -> its state
    on_token: Callable[[np.ndarray], None] | None = None  # each new token (one a sequence)
    # at a terminal, the prompt's steps until the first token (the tokens then show decode)
    prefill: Progress | None = None
    # the step's micro-batches judged so far: (chosen, expected, tied, margins) each
    pending: list[tuple[np.ndarray, ...]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.states = {self.graph.value(w).name: self.graph.value(s).name
                       for s, w in state_writes(self.graph).items()}

    def __len__(self) -> int:
        steps = self.new_tokens - 1 + (0 if self.prefilled else self.prompt.shape[1])
        return steps * self.micro_batches

    def rows(self, micro: int) -> slice:
        """Micro-batch ``micro``'s sequences of the batch."""
        size = self.prompt.shape[0] // self.micro_batches
        return slice(micro * size, (micro + 1) * size)

    def inputs(self, number: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        micro, step = number % self.micro_batches, number // self.micro_batches
        prompt = self.prompt.shape[1]
        position = step + (prompt if self.prefilled else 0)
        rows = self.rows(micro)
        tokens = self.prompt[rows, position] if position < prompt else self.chosen[-1][rows]
        return (self.step_inputs(tokens, position, micro * self.micro_positions),
                dict(self.state))

    def probed(self, items: list) -> None:
        for name, values in items:
            if name in self.states:  # a layer's cache as the device wrote it
                self.state[self.states[name]] = np.asarray(values, dtype=np.float32)

    def judged(self, number: int, outputs: dict[str, np.ndarray],
               reference: Mapping[str, np.ndarray]) -> None:
        micro, step = number % self.micro_batches, number // self.micro_batches
        if not self.prefilled and step < self.prompt.shape[1] - 1:
            if self.prefill is not None and micro == self.micro_batches - 1:
                self.prefill.step("prompt tokens")
            return  # a prompt token's step: its logits choose nothing
        if self.prefill is not None:  # the first token: its line replaces the progress
            self.prefill.close()
            self.prefill = None
        logits = next(v for v in self.graph.values if v.role == "output")
        size = self.prompt.shape[0] // self.micro_batches
        # each sequence's last row (a prompt's pass may give every position's)
        device = np.asarray(outputs[logits.name], np.float32).reshape(
            size, -1, logits.type.cols)[:, -1]
        host = np.asarray(reference[logits.name], np.float32).reshape(
            size, -1, logits.type.cols)[:, -1]
        chosen, expected = device.argmax(axis=1), host.argmax(axis=1)
        rows = np.arange(size)
        # a tie at device precision: the device's choice is within the logits' own
        # device-to-reference difference of the reference's best
        slack = np.abs(device - host).max(axis=1)
        top = np.sort(host, axis=1)[:, -2:]
        self.pending.append((chosen, expected,
                             (chosen != expected)
                             & (host[rows, chosen] >= host[rows, expected] - slack),
                             top[:, 1] - top[:, 0]))
        if len(self.pending) < self.micro_batches:
            return
        whole = [np.concatenate(parts) for parts in zip(*self.pending, strict=True)]
        self.pending = []
        self.chosen.append(whole[0])
        self.expected.append(whole[1])
        self.tied.append(whole[2])
        self.margins.append(whole[3])
        if self.on_token is not None:
            self.on_token(whole[0])


@dataclass
class PromptFeed(TokenFeed):
    """The prompt's pass: one call a micro-batch over its whole prompt, each filling every
    layer's cache (kept as ``filled``, one a micro-batch) and choosing the first new token."""

    prompt_inputs: Callable[[np.ndarray], dict[str, np.ndarray]] | None = None
    filled: list[dict[str, np.ndarray]] = field(default_factory=list)

    def __len__(self) -> int:
        return self.micro_batches

    def inputs(self, number: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        assert self.prompt_inputs is not None
        return self.prompt_inputs(self.prompt[self.rows(number)]), {}

    def judged(self, number: int, outputs: dict[str, np.ndarray],
               reference: Mapping[str, np.ndarray]) -> None:
        self.filled.append(dict(self.state))
        super().judged(number, outputs, reference)


def prompt_tokens(seed: int, batch: int, tokens: int, vocab: int) -> np.ndarray:
    """A random prompt of ``tokens`` ids a sequence (seeded)."""
    return np.random.default_rng(seed).integers(0, vocab, (batch, tokens))


@dataclass(frozen=True)
class Compiled:
    """A compiled program to run: its package, graph and tensors."""

    path: Path
    graph: Graph
    tensors: Mapping[str, Any]


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
    options = StreamOptions(settings.engine, None, settings.record, settings.poison,
                            settings.lock_path, settings.wait, model)
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
                                prompt_pass.tensors, prompt_feed, options)
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
    run = run_stream(package, graph, tensors, feed, options) if len(feed) else None
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


def _calls(run: StreamRun, calls: int, clock: float) -> tuple[list[int], list[int], int]:
    """Each call's device cycles (its groups in order, and every hand-off: each link, each
    on-chip hand-off phase), each call's host transfer cycles, and the hand-offs."""
    per_chip = run.groups // run.chips
    handoffs = sum(run.link_cycles) + sum(h * (per_chip - 1) for h in run.chip_handoffs)
    cycles = [sum(r.cycles for (_, n), r in run.runs.items() if n == number) + handoffs
              for number in range(calls)]
    host = [host_cycles(sum(r.host_bytes for (_, n), r in run.runs.items() if n == number),
                        clock) for number in range(calls)]
    return cycles, host, handoffs


def pipeline_step(run: StreamRun, clock: float) -> int:
    """A step of the chips' pipeline with micro-batches in flight: each chip's full step
    and its own host transfers (its card's PCIe link, not overlapped with its step), the
    slowest chip's, then the link phase."""
    moved = [run.chip_host_bytes(number) for number in {number for _, number in run.runs}]
    own = [host_cycles(max(call[chip] for call in moved), clock) for chip in range(run.chips)]
    return max(full + host for full, host in zip(run.chip_full_cycles, own, strict=True)) \
        + max(run.link_cycles, default=0)


def _timing(gen: GenerationRun, clock: float, cache_bytes: int) -> dict[str, Any]:
    """The time to the first token and a decode step's: from the prompt's pass (and the
    prompt's rows of the caches, ``cache_bytes`` in all, handed to the decode program at the
    host link's rate), or from the prompt's steps; a decode step's cycles with its host
    transfers.  With micro-batches in flight a step of the pipeline
    (:func:`pipeline_step`) advances one micro-batch, so a sequence's next token comes
    ``M`` such steps later."""
    batch, prompt = gen.feed.prompt.shape
    micro = gen.feed.micro_batches
    cycles, host, handoffs = _calls(gen.decode, len(gen.feed), clock) if gen.decode \
        else ([], [], 0)
    image = 0 if gen.image_run is None else (gen.image_run.run.cycles
                                             + gen.image_run.run.host_cycles)
    period = pipeline_step(gen.decode, clock) if gen.decode and micro > 1 else None
    if gen.prompt_run is not None:
        first, first_host, _ = _calls(gen.prompt_run, micro, clock)
        state = next(iter(state_writes(gen.graph)))
        positions = gen.graph.value(state).type.rows // (batch // micro) // micro
        filled = cache_bytes * prompt // positions
        prefill = sum(first)  # the micro-batches' passes one after another
        ttft = image + prefill + sum(first_host) + host_cycles(filled, clock)
        decode, decode_host = cycles, host
    else:
        steps = prompt * micro
        decode, decode_host = cycles[steps:], host[steps:]
        prefill = sum(cycles[:steps]) if period is None else \
            prompt * micro * gen.decode.steady_cycles
        ttft = image + (prefill + sum(host[:steps]) if period is None
                        else prompt * micro * period)
        filled = 0
    step = None if not decode else (max(decode) + max(decode_host) if period is None
                                    else micro * period) / clock
    return {"ttftMicroseconds": round(ttft / clock * 1e6, 3),
            "tpotMicroseconds": None if step is None else round(step * 1e6, 3),
            "tokensPerSecond": None if step is None else round(batch / step, 1),
            "prefillCycles": prefill, "decodeCycles": max(decode, default=None),
            "decodeCyclesMin": min(decode, default=None), "handoffCycles": handoffs,
            "microBatches": micro, "periodCycles": period,
            "cacheHandoffBytes": filled,
            **({} if gen.image_run is None else {"imageCycles": gen.image_run.run.cycles})}


def generation_fields(gen: GenerationRun, fields: dict[str, Any]) -> dict[str, Any]:
    """The record: the verdict over every call, the tokens against the reference's, the time
    to the first token, a decode step's time and the tokens a second it gives, and what the
    cache holds."""
    clock = get_target(gen.package.target).clock_hz
    feed, batch = gen.feed, gen.feed.prompt.shape[0]
    runs = [r for r in (gen.prompt_run, gen.decode) if r is not None]
    verdicts = [v for r in runs for v in r.verdicts] + (
        [] if gen.image_run is None else [gen.image_run.verdict])
    chosen, expected = np.array(feed.chosen), np.array(feed.expected)
    ties = int(np.array(feed.tied).sum())
    differ = np.argwhere(chosen != expected)
    cache_bytes = sum(gen.graph.value(s).type.nbytes for s in state_writes(gen.graph))
    worst = max(verdicts, key=lambda v: (not v.passed, getattr(v.worst, "max_ulps", 0)))
    record = {
        "numericalTest": "PASS" if all(v.passed for v in verdicts) else "FAIL",
        **fields,
        "batch": batch,
        "chips": runs[-1].chips,
        "promptTokens": feed.prompt.shape[1],
        "newTokens": feed.new_tokens,
        "prefill": "one pass" if gen.prompt_run is not None else "a token a step",
        "tokensMatch": len(differ) == ties,
        "tokensDiffering": int(len(differ)),
        "tokensTied": ties,
        "firstDifferingMargin": round(float(feed.margins[differ[0][0]][differ[0][1]]), 6)
        if len(differ) else None,
        **_timing(gen, clock, cache_bytes),
        "kvCacheBytes": cache_bytes,
        "peakTileBytes": int(gen.package.manifest["memory"]["peak_bytes"]),
        **verdict_fields(worst),
        # the image program's run counts too
        "verdictSeconds": round(sum(r.verdict_seconds for r in runs) + (
            0.0 if gen.image_run is None else gen.image_run.verdict.seconds), 2),
        "simulateSeconds": round(sum(r.simulate_seconds for r in runs) + (
            0.0 if gen.image_run is None else gen.image_run.simulate_seconds), 2),
        "hostPeakBytes": max(r.host_peak_bytes for r in runs),
        "generated": chosen[:, 0].tolist() if len(chosen) else [],
    }
    event(LOG, "generated", tokens=feed.new_tokens, batch=batch,
          tokensMatch=record["tokensMatch"], tpotMicroseconds=record["tpotMicroseconds"])
    return record


__all__ = ["Compiled", "Generation", "GenerationRun", "PromptFeed", "TokenFeed",
           "generation_fields", "prompt_tokens", "run_generation"]
