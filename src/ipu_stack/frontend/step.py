"""A decoder's step exported with a static KV cache, as generation drives it.

``transformers.integrations.executorch`` exports a decoder as one step: token ids
``[B, T]`` and their cache positions ``[T]`` in, logits out, the cache held in buffers the
step writes in place (``frontend/ops_cache.py``).  ``ipu-stack generate MODEL.pt2`` feeds
the prompt a token a step and then the device's own choices: each step's inputs come from
the user inputs the host makes here (the ids, the positions), mapped through the import's
per-call inputs (the slots, the mask and the RoPE tables the host computes from the
positions).  An export whose sequence length is dynamic also gives the prompt's pass: the
step re-exported at the prompt's length (:func:`prompt_feed`).  PyTorch's own greedy tokens
(:func:`torch_greedy`) run the same program in float32 from its own prefix, for
``torchTokenMatch``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ipu_stack.frontend.convert import InputSpec, op_name, user_inputs_read
from ipu_stack.frontend.ops_cache import cache_buffers, position_inputs
from ipu_stack.util.errors import UsageError


@dataclass(frozen=True)
class CacheStep:
    """The shape of a step program: sequences, tokens a step, cache positions, vocabulary
    (the width of its logits), and which user input is the positions.  A step exported to
    take ``inputs_embeds`` (a VLM's decoder, whose prompt holds an image's rows) has its
    token table here: the host looks the tokens up (host preprocessing, as a serving stack
    does for such a step) and puts the image's rows where the image is."""

    batch: int
    tokens: int
    context: int
    vocab: int
    position_index: int
    table: np.ndarray | None = field(default=None, compare=False, repr=False)
    lookup_rows: int = 0  # the rows of the table its ids index (0: none found)
    position_rows: int = 0  # the rows of a table looked up at its positions (0: none)

    def check_batch(self, batch: int) -> None:
        """Refuse a ``--batch`` other than the export's: a static cache holds its batch."""
        if batch not in (0, self.batch):
            raise UsageError(f"--batch {batch}: the step was exported for batch {self.batch}")


def cache_step(program: Any, shapes: list[tuple[str, tuple[int, ...]]]) -> CacheStep | None:
    """The program's step shape when it is a decoder step with a static KV cache (one ids
    input, one positions input), else None."""
    positions = position_inputs(program)
    if len(positions) != 1 or len(shapes) != 2:
        return None
    index = next(i for i, (name, _) in enumerate(shapes) if name == positions[0])
    ids = shapes[1 - index][1]
    tables = token_tables(program)
    table = token_table(tables, ids[-1]) if len(ids) == 3 else None
    if len(ids) != 2 and table is None:
        return None
    name = cache_buffers(program)[0]
    cache = next(n for n in program.graph.nodes if n.name == name).meta.get("val")
    outputs = [n for n in program.graph.nodes if n.op == "output"][0].args[0]
    logits = outputs[0].meta.get("val") if outputs and hasattr(outputs[0], "meta") else None
    if getattr(cache, "ndim", 0) != 4 or getattr(logits, "ndim", 0) < 2:
        return None  # not a step's cache and logits: generate refuses it in one line
    return CacheStep(int(ids[0]), int(ids[1]), int(cache.shape[2]), int(logits.shape[-1]),
                     index, table, int(tables[0].shape[0]) if len(tables) == 1 else 0,
                     position_table_rows(program, positions[0]))


def position_table_rows(program: Any, positions: str) -> int:
    """The rows of the smallest table the step looks up at positions computed from its
    ``positions`` input (GPT-2's learned position embedding): the positions it can take
    (0: it has none)."""
    rows = []
    for node in program.graph.nodes:
        if node.op == "call_function" and op_name(node.target) == "aten.embedding" \
                and len(node.args) > 1 and positions in user_inputs_read(program, node.args[1]):
            table = getattr(node.args[0], "meta", {}).get("val")
            if getattr(table, "ndim", 0) == 2:  # else the import refuses it in one line
                rows.append(int(table.shape[0]))
    return min(rows, default=0)


def token_tables(program: Any) -> list[Any]:
    """The program's token tables: its parameters named as transformers names them
    (``embed_tokens.weight``), ``[vocab, width]``."""
    return [tensor for name, tensor in program.state_dict.items()
            if name.endswith("embed_tokens.weight") and tensor.ndim == 2]


def token_table(tables: list[Any], width: int) -> np.ndarray | None:
    """The token table (of ``tables``) of a step that takes embeddings ``width`` wide,
    ``[vocab, width]``, in float32."""
    found = [t for t in tables if int(t.shape[1]) == width]
    return found[0].detach().float().numpy() if len(found) == 1 else None


def last_position_logits(module: Any, tokens: int) -> Any:
    """``module`` (a decoder step's, ``tokens`` a sequence) with its LM head reading each
    sequence's last position only: a prompt's pass, whose other logits nothing reads (the
    builtin's pass computes the last row's alone), so the device multiplies and sends one
    row a sequence.  The LM head is the linear layer the output comes from (through casts
    and views); a module without one is returned as it is."""
    import torch
    from torch.utils import _pytree

    output = next(n for n in module.graph.nodes if n.op == "output")
    node = _pytree.tree_leaves(output.args[0])[0]
    while getattr(node, "op", "") == "call_function" and node.target in (
            torch.ops.aten._to_copy.default, torch.ops.aten.view.default,
            torch.ops.aten.clone.default):
        node = node.args[0]
    if getattr(node, "target", None) != torch.ops.aten.linear.default or tokens < 2:
        return module
    hidden = node.args[0]
    if len(getattr(getattr(hidden, "meta", {}).get("val"), "shape", ())) != 3:
        return module  # not [B, T, D] (its T is the export's symbol): left as it is
    with module.graph.inserting_before(node):  # a step of ``tokens``: a subset of the rows
        last = module.graph.call_function(torch.ops.aten.slice.Tensor,
                                          (hidden, 1, tokens - 1, tokens, tokens))
    node.replace_input_with(hidden, last)
    module.recompile()
    return module


def user_arrays(step: CacheStep, tokens: Any, position: int, rows: np.ndarray | None = None
                ) -> list[np.ndarray]:
    """The program's user inputs for ``tokens`` (one id a sequence) at cache ``position``;
    a step taking embeddings gets the tokens' table rows, the first ones replaced by
    ``rows`` (``[batch, n, width]``: an image's, where a VLM's prompt holds it)."""
    if not 0 <= position <= step.context - step.tokens:
        raise UsageError(f"position {position} is outside the KV cache's {step.context} "
                         "positions")
    ids = np.asarray(tokens, dtype=np.float32).reshape(step.batch, step.tokens)
    if step.table is not None:
        ids = step.table[ids.astype(np.int64)]
        if rows is not None and rows.shape[1]:
            ids[:, :rows.shape[1]] = rows
    where = (position + np.arange(step.tokens)).astype(np.float32)
    return [where, ids] if step.position_index == 0 else [ids, where]


def step_feed(step: CacheStep, inputs: Callable[[], list[InputSpec]]
              ) -> Callable[..., dict[str, np.ndarray]]:
    """A workload's ``step_inputs``: the graph's inputs for a step, each made by the host
    from the step's user inputs as the last import says (``inputs``)."""
    def feed(params: dict[str, Any], tokens: Any, position: int, first: int = 0
             ) -> dict[str, np.ndarray]:
        if first:
            raise UsageError("a model file's step holds one range of its cache")
        arrays = user_arrays(step, tokens, position)
        return {spec.name: np.asarray(spec.make(arrays), np.float32) for spec in inputs()}
    return feed


def prompt_feed(step: CacheStep, inputs: Callable[[int], list[InputSpec]]
                ) -> Callable[..., dict[str, np.ndarray]]:
    """A workload's ``prompt_inputs`` where the export's sequence length is dynamic: the
    prompt's pass's inputs, made from the prompt's ids at positions ``0 .. N - 1`` as the
    import of that length says (``inputs(N)``)."""
    def feed(params: dict[str, Any], ids: np.ndarray, image: Any = None
             ) -> dict[str, np.ndarray]:
        rows = None if image is None else image_rows(step, image)
        arrays = user_arrays(replace(step, tokens=ids.shape[1]), ids, 0, rows)
        return {spec.name: np.asarray(spec.make(arrays), np.float32)
                for spec in inputs(ids.shape[1])}
    return feed


def image_rows(step: CacheStep, image: np.ndarray) -> np.ndarray:
    """A VLM's image rows (``[batch x n, width]``, as its image program leaves them) as
    ``[batch, n, width]``; refused where the step looks its tokens up itself."""
    if step.table is None:
        raise UsageError("the decoder step takes token ids: a prompt with an image needs a "
                         "step exported with inputs_embeds (benchmarks/export_smolvlm.py)")
    width = step.table.shape[1]
    if image.size % (step.batch * width):
        raise UsageError(f"the image program's rows are not {width} wide for a batch of "
                         f"{step.batch}")
    return np.asarray(image, np.float32).reshape(step.batch, -1, width)


def torch_greedy(run: Callable[[list[np.ndarray]], np.ndarray], step: CacheStep,
                 prompt: np.ndarray, new_tokens: int, image: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """PyTorch's own greedy generation: ``run`` calls the program's module (whose caches are
    its own) on a step's user inputs; the prompt goes a token a step (an image's rows,
    ``[batch, n, width]``, at its first ``n`` positions), then ``new_tokens`` choices.
    Returns the tokens (``[new_tokens, batch]``) and the top-two logit gap at each."""
    chosen, margins = [], []
    current = prompt[:, 0]
    count = 0 if image is None else image.shape[1]
    for position in range(prompt.shape[1] + new_tokens - 1):
        rows = image[:, position:position + 1] if position < count else None
        logits = np.asarray(run(user_arrays(step, current, position, rows)), np.float64)
        last = logits.reshape(step.batch, -1)
        if position + 1 < prompt.shape[1]:
            current = prompt[:, position + 1]
            continue
        top = np.sort(last, axis=-1)[:, -2:]
        current = last.argmax(axis=-1)
        chosen.append(current)
        margins.append(top[:, 1] - top[:, 0])
    return np.array(chosen), np.array(margins)


def torch_token_fields(device: np.ndarray, torch_tokens: np.ndarray, margins: np.ndarray
                       ) -> dict[str, Any]:
    """The device's tokens against PyTorch's: whether all match, and where they first part
    (each follows its own prefix after that) with PyTorch's top-two gap there."""
    differ = np.argwhere(np.asarray(device) != torch_tokens)
    first = differ[0] if len(differ) else None
    return {"torchTokenMatch": first is None,
            "torchFirstDifferingStep": None if first is None else int(first[0]),
            "torchMarginThere": None if first is None else
            round(float(margins[first[0], first[1]]), 6)}
