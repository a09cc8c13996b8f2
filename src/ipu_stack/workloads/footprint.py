"""Sizes refused before any work: a builtin workload's least memory, from its parameters alone.

A compile builds the graph, fits the FP8 calibration in a child process and plans every
stage before it learns that a model cannot fit; at absurd sizes (``--layers 100000``,
``--batch 100000``) that work alone exhausts the host.  Every builtin workload therefore
states, in closed form, bytes it cannot do without: its GEMM weights in their stored
precision, and the largest pair of activations one operation reads and writes (a GEMM's
input and output, or attention's scores).  Both are lower bounds (norm and bias vectors,
kernels, exchange tables and partials come on top), so a refusal is never wrong; a model
that passes may still not fit, which the planner then says with the fullest tile's contents.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ipu_stack.target import Target, get_target
from ipu_stack.target.links import LINK_FACTS
from ipu_stack.util.errors import CompileError


@dataclass(frozen=True)
class Footprint:
    """Bytes a workload needs at least: weights, and the largest activations alive together
    (``activation_what`` says which)."""

    weight_bytes: int
    activation_bytes: int
    activation_what: str
    layers: int  # the repeated layers (or blocks) the weights grow with
    layer_parameter: str  # the option that sets them
    layer_weight_bytes: int  # the weights of one of them
    # an imported program's largest value of any kind, in bytes at its own type, and which
    # it is: its host references hold it whole (``VALUE_BYTES``)
    value_bytes: int = 0
    value_what: str = ""
    # of ``weight_bytes``, a decode step's KV cache (named apart: it grows with the context
    # and the batch, the weights do not)
    cache_bytes: int = 0
    # of ``weight_bytes``, the largest weight outside the layers (a token table), which a
    # pipeline over chips cannot split either: it stays on one chip, as a layer does
    part_bytes: int = 0
    part_what: str = ""


VALUE_BYTES = 2 ** 30
"""The most bytes one value of a model may hold at its own type (1 GiB, more than a chip
holds): a file of a few hundred bytes can ask for a broadcast of billions, which the host's
references (torch, onnxruntime, float64) would hold whole."""
MADE_BYTES = 2 ** 31
"""The most bytes an import may make on the host from a program's constants in all (masks,
tables, shape arithmetic: 2 GiB, many times what real models fold)."""


def gib(count: int) -> str:
    """``count`` bytes in GiB, as the bounds' messages give them."""
    return f"{count / 2 ** 30:.1f} GiB"


def _items(params: dict[str, Any]) -> tuple[int, int]:
    """Bytes of a GEMM weight and of a GEMM operand activation at the workload's precision
    (FP8 stores one byte, F16 two)."""
    size = 1 if params.get("precision", "fp8") == "fp8" else 2
    return size, size


def mlp_footprint(params: dict[str, Any]) -> Footprint:
    """``fc2(gelu(fc1(x)))`` blocks: two weights a block; fc1's input and output together."""
    weight, act = _items(params)
    rows = params["batch"] * params["tokens"]
    dim, hidden = params["dim"], params["hidden"]
    return Footprint(params["blocks"] * 2 * dim * hidden * weight,
                     rows * (dim + hidden) * act, "fc1's input and output",
                     params["blocks"], "blocks", 2 * dim * hidden * weight)


def layer_footprint(params: dict[str, Any], layers: int, layer_parameter: str,
                    tokens: int, extra_weights: int = 0) -> Footprint:
    """Pre-norm transformer layers: q, k, v, o and, with an MLP, fc1 and fc2 a layer; the
    larger of fc1's input and output and one layer's attention scores (F16, every head)."""
    weight, act = _items(params)
    dim, heads = params["dim"], params.get("heads", 1)
    hidden = params.get("hidden", 0)
    rows = params["batch"] * tokens
    per_layer = (4 * dim * dim + 2 * dim * hidden) * weight
    scores = params["batch"] * heads * tokens * tokens * 2
    mlp = rows * (dim + hidden) * act
    what = "one layer's attention scores" if scores >= mlp else "fc1's input and output"
    return Footprint(layers * per_layer + extra_weights, max(scores, mlp), what, layers,
                     layer_parameter, per_layer)


def tower_footprint(params: dict[str, Any], cls: bool) -> Footprint:
    """A vision tower: the patch embedding (3 p^2 x dim, its patches in and embeddings out)
    and the layers, at the tokens its image and patch give (plus a CLS token where the tower
    has one)."""
    weight, act = _items(params)
    grid = params["image"] // params["patch"]
    tokens = grid * grid + (1 if cls else 0)
    depth = 3 * params["patch"] ** 2
    layers = layer_footprint(params, params["layers"], "layers", tokens,
                             depth * params["dim"] * weight)
    embedding = params["batch"] * tokens * (depth + params["dim"]) * act
    if embedding <= layers.activation_bytes:
        return layers
    return replace(layers, activation_bytes=embedding,
                   activation_what="the patch embedding's input and output")


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e8 else f"{nbytes / 1e6:.1f} MB"


def chip_bytes(target: Target) -> int:
    """Bytes one chip's tiles hold for a program (its tiles' memory above the runtime's)."""
    return target.tiles * (target.memory_end - target.memory_base)


def check_fits(workload: Any, params: dict[str, Any], target: str, chips: int) -> None:
    """Before a workload is built: refuse it when its least memory cannot fit ``chips``
    chips (a workload without a footprint, an imported program, is built to be sized)."""
    if workload.footprint is not None:
        check_footprint(workload_label(workload, params), workload.footprint(params), target,
                        chips)


def workload_label(workload: Any, params: dict[str, Any]) -> str:
    """The name a message gives a workload: an imported model's file name (its workload's
    name is the importer's, the same for every file), else the builtin's name."""
    return Path(params["model"]).name if params.get("model") else workload.name


def check_value(name: str, footprint: Footprint) -> None:
    """Refuse, in one line, a workload one of whose values takes over ``VALUE_BYTES``: the
    host's references would hold it whole (a listing of operations too, which makes every
    value once)."""
    if footprint.value_bytes > VALUE_BYTES:
        raise CompileError(f"{name}: {footprint.value_what} takes "
                           f"{gib(footprint.value_bytes)}, over the bound of "
                           f"{gib(VALUE_BYTES)} for one value")


def check_footprint(name: str, footprint: Footprint, target: str, chips: int) -> None:
    """Refuse, in one line, a workload whose least memory exceeds ``chips`` chips', naming
    what fills it and the size or chip count that could fit."""
    chip = chip_bytes(get_target(target))
    held = chips * chip
    need = footprint.weight_bytes + footprint.activation_bytes
    if chips > 1:
        check_parts(name, footprint, target, chip)
    if need <= held:
        check_value(name, footprint)
        return
    where = (f"{chips} chips of {target} hold {_gb(held)}" if chips > 1
             else f"one chip of {target} holds {_gb(held)}")
    if footprint.weight_bytes > held:
        cards = int(LINK_FACTS["max_cards"].value)
        needed = least_chips(footprint, target)
        hint = (f"; it needs at least {needed} chips (--chips {needed})" if needed <= cards
                else f"; more than the {cards} cards a C600 cluster links")
        per_layer = max(footprint.layer_weight_bytes, 1)
        rest = footprint.weight_bytes - footprint.layers * footprint.layer_weight_bytes
        fit = (held - rest - footprint.activation_bytes) // per_layer
        if footprint.layers > 1 and 0 < fit < footprint.layers:
            hint += (f"; or --{footprint.layer_parameter} {fit} at most on "
                     f"{chips if chips > 1 else 'one'} chip{'s' if chips > 1 else ''}")
        raise CompileError(f"{name} does not fit: its {_held(footprint)} alone take at least "
                         f"{_gb(footprint.weight_bytes)} and {where}{hint}")
    raise CompileError(f"{name} does not fit: its {_held(footprint)} "
                     f"({_gb(footprint.weight_bytes)}) and "
                     f"{footprint.activation_what} ({_gb(footprint.activation_bytes)}) take "
                     f"at least {_gb(need)} and {where}")


def check_parts(name: str, footprint: Footprint, target: str, chip: int) -> None:
    """Refuse, in one line, a workload whose one layer or table alone is more than one chip
    holds: a pipeline over several chips puts each on one chip, so more chips cannot help."""
    unit = "block" if footprint.layer_parameter == "blocks" else "layer"
    # an imported program's footprint does not know its layers (its one "layer" is all)
    layer = (footprint.layer_weight_bytes if footprint.layer_parameter else 0,
             f"one {unit}'s weights" + (" and KV cache take" if footprint.cache_bytes
                                        else " take"))
    size, what = max(layer, (footprint.part_bytes, f"{footprint.part_what} takes"))
    if size > chip:
        raise CompileError(f"{name} does not fit: {what} at least {_gb(size)} alone and one "
                           f"chip of {target} holds {_gb(chip)} (a pipeline over chips keeps "
                           f"each {unit} and table on one chip)")


def _held(footprint: Footprint) -> str:
    """What ``weight_bytes`` counts, in words: the weights, and a decode step's KV cache."""
    if not footprint.cache_bytes:
        return "weights"
    return f"weights and KV cache (the cache {_gb(footprint.cache_bytes)})"


def least_chips(footprint: Footprint, target: str) -> int:
    """The fewest chips whose memory could hold the footprint (a lower bound: the planner
    may need more)."""
    need = footprint.weight_bytes + footprint.activation_bytes
    return max(1, -(-need // chip_bytes(get_target(target))))


def footprint_line(workload: Any, target: str = "ipu21") -> str | None:
    """One line for a listing: the weights at the defaults and the fewest chips."""
    if workload.footprint is None:
        return None
    footprint = workload.footprint(workload.defaults())
    chips = least_chips(footprint, target)
    return (f"GEMM weights {_gb(footprint.weight_bytes)} at the defaults; "
            + ("fits one chip's memory" if chips == 1 else f"needs --chips {chips} or more"))
