"""Cut a tower into consecutive layer groups: the pipeline strategy's stages.

A tower is a stem, N identical layers (``planning.repeat``) and a head.  The pipeline
strategy gives each of G tile groups a run of consecutive layers (the first group also the
stem, the last the head) and streams images through them: in a steady step every group
works on a different image, and one activation moves from each group to the next.

:func:`split_tower` cuts the graph at layer boundaries into G graphs of their own.  Each is
an ordinary graph (its own value and operation numbering, names kept), so every group is
planned, lowered and placed by the single-program compiler on its share of the tiles.  A
group's input is the value the previous group's last layer carries out, and its output the
value its own last layer carries out; weights stay weights.  A tower whose layers read
anything else from outside their group (an activation from before the loop, say) cannot be
cut this way, and says so in one line.

:func:`split_at_stages` cuts before any stage where one activation alone crosses: a layer's
end, or inside a layer where :func:`mid_layer_cuts` finds such a point (in a pre-norm
transformer, after attention's residual add; stage 11 of pe-giant's 15 a layer).  Chips
whose layers do not divide evenly (50 on 4) are then cut into equal shares of half layers
(:func:`half_layer_bounds`: 12.5 each) instead of leaving two chips a layer more; the
single-program compiler finds the repeated body of such a group (the second half of one
layer and the first of the next) as it finds whole layers.

:func:`group_layers` balances the layers: the slowest group's step sets the rate, so the
groups get as equal a number of layers as the count allows; the extra layers go to the
middle groups first, since the first and last groups also carry the stem and the head.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ipu_stack.ir.graph import Graph, Operation, Value, verify_graph
from ipu_stack.planning.repeat import LayerLoop, find_layer_loop
from ipu_stack.planning.stages import Stage, find_stages, stage_operations
from ipu_stack.util.errors import CompileError


class PipelineError(CompileError):
    """The model cannot be cut into layer groups (one line: why)."""


@dataclass(frozen=True)
class LayerGroup:
    """Group ``index``: layers ``[first, first + layers)`` of the tower as a graph of its own.

    A group cut inside a layer (:func:`split_at_stages`) counts that layer as a half:
    ``first`` 12.5 starts after layer 12's attention.  ``source_ops[i]`` is the tower's
    operation id of the group's operation ``i`` (the host reference rounds each matmul where
    the group's plan rounds it)."""

    index: int
    first: float  # an int for a group that starts at a layer's start
    layers: float
    graph: Graph
    source_ops: tuple[int, ...]
    input_name: str | None  # the activation handed over by the previous group
    output_name: str  # the activation (or the tower's output) this group hands on

    def signature(self) -> str:
        """What must match for two groups to share one compiled program: everything but
        the values' names (middle groups differ only in which layer's weights they hold)."""
        body = {
            "values": [[v.type.to_json(), v.role] for v in self.graph.values],
            "ops": [[o.kind, list(o.inputs), list(o.outputs), sorted(o.attrs.items())]
                    for o in self.graph.operations],
        }
        return json.dumps(body, sort_keys=True, default=str)


def tower_loop(graph: Graph, stages: list[Stage] | None = None) -> LayerLoop:
    """The tower's repeated layers (``stages``: its stages, when already found), or a
    one-line reason it has none."""
    loop = find_layer_loop(graph, find_stages(graph) if stages is None else stages)
    if loop is None:
        raise PipelineError(f"{graph.name} cannot be pipelined: it has no repeated layers")
    return loop


def group_layers(layers: int, groups: int) -> list[int]:
    """Layers per group, as even as possible, the extra ones in the middle groups first."""
    if not 1 <= groups <= layers:
        raise PipelineError(f"cannot cut {layers} layers into {groups} groups")
    base, extra = divmod(layers, groups)
    order = list(range(1, groups - 1)) + [0, groups - 1] if groups > 2 else list(range(groups))
    counts = [base] * groups
    for index in order[:extra]:
        counts[index] += 1
    return counts


def chip_group_layers(layers: int, chips: int, per_chip: int) -> list[int]:
    """Layers per group for ``per_chip`` groups on each of ``chips`` chips: the chips are
    balanced first (a chip's step is its slowest group's, and the link hand-off waits for the
    slowest chip), then each chip's layers among its groups.  On one chip this is
    :func:`group_layers`."""
    if chips * per_chip > layers:
        raise PipelineError(f"cannot cut {layers} layers into {chips * per_chip} groups")
    return [n for on_chip in group_layers(layers, chips)
            for n in group_layers(on_chip, per_chip)]


def split_tower(graph: Graph, counts: list[int]) -> list[LayerGroup]:
    """The tower cut into ``len(counts)`` groups of ``counts[g]`` consecutive layers."""
    stages = find_stages(graph)
    loop = tower_loop(graph, stages)
    if sum(counts) != loop.count:
        raise PipelineError(f"the groups hold {sum(counts)} layers, the tower has {loop.count}")
    bounds, first = [], 0
    for count in counts[:-1]:
        first += count
        bounds.append(loop.start + first * loop.length)
    return split_at_stages(graph, bounds, stages)


def half_layer_bounds(graph: Graph, shares: list[float],
                      stages: list[Stage] | None = None) -> list[int]:
    """Stage positions that cut the tower into ``shares`` layers each, a half being a cut
    after the layer's :func:`mid_layer_cuts` offset (a one-line error where the tower has
    none, or the shares do not add up)."""
    stages = find_stages(graph) if stages is None else stages
    loop = tower_loop(graph, stages)
    if sum(shares) != loop.count or any(2 * x != int(2 * x) or x <= 0 for x in shares):
        raise PipelineError(f"layer shares {shares} are not halves adding up to the tower's "
                            f"{loop.count} layers")
    offsets = mid_layer_cuts(graph, stages)
    bounds, done = [], 0.0
    for share in shares[:-1]:
        done += share
        whole = int(done)
        if done != whole and not offsets:
            raise PipelineError(f"{graph.name} has no point inside a layer where one "
                                "activation alone crosses")
        bounds.append(loop.start + whole * loop.length + (offsets[0] if done != whole else 0))
    return bounds


def layer_range(first: float, layers: float) -> str:
    """A group's layers for a label: ``12-24`` (inclusive) for whole layers, ``12.5-25`` (from
    the middle of layer 12 to the end of layer 24) where a group is cut inside a layer."""
    if first == int(first) and layers == int(layers):
        return f"{int(first)}-{int(first + layers) - 1}"
    return f"{first:g}-{first + layers:g}"


def crossing_values(graph: Graph, stages: list[Stage], position: int) -> list[int]:
    """The activations made by ``stages[:position]`` and read by ``stages[position:]``: what
    a cut before stage ``position`` would hand over."""
    made = {o for stage in stages[:position] for op in stage_operations(stage)
            for o in graph.operations[op].outputs}
    read = {i for stage in stages[position:] for op in stage_operations(stage)
            for i in graph.operations[op].inputs}
    return sorted(v for v in made & read if graph.value(v).role not in ("weight", "input"))


def mid_layer_cuts(graph: Graph, stages: list[Stage] | None = None) -> list[int]:
    """Stage offsets inside a layer (0 < offset < the layer's stages) where one activation
    alone crosses, so the tower could be cut there as at a layer's end; in a pre-norm
    transformer, after attention's residual add (``stages``: the graph's, when found)."""
    stages = find_stages(graph) if stages is None else stages
    loop = tower_loop(graph, stages)
    return [offset for offset in range(1, loop.length)
            if len(crossing_values(graph, stages, loop.start + offset)) == 1]


def split_at_stages(graph: Graph, bounds: list[int],
                    stages: list[Stage] | None = None) -> list[LayerGroup]:
    """The tower cut before each stage position in ``bounds`` (increasing), wherever exactly
    one activation crosses (a layer's end, or a :func:`mid_layer_cuts` offset); each group's
    ``first``/``layers`` count the tower's layers before it and in it, a layer cut inside
    counting as a half."""
    stages = find_stages(graph) if stages is None else stages
    loop = tower_loop(graph, stages)
    cuts = [0, *bounds, len(stages)]
    if any(b <= a for a, b in zip(cuts, cuts[1:], strict=False)):
        raise PipelineError(f"cut positions {bounds} are not increasing inside the tower's "
                            f"{len(stages)} stages")
    handed = {}
    for position in bounds:
        offset = position - loop.start
        if loop.start < position <= loop.end and offset % loop.length == 0:
            # a layer's end: its carried value (a group that reads anything else is named
            # by _slice)
            handed[position] = loop.value(offset // loop.length - 1, loop.carried_out)
            continue
        crossing = crossing_values(graph, stages, position)
        if len(crossing) != 1:
            raise PipelineError(f"{graph.name} cannot be cut before stage {position}: "
                                f"{len(crossing)} activations cross there")
        handed[position] = crossing[0]

    def layers_before(position: int) -> float:  # a cut inside a layer counts it as a half
        whole, inside = divmod(min(max(0, position - loop.start), loop.end - loop.start),
                               loop.length)
        return whole + 0.5 if inside else whole

    groups = []
    for index, (lo, hi) in enumerate(zip(cuts, cuts[1:], strict=False)):
        ops = sorted(op for stage in stages[lo:hi] for op in stage_operations(stage))
        first = layers_before(lo)
        groups.append(_slice(graph, index, first, layers_before(hi) - first, ops,
                             handed.get(lo), handed.get(hi)))
    return groups


def _slice(graph: Graph, index: int, first: float, count: float, op_ids: list[int],
           carried_in: int | None, carried_out: int | None) -> LayerGroup:
    """The operations ``op_ids`` as a graph: outside values they read become weights (if
    weights) or the group's input (the carried activation); ``carried_out`` (or, for the
    last group, the tower's outputs) its output."""
    chosen = set(op_ids)
    produced = {o for op in op_ids for o in graph.operations[op].outputs}
    used: set[int] = set(produced)
    for op in op_ids:
        for value_id in graph.operations[op].inputs:
            used.add(value_id)
            if value_id in produced:
                continue
            role = graph.value(value_id).role
            # a weight, the carried activation, or a host input (every group may read the
            # tower's inputs: a decode step's slots, mask and RoPE angles feed every layer)
            if role in ("weight", "input") or value_id == carried_in:
                continue
            raise PipelineError(
                f"{graph.name} cannot be pipelined: group {index} reads "
                f"{graph.value(value_id).name} from outside its layers")
    for op in graph.operations:  # what the group makes is read only by itself and the next
        if op.id in chosen:
            continue
        for value_id in op.inputs:
            if value_id in produced and value_id != carried_out:
                raise PipelineError(
                    f"{graph.name} cannot be pipelined: {graph.value(value_id).name} is read "
                    f"outside group {index}")
    outputs = {carried_out} if carried_out is not None else {
        v.id for v in graph.by_role("output")}
    renumber = {old: new for new, old in enumerate(sorted(used))}
    values = []
    for old in sorted(used):
        value = graph.value(old)
        role = value.role
        if old == carried_in:
            role = "input"
        elif old in outputs:
            role = "output"
        elif role == "output":
            role = "intermediate"
        values.append(Value(renumber[old], value.name, value.type, role))
    operations = [
        Operation(new, graph.operations[op].kind,
                  tuple(renumber[i] for i in graph.operations[op].inputs),
                  tuple(renumber[o] for o in graph.operations[op].outputs),
                  dict(graph.operations[op].attrs))
        for new, op in enumerate(op_ids)]
    sliced = Graph(f"{graph.name}.group{index}", values, operations)
    verify_graph(sliced)
    output = graph.value(carried_out).name if carried_out is not None else ",".join(
        graph.value(v).name for v in sorted(outputs))
    return LayerGroup(index, first, count, sliced, tuple(op_ids),
                      None if carried_in is None else graph.value(carried_in).name, output)



GROUP_COUNTS = (2, 3, 4, 5, 6, 8, 9, 12)
"""The group counts a chip's pipeline tries (below 2 is the layers strategy; over several
chips one group a chip is tried too)."""


def group_tiles(chip_tiles: int, groups: int) -> int:
    """Tiles each of ``groups`` groups on a chip gets: an even share, so tile pairs stay
    whole."""
    return (chip_tiles // groups) & ~1


def groupings(graph: Graph, stages: list[Stage], layers: int, chips: int,
               counts: tuple[int, ...]) -> list[tuple[int, list[float] | None, bool]]:
    """Each count of groups a chip to try, cut at layers' ends (``None``); and, with one
    group a chip where the tower has a point inside a layer that one activation alone
    crosses (``mid_layer_cuts``), also cut inside layers: into equal shares of half layers
    over chips whose layers do not divide evenly (12.5 each for 50 layers on 4 chips: the
    whole-layer cut leaves some chips a layer more, and they set the step), and with the
    last chip half a layer lighter than the first (its head, a language model's LM head,
    is work the others do not have; marked True), kept only where it ranks first."""
    found: list[tuple[int, list[float] | None, bool]] = [(c, None, False) for c in counts]
    if chips > 1 and 1 in counts and mid_layer_cuts(graph, stages):
        ends = [round(2 * layers * k / chips) / 2 for k in range(chips + 1)]
        shares = [b - a for a, b in zip(ends, ends[1:], strict=False)]
        if layers % chips:
            found.append((1, shares, False))
        if shares[-1] > 0.5:  # the last chip, which holds the head, half a layer lighter
            found.append((1, [shares[0] + 0.5, *shares[1:-1], shares[-1] - 0.5], True))
    return found


def refuse_one_group(groups: int, chips: int) -> None:
    """One group on one chip would run as the layers strategy while the user asked for a
    pipeline: refused, so that the record never names another strategy than the one asked."""
    if groups * chips == 1:
        raise PipelineError("a pipeline of one group on one chip is the layers strategy: "
                            "give --groups 2 or more, or --strategy layers")


def group_counts(layers: int, chips: int, groups: int | None = None,
                 most: int | None = None) -> tuple[int, ...]:
    """The groups a chip the planner tries: ``groups`` when asked, else ``GROUP_COUNTS``
    (and one a chip over several chips), as far as the tower has layers for them and, with
    ``most`` (the images a run streams: a steady step needs one in each group of a chip),
    no more than that many."""
    if groups:
        refuse_one_group(groups, chips)
        if groups * chips > layers:
            raise PipelineError(f"cannot cut {layers} layers into {groups * chips} groups"
                                + (f" ({groups} on each of {chips} chips)" if chips > 1
                                   else ""))
        return (groups,)
    counts = ((1,) if chips > 1 else ()) + GROUP_COUNTS
    found = tuple(c for c in counts if c * chips <= layers)
    if not found:
        raise PipelineError(f"the tower's {layers} layers cannot fill {chips} chips")
    if most is not None:
        found = tuple(c for c in found if c <= most)
        if not found:
            raise PipelineError(f"{most} image{'s' if most > 1 else ''} cannot fill a "
                                f"pipeline of {min(counts)} or more groups"
                                + (" a chip" if chips > 1 else ""))
    return found

__all__ = ["GROUP_COUNTS", "LayerGroup", "PipelineError", "chip_group_layers", "crossing_values",
           "group_counts", "group_layers", "group_tiles", "groupings", "half_layer_bounds",
           "layer_range", "mid_layer_cuts", "refuse_one_group", "split_at_stages", "split_tower",
           "tower_loop"]
