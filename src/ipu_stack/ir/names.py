"""Model-part names: which part of the model a graph value, a compile stage or a tile buffer
serves, in the words a person reads on a page (``layer 3 fc1``, ``layer 0 attn scores``).

They come from the graph's own value names: a builtin tower's ``layer3.fc1.out``, or an
imported model's transformers module path and operation, ``layer3.mlp.fc1.linear``
(``frontend.convert``).  The internal names (``stage11.gemm``, ``stage4.a``) stay what the
program, the logs and the package use; these labels sit beside them for people.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from ipu_stack.util.errors import UsageError

LAYER = re.compile(r"^layer(\d+)\.")
MOST_LAYER_NUMBER = 9999  # --keep-f16's numbers: bounded before a range of them is made
STAGE = re.compile(r"^stage(\d+)(?:\.(.*))?$")
# trailing words that name how a value was computed, not which part it belongs to
OPERATION_WORDS = frozenset({"out", "mm", "linear", "addmm", "matmul", "bmm", "default"})
# a value's or a stage buffer's last word, said as a person would
WORDS = {"w": "weights", "b": "bias", "partial": "partial sums",
         "received": "received partials"}
OPERANDS = {**WORDS, "a": "A operand", "b": "B operand"}  # a stage buffer's first word


@dataclass(frozen=True)
class Part:
    """A model part: its layer (None outside the layer stack) and what it is in the layer."""

    layer: int | None
    what: str

    def label(self, passes: int = 0) -> str:
        """``layer 3 fc1``; ``passes`` shifts the layer (pass k of a layer loop whose body
        was lowered from this part's layer, or a program shared by a later group)."""
        if self.layer is None:
            return self.what
        return f"layer {self.layer + passes} {self.what}"

    def to_json(self) -> list[object]:
        """``[layer or -1, what]``, ``what`` cut to the 200 characters a reader accepts."""
        return [-1 if self.layer is None else self.layer, self.what[:200]]


def value_part(name: str) -> Part:
    """The part a value named ``name`` belongs to: ``layer0.attn.q.out`` -> layer 0,
    ``attn q``; ``layer3.mlp.fc1.linear#1`` -> layer 3, ``mlp fc1``; ``x`` -> ``x``."""
    layer, rest = None, name
    match = LAYER.match(name)
    if match:
        layer, rest = int(match.group(1)), name[match.end():]
    words = [w for w in rest.split("#")[0].split(".") if w]
    while len(words) > 1 and words[-1] in OPERATION_WORDS:
        words.pop()
    if len(words) > 1:
        words[-1] = WORDS.get(words[-1], words[-1])
    return Part(layer, " ".join(words) or name)


def step_label(name: str, parts: dict[int, Part], passes: int = 0) -> str:
    """A program step's or buffer's name with its stage's part in front: ``stage11.gemm`` ->
    ``layer 0 fc1 gemm``; a name that is no stage's (a value's buffer) is read as a value
    name; ``passes`` as in :meth:`Part.label`."""
    match = STAGE.match(name)
    if match is None:
        return value_part(name).label(passes)
    part = parts.get(int(match.group(1)))
    if part is None:
        return name
    words = [w for w in (match.group(2) or "").split(".") if w]
    rest = [OPERANDS.get(w, w) if k == 0 else WORDS.get(w, w) for k, w in enumerate(words)]
    if rest and rest[0].replace("_", " ") in part.what:  # the row kernel the part names
        rest = rest[1:]
    return " ".join([part.label(passes), *rest])


def parts_from_json(data: object, limit: int = 1 << 20) -> dict[int, Part]:
    """The ``parts`` record of a package manifest (``[[stage, layer or -1, what], ...]``),
    checked entry by entry: it is read from a file, so anything else is ``ValueError``."""
    if not isinstance(data, list) or len(data) > limit:
        raise ValueError("parts is not a list of at most 2^20 entries")
    parts: dict[int, Part] = {}
    for entry in data:
        if (not isinstance(entry, list) or len(entry) != 3
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in entry[:2])
                or not isinstance(entry[2], str) or len(entry[2]) > 200
                or entry[0] < 0 or entry[1] < -1):
            raise ValueError(f"parts entry {str(entry)[:60]} is not [stage, layer, what]")
        parts[entry[0]] = Part(None if entry[1] < 0 else entry[1], entry[2])
    return parts


# a weight's module path inside a layer stack (``encoder.layers.3.mlp.fc1.weight``)
MODULE_LAYER = re.compile(r"(?:^|\.)(?:layers|layer|blocks|resblocks|h)\.(\d+)(?:\.|$)")


def name_layer(name: str) -> int | None:
    """The layer a value or weight belongs to: ``layer3.fc1.out`` and
    ``model.encoder.layers.3.mlp.fc1.weight`` are layer 3; ``None`` outside the stack."""
    match = LAYER.match(name) or MODULE_LAYER.search(name)
    return int(match.group(1)) if match else None


def layer_set(text: str, option: str = "--keep-f16") -> frozenset[int]:
    """``"3,7"`` or ``"0-2,9"`` as a set of layer numbers (empty text: none)."""
    layers: set[int] = set()
    for item in (t.strip() for t in str(text or "").split(",")):
        if not item:
            continue
        low, _, high = item.partition("-")
        if not low.isdigit() or (high and not high.isdigit()) or (high and int(high) < int(low)):
            raise UsageError(f"{option} {text!r}: give layer numbers, e.g. 3,7 or 0-2")
        if int(high or low) > MOST_LAYER_NUMBER:  # bounded before a range is made
            raise UsageError(f"{option} {text!r}: layer numbers go up to {MOST_LAYER_NUMBER}")
        layers.update(range(int(low), int(high or low) + 1))
    return frozenset(layers)


def refuse_absent_layers(params: dict, names: Iterable[str]) -> None:
    """One line where ``--keep-f16`` names a layer the model (its values' ``names``) lacks,
    or is given to a model that is not FP8: either would change nothing, silently."""
    text, option = params.get("keep_f16", ""), "--keep-f16"
    kept = layer_set(text, option)
    if not kept:
        return
    if params.get("precision") != "fp8":
        raise UsageError(f"{option} {text}: every layer is F16 at --precision "
                         f"{params.get('precision')}; it keeps layers of an FP8 model F16")
    present = {layer for layer in map(name_layer, names) if layer is not None}
    absent = sorted(kept - present)
    if absent:
        has = f"its layers are 0-{max(present)}" if present else "it has no numbered layers"
        raise UsageError(f"{option} {text}: the model has no layer {absent[0]} ({has})")


def fp8_allowed(name: str, kept: frozenset[int]) -> bool:
    """Whether a value or weight named ``name`` may be FP8 when the layers ``kept`` stay
    F16 (an FP8 recipe, ``ipu-stack fp8-recipe``)."""
    return not kept or name_layer(name) not in kept
