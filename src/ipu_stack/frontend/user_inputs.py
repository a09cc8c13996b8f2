"""A torch program's user inputs: which are tensors and which constants the export fixed,
their shapes, the arguments to call the program with, and the arrays it runs on (random,
seeded a name at a time, or a user's ``.npz``, bounded by the program's inputs before any
array is read)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ipu_stack.frontend.convert import TRANSPARENT, op_name, user_input_nodes
from ipu_stack.frontend.input_file import read_input_arrays, refuse_past_a_chip
from ipu_stack.frontend.loader import require_torch
from ipu_stack.frontend.ops_cache import position_inputs
from ipu_stack.util.errors import UsageError
from ipu_stack.workloads.base import rng_for

CONSTANT_TYPES = (bool, int, float, str, type(None))


def user_input_values(program: Any) -> list[tuple[str, Any]]:
    """(name, value) of each user input as the export saw it: a fake tensor, or the constant
    ``torch.export`` fixed (``use_cache=False``).  A constant is specialised: the program
    runs with that value; an input of any other kind is refused in one line."""
    out = []
    for node in user_input_nodes(program):
        value = node.meta.get("val")
        if not hasattr(value, "shape") and not isinstance(value, CONSTANT_TYPES):
            raise UsageError(f"program input {node.name} is a {type(value).__name__}, "
                             "neither a tensor nor a constant the export fixed")
        out.append((node.name, value))
    return out


def call_arguments(program: Any, arrays: list[np.ndarray]) -> tuple[tuple, dict]:
    """The positional and keyword arguments to call the program's module with: ``arrays``
    for its tensor inputs, in order, and the constants it was exported with."""
    torch = require_torch()
    from torch.utils import _pytree

    tensors = iter([torch.from_numpy(np.ascontiguousarray(a)) for a in arrays])
    examples = getattr(program, "example_inputs", None)
    if examples is None:  # the placeholders say which inputs are ids
        return tuple(next(tensors).to(torch.int64 if integer else torch.float32)
                     for integer in integer_inputs(program)), {}
    leaves, spec = _pytree.tree_flatten(examples)
    filled = [next(tensors).to(leaf.dtype) if isinstance(leaf, torch.Tensor) else leaf
              for leaf in leaves]
    args, kwargs = _pytree.tree_unflatten(filled, spec)
    return tuple(args), dict(kwargs)


def input_shapes(program: Any) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of each tensor user input of the program (static: see
    :func:`specialize`); constants the export fixed are not inputs here."""
    out = []
    for name, value in user_input_values(program):
        if not hasattr(value, "shape"):
            continue
        if not all(isinstance(s, int) for s in value.shape):
            raise UsageError(f"program input {name} has a dynamic shape "
                             f"{list(value.shape)}: specialize it first")
        out.append((name, tuple(int(s) for s in value.shape)))
    return out


def integer_inputs(program: Any) -> list[bool]:
    """Whether each tensor user input is integer (ids a lookup reads), in order."""
    return [not getattr(value, "dtype", None).is_floating_point
            for _, value in user_input_values(program) if hasattr(value, "shape")]


def smallest_table_rows(program: Any, name: str) -> int:
    """The fewest rows of the tables an integer input's ids are looked up in (through
    views), so that random ids index every one of them; refused when no lookup reads it."""
    start = next(n for n in program.graph.nodes if n.name == name)
    frontier, rows = [start], []
    while frontier:
        node = frontier.pop()
        for user in node.users:
            kind = op_name(user.target)
            if kind == "aten.embedding" and len(user.args) > 1 and user.args[1] is node:
                rows.append(int(user.args[0].meta["val"].shape[0]))
            elif kind in TRANSPARENT:
                frontier.append(user)
    if not rows:
        raise UsageError(f"program input {name} is an integer tensor that no lookup "
                         "(aten.embedding) reads: an integer input must be token ids, or a "
                         "cache step's positions; export without it (an attention_mask: the "
                         "model builds its causal mask itself)")
    return min(rows)


def random_inputs(program: Any, seed: int) -> list[np.ndarray]:
    """Standard-normal inputs of the exported shapes, one generator per input name; an
    integer input gets ids within the tables it is looked up in."""
    out = []
    positions = position_inputs(program)
    for (name, shape), integer in zip(input_shapes(program), integer_inputs(program),
                                      strict=True):
        refuse_past_a_chip(f"input {name}", shape)
        rng = rng_for(seed, name)
        if name in positions:  # a static cache's step: the first positions
            out.append(np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape))
            continue
        out.append(rng.integers(0, smallest_table_rows(program, name), shape).astype(np.float32)
                   if integer else rng.standard_normal(shape).astype(np.float32))
    return out


def inputs_from_file(program: Any, path: str | Path) -> list[np.ndarray]:
    """Inputs from an ``.npz``: by input name, else ``arr_0, arr_1, ...`` in order (the
    file's arrays bounded by the program's inputs, as float64, before any is read)."""
    shapes = input_shapes(program)
    most = sum(int(np.prod(shape, dtype=np.float64)) for _, shape in shapes) * 8 + (1 << 20)
    data = read_input_arrays(path, most_bytes=most)
    arrays, used = [], set()
    integer = integer_inputs(program)
    for index, (name, shape) in enumerate(shapes):
        key = name if name in data else f"arr_{index}"
        used.add(key)
        if key not in data:
            raise UsageError(f"--inputs {path}: no array {name!r} (has {', '.join(data)})")
        if not integer[index] and data[key].dtype.kind in "biu":  # ids, or a mask, by mistake
            raise UsageError(f"--inputs {path}: {name} holds {data[key].dtype} values and the "
                             "program takes floating point there (cast the array if meant)")
        array = np.asarray(data[key], dtype=np.float32)
        if array.shape != shape:
            raise UsageError(f"--inputs {path}: {name} is {list(array.shape)}, the program was "
                             f"exported for {list(shape)}")
        if integer[index] and array.size:
            rows = smallest_table_rows(program, name)
            if array.min() < 0 or array.max() >= rows or (array % 1).any():
                raise UsageError(f"--inputs {path}: {name} holds ids outside [0, {rows}) or "
                                 f"not whole ({array.min():g} to {array.max():g})")
        arrays.append(array)
    unread = sorted(set(data) - used)
    if unread:  # a misspelt name would otherwise leave its input random, without a word
        raise UsageError(f"--inputs {path}: {unread[0]} is not an input of the program (its "
                         f"inputs: {', '.join(name for name, _ in shapes)})")
    return arrays
