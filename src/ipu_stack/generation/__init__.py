"""Greedy generation: a decode step's package run once a token, its KV cache kept on the
device.

The package is a decode step (``--context S``: one token a sequence in, logits out, each
layer's keys and values written into a cache that stays in tile memory from call to call).
The prompt goes in one pass (a program of its own that fills every layer's cache and
chooses the first token) or, where that does not fit, a token a step (the time to the first
token says so); then each step's input is the token the device chose at the step before
(greedy: the largest logit).  Every step runs through the one run loop (``runtime.stream``) as a call
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

from ipu_stack.generation.command import (
    DecodePlan,
    GenerateRequest,
    Resolve,
    decode_plan,
    generate,
)
from ipu_stack.generation.feed import PromptFeed, StepInputs, TokenFeed, prompt_tokens
from ipu_stack.generation.record import generation_answer, generation_fields, pipeline_step
from ipu_stack.generation.run import Compiled, Generation, GenerationRun, run_generation

__all__ = ["Compiled", "DecodePlan", "GenerateRequest", "Generation", "GenerationRun",
           "PromptFeed", "Resolve", "StepInputs", "TokenFeed", "decode_plan", "generate",
           "generation_answer", "generation_fields", "pipeline_step", "prompt_tokens",
           "run_generation"]
