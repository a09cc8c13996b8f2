"""Find identical consecutive layers, so they are planned, lowered and laid out once.

A vision tower is a stem, N layers of the same shapes and a head.  Planning and lowering
every layer separately gives N copies of the same kernels, exchange schedules and tables,
and N sets of activations and partials: the program, not the weights, fills the tiles.
:func:`find_layer_loop` finds the longest run of stages that repeats with identical
signatures (kinds, shapes, precisions, attributes) and checks that the repeats are wired the
same way:

* a value produced inside an iteration is used only inside that iteration, except the one
  *carried* value: the last stage's result, which the next iteration reads where the first
  iteration read the loop's input (and which the stages after the loop may read);
* a weight is either the same value in every iteration (shared, e.g. RoPE tables) or a
  different value of the same type in each (per-layer weights: each gets its own slot);
* any other value from before the loop is the same value in every iteration.

The result maps every value and operation of iteration ``k`` to its counterpart in
iteration 0, which is what lowering, the package's per-layer tables and the verdict need.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from ipu_stack.ir.graph import Graph
from ipu_stack.planning.stages import GemmStage, Stage, stage_operations


@dataclass(frozen=True)
class LayerLoop:
    """Stages ``[start, start + length)`` repeat ``count`` times from ``start``.

    ``values[k]`` maps a value id of iteration 0 to iteration ``k``'s; ``operations[k]`` the
    same for operation ids.  ``carried_in`` is the value iteration 0 reads from before the
    loop and ``carried_out`` the value its last stage produces (iteration ``k``'s
    counterpart feeds iteration ``k + 1``).  ``slot_weights`` are iteration 0's per-layer
    weights (each iteration has its own value of the same type).
    """

    start: int
    length: int
    count: int
    carried_in: int
    carried_out: int
    values: tuple[dict[int, int], ...]
    operations: tuple[dict[int, int], ...]
    slot_weights: tuple[int, ...]

    @property
    def end(self) -> int:
        """Index of the first stage after the loop (in the full stage list)."""
        return self.start + self.length * self.count

    def compact(self, stages: list[Stage]) -> list[Stage]:
        """The stages that are planned and lowered: before, one iteration, after."""
        return stages[: self.start + self.length] + stages[self.end :]

    def multiplicity(self, compact_index: int) -> int:
        """How many times the compact stage ``compact_index`` runs."""
        inside = self.start <= compact_index < self.start + self.length
        return self.count if inside else 1

    def value(self, iteration: int, value_id: int) -> int:
        return self.values[iteration].get(value_id, value_id)


def _stage_inputs(stage: Stage) -> tuple[int, ...]:
    if isinstance(stage, GemmStage):
        return (stage.a, stage.b) + (() if stage.bias is None else (stage.bias,))
    return stage.inputs


def _signature(graph: Graph, stage: Stage) -> str:
    """What must match for two stages to share one plan and one lowering."""
    def typed(value_id: int) -> list:
        value = graph.value(value_id)
        # the matrix the device holds, not the logical shape: an imported layer may read
        # [B, T, D] where the next reads [B*T, D] (the same rows)
        shape = [value.type.rows, value.type.cols] if len(value.type.shape) > 1 else [
            value.type.cols]
        return [shape, value.type.precision.to_json(), value.role == "weight"]

    ops = stage_operations(stage)
    body = {
        "class": type(stage).__name__, "kind": stage.kind,
        "attrs": {k: stage.attrs[k] for k in sorted(stage.attrs)},
        "chain": [list(step) for step in stage.chain] if isinstance(stage, GemmStage) else [],
        "inputs": [typed(v) for v in _stage_inputs(stage)],
        "out": typed(stage.out),
        "ops": [[graph.operations[o].kind, sorted(graph.operations[o].attrs.items())]
                for o in ops],
    }
    return json.dumps(body, sort_keys=True, default=str)


def _candidates(codes: np.ndarray) -> list[tuple[int, int, int]]:
    """``(start, length, count)`` of runs of a repeated block, most stages saved first."""
    n = len(codes)
    found = []
    for length in range(1, n // 2 + 1):
        equal = codes[:-length] == codes[length:]
        run = 0
        runs = np.zeros(len(equal) + 1, dtype=np.int64)  # equal run length starting at i
        for i in range(len(equal) - 1, -1, -1):
            run = run + 1 if equal[i] else 0
            runs[i] = run
        for start in range(len(equal)):
            count = 1 + int(runs[start]) // length
            if count >= 2:
                found.append((start, length, count))
    found.sort(key=lambda c: (-(c[2] - 1) * c[1], c[0], c[1]))
    return found


def find_layer_loop(graph: Graph, stages: list[Stage]) -> LayerLoop | None:
    """The repeated block that saves the most stages and is wired as a loop, if any."""
    if len(stages) < 2:
        return None
    index: dict[str, int] = {}
    codes = np.array([index.setdefault(_signature(graph, s), len(index)) for s in stages])
    for start, length, count in _candidates(codes)[:64]:
        loop = _wire(graph, stages, start, length, count)
        if loop is not None:
            return loop
    return None


def _producers(stages: list[Stage]) -> dict[int, int]:
    return {stage.out: i for i, stage in enumerate(stages)}


def _wire(graph: Graph, stages: list[Stage], start: int, length: int,
          count: int) -> LayerLoop | None:
    """The loop with this block, if its iterations are wired alike (module docstring)."""
    produced_at = _producers(stages)
    end = start + length * count
    base = stages[start : start + length]
    carried_out = base[-1].out
    carried_in = None
    values: list[dict[int, int]] = []
    operations: list[dict[int, int]] = []
    slots: set[int] = set()
    shared: set[int] = set()
    for k in range(count):
        vmap: dict[int, int] = {}
        omap: dict[int, int] = {}
        offset = start + k * length
        for j, (stage0, stage) in enumerate(zip(base, stages[offset : offset + length],
                                                strict=True)):
            omap.update(zip(stage_operations(stage0), stage_operations(stage), strict=True))
            vmap[stage0.out] = stage.out
            for v0, v in zip(_stage_inputs(stage0), _stage_inputs(stage), strict=True):
                where0, where = produced_at.get(v0, -1), produced_at.get(v, -1)
                if where0 >= start:  # produced inside iteration 0: same position in k
                    if where != where0 + k * length:
                        return None
                elif graph.value(v0).role == "weight":
                    if k == 0:
                        pass
                    elif v == v0:
                        shared.add(v0)
                    elif graph.value(v).role == "weight":
                        slots.add(v0)
                    else:
                        return None
                elif k == 0:  # from before the loop: the first stage's first such read is
                    if carried_in is None and j == 0:  # the carried input (the layer's input)
                        carried_in = v0
                elif v0 == carried_in:
                    if where != start + k * length - 1:  # the previous iteration's result
                        return None
                elif v != v0:
                    return None
                vmap[v0] = v
        values.append(vmap)
        operations.append(omap)
    if carried_in is None or slots & shared:
        return None
    if not _contained(graph, stages, start, length, count, end):
        return None
    return LayerLoop(start, length, count, carried_in, carried_out, tuple(values),
                     tuple(operations), tuple(sorted(slots)))


def _contained(graph: Graph, stages: list[Stage], start: int, length: int, count: int,
               end: int) -> bool:
    """Values made inside iteration ``k`` are read only inside it, by iteration ``k + 1``
    (the carried value) or, for the last iteration's carried value, after the loop."""
    for k in range(count):
        lo, hi = start + k * length, start + (k + 1) * length
        last = stages[hi - 1].out
        for stage in stages[lo:hi]:
            out = stage.out
            if graph.value(out).role == "output" and not (k == count - 1 and out == last):
                return False
            for later in stages[hi:]:
                if out in _stage_inputs(later):
                    allowed = out == last and (
                        (k < count - 1 and hi <= later.index < hi + length)
                        or (k == count - 1 and later.index >= end))
                    if not allowed:
                        return False
    return True


def loop_fields(loop: LayerLoop | None) -> dict[str, int]:
    """The loop's shape for log lines and the manifest."""
    if loop is None:
        return {"layer_loop": 0}
    return {"layer_loop": loop.count, "loop_stages": loop.length,
            "per_layer_weights": len(loop.slot_weights)}


__all__ = ["LayerLoop", "find_layer_loop", "loop_fields"]
