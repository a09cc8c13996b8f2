"""What ``ipu-stack generate`` asks for, resolved into programs, compiled, run and recorded.

A request names a decoder (a builtin with a KV cache, a VLM, or a step exported with a
static cache) and the prompt and new tokens.  The decode program is one token a sequence
with a cache as long as the prompt and the new tokens need; the prompt's pass is a program
of its own where it fits the chips (else the prompt goes a token a step, said in one
warning line); a VLM's image program runs first.  The batch may go as micro-batches in
flight, one a step of the chips' pipeline, each in its own range of the caches.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ipu_stack.frontend import is_program_path
from ipu_stack.generation.feed import prompt_tokens
from ipu_stack.generation.record import generation_fields
from ipu_stack.generation.run import Compiled, Generation, run_generation
from ipu_stack.ir.graph import POSITION_GRAIN
from ipu_stack.pipeline import CompileOptions
from ipu_stack.runtime.execute import RunSettings
from ipu_stack.strategy import compile_strategy
from ipu_stack.util import log
from ipu_stack.util.errors import CompileError, UsageError
from ipu_stack.workloads import get_workload

LOG = logging.getLogger("ipu_stack.generation")

Resolve = Callable[[dict[str, Any]], tuple[Any, dict[str, Any]]]
"""The workload and its parameters from the command's options with some set anew
(``{"tokens": 1, "context": 160}``), checked as ``compile`` checks them."""


@dataclass(frozen=True)
class GenerateRequest:
    """The options of ``generate``: the model (a builtin's name or a model file), the
    prompt's and new tokens, and what the options say of the cache, the batch, the chips,
    the micro-batches and the groups (``None``: not given)."""

    model: str
    prompt_tokens: int
    new_tokens: int
    chips: int = 1
    context: int | None = None
    batch: int | None = None
    tokens: int | None = None
    micro_batches: int | None = None
    groups: int | None = None
    prompt_by_steps: bool = False
    image: str | None = None  # a model file's VLM: the image program's file
    choose: str | None = None  # where tokens are chosen (``--choose``; default: device)

    def check(self) -> None:
        """The options generate refuses whatever it runs."""
        if self.prompt_tokens < 1 or self.new_tokens < 1:
            raise UsageError("--prompt-tokens and --new-tokens must be at least 1")
        if self.tokens not in (None, 1):
            raise UsageError("generate feeds one token a step: give --prompt-tokens, not "
                             "--tokens")

    @property
    def positions(self) -> int:
        """The cache positions the prompt and the new tokens fill (the last new token is
        not fed back)."""
        return self.prompt_tokens + self.new_tokens - 1


@dataclass(frozen=True)
class DecodePlan:
    """The decode step's workload and parameters, the micro-batches in flight, the groups
    a chip to compile for (``None``: the planner's choice), whether the prompt goes a
    token a step, and an imported VLM's image program's inputs (``--inputs``: its pixels)."""

    workload: Any
    params: dict[str, Any]
    micro_batches: int
    groups: int | None
    by_steps: bool
    image_inputs: str = ""


def decode_plan(request: GenerateRequest, resolve: Resolve) -> DecodePlan:
    """The decode program a request runs: one token a sequence, a cache as long as the
    prompt and the new tokens need (a VLM's image tokens ahead of them)."""
    if is_program_path(request.model):
        return _program_plan(request, resolve)
    if request.image is not None:
        raise UsageError("--image-program goes with a decoder step's model file (MODEL.pt2), "
                         f"not the builtin {request.model} (smolvlm-256m compiles its own "
                         "image program)")
    workload = get_workload(request.model)
    if workload.step_inputs is None:
        raise UsageError(f"{workload.name} is not a language model with a KV cache "
                         "(generate runs smollm2-135m, tinyllama-1.1b, smolvlm-256m or a "
                         "MODEL.pt2 step exported with a static cache)")
    request.check()
    needed = request.positions
    if workload.vision is not None:  # a VLM: the image's tokens go ahead of the prompt's
        if request.prompt_by_steps or request.prompt_tokens < 2:
            raise UsageError(f"{workload.name} reads its image in the prompt's pass: give "
                             "--prompt-tokens of at least 2, without --prompt-by-steps")
        needed += workload.image_prompt(resolve({"tokens": 1})[1])[0]
    context = request.context or needed
    most = next((p.maximum for p in workload.parameters if p.name == "context"), None)
    if request.context is None and most is not None and needed > most:
        raise UsageError(f"--prompt-tokens {request.prompt_tokens} and --new-tokens "
                         f"{request.new_tokens} fill {needed} positions; a cache holds at "
                         f"most {most}")
    if context < needed:
        raise UsageError(f"--context {context} holds fewer than the {needed} positions "
                         "the prompt and the new tokens fill")
    if workload.positions is not None and max(needed, context) > workload.positions:
        asked = f"--context {context} holds more than" if context > needed else (
            f"--prompt-tokens {request.prompt_tokens} and --new-tokens {request.new_tokens} "
            f"fill {needed} positions, past")
        raise UsageError(f"{asked} {workload.name}'s {workload.positions} (its "
                         "configuration's max_position_embeddings)")
    micro, groups = micro_batches(request, workload.vision is not None)
    batch = request.batch
    if micro > 1:  # one program for a micro-batch, each its own cache range
        context = -(-context // POSITION_GRAIN) * POSITION_GRAIN * micro
        batch = (batch or 1) // micro
    # the next token chosen on the device unless --choose host says otherwise
    workload, params = resolve({"tokens": 1, "context": context, "batch": batch,
                                "choose": request.choose or "device"})
    if params.get("part", "decoder") != "decoder":  # before anything is compiled
        raise UsageError(f"generate runs {workload.name}'s decoder; --part {params['part']} "
                         f"is its image program alone (ipu-stack bench {workload.name} --part "
                         f"{params['part']})")
    return DecodePlan(workload, params, micro, groups,
                      request.prompt_by_steps or request.prompt_tokens < 2)


def micro_batches(request: GenerateRequest, vision: bool) -> tuple[int, int | None]:
    """The batch's micro-batches in flight: ``--micro-batches``, or one a chip where the
    layers are pipelined over several and the batch divides among them; and the groups: one
    a chip over several chips unless ``--groups`` says otherwise (the planner's choice on
    one).  A batch stepping together is in one group at a time, so more groups than
    micro-batches would leave each chip's other groups' tiles idle while it passes."""
    batch, micro, chips = request.batch or 1, request.micro_batches, request.chips
    groups = request.groups or None  # one a chip where micro-batches fill several
    if micro is None:
        micro = chips if chips > 1 and batch % chips == 0 and not vision else 1
        return micro, groups or (1 if micro > 1 or chips > 1 else None)
    if micro < 1:
        raise UsageError("--micro-batches must be at least 1")
    if batch % micro:
        raise UsageError(f"--micro-batches {micro} does not divide the batch of {batch}")
    if micro > 1 and vision:
        raise UsageError("a VLM's image program runs for the whole batch: give no "
                         "--micro-batches")
    # no more micro-batches than chips: one group a chip (more groups could not fill)
    return micro, groups or (1 if 1 < chips and micro <= chips else None)


def _program_plan(request: GenerateRequest, resolve: Resolve) -> DecodePlan:
    """A decoder step exported with a static KV cache (``frontend/step.py``): its cache
    and batch are the export's; the prompt goes a token a step, or in one pass where the
    export's sequence length is dynamic."""
    request.check()
    if request.context is not None:
        raise UsageError("a model file's KV cache has the length it was exported with; "
                         "give no --context")
    workload, params = resolve({"choose": request.choose or "device"})
    step = getattr(workload, "step", None)
    if step is None:
        raise UsageError(f"{request.model} is not a decoder step with a static KV cache "
                         "(export one with transformers.integrations.executorch)")
    if step.tokens != 1:
        raise UsageError(f"{request.model} takes {step.tokens} tokens a step; generate runs "
                         "a one-token step")
    if step.lookup_rows and step.lookup_rows != step.vocab:
        raise UsageError(f"{request.model} returns {step.vocab} values a position, not logits "
                         f"over its {step.lookup_rows}-token table (export the model with its "
                         "LM head, as LlamaForCausalLM)")
    if request.positions > step.context:
        raise UsageError(f"the prompt and the new tokens fill {request.positions} positions; "
                         f"the exported cache holds {step.context}")
    if step.position_rows and request.positions > step.position_rows:
        raise UsageError(f"the prompt and the new tokens fill {request.positions} positions; "
                         f"{request.model}'s position table holds {step.position_rows}")
    step.check_batch(params["batch"])
    if request.micro_batches not in (None, 1):
        raise UsageError("a model file's step is exported for one batch and one cache: give "
                         "no --micro-batches")
    # a dynamic sequence length gives the prompt's pass from the same file
    by_steps = request.prompt_by_steps or request.prompt_tokens < 2 \
        or workload.prompt_inputs is None
    if request.image is not None and (step.table is None or workload.prompt_inputs is None):
        raise UsageError(f"{request.model} must take inputs_embeds with a dynamic sequence "
                         "length for --image-program (the image's rows open the prompt's "
                         "pass)")
    if request.image is not None and by_steps:
        raise UsageError("--image-program runs the prompt's pass (the image's rows open it): "
                         "give --prompt-tokens of at least 2, without --prompt-by-steps")
    pixels = params.get("inputs", "") if request.image is not None else ""
    return DecodePlan(workload, {**params, "batch": step.batch, **({"inputs": ""} if pixels
                                                                   else {})},
                      1, request.groups, by_steps, pixels)


def generate(plan: DecodePlan, request: GenerateRequest, options: CompileOptions,
             settings: RunSettings, out: Path,
             on_token: Callable[[np.ndarray], None] | None = None) -> dict[str, Any]:
    """Compile the plan's programs into ``out`` (the decode step; the prompt's pass in
    ``out/prompt``; a VLM's image program in ``out/vision``), generate and return the
    record (with PyTorch's own greedy tokens for a model file)."""
    workload, params, micro = plan.workload, plan.params, plan.micro_batches
    started = time.perf_counter()  # every program's compile: the step, the pass, the image
    result = compile_choosing(workload, params, out, options, request.choose, micro)
    if micro > 1 and len(result.groups) < 2:
        log.event(LOG, "--micro-batches has no pipeline to fill: the micro-batches run one "
                  "after another on the one program, each step a call of each (give --chips, "
                  "or --strategy pipeline --groups G)", level=logging.WARNING,
                  microBatches=micro)
    step = getattr(workload, "step", None)  # an imported step: its vocabulary
    prompt = prompt_tokens(params["seed"], params["batch"] * micro, request.prompt_tokens,
                           params["vocab"] if step is None else step.vocab)
    if workload.vision is not None:  # a VLM: the image's tokens ahead of the text's
        count, token = workload.image_prompt(params)
        prompt = np.concatenate([np.full((params["batch"], count), token), prompt], axis=1)
    image, torch_image = None, None
    if request.image is not None:  # a model file's VLM: its image program's file
        image, torch_image = _image_program(request, params, _image_options(options),
                                            out / "vision", plan.image_inputs)
        if torch_image.shape[-1] != step.table.shape[1]:
            raise UsageError(f"{request.image}'s rows are {torch_image.shape[-1]} wide; the "
                             f"decoder's embeddings are {step.table.shape[1]}")
        prompt = np.concatenate([np.zeros((params["batch"], torch_image.shape[1])), prompt],
                                axis=1)
        if prompt.shape[1] + request.new_tokens - 1 > step.context:
            raise UsageError(f"the image's {torch_image.shape[1]} rows, the prompt and the "
                             f"new tokens fill {prompt.shape[1] + request.new_tokens - 1} "
                             f"positions; the exported cache holds {step.context}")
    prompt_pass, prompt_inputs = None, None
    if not plan.by_steps:  # the prompt's pass, compiled beside the decode step
        image_rows = 0 if torch_image is None else torch_image.shape[1]
        prompt_pass, prompt_inputs = _prompt_pass(plan, request.prompt_tokens + image_rows,
                                                  _dump_in(options, "prompt"), out / "prompt",
                                                  image_rows > 0, request.choose)
    if workload.vision is not None:  # a VLM's tower and connector
        looked = compile_strategy(workload, workload.vision(params), out / "vision",
                                  _image_options(options), in_flight=1)
        image = Compiled(looked.package, looked.graph, looked.tensors)
    generation = Generation(prompt, request.new_tokens,
                            lambda tokens, position, first: workload.step_inputs(
                                params, tokens, position, first),
                            prompt_inputs, on_token, image, micro,
                            params["context"] // micro if micro > 1 else 0)
    compile_seconds = time.perf_counter() - started
    run = run_generation(Compiled(result.package, result.graph, result.tensors), generation,
                         settings, prompt_pass)
    fields = {"workload": workload.identifier(params), **workload.benchmark_fields(params),
              "compileSeconds": round(compile_seconds, 2),
              # the decode step's strategy (--strategy auto chooses by the estimate), and the
              # prompt's pass's (none where the prompt goes a token a step)
              "strategy": result.strategy, "pipelineGroups": max(1, len(result.groups)),
              "promptStrategy": None if prompt_pass is None else prompt_pass.strategy}
    if params.get("context"):  # the positions a sequence's cache holds, whole blocks
        fields["context"] = -(-params["context"] // (POSITION_GRAIN * micro)) * POSITION_GRAIN
    record = generation_fields(run, fields)
    if torch_image is not None:
        record["imageTokens"] = torch_image.shape[1]
    if step is not None:  # PyTorch's own greedy tokens from the same prompt
        record.update(workload.torch_tokens(prompt, request.new_tokens,
                                            np.array(run.feed.chosen), torch_image))
    return record


def _dump_in(options: CompileOptions, program: str) -> CompileOptions:
    """``options`` for another of generate's programs: its ``--dump-stages`` in a subfolder
    of its own, so the decode step's dumps (the folder itself) are not overwritten."""
    if not options.dump_stages:
        return options
    return dataclasses.replace(options, dump_stages=str(Path(options.dump_stages) / program))


def _image_options(options: CompileOptions) -> CompileOptions:
    """A VLM's image program's options: one program on the first chip, whatever the
    decoder's chips or strategy (it runs once, before the prompt's pass, as one call)."""
    return dataclasses.replace(_dump_in(options, "vision"), chips=1, strategy="layers",
                               groups=0)


def _image_program(request: GenerateRequest, params: dict[str, Any], options: CompileOptions,
                   out: Path, pixels: str = "") -> tuple[Compiled, np.ndarray]:
    """A model file's image program (``--image-program``) compiled at the decoder's precision and
    seed on ``pixels`` (an ``.npz`` of its inputs; default: random from the seed), and
    PyTorch's image rows for those inputs (``[batch, n, width]``): the prompt that
    ``torchTokenMatch`` runs opens with them, as the device's opens with its own."""
    from ipu_stack.frontend import imported_workload

    workload, base = imported_workload(request.image)  # type: ignore[arg-type]
    image_params = workload.resolve({**base, "precision": params["precision"],
                                     "seed": params["seed"], "inputs": pixels})
    compiled = compile_strategy(workload, image_params, out, options, in_flight=1)
    outputs = [v.name for v in compiled.graph.values if v.role == "output"]
    if len(outputs) != 1:
        raise UsageError(f"{request.image} returns {len(outputs)} tensors; an image program "
                         "returns its image's rows alone")
    rows = workload.reference(compiled.graph, compiled.tensors)[outputs[0]]
    rows = np.asarray(rows, np.float32).reshape(params["batch"], -1, rows.shape[-1])
    return Compiled(compiled.package, compiled.graph, compiled.tensors), rows


def compile_choosing(workload: Any, params: dict[str, Any], out: Path, options: CompileOptions,
                     given: str | None, in_flight: int = 1) -> Any:
    """Compile a program of the generation (``in_flight`` of its passes at once, each
    waiting for its own last token: what ``--strategy auto`` weighs a pipeline by); where
    the device's argmax does not fit beside it (``--choose`` not given), the host chooses
    that program's tokens, said in one warning line (each program's feed reads its own
    graph's output).  Where the program does not compile without the argmax either, that
    error is the one raised, and no warning blames the argmax."""
    try:
        return compile_strategy(workload, params, out, options, in_flight=in_flight)
    except CompileError as why:
        if given is not None or params.get("choose") != "device":
            raise
        compiled = compile_strategy(workload, {**params, "choose": "host"}, out, options,
                                    in_flight=in_flight)
        log.event(LOG, "the argmax on the device does not fit: the host chooses the tokens",
                  logging.WARNING, reason=str(why))
        return compiled


def _prompt_pass(plan: DecodePlan, tokens: int, options: CompileOptions, out: Path,
                 reads_image: bool = False, given: str | None = None
                 ) -> tuple[Compiled | None, Any]:
    """The prompt's pass of ``tokens`` a sequence (``reads_image``: an imported VLM's, the
    image's rows and the text's) compiled (a micro-batch's sequences and cache range) with
    the maker of its inputs; ``(None, None)`` where it does not fit the chips, and the
    prompt then goes a token a step through the decode program (a VLM's pass, which reads
    the image, must fit)."""
    workload, micro = plan.workload, plan.micro_batches
    passing = {**plan.params, "tokens": tokens,
               **({"context": plan.params["context"] // micro} if micro > 1 else {})}
    try:
        compiled = compile_choosing(workload, passing, out, options, given)
    except CompileError as why:
        if workload.vision is not None or reads_image:
            raise
        log.event(LOG, "the prompt's pass does not fit: the prompt goes a token a step",
                  logging.WARNING, reason=str(why))
        return None, None
    return (Compiled(compiled.package, compiled.graph, compiled.tensors, compiled.strategy),
            lambda ids, rows: workload.prompt_inputs(passing, ids, rows))


__all__ = ["DecodePlan", "GenerateRequest", "Resolve", "decode_plan", "generate", "micro_batches"]
