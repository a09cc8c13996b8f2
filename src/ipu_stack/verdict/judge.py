"""The numerical verdict, in two parts that hold at any depth.

**Implementation agreement** judges every stage on its own inputs.  The device's value of
each stage result is read back (every stage of every package has a probe read), and the host
reruns that stage at device precision from the device's own values of the stage's inputs
(graph inputs and weights come from the host).  The device and the host then round at the
same points, so they agree bit for bit except where a float32 summation order differs and
moves a value across a rounding boundary: a share of elements one unit in the last place
(ulp) of the stored precision apart.  A kernel, layout or exchange bug moves many elements
by many ulps, or a large share by one ulp (a 1 % scale on an FP8 output flips about one
element in twelve).  Because each stage starts from the device's inputs, a rounding flip in
layer 1 cannot cascade into a failure in layer 4: this part means the same at any depth.

**Fidelity to the model** compares the outputs with the ideal answer, the same graph in
float64 with no rounding anywhere (``evaluate_float64``), in units of the noise the precision
path is expected to add.  That noise is measured on the same input: the error of the host's
device-precision reference (float32, rounding to every stored precision) against the ideal.
``noiseRatio`` is the device's RMS error over that RMS noise, ``tailRatio`` its largest error
over the reference's largest.  A correct device lands near 1 on both at any depth (FP8 flips
cascade differently on the two, but they are the same noise); an error the model does not
have lifts them.  The limits and the measured distributions are in ``docs/tolerance.md``.

``numericalTest`` is PASS only when both parts pass.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ipu_stack.ir.graph import Graph, Value, fidelity_values, table_maps, table_row_index
from ipu_stack.ir.interpret import HostValues, evaluate_float64, evaluate_operations
from ipu_stack.ir.precision import Precision
from ipu_stack.ir.rounding import differing, differing_codes, differing_rows
from ipu_stack.ir.values import CompactValues, StoredTensor
from ipu_stack.planning.stages import GemmStage, Stage, find_stages, stage_operations
from ipu_stack.util.log import event

LOG = logging.getLogger("ipu_stack.runtime")
DIAGNOSTICS_LOG = "ipu_stack.diagnostics"  # shown whenever --diagnostics asks for it

# Agreement: at most this share of a stage's elements may differ at all (float32 summation
# order), and none by more than a few ulps (one for FP8, whose ulp is 1/8 of the value).
MISMATCH_LIMIT = 2.0**-7
ULP_LIMIT = {"F32": 64, "F16": 4, "F8F143": 1, "F8F152": 1, "I32": 0}
# Fidelity: RMS and worst error against the ideal answer, in units of the reference's own.
NOISE_LIMIT = 1.5
TAIL_LIMIT = 2.0
FAR = 1 << 30  # the ulp distance reported for a non-finite element


def ulp_distance(device: np.ndarray, expected: np.ndarray, precision: Precision) -> np.ndarray:
    """Units in the last place of ``precision`` between two arrays of values it can hold
    exactly (their storage codes, ordered as the numbers they mean)."""
    a = _ordinal(precision.quantize(device), precision)
    b = _ordinal(precision.quantize(expected), precision)
    distance = np.abs(a - b)
    finite = np.isfinite(device) & np.isfinite(expected)
    return np.where(finite, distance, FAR)


def _rms(values: np.ndarray) -> float:
    # all finite (the rule): the flattened values are the same sequence, without a copy
    finite = values.reshape(-1) if np.isfinite(values).all() else values[np.isfinite(values)]
    return float(np.sqrt(np.mean(np.square(finite, dtype=np.float64)))) if finite.size else 0.0


def scaled_ulps(device: np.ndarray, expected: np.ndarray, precision: Precision,
                rms: float | None = None) -> np.ndarray:
    """:func:`ulp_distance`, but an element smaller than the tensor's RMS is measured in ulps
    at the RMS: a stage that ends in a sum (a bias or residual add) can cancel its operands,
    and a one-ulp rounding difference of an operand then shows as many ulps of a result much
    smaller than the operands.  The RMS (of the whole tensor: ``rms``, when the arrays are
    the differing elements only) stands in for the operands' magnitude."""
    distance = ulp_distance(device, expected, precision).astype(np.float64)
    finite = np.isfinite(expected)
    rms = _rms(expected) if rms is None else rms  # the whole tensor's, when given a subset
    if rms == 0.0:
        return distance
    magnitude = np.abs(expected.astype(np.float64))
    small = finite & (magnitude < rms) & (distance < FAR)
    if small.any():
        ulp_here = _spacing(magnitude[small], precision)
        ulp_rms = _spacing(np.array([rms]), precision)[0]
        gap = np.abs(device[small].astype(np.float64) - expected[small].astype(np.float64))
        distance[small] = np.minimum(distance[small], gap / np.maximum(ulp_here, ulp_rms))
    return distance


def _spacing(magnitude: np.ndarray, precision: Precision) -> np.ndarray:
    """The gap between ``precision``'s neighbours at each magnitude."""
    stored = precision.quantize(magnitude)
    value = precision.dequantize(stored).astype(np.float64)
    ordinal = _ordinal(stored, precision)  # magnitudes are >= 0: ordinal is the code
    bits = {1: np.uint8, 2: np.uint16, 4: np.uint32}[precision.itemsize]
    above = precision.dequantize((ordinal + 1).astype(bits).view(precision.dtype))
    below = precision.dequantize(np.maximum(ordinal - 1, 0).astype(bits).view(precision.dtype))
    gap = np.abs(above.astype(np.float64) - value)
    return np.where(np.isfinite(gap), gap, np.abs(value - below.astype(np.float64)))


def _ordinal(stored: np.ndarray, precision: Precision) -> np.ndarray:
    """Sign-magnitude storage codes as integers that order like the values (-0 == +0)."""
    bits = {1: np.uint8, 2: np.uint16, 4: np.uint32}[precision.itemsize]
    raw = np.ascontiguousarray(stored).view(bits).astype(np.int64)
    sign = 1 << (8 * precision.itemsize - 1)
    return np.where(raw & sign, -(raw & (sign - 1)), raw)


@dataclass(frozen=True)
class StageAgreement:
    """One stage's result against the host's rerun of that stage on the device's inputs."""

    stage: str
    layer: str
    precision: str
    max_ulps: int
    mismatch: float
    elements: int

    @property
    def passed(self) -> bool:
        """Within the ulp limit, on at most 2^-7 of the elements, and always one element: a
        stage of fewer than 128 elements would otherwise allow no summation-order flip at all
        (one of a tiny tower's [20, 5] attention scores, 1 ulp off, was 1 % of it)."""
        if self.precision == "I32":  # columns chosen (an argmax): each one right
            return self.mismatch == 0
        differing = round(self.mismatch * self.elements)
        return self.max_ulps <= ULP_LIMIT[self.precision] and (
            self.mismatch <= MISMATCH_LIMIT or differing <= 1)


@dataclass(frozen=True)
class Fidelity:
    noise_ratio: float
    tail_ratio: float
    rms_error: float
    rms_noise: float

    @property
    def passed(self) -> bool:
        return self.noise_ratio <= NOISE_LIMIT and self.tail_ratio <= TAIL_LIMIT


@dataclass
class Verdict:
    stages: list[StageAgreement] = field(default_factory=list)
    fidelity: Fidelity | None = None
    seconds: float = 0.0  # wall time the verdict added after the device finished
    ideal_seconds: float = 0.0  # the float64 model's own time (overlapped with the device)

    @property
    def agreement_passed(self) -> bool:
        return all(s.passed for s in self.stages)

    @property
    def passed(self) -> bool:
        return self.agreement_passed and (self.fidelity is None or self.fidelity.passed)

    @property
    def worst(self) -> StageAgreement | None:
        """The stage furthest outside its limits (or closest to them when all pass)."""
        def badness(s: StageAgreement) -> float:
            return max(s.max_ulps / max(ULP_LIMIT[s.precision], 1),
                       s.mismatch / MISMATCH_LIMIT)
        return max(self.stages, key=badness, default=None)

    @property
    def first_failure(self) -> StageAgreement | None:
        return next((s for s in self.stages if not s.passed), None)

    @property
    def failed_parts(self) -> list[str]:
        parts = [] if self.agreement_passed else ["stageAgreement"]
        if self.fidelity is not None and not self.fidelity.passed:
            parts.append("fidelity")
        return parts


def layer_of(name: str) -> str:
    """The layer a value belongs to, from its name (``layer3.attn.probs`` -> ``layer3``)."""
    head = name.split(".")[0]
    return head if head.startswith("layer") else ""


def judge(
    graph: Graph,
    tensors: dict[str, np.ndarray],
    device_values: Mapping[str, np.ndarray],
    reference: Mapping[str, np.ndarray],
    gemm_modes: dict[str, dict] | None = None,
    ideal: dict[str, np.ndarray] | None = None,
) -> Verdict:
    """Both parts of the verdict for one run, with every device value at hand.

    ``device_values``: every stage result the device produced (probe reads and outputs, by
    value name, ``[rows, cols]``); ``reference``: the host's device-precision evaluation of
    the whole graph (for the noise the precision path adds); ``ideal``: the float64 model
    (``evaluate_float64``), evaluated here when not given."""
    judging = StageJudge(graph, tensors, reference, gemm_modes)
    for name in device_values:
        judging.arrive(name, device_values[name])
    return judging.finish(ideal)


class StageJudge:
    """The verdict, judged stage by stage as the device's values arrive.

    Stages are judged in graph order; a stage waits until the device has produced its
    result and every device value it reads.  A device value is dropped as soon as no stage
    still to be judged reads it (outputs are kept for fidelity), so a run that streams its
    probe reads here holds only the stages in flight, not a whole tower's."""

    def __init__(self, graph: Graph, tensors: dict[str, np.ndarray],
                 reference: Mapping[str, np.ndarray], gemm_modes: dict[str, dict] | None):
        self.graph, self.tensors, self.reference = graph, tensors, reference
        self.gemm_modes = gemm_modes
        self.verdict = Verdict()
        self.seconds = 0.0
        self.device: CompactValues = CompactValues()
        # inputs and weights as the device holds them: the reference already rounded them
        host: Mapping[int, np.ndarray] = {
            v.id: np.asarray(reference[v.name], np.float32).reshape(v.type.rows, -1)
            if len(v.type.shape) > 1 else np.asarray(reference[v.name], np.float32)
            for v in graph.values if v.role in ("input", "weight") and v.name in reference}
        if len(host) != sum(1 for v in graph.values if v.role in ("input", "weight")):
            host = HostValues(graph, tensors)  # rounded per stage, not all held at once
        self.host = host
        # every activation matrix: a reference still being computed has them all in the end
        self.reference_by_id = _ById(graph, reference, {
            v.id for v in graph.values if v.role != "weight" and v.id not in host
            and len(v.type.shape) > 1})
        # per stage: its operations, inputs, the values it makes, and the values it reads
        # from the device (inputs neither made inside it nor held by the host)
        host_ids = set(host)
        self.pending: list[tuple[Stage, list[int], set[int], set[int], set[int]]] = []
        for stage in find_stages(graph):
            operations = list(stage_operations(stage))
            inputs = {i for op in operations for i in graph.operations[op].inputs}
            produced = {o for op in operations for o in graph.operations[op].outputs}
            self.pending.append((stage, operations, inputs, produced,
                                 inputs - produced - host_ids))
        # outputs, and what the float64 model judges for each (an argmax's values)
        self.outputs = {v.name for v in graph.by_role("output")} | set(
            fidelity_values(graph).values())
        self.last_reader: dict[str, int] = {}  # device values: the last stage reading them
        last_stage: dict[str, int] = {}  # any value: the last stage reading or making it
        for position, (stage, _, inputs, produced, from_device) in enumerate(self.pending):
            for value_id in from_device | {stage.out}:
                self.last_reader[graph.value(value_id).name] = position
            for value_id in inputs | produced:
                last_stage[graph.value(value_id).name] = position
        self.judged = 0
        # the reference's values in the order the stages stop needing them (last first)
        self.forgettable = sorted(((last_stage.get(v.name, -1), v.name) for v in graph.values
                                   if v.name not in self.outputs), reverse=True)

    def arrive(self, name: str, values: np.ndarray | StoredTensor) -> None:
        """A device value (float32, or as the device stored it)."""
        if isinstance(values, StoredTensor):
            self.device.hold(name, values)
        else:
            self.device[name] = values

    def judge_ready(self, final: bool = False) -> None:
        """Judge every stage, in order, whose values have arrived; with ``final`` (nothing
        more will arrive), skip the stages the device did not probe."""
        started = time.perf_counter()
        while self.pending:
            stage, operations, inputs, produced, from_device = self.pending[0]
            device_inputs = [self.graph.value(i).name for i in from_device]
            out = self.graph.value(stage.out)
            ready = out.name in self.device and all(n in self.device for n in device_inputs)
            if not all(n in self.reference for n in [out.name, *device_inputs]):
                break  # the reference has not got this far yet (final: it has)
            if not ready and not final:
                break
            self.pending.pop(0)
            if ready:
                self._judge(stage, operations, inputs, produced, from_device)
            self._drop(self.judged)
            self.judged += 1
        self.seconds += time.perf_counter() - started

    def _judge(self, stage: Stage, operations: list[int], inputs: set[int],
               produced: set[int], from_device: set[int]) -> None:
        graph, out = self.graph, self.graph.value(stage.out)
        known = _Inputs(graph, {i for i in inputs if i in self.host}, self.host, self.device,
                        from_device)
        expected = _rerun(graph, stage, operations, known, inputs - produced, self.host,
                          self.reference_by_id, self.gemm_modes)
        count, differ, device, expected = self._compare(out, expected)
        ulps = scaled_ulps(device[differ], expected[differ], out.type.precision,
                           _rms(expected)) if count and not out.type.precision.is_integer \
            else np.zeros(0)
        self.verdict.stages.append(StageAgreement(
            out.name, layer_of(out.name), out.type.precision.kind,
            int(np.ceil(ulps.max(initial=0) - 1e-9)),
            count / differ.size if differ.size else 0.0, int(differ.size)))

    def _compare(self, out: Value, expected: np.ndarray | None
                 ) -> tuple[int, np.ndarray, np.ndarray | None, np.ndarray | None]:
        """Which elements of the device's value of ``out`` differ from ``expected`` (the
        rerun, or ``None``: the reference's own value), as values (NaN equals NaN); and the
        two as float32 matrices, decoded only where something differs.  Against the
        reference, the storage codes are compared where both sides hold them."""
        if expected is None:
            mine, theirs = self.device.held(out.name), self.reference_by_id.held(out.id)
            if (isinstance(mine, StoredTensor) and isinstance(theirs, StoredTensor)
                    and mine.precision == theirs.precision
                    and mine.stored.size == theirs.stored.size and mine.precision.kind != "F32"):
                count, differ = differing_codes(mine.stored, theirs.stored, mine.precision.kind,
                                                mine.precision.scale_exponent)
                if not count:
                    return 0, differ, None, None
            expected = self.reference_by_id[out.id]
        device = np.asarray(self.device[out.name], dtype=np.float32).reshape(expected.shape)
        count, differ = differing(device, expected)
        return count, differ, device, expected

    def _drop(self, position: int) -> None:
        """Forget device values no stage after ``position`` reads, and the reference's
        values of them when it can forget (outputs stay, for fidelity)."""
        for name in [n for n in self.device if n not in self.outputs
                     and self.last_reader.get(n, -1) <= position]:
            del self.device[name]
        if isinstance(self.reference, CompactValues):  # a run's own reference, not a caller's
            while self.forgettable and self.forgettable[-1][0] <= position:
                name = self.forgettable.pop()[1]
                if name in self.reference:
                    del self.reference[name]

    def finish(self, ideal: dict[str, np.ndarray] | None = None) -> Verdict:
        """Judge what is left, then fidelity (the float64 model, evaluated here when not
        given, against the device's outputs)."""
        self.judge_ready(final=True)
        started = time.perf_counter()
        if ideal is None:
            ideal = evaluate_float64(self.graph, self.tensors, keep=self.outputs)
        self.verdict.fidelity = _fidelity(self.graph, ideal, self.device, self.reference)
        self.seconds += time.perf_counter() - started
        self.verdict.seconds = self.seconds
        return self.verdict


class _ById(Mapping):
    """The reference's matrices by value id, read (decoded) when asked for, not all held."""

    def __init__(self, graph: Graph, reference: Mapping[str, np.ndarray], ids: set[int]):
        self.graph, self.reference, self.ids = graph, reference, ids

    def __getitem__(self, value_id: int) -> np.ndarray:
        if value_id not in self.ids:
            raise KeyError(value_id)
        value = self.graph.value(value_id)
        return np.asarray(self.reference[value.name], np.float32).reshape(value.type.rows, -1)

    def held(self, value_id: int) -> StoredTensor | np.ndarray | None:
        """The value as the reference keeps it (its storage codes, when a run's own
        reference has them), or ``None`` when it is not kept that way."""
        if value_id not in self.ids or not isinstance(self.reference, CompactValues):
            return None
        return self.reference.held(self.graph.value(value_id).name)

    def writable(self, value_id: int) -> np.ndarray:
        """The value as a matrix the caller may change: decoded codes are already a fresh
        array; a caller's own array is copied."""
        held = self.held(value_id)
        if isinstance(held, StoredTensor):
            return self[value_id]
        return self[value_id].copy()

    def __contains__(self, value_id: object) -> bool:
        return value_id in self.ids

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.ids)

    def __len__(self) -> int:
        return len(self.ids)


class _Inputs(Mapping):
    """A stage's inputs for its rerun, decoded when first read: weights and graph inputs
    from the host, the rest the device's values.  A stage whose activations all equal the
    reference's is not rerun, and then neither its weights nor the device's inputs are
    decoded (the comparison reads their storage codes)."""

    def __init__(self, graph: Graph, from_host: set[int], host: Mapping[int, np.ndarray],
                 device: CompactValues, from_device: set[int]) -> None:
        self.graph, self.host, self.device = graph, host, device
        self.from_host, self.from_device = from_host, from_device
        self.read: dict[int, np.ndarray] = {}

    def __getitem__(self, value_id: int) -> np.ndarray:
        if value_id not in self.read:
            if value_id in self.from_device:
                self.read[value_id] = self.device[self.graph.value(value_id).name]
            elif value_id in self.from_host:
                self.read[value_id] = self.host[value_id]
            else:
                raise KeyError(value_id)
        return self.read[value_id]

    def held(self, value_id: int) -> StoredTensor | np.ndarray | None:
        """A device input as the device stored it (its codes), without decoding it."""
        if value_id in self.from_device:
            return self.device.held(self.graph.value(value_id).name)
        return None

    def __contains__(self, value_id: object) -> bool:
        return value_id in self.from_device or value_id in self.from_host

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.from_host | self.from_device)

    def __len__(self) -> int:
        return len(self.from_host | self.from_device)


ROW_LOCAL = ("matmul", "layer_norm", "rms_norm", "softmax", "biased_softmax", "add", "mul",
             "swiglu", "bias_add", "gelu", "activation", "cast", "scale")


def _rerun(graph: Graph, stage: Stage, operations: list[int], known: _Inputs,
           inputs: set[int], host: Mapping[int, np.ndarray], reference: _ById,
           gemm_modes: dict[str, dict] | None) -> np.ndarray | None:
    """The host's rerun of a stage on the device's inputs; ``None`` where it is the
    reference's own value.

    Where the device fed the stage exactly what the host reference computed (every
    activation equal in shape and value, NaN equal to NaN), the rerun *is* the reference's
    value (same operations, same inputs), so it is not redone; that holds for any stage, also
    one whose inputs and result have different row counts (attention's scores and context).
    A row-local stage (each result row depends only on the same row of its activations) is
    rerun only on the rows whose inputs differ, usually a handful after an FP8 rounding flip
    upstream; when every row differs, it is rerun whole, with nothing spliced.
    """
    outside = inputs - set(host)
    activations = [i for i in outside if i in reference]
    if len(activations) != len(outside):
        return evaluate_operations(graph, operations, dict(known), gemm_modes)[stage.out]
    rows_out = graph.value(stage.out).type.rows
    differs = []  # per activation, which of its rows differ from the reference's
    for i in activations:
        differ = _rows_differing(graph, i, known, reference)
        if differ is None:  # not the reference's shape: rerun whole
            break
        differs.append(differ)
    same_shapes = len(differs) == len(activations)
    if same_shapes and not any(differ.any() for differ in differs):
        return None
    same_rows = same_shapes and all(differ.size == rows_out for differ in differs)
    rows_differ = np.logical_or.reduce(differs) if same_rows and differs else \
        np.zeros(rows_out, dtype=bool)
    kinds = {graph.operations[op].kind for op in operations}
    # a depth-split GEMM adds its blocks' partials in the order of the row blocks its tiles
    # own (``depth_owners``): a rerun of some rows only would add them in another order
    depth_split = any(int((gemm_modes or {}).get(str(op), {}).get("depth_splits", 1)) > 1
                      for op in operations if graph.operations[op].kind == "matmul")
    row_local = same_rows and kinds <= set(ROW_LOCAL) and not depth_split and (
        not isinstance(stage, GemmStage) or stage.kind == "matmul")
    if not row_local or rows_differ.all():
        return evaluate_operations(graph, operations, dict(known), gemm_modes)[stage.out]
    rows = np.flatnonzero(rows_differ)
    sliced = dict(known)
    gemm_weights = {graph.operations[op].inputs[1] for op in operations
                    if graph.operations[op].kind == "matmul"}
    for value_id in inputs:
        # activations, and per-row tables (position embeddings): not a GEMM's weights
        held = sliced[value_id]
        if value_id in gemm_weights or held.ndim != 2:
            continue
        if held.shape[0] == rows_out:
            sliced[value_id] = held[rows]
        elif rows_out % held.shape[0] == 0:  # rows that repeat (a Swin layer's bias, its mask)
            where = _table_map(graph, operations, value_id)
            sliced[value_id] = held[table_row_index(rows_out, held.shape[0], *where)[rows]]
    expected = reference.writable(stage.out)
    expected[rows] = evaluate_operations(graph, operations, sliced, gemm_modes)[stage.out]
    return expected


def _table_map(graph: Graph, operations: list[int], value_id: int) -> tuple[int, int]:
    """How a softmax's table ``value_id`` repeats over its scores' rows: ``(1, 1)`` (a
    period) unless a ``biased_softmax`` of ``operations`` maps it otherwise."""
    for op in (graph.operations[i] for i in operations):
        if op.kind == "biased_softmax" and value_id in op.inputs[1:]:
            return table_maps(op.attrs, len(op.inputs) - 1)[op.inputs[1:].index(value_id)]
    return (1, 1)


def _rows_differing(graph: Graph, value_id: int, known: _Inputs, reference: _ById
                    ) -> np.ndarray | None:
    """Which rows of the device's value of an activation differ from the reference's (as
    values: NaN equals NaN), or ``None`` when the two shapes differ.  Storage codes are
    compared where both hold them, and a row is read only up to its first difference."""
    mine, theirs = known.held(value_id), reference.held(value_id)
    if (isinstance(mine, StoredTensor) and isinstance(theirs, StoredTensor)
            and mine.precision == theirs.precision and mine.precision.kind != "F32"):
        rows = graph.value(value_id).type.rows
        shape = (rows, theirs.stored.size // rows)
        if mine.stored.shape != shape:
            return None
        return differing_rows(mine.stored, theirs.stored.reshape(shape), mine.precision.kind,
                              mine.precision.scale_exponent)
    device, held = known[value_id], reference[value_id]
    if device.shape != held.shape:
        return None
    return differing_rows(device, held)


def _fidelity(graph: Graph, ideal: dict[str, np.ndarray], device_values: dict[str, np.ndarray],
              reference: dict[str, np.ndarray]) -> Fidelity:
    errors, noises, targets = [], [], []
    for name in fidelity_values(graph).values():
        target = ideal[name].reshape(-1).astype(np.float64)
        errors.append(np.asarray(device_values[name], np.float64).reshape(-1) - target)
        noises.append(np.asarray(reference[name], np.float64).reshape(-1) - target)
        targets.append(target)
    error, noise = np.concatenate(errors), np.concatenate(noises)
    # the noise is never taken below F16 rounding of the outputs (a graph with no rounding
    # would otherwise divide by zero)
    floor = 2.0**-11 * float(np.sqrt(np.mean(np.concatenate(targets) ** 2)))
    rms_error = float(np.sqrt(np.mean(error**2))) if np.isfinite(error).all() else float("inf")
    rms_noise = max(float(np.sqrt(np.mean(noise**2))), floor)
    worst = float(np.abs(error).max()) if np.isfinite(error).all() else float("inf")
    return Fidelity(rms_error / rms_noise, worst / max(float(np.abs(noise).max()), floor),
                    rms_error, rms_noise)


def log_verdict(verdict: Verdict, per_stage: bool, source: str = "float64") -> None:
    """The verdict in the reference's log format; ``per_stage`` (``--diagnostics``) logs
    every stage, and names the first stage and layer whose agreement breaks."""
    diagnostics = logging.getLogger(DIAGNOSTICS_LOG)
    if per_stage:
        for index, stage in enumerate(verdict.stages):
            event(diagnostics, "diagnostic checkpoint", checkpoint=index, tensor=stage.stage,
                  layer=stage.layer or "-", ulps=stage.max_ulps,
                  mismatch=round(stage.mismatch, 6), samples=stage.elements,
                  passed=stage.passed)
    if per_stage:
        event(diagnostics, "diagnostic checkpoints checked", diagnosticCheckpoints=len(verdict.stages),
              numericalTest="PASS" if verdict.agreement_passed else "FAIL")
    first = verdict.first_failure
    if first is not None:
        event(LOG, "stage agreement broke", level=logging.WARNING, layer=first.layer or "-",
              stage=first.stage, ulps=first.max_ulps, mismatch=round(first.mismatch, 6))
    if verdict.fidelity is not None:
        f = verdict.fidelity
        event(LOG, f"checked fidelity to the {source} model", noiseRatio=round(f.noise_ratio, 4),
              tailRatio=round(f.tail_ratio, 4), rmsError=round(f.rms_error, 6),
              rmsNoise=round(f.rms_noise, 6), passed=f.passed)
