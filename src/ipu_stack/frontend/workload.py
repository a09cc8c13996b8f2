"""An imported torch program as a :class:`~ipu_stack.workloads.base.Workload`.

``import_program`` is the Python entry point: an ``ExportedProgram`` (or an ``nn.Module``
plus example inputs, exported here) and the user's input arrays in, the IR graph, its
device tensors and PyTorch's own float32 outputs out.  ``imported_workload`` wraps a
``.pt2`` file so that ``pipeline.compile_workload`` compiles it unchanged and a package
records the file's path and sha256 (``ipu-stack run`` re-imports it and checks the hash).

Two passes, as the builtins: FP8 activation exponents, one per role (a value's name without
its ``layerN.``), are fitted on a calibration input drawn from ``seed + 1`` (the graph run
unrounded in float32), then the graph is built again with them.  After the build, the
*conversion check* runs the graph in float64 on the exact float32 weights and inputs and
compares it with torch's float32 outputs: a mapping error shows there at once (relative RMS
far above float32's 1e-6), independent of precision.
"""

from __future__ import annotations

import hashlib
import logging
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ipu_stack.frontend.attention import attention_ran_in
from ipu_stack.frontend.convert import (
    Converted,
    role,
)
from ipu_stack.frontend.input_file import refuse_past_a_chip
from ipu_stack.frontend.loader import file_sha256, load_program, require_torch
from ipu_stack.frontend.names import IMPORTED
from ipu_stack.frontend.onnx_file import onnx_sha256
from ipu_stack.frontend.ops_cache import cache_buffers, position_inputs
from ipu_stack.frontend.options import program_parameters
from ipu_stack.frontend.sizing import program_footprint
from ipu_stack.frontend.step import (
    CacheStep,
    cache_step,
    last_position_logits,
    prompt_feed,
    step_feed,
    torch_greedy,
    torch_token_fields,
)
from ipu_stack.frontend.user_inputs import (
    call_arguments,
    input_shapes,
    inputs_from_file,
    random_inputs,
    user_input_values,
)
from ipu_stack.frontend.walk import Importer
from ipu_stack.ir.graph import Graph, choose_on_device
from ipu_stack.ir.interpret import evaluate_float64, fit_scales
from ipu_stack.ir.names import layer_set
from ipu_stack.ir.rope_pairs import interleave_rope_pairs
from ipu_stack.util.errors import CompileError, ConversionError, UsageError, first_line
from ipu_stack.util.log import event
from ipu_stack.workloads.base import Parameter, Workload, choose_suffix
from ipu_stack.workloads.transformer import attention_precision, attention_suffix

LOG = logging.getLogger("ipu_stack.frontend")
NAME = IMPORTED
CONVERSION_LIMIT = 1e-4  # relative RMS of float64 graph vs torch float32 (float32 is ~1e-6)
# where the reference computes in a half-precision type (an FP16 ONNX file, a .pt2 exported
# in half): its own rounding alone is ~3e-4 (F16, 2^-11 an operation) or ~2e-3 (BF16, 2^-8)
HALF_CONVERSION_LIMITS = {"float16": 1e-2, "bfloat16": 5e-2}


def conversion_limit(program: Any, kinds: frozenset[str] = frozenset()) -> float:
    """The conversion check's bound for ``program``: float32's, or the loosest of the
    half-precision types any of its values (or its reference, ``kinds``) is computed in."""
    kinds = kinds | {str(getattr(node.meta.get("val"), "dtype", "")).removeprefix("torch.")
                     for node in program.graph.nodes if node.op == "call_function"}
    return max([CONVERSION_LIMIT, *(HALF_CONVERSION_LIMITS.get(k, 0.0) for k in kinds)])


@dataclass
class Imported:
    """One import: the converted graph and tensors, torch's outputs laid out as the graph's
    outputs (by output name), and the conversion check's relative RMS error."""

    converted: Converted
    torch_outputs: dict[str, np.ndarray]
    conversion_error: float
    user_inputs: list[np.ndarray]

    @property
    def graph(self) -> Graph:
        return self.converted.graph

    @property
    def tensors(self) -> dict[str, np.ndarray]:
        return self.converted.tensors


def _export(module: Any, example_inputs: tuple[Any, ...]) -> Any:
    torch = require_torch()
    return torch.export.export(module.eval(), tuple(example_inputs))


def _example_shapes(program: Any) -> list[tuple[int, ...]]:
    """The shapes of the example inputs saved with the program (dynamic dims resolved)."""
    torch = require_torch()
    examples = getattr(program, "example_inputs", None)
    if examples is not None:
        args, _ = examples
        leaves = [a for a in args if isinstance(a, torch.Tensor)]
        if leaves:
            return [tuple(int(s) for s in leaf.shape) for leaf in leaves]
    return [tuple(s if isinstance(s, int) else 1 for s in value.shape)
            for _, value in user_input_values(program) if hasattr(value, "shape")]


def specialize(program: Any, batch: int) -> Any:
    """``program`` with static shapes and ``batch`` images (0: the exported batch).

    A program exported with a dynamic batch dimension is re-exported from its own module at
    the size asked for; one exported with static shapes can only run at its own batch."""
    shapes = _example_shapes(program)
    exported = shapes[0][0] if shapes and shapes[0] else 1
    if not has_dynamic_shape(program) and batch in (0, exported):
        return program
    size = batch or exported
    refusal = (f"batch {size}: the program's dynamic batch dimension does not take it" if
               has_dynamic_shape(program) else f"batch {size}: the program was exported for "
               f"batch {exported} without a dynamic batch dimension (export with "
               "dynamic_shapes={input: {0: Dim('batch')}})")
    for shape in shapes:  # before the examples are made
        refuse_past_a_chip(f"batch {size}: an input", (size, *shape[1:]))
    return _reexport(program, [np.zeros((size, *shape[1:]), np.float32) for shape in shapes],
                     refusal)


def has_dynamic_shape(program: Any) -> bool:
    """Whether a tensor input of the program has a dimension the export left dynamic."""
    return any(not isinstance(size, int) for _, value in user_input_values(program)
               if hasattr(value, "shape") for size in value.shape)


def step_program(program: Any, tokens: int) -> Any:
    """A decoder step with a static cache and a dynamic sequence length, re-exported at
    ``tokens`` tokens a sequence at positions ``0 .. tokens - 1``: a prompt's pass, its last
    position's logits alone (:func:`~ipu_stack.frontend.step.last_position_logits`)."""
    shapes = _example_shapes(program)
    tensors = [name for name, value in user_input_values(program) if hasattr(value, "shape")]
    arrays = [np.arange(tokens, dtype=np.float32) if name in position_inputs(program) else
              np.zeros((shape[0], tokens, *shape[2:]), np.float32)
              for name, shape in zip(tensors, shapes, strict=True)]
    return _reexport(program, arrays, f"the step cannot take {tokens} tokens a sequence",
                     lambda module: last_position_logits(module, tokens))


def _reexport(program: Any, arrays: list[np.ndarray], refusal: str,
              change: Callable[[Any], Any] = lambda module: module) -> Any:
    """``program`` exported again from its own module (``change``d) at the shapes of
    ``arrays``; a shape its export refuses is refused in one line (``refusal``)."""
    torch = require_torch()
    args, kwargs = call_arguments(program, arrays)
    try:
        return torch.export.export(change(quiet_module(program)), args, kwargs=kwargs)
    except Exception as exc:  # torch reports a failed guard in many exception types
        first = first_line(exc)
        raise UsageError(f"{refusal}: {first[:120]}") from None


def torch_outputs(program: Any, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """The program run by PyTorch itself on CPU in float32: its output leaves, in order."""
    torch = require_torch()
    from torch.utils import _pytree

    args, kwargs = call_arguments(program, inputs)
    with torch.no_grad():
        result = fresh_module(program)(*args, **kwargs)
    return [leaf.detach().to(torch.float32).numpy() for leaf in _pytree.tree_leaves(result)
            if isinstance(leaf, torch.Tensor)]


def quiet_module(program: Any) -> Any:
    """``program.module()`` without torch's warning for each lifted cache tensor (hundreds
    of lines for a re-exported 30-layer decoder)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning, module="torch.export")
        return program.module()


def fresh_module(program: Any) -> Any:
    """The program's module with copies of the buffers it writes (a static KV cache):
    a run must not change the program, whose buffers the next import reads."""
    module = quiet_module(program)
    for name in cache_buffers(program):
        target = next(spec.target for spec in program.graph_signature.input_specs
                      if spec.arg.name == name)
        owner, _, leaf = target.rpartition(".")
        holder = module.get_submodule(owner) if owner else module
        if leaf in dict(holder.named_buffers(recurse=False)):  # (a re-export: an attribute)
            holder.register_buffer(leaf, holder.get_buffer(leaf).clone(), persistent=False)
        else:
            setattr(holder, leaf, getattr(holder, leaf).clone())
    return module


@dataclass(frozen=True)
class Reference:
    """What an imported program's outputs are checked against: ``outputs(program, inputs)``
    gives them in the program's output order; ``source`` names it in records
    (``referenceSource``)."""

    source: str
    outputs: Callable[[Any, list[np.ndarray]], list[np.ndarray]]
    # the half-precision types the reference computes in beyond the program's own (an FP16
    # ONNX file runs in FP16 in onnxruntime, traced in float32 here)
    kinds: frozenset[str] = frozenset()


TORCH_REFERENCE = Reference("torch", torch_outputs)


def _fit_scales(program: Any, calibration: list[np.ndarray], name: str,
                attention: str = "f16") -> dict[str, int]:
    """FP8 exponents of activations, one per role (the largest over its layers), fitted
    with 2x headroom on an unrounded float32 run of a calibration input: the test data never tunes its
    own scales, and identical layers keep identical precisions."""
    first = Importer(program, calibration, "fp8", {}, name, attention,
                     device_tensors=False).run()
    # float32, as the builtins fit; each value fitted as it is made, then dropped
    return fit_scales(first.graph, first.exact,
                      [v.name for v in first.graph.values
                       if v.role in ("intermediate", "output") and v.type.precision.is_fp8],
                      role)


def import_program(program: Any, example_inputs: tuple[Any, ...] | None = None, *,
                   inputs: list[np.ndarray] | None = None, precision: str = "fp8", seed: int = 0,
                   calibration: list[np.ndarray] | None = None, name: str = "imported",
                   attention: str = "f16", reference: Reference | None = None,
                   kept: frozenset[int] = frozenset()) -> Imported:
    """Import ``program`` (an ``ExportedProgram``, or an ``nn.Module`` exported here with
    ``example_inputs``) into the IR; ``inputs`` default to random ones from ``seed`` and
    ``calibration`` to random ones from ``seed + 1``; ``attention`` "fp8" stores attention's
    operands in FP8 (with ``precision`` fp8), as the builtin towers do; ``reference`` gives
    the outputs the conversion check and the verdict compare with (default: torch's);
    ``kept`` layers stay F16 in fp8 mode (an FP8 recipe)."""
    torch = require_torch()
    if isinstance(program, torch.nn.Module):
        if example_inputs is None:
            raise UsageError("importing an nn.Module needs example inputs")
        program = _export(program, example_inputs)
    program = specialize(program, 0)
    if precision not in ("fp8", "f16"):
        raise UsageError(f"precision {precision!r} is not fp8 or f16")
    if attention not in ("fp8", "f16"):
        raise UsageError(f"attention {attention!r} is not fp8 or f16")
    user = inputs if inputs is not None else random_inputs(program, seed)
    scales: dict[str, int] = {}
    if precision == "fp8":
        calib = calibration if calibration is not None else random_inputs(program, seed + 1)
        scales = _fit_scales(program, calib, name, attention)
    converted = Importer(program, user, precision, scales, name, attention, kept).run()
    reference = reference or TORCH_REFERENCE
    outputs = reference.outputs(program, user)
    if len(outputs) != len(converted.outputs):
        raise CompileError(f"{reference.source} returned {len(outputs)} tensors, the import "
                           f"has {len(converted.outputs)} outputs")
    laid_out = {spec.name: spec.to_ir(outputs[spec.index]).astype(np.float32)
                for spec in converted.outputs}
    broken = next((n for n, v in laid_out.items() if not np.isfinite(v).all()), None)
    if broken is not None:  # the inputs overflow the model itself: nothing to compare with
        raise UsageError(f"{reference.source}'s own output {broken} holds NaN or infinite "
                         "values for these inputs: give inputs the model computes in float32")
    error = conversion_error(converted, laid_out)
    limit = conversion_limit(program, reference.kinds)
    if not error <= limit:
        raise ConversionError(f"conversion check failed: the imported graph in float64 differs from "
                           f"{reference.source} by {error:.3g} relative RMS (limit "
                           f"{limit:g}): an operation imported wrongly (please report "
                           "it with the model), or the reference's precision losing what "
                           "float64 keeps")
    event(LOG, "imported program", graph=name, precision=precision, reference=reference.source,
          operations=len(converted.graph.operations), rewrites=len(converted.rewrites),
          conversionError=float(f"{error:.3g}"))
    for rewrite in converted.rewrites:
        event(LOG, "import rewrite", level=logging.DEBUG, rewrite=rewrite)
    return Imported(converted, laid_out, error, user)


def conversion_error(converted: Converted, expected: dict[str, np.ndarray]) -> float:
    """Relative RMS of the graph in float64 (exact weights and inputs) against torch; only
    the outputs are kept (every float64 intermediate of a CLIP text encoder at batch 40 held
    at once is gigabytes: a CLIP text encoder's at batch 40 peaked at 8.9 GB)."""
    ideal = evaluate_float64(converted.graph, converted.exact,
                             keep={spec.name for spec in converted.outputs})
    diff, ref = [], []
    for spec in converted.outputs:
        got = np.asarray(ideal[spec.name], np.float64).reshape(expected[spec.name].shape)
        diff.append((got - expected[spec.name]).ravel())
        ref.append(expected[spec.name].ravel().astype(np.float64))
    d, r = np.concatenate(diff), np.concatenate(ref)
    scale = float(np.sqrt(np.mean(r**2))) or 1.0
    return float(np.sqrt(np.mean(d**2))) / scale


@dataclass(frozen=True)
class ImportedWorkload(Workload):
    """A workload made from one torch program; ``reference`` gives torch's outputs for a
    graph it built (the verdict's fidelity target), ``imports`` keeps the last imports."""

    program: Any = None
    imports: dict[int, Imported] = field(default_factory=dict, compare=False)
    reference_source: str = "torch"
    # (name, layer) of each product in the user's file where it names them (ONNX nodes)
    source_gemms: tuple[tuple[str, int | None], ...] = ()
    step: CacheStep | None = None  # a decoder step with a static KV cache (generate)

    def torch_tokens(self, prompt: np.ndarray, new_tokens: int, device: np.ndarray,
                     image: np.ndarray | None = None) -> dict[str, Any]:
        """The device's generated tokens (``[new_tokens, batch]``) against PyTorch's own
        greedy tokens for ``prompt`` (``frontend/step.py``; ``image``: PyTorch's image rows
        ahead of it), run with a fresh copy of the program's caches: ``torchTokenMatch``
        and where they first part."""
        torch = require_torch()
        module = fresh_module(self.program)

        def run(arrays: list[np.ndarray]) -> np.ndarray:
            args, kwargs = call_arguments(self.program, arrays)
            with torch.no_grad():
                return module(*args, **kwargs).float().numpy()
        assert self.step is not None
        return torch_token_fields(device, *torch_greedy(run, self.step, prompt, new_tokens,
                                                        image))

    @property
    def reference(self) -> ReferenceOutputs:
        """The outputs fidelity is measured against, for a graph this workload built."""
        return ReferenceOutputs(self.imports, self.reference_source)


@dataclass(frozen=True)
class ReferenceOutputs:
    """The reference's float32 outputs of each graph a workload built (by output name):
    PyTorch's for a ``.pt2``, onnxruntime's for an ONNX model; ``source`` names it in the
    record (``referenceSource``)."""

    imports: dict[int, Imported]
    source: str

    def __call__(self, graph: Graph, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        found = self.imports.get(id(graph))
        if found is None:
            raise CompileError(f"no {self.source} reference for a graph this workload did "
                               "not build")
        return dict(found.torch_outputs)


class ShapedPrograms:
    """An imported workload's program at each run's shape (batch, tokens a sequence).

    A decoder step with a static cache keeps its one-token step, and a prompt's pass of
    any length where the export's sequence length is dynamic (``frontend/step.py``).  A
    file's program without a cache is let go once imported (its float32 weights take as
    much as the rest of a run) and loaded again, its sha256 checked, if another import
    needs it; the input shapes of each shape are kept for the record."""

    def __init__(self, program: Any, path: str, sha256: str,
                 sized: Callable[[dict[str, Any]], Any] | None, source: str) -> None:
        self.program, self.path, self.sha256, self.sized = program, path, sha256, sized
        self.cached = source == "torch" and bool(position_inputs(program))
        self.prompts = self.cached and has_dynamic_shape(program)
        self.base = step_program(program, 1) if self.prompts else program
        self.step = cache_step(self.base, input_shapes(self.base)) if self.cached else None
        self.releasable = bool(path) and sized is None and not self.cached
        self.specialized: dict[tuple, Any] = {}
        self.shapes_at: dict[tuple, list[tuple[str, tuple[int, ...]]]] = {}

    def at(self, params: dict[str, Any]) -> Any:
        """The program at ``params``' batch and tokens."""
        key = (params["batch"], params.get("tokens", 0))
        if key not in self.specialized:
            if self.sized:  # an ONNX file sizes its symbolic dimensions itself
                self.specialized[key] = self.sized(params)
            elif key[1] > 1 and not self.prompts:
                raise UsageError(f"--tokens {key[1]}: " + (
                    "this decoder step was exported at a fixed length (export it with a "
                    "dynamic one for a prompt's pass)" if self.cached else
                    "a .pt2 program runs at the sequence length it was exported at"))
            elif self.cached:
                self.step.check_batch(key[0])
                self.specialized[key] = step_program(self.program, key[1]) \
                    if self.prompts and key[1] > 1 else self.base
            else:
                if self.program is None:
                    self.program = load_program(recorded_file(
                        {"model": self.path, "sha256": self.sha256}))
                self.specialized[key] = specialize(self.program, params["batch"])
        return self.specialized[key]

    def shapes(self, params: dict[str, Any]) -> list[tuple[str, tuple[int, ...]]]:
        key = (params["batch"], params.get("tokens", 0))
        if key not in self.shapes_at:
            self.shapes_at[key] = input_shapes(self.at(params))
        return self.shapes_at[key]

    def release(self) -> None:
        """Let the program go, where it can be loaded again."""
        if self.releasable:
            self.program = self.base = None
            self.specialized.clear()


def make_workload(program: Any, label: str, path: str = "", sha256: str = "", *,
                  sized: Callable[[dict[str, Any]], Any] | None = None,
                  reference: Reference = TORCH_REFERENCE,
                  parameters: tuple[Parameter, ...] | None = None,
                  source_gemms: tuple[tuple[str, int | None], ...] = ()) -> ImportedWorkload:
    """Wrap ``program`` as a workload (``label`` names it in identifiers and records);
    ``sized`` gives the program at a run's parameters (default: ``program`` re-exported at
    ``--batch``), ``reference`` what its outputs are checked against."""
    holder: dict[int, Imported] = {}
    shaped = ShapedPrograms(program, path, sha256, sized, reference.source)
    step = shaped.step

    def tokens_of(imported: Imported) -> int:
        """The tokens a sequence an import of a step takes (its positions input's)."""
        return imported.user_inputs[step.position_index].size if step else 0

    def imported_at(tokens: int) -> Imported:
        """The last import taking ``tokens`` tokens a sequence (a step: 1)."""
        found = [i for i in holder.values() if tokens_of(i) == tokens]
        if not found:
            raise CompileError(f"no import of {label} takes {tokens} tokens a sequence")
        return found[-1]

    def build(params: dict[str, Any]) -> tuple[Graph, dict[str, np.ndarray]]:
        shaped.shapes(params)
        sized_program = shaped.at(params)
        user = inputs_from_file(sized_program, params["inputs"]) if params["inputs"] else None
        imported = import_program(sized_program, inputs=user, precision=params["precision"],
                                  seed=params["seed"], name=label,
                                  attention=attention_precision(params), reference=reference,
                                  kept=layer_set(params.get("keep_f16", "")))
        del sized_program
        shaped.release()
        for key in [k for k, i in holder.items()
                    if not shaped.cached or tokens_of(i) == tokens_of(imported)]:
            del holder[key]  # one import a shape: the graphs the pipeline holds now
        holder[id(imported.graph)] = imported
        if params.get("choose") == "device":  # the torch outputs stay the logits' reference
            choose_on_device(imported.graph)
        interleave_rope_pairs(imported.graph, imported.tensors)  # as the builtin decoders
        # the exact float32 weights served the conversion check; the compile and the run
        # read the device's tensors and torch's outputs (half a gigabyte for CLIP's text)
        imported.converted.exact.clear()
        return imported.graph, imported.tensors

    def identifier(params: dict[str, Any]) -> str:
        digest = (params["sha256"] or hashlib.sha256(label.encode()).hexdigest())[:8]
        batch = f"-b{params['batch']}" if params["batch"] else ""
        batch += f"-t{params['tokens']}" if params.get("tokens") else ""
        return (f"{label}-{params['precision']}{batch}-{digest}"
                f"{attention_suffix(params, 'f16')}{choose_suffix(params)}")

    def fields(params: dict[str, Any]) -> dict[str, Any]:
        last = next(iter(holder.values()), None)
        shapes = shaped.shapes(params)
        return {"benchmark": f"{label}-{params['precision']}", "model": params["model"] or label,
                "batch": shapes[0][1][0] if shapes and shapes[0][1] else 1,
                "inputShapes": ";".join("x".join(map(str, s)) for _, s in shapes),
                "conversionError": None if last is None else float(f"{last.conversion_error:.3g}"),
                "attention": attention_precision(params) if last is None
                else attention_ran_in(last.converted.graph)}

    kind = "ONNX model" if reference.source == "onnxruntime" else "torch.export program"
    return ImportedWorkload(
        name=NAME, description=f"{kind} {label}", parameters=parameters or program_parameters(),
        build=build, identifier=identifier, benchmark_fields=fields,
        program=None if shaped.releasable else program,
        footprint=lambda params: program_footprint(shaped.at(params), params["precision"]),
        imports=holder, reference_source=reference.source, source_gemms=source_gemms,
        step=step, step_inputs=None if step is None else step_feed(
            step, lambda: imported_at(step.tokens).converted.inputs),
        prompt_inputs=prompt_feed(step, lambda tokens: imported_at(tokens).converted.inputs)
        if shaped.prompts and step is not None else None)


def imported_workload(path: str | Path) -> tuple[ImportedWorkload, dict[str, Any]]:
    """The workload of a ``.pt2`` file and its base parameters (absolute path, sha256)."""
    path = Path(path).resolve()
    program = load_program(path)
    digest = file_sha256(path)
    workload = make_workload(program, path.stem, str(path), digest)
    return workload, {"model": str(path), "sha256": digest}


def recorded_file(params: dict[str, Any]) -> Path:
    """The model file a package recorded, checked to be the same (same sha256).  A package
    is hostile input: it may name only a ``.pt2`` or ``.onnx`` file, with its sha256, so
    no other file of the host is opened or hashed on its say."""
    path = Path(str(params.get("model", "")))
    if path.suffix not in (".pt2", ".onnx"):
        raise UsageError(f"the package names {path} as its model file, which is not a .pt2 "
                         "or .onnx file")
    if not re.fullmatch(r"[0-9a-f]{64}", str(params.get("sha256") or "")):
        raise UsageError(f"the package names {path} as its model file but records no sha256 "
                         "of it")
    if not path.is_file():
        raise UsageError(f"the package was compiled from {path}, which is no longer there")
    inputs = params.get("inputs")
    if inputs and not Path(inputs).is_file():
        raise UsageError(f"the package was compiled with the inputs {inputs}, which are no "
                         "longer there")
    digest = onnx_sha256(path) if path.suffix == ".onnx" else file_sha256(path)
    if params.get("sha256") and digest != params["sha256"]:
        raise UsageError(f"{path} changed since the package was compiled (sha256 {digest[:12]}, "
                         f"recorded {str(params['sha256'])[:12]})")
    return path
