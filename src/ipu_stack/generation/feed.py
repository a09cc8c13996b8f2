"""The calls of a greedy generation: the decode steps' inputs made from the calls before, and
each call's tokens chosen and judged against the host reference's (``generation`` package)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from ipu_stack.ir.graph import Graph, fidelity_values, state_writes
from ipu_stack.runtime.stream import StepFeed
from ipu_stack.util.log import Progress

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
    output: str = field(init=False, default="")  # the program's output
    # the logits' name: the output, or what an argmax on the device chose the output from
    logits: str = field(init=False, default="")
    vocab: int = field(init=False, default=0)  # the logits' columns
    on_device: bool = field(init=False, default=False)  # the device sends its choices
    device_logits: np.ndarray | None = field(init=False, default=None)  # probed, if so

    def __post_init__(self) -> None:
        self.states = {self.graph.value(w).name: self.graph.value(s).name
                       for s, w in state_writes(self.graph).items()}
        self.output = next(v.name for v in self.graph.values if v.role == "output")
        self.logits = fidelity_values(self.graph)[self.output]
        self.vocab = next(v for v in self.graph.values if v.name == self.logits).type.cols
        self.on_device = self.logits != self.output

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
            elif name == self.logits:  # what an argmax on the device chose from
                self.device_logits = np.asarray(values, dtype=np.float32)

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
        size, vocab = self.prompt.shape[0] // self.micro_batches, self.vocab
        # each sequence's last row (a prompt's pass may give every position's)
        if self.on_device:  # the device's choices, and the logits it chose from (probed)
            assert self.device_logits is not None, "the device's logits were not probed"
            device = self.device_logits.reshape(size, -1, vocab)[:, -1]
            self.device_logits = None  # each call's own, never the call before's
            chosen = np.asarray(outputs[self.output]).reshape(size, -1)[:, -1].astype(np.int64)
        else:
            device = np.asarray(outputs[self.logits], np.float32).reshape(size, -1, vocab)[:, -1]
            chosen = device.argmax(axis=1)
        host = np.asarray(reference[self.logits], np.float32).reshape(size, -1, vocab)[:, -1]
        expected = host.argmax(axis=1)
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


__all__ = ["PromptFeed", "StepInputs", "TokenFeed", "prompt_tokens"]
