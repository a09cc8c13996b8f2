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
from ipu_stack.runtime.execute import RunSettings
from ipu_stack.runtime.record import verdict_fields
from ipu_stack.runtime.session import load_package
from ipu_stack.runtime.stream import StepFeed, StreamOptions, StreamRun, run_stream
from ipu_stack.target import get_target
from ipu_stack.util.errors import UsageError
from ipu_stack.util.log import event

LOG = logging.getLogger("ipu_stack.runtime")

StepInputs = Callable[[np.ndarray, int], dict[str, np.ndarray]]


@dataclass
class TokenFeed(StepFeed):
    """The decode steps of a greedy generation: the prompt's tokens a step, then the
    device's own choices; the host reference's cache carried from step to step."""

    prompt: np.ndarray  # [batch, prompt tokens] ids
    new_tokens: int
    step_inputs: StepInputs
    graph: Graph
    state: dict[str, np.ndarray]  # the device's cache before the next step, by state name
    chosen: list[np.ndarray] = field(default_factory=list)  # the device's, each generated step
    expected: list[np.ndarray] = field(default_factory=list)  # the reference's choices
    margins: list[np.ndarray] = field(default_factory=list)  # the reference's top-2 gaps
    tied: list[np.ndarray] = field(default_factory=list)  # differing, but a tie (see judged)
    states: dict[str, str] = field(default_factory=dict)  # written value -> its state

    def __post_init__(self) -> None:
        self.states = {self.graph.value(w).name: self.graph.value(s).name
                       for s, w in state_writes(self.graph).items()}

    def __len__(self) -> int:
        return self.prompt.shape[1] + self.new_tokens - 1

    def inputs(self, number: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        prompt = self.prompt.shape[1]
        tokens = self.prompt[:, number] if number < prompt else self.chosen[-1]
        return self.step_inputs(tokens, number), dict(self.state)

    def probed(self, items: list) -> None:
        for name, values in items:
            if name in self.states:  # a layer's cache as the device wrote it
                self.state[self.states[name]] = np.asarray(values, dtype=np.float32)

    def judged(self, number: int, outputs: dict[str, np.ndarray],
               reference: Mapping[str, np.ndarray]) -> None:
        if number < self.prompt.shape[1] - 1:
            return  # a prompt token's step: its logits choose nothing
        batch = self.prompt.shape[0]
        device = np.asarray(outputs["logits"], np.float32).reshape(batch, -1)
        host = np.asarray(reference["logits"], np.float32).reshape(batch, -1)
        chosen, expected = device.argmax(axis=1), host.argmax(axis=1)
        rows = np.arange(batch)
        # a tie at device precision: the device's choice is within the logits' own
        # device-to-reference difference of the reference's best
        slack = np.abs(device - host).max(axis=1)
        self.tied.append((chosen != expected)
                         & (host[rows, chosen] >= host[rows, expected] - slack))
        self.chosen.append(chosen)
        self.expected.append(expected)
        top = np.sort(host, axis=1)[:, -2:]
        self.margins.append(top[:, 1] - top[:, 0])


def prompt_tokens(seed: int, batch: int, tokens: int, vocab: int) -> np.ndarray:
    """A random prompt of ``tokens`` ids a sequence (seeded)."""
    return np.random.default_rng(seed).integers(0, vocab, (batch, tokens))


@dataclass(frozen=True)
class Generation:
    """What ``generate`` asks for: the prompt, how many tokens to generate, and how to make
    a step's inputs."""

    prompt: np.ndarray
    new_tokens: int
    step_inputs: StepInputs


def run_generation(path: Path, graph: Graph, tensors: Mapping[str, Any],
                   generation: Generation, settings: RunSettings,
                   model: Any = None) -> tuple[StreamRun, TokenFeed, Package]:
    """Every step of ``generation`` on the package at ``path``, judged step by step."""
    states = {graph.value(s).name for s in state_writes(graph)}
    if not states:
        raise UsageError("generate needs a decode step's package (a KV cache: --context)")
    package = load_package(path)
    feed = TokenFeed(generation.prompt, generation.new_tokens, generation.step_inputs, graph,
                     {name: np.asarray(tensors[name], np.float32) for name in states})
    options = StreamOptions(settings.engine, None, settings.record, settings.poison,
                            settings.lock_path, settings.wait, model)
    run = run_stream(package, graph, tensors, feed, options)
    return run, feed, package


def generation_fields(run: StreamRun, feed: TokenFeed, package: Package, graph: Graph,
                      fields: dict[str, Any]) -> dict[str, Any]:
    """The record: the verdict over every step, the tokens against the reference's, the time
    to the first token (the prompt's steps and their host transfers), a decode step's time
    and the tokens a second it gives, and what the cache holds."""
    clock = get_target(package.target).clock_hz
    prompt = feed.prompt.shape[1]
    batch = feed.prompt.shape[0]
    # a step crosses every hand-off once: each link, and each on-chip hand-off phase
    per_chip = run.groups // run.chips
    handoffs = sum(run.link_cycles) + sum(h * (per_chip - 1) for h in run.chip_handoffs)
    steps = [sum(r.cycles for (g, n), r in run.runs.items() if n == number) + handoffs
             for number in range(len(feed))]
    hosts = [sum(r.host_bytes for (g, n), r in run.runs.items() if n == number)
             for number in range(len(feed))]
    host = [host_cycles(b, clock) for b in hosts]
    decode = steps[prompt:] or steps[-1:]
    decode_host = host[prompt:] or host[-1:]
    tpot = (max(decode) + max(decode_host)) / clock
    chosen, expected = np.array(feed.chosen), np.array(feed.expected)
    differ = np.argwhere(chosen != expected)
    ties = int(np.array(feed.tied).sum())
    worst = max(run.verdicts, key=lambda v: (not v.passed, getattr(v.worst, "max_ulps", 0)))
    kv_bytes = sum(graph.value(s).type.nbytes for s in state_writes(graph))
    record = {
        "numericalTest": "PASS" if run.passed else "FAIL",
        **fields,
        "batch": batch,
        "chips": run.chips,
        "promptTokens": prompt,
        "newTokens": feed.new_tokens,
        "tokensMatch": len(differ) == ties,
        "tokensDiffering": int(len(differ)),
        "tokensTied": ties,
        "firstDifferingMargin": round(float(feed.margins[differ[0][0]][differ[0][1]]), 6)
        if len(differ) else None,
        "ttftMicroseconds": round((sum(steps[:prompt]) + sum(host[:prompt]))
                                  / clock * 1e6, 3),
        "tpotMicroseconds": round(tpot * 1e6, 3),
        "tokensPerSecond": round(batch / tpot, 1),
        "prefillCycles": sum(steps[:prompt]),
        "decodeCycles": max(decode),
        "decodeCyclesMin": min(decode),
        "handoffCycles": handoffs,
        "kvCacheBytes": kv_bytes,
        "peakTileBytes": int(package.manifest["memory"]["peak_bytes"]),
        **verdict_fields(worst),
        "verdictSeconds": round(run.verdict_seconds, 2),
        "simulateSeconds": round(run.simulate_seconds, 2),
        "hostPeakBytes": run.host_peak_bytes,
        "generated": chosen[:, 0].tolist() if len(chosen) else [],
    }
    event(LOG, "generated", tokens=feed.new_tokens, batch=batch,
          tokensMatch=record["tokensMatch"], tpotMicroseconds=record["tpotMicroseconds"])
    return record


__all__ = ["Generation", "TokenFeed", "generation_fields", "prompt_tokens", "run_generation"]
