"""The simulated ipu21: real bytes in real tile memories, cycles from the program that ran.

The device knows only the package, read into a typed :class:`~ipu_stack.contract.DeviceProgram`
(kernel instances, per-call tiles and operand addresses, exchange transfers with their
schedule, host streams, the allocation map).  Loading runs the contract's one verifier
(tiles exist, every access inside tile memory and a live allocation, every exchange schedule
valid); then the device executes typed steps and times what it executed:

* compute: a kernel call runs once over all its tiles, each operand gathered at each tile's
  own address (docs/architecture.md, "How the simulator runs a package fast"); each call
  reports the work it did (AMP passes and rows, per-worker element counts, ...), and
  ``device.pricing.price_work`` turns that work into cycles, with the AMP weight price taken
  from where the weights really sit (interleaved or standard memory); the superstep takes the
  busiest tile (no sync: a tile's compute reads only its own memory, so the next compute set
  starts without waiting for the others);
* exchange: one compiled gather/scatter of words (all reads before any write); cycles come
  from the phase's chunks, issued by ``device.pricing`` as send instructions of at most 64
  words on aligned events, plus the measured per-phase cost, plus the sync before it (the
  phase's schedule assumes every tile starts it together);
* host streams: bytes over the 32 GB/s link, reported as host cycles beside the device's;
* a loop step runs its body once per layer: each operand or send that names a per-layer
  weight is moved, on pass ``k``, to layer ``k``'s copy through the slot's address table
  (checked at load for every layer); cycles are also reported per pass;
* probe reads (checkpoints) stay in their stored precision and, when the caller asks, are
  handed over as soon as their last piece is read, so a verdict can run beside the device.

None of this calls the planner's cost functions: ``estimatedCycles`` and ``cycles`` are two
code paths, and the benchmark reports their difference.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ipu_stack.contract import (
    Compute,
    DeviceProgram,
    Exchange,
    HostRead,
    HostWrite,
    Loop,
    Step,
    from_manifest,
    verify_program,
)
from ipu_stack.contract.program import (
    Call,
    call_addresses,
    exchange_sources,
    execution_order,
    read_addresses,
)
from ipu_stack.device import pricing
from ipu_stack.device.record import ComputeTrace, StepRecord
from ipu_stack.device.words import move_words
from ipu_stack.ir.precision import Precision
from ipu_stack.ir.values import StoredTensor
from ipu_stack.kernels.base import KernelInstance, read_rows
from ipu_stack.package import Package
from ipu_stack.target import Target, timing
from ipu_stack.target.timing import Work
from ipu_stack.util.errors import DeviceFault, PackageError
from ipu_stack.util.heap import zeroed_pages
from ipu_stack.util.log import event

LOG = logging.getLogger("ipu_stack.device")
WORD = 4


@dataclass
class CallReport:
    """What one host call cost: totals and per-tile busy cycles."""

    program: str
    cycles: int = 0
    compute_cycles: int = 0
    exchange_cycles: int = 0
    sync_cycles: int = 0
    host_bytes: int = 0
    host_cycles: int = 0
    supersteps: int = 0
    phases: int = 0
    tile_busy: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    checkpoints: dict[int, dict[str, Any]] = field(default_factory=dict)
    # the busiest tile's cycles of each compute superstep, by kind of work
    breakdown: dict[str, int] = field(default_factory=dict)
    steps: list[StepRecord] = field(default_factory=list)  # only when recording
    layer_cycles: list[int] = field(default_factory=list)  # each pass of the layer loop
    # every superstep's cycles with its sync, and its kind, in order: a pipeline step merges
    # the groups' supersteps as the chip runs them (device/alignment.py)
    superstep_cycles: list[int] = field(default_factory=list)
    superstep_kinds: list[str] = field(default_factory=list)  # compute or exchange


class SimulatedIpu:
    """A loaded package on a simulated chip."""

    def __init__(self, target: Target, poison: bool = False, record: bool = False) -> None:
        self.target = target
        self.base = target.memory_base
        self.size = target.memory_end - target.memory_base
        self.memory = zeroed_pages(target.tiles, self.size)
        # poison mode: which bytes have been written; reading any other byte is a fault
        self.written = np.zeros_like(self.memory, dtype=bool) if poison else None
        self.program: DeviceProgram | None = None
        self.package: Package | None = None  # the loaded package (the runtime's records)
        self.record = record  # keep a StepRecord of every superstep (the execution profile)
        self.tables: tuple[np.ndarray, ...] = ()  # the running layer loop's slot tables
        # each exchange phase's timing, by the step's identity in the loaded program
        self._timed_phases: dict[int, tuple[int, np.ndarray, dict[str, Any]]] = {}

    # ------------------------------------------------------------------ loading
    def load(self, package: Package) -> None:
        """Read the package's program (types and bounds), verify it against this machine,
        then hold it for calls."""
        program = from_manifest(package.manifest, package.arrays)
        try:
            verify_program(program, self.target)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise PackageError(f"package program is malformed: {exc!r}") from None
        self.program, self.package = program, package
        self._timed_phases = {}
        event(LOG, "loading application", tile_count=self.target.tiles,
              final_mark=program.step_count)

    # ------------------------------------------------------------------ running
    def call(self, program: str, tensors: dict[str, np.ndarray],
             on_probes: ProbeListener | None = None) -> CallReport:
        """Run ``initialize`` or ``run`` with host tensors; return outputs and cycles.

        ``on_probes``: handed each probe read (checkpoint) as soon as its last piece has
        been read, as ``[(tensor, StoredTensor), ...]``, and not kept in the report: a
        verdict can judge a stage while the device runs the next and drop what it judged.
        """
        if self.program is None:
            raise DeviceFault("no application loaded")
        steps = self.program.program(program)
        report = CallReport(program, tile_busy=np.zeros(self.target.tiles, dtype=np.int64))
        event(LOG, "invoking host exchange call", call=program, command=0,
              phases=sum(1 for s in steps if isinstance(s, Exchange)))
        complete_after = _last_probe_reads(steps) if on_probes is not None else {}
        previous: tuple[int, int] | None = None  # the loop pass running: (loop step, layer)
        before = 0
        for ordinal, (index, step, layer, loop) in enumerate(execution_order(steps)):
            current = None if layer is None else (loop, layer)
            if layer is not None:
                looping = steps[loop]
                assert isinstance(looping, Loop)
                self.tables = looping.slots
            if current != previous:  # a pass of the loop ends, begins, or both
                if previous is not None:
                    report.layer_cycles.append(report.cycles - before)
                before, previous = report.cycles, current
            self._run_step(report, index, step, tensors, layer)
            if on_probes is not None and ordinal in complete_after:
                on_probes([(entry["tensor"], entry["values"]) for entry in (
                    report.checkpoints.pop(c) for c in complete_after[ordinal]
                    if c in report.checkpoints)])
        if previous is not None:
            report.layer_cycles.append(report.cycles - before)
        report.tile_busy += report.sync_cycles
        report.host_cycles = pricing.host_cycles(report.host_bytes, self.target.clock_hz)
        return report

    def _run_step(self, report: CallReport, index: int, step: Step,
                  tensors: dict[str, np.ndarray], layer: int | None) -> None:
        """One step (on pass ``layer`` of the loop, if inside it), added to ``report``."""
        if isinstance(step, HostRead):
            read_now = step.on_pass(layer)
            if read_now is None:
                return  # this pass's value is a graph output, read as one
            step = read_now
        kind = step.kind
        sync = timing.p("sync")
        label = step.tensor if isinstance(step, (HostWrite, HostRead)) else step.name
        record = StepRecord(index, label, kind, 0, 0, layer=layer)
        if isinstance(step, HostWrite):
            written = self._host_write(step, tensors)
            report.host_bytes += written
            record.host = {"tensor": step.tensor, "bytes": written}
        elif isinstance(step, HostRead):
            piece, precision = self._host_read(step, layer)
            read = 0
            if step.checkpoint is None:  # probes are the simulator's, not traffic
                read = int(piece.size) * precision.itemsize
            report.host_bytes += read
            record.host = {"tensor": step.tensor, "bytes": read,
                           "probe": step.checkpoint is not None}
            self._collect(report, step, piece, precision)
        elif isinstance(step, Compute):
            trace = ComputeTrace() if self.record else None
            busy, by_kind = self._compute(step, trace, layer or 0)
            busiest = int(np.argmax(busy)) if busy.size else 0
            report.compute_cycles += int(busy[busiest]) if busy.size else 0
            for work_kind, cycles in by_kind.items():
                report.breakdown[work_kind] = (report.breakdown.get(work_kind, 0)
                                               + int(cycles[busiest]))
            report.tile_busy += busy
            report.cycles += int(busy[busiest]) if busy.size else 0
            report.superstep_cycles.append(int(busy[busiest]) if busy.size else 0)
            report.superstep_kinds.append("compute")
            report.supersteps += 1
            record.cycles, record.sync, record.tile_cycles = int(busy[busiest]), 0, busy
            record.busiest_tile = busiest
            record.by_kind = {k: int(v[busiest]) for k, v in by_kind.items()}
            if trace is not None:
                record.calls, record.busiest_work = trace.calls(busy), trace.work_on(busiest)
        elif isinstance(step, Exchange):
            cycles, ports, details = self._exchange_step(step, layer or 0)
            report.exchange_cycles += cycles
            report.tile_busy += ports
            report.cycles += cycles + sync
            report.superstep_cycles.append(cycles + sync)
            report.superstep_kinds.append("exchange")
            report.sync_cycles += sync
            report.supersteps += 1
            report.phases += 1
            record.cycles, record.sync, record.tile_cycles = cycles, sync, ports
            record.busiest_tile, record.exchange = int(np.argmax(ports)), details
        if self.record:
            report.steps.append(record)

    def _host_write(self, step: HostWrite, tensors: dict[str, np.ndarray]) -> int:
        name = step.tensor
        if name not in tensors:
            raise DeviceFault(f"host call is missing tensor {name!r}")
        tiles, addresses = step.tiles, step.addresses
        layout = step.layout.on(tiles)
        stored = layout.precision.quantize(np.asarray(tensors[name]))
        blocks = layout.to_blocks(stored.reshape(layout.rows, layout.cols))
        nbytes = layout.block_bytes
        valid = tiles >= 0
        block_index = np.broadcast_to(
            np.arange(tiles.shape[0] * tiles.shape[1]).reshape(tiles.shape[:2] + (1,)), tiles.shape
        )
        flat_blocks = blocks.reshape(-1, nbytes)
        t, a, b = tiles[valid], addresses[valid] - self.base, block_index[valid]
        for address in np.unique(a):
            sel = a == address
            self.memory[t[sel], address : address + nbytes] = flat_blocks[b[sel]]
            if self.written is not None:
                self.written[t[sel], address : address + nbytes] = True
        return int(valid.sum()) * nbytes

    def _collect(self, report: CallReport, step: HostRead, piece: np.ndarray,
                 precision: Precision) -> None:
        """Place a read piece (storage codes) into its tensor (outputs and checkpoints may
        come in pieces).  Outputs are float32; checkpoints stay in their stored precision
        (a tower's probe reads of every stage would be gigabytes as float32), with the
        format's NaN wherever no piece landed."""
        assert self.program is not None
        name = step.tensor
        rows, cols = self.program.tensors[name].matrix
        checkpoint = step.checkpoint
        # a tensor's buffer is made by its first piece only (not built and thrown away
        # for every later piece)
        if checkpoint is None:
            if name not in report.outputs:
                report.outputs[name] = np.full((rows, cols), np.nan, np.float32)
            target = report.outputs[name]
            piece = precision.dequantize(piece)
        else:
            if int(checkpoint) not in report.checkpoints:
                # the format's NaN code, encoded once and repeated (not a float32 NaN matrix
                # encoded element by element: 2 % of a pipelined tower's run)
                nan_code = precision.quantize(np.full((1, 1), np.nan, np.float32))
                report.checkpoints[int(checkpoint)] = {
                    "tensor": name, "operation": step.operation,
                    "values": StoredTensor(precision, np.full((rows, cols), nan_code[0, 0],
                                                              nan_code.dtype)),
                }
            if report.checkpoints[int(checkpoint)]["tensor"] != name:
                raise PackageError(f"checkpoint {int(checkpoint)} is read from both "
                                   f"{report.checkpoints[int(checkpoint)]['tensor']} and {name}")
            target = report.checkpoints[int(checkpoint)]["values"].stored
        r0, c0 = step.origin
        if r0 < 0 or c0 < 0 or r0 + piece.shape[0] > rows or c0 + piece.shape[1] > cols:
            raise PackageError(f"host read of {name} at {r0},{c0} lies outside the tensor")
        target[r0 : r0 + piece.shape[0], c0 : c0 + piece.shape[1]] = piece

    def _host_read(self, step: HostRead, layer: int | None = None
                   ) -> tuple[np.ndarray, Precision]:
        tiles = step.tiles[:, :, :1]
        addresses = read_addresses(step, self.tables, layer)[:, :, :1]
        layout = step.layout.on(tiles)
        nbytes = layout.block_bytes
        blocks = np.zeros((tiles.shape[0] * tiles.shape[1], nbytes), dtype=np.uint8)
        flat_t, flat_a = tiles.ravel(), addresses.ravel() - self.base
        held = flat_t >= 0
        if held.any():  # one compiled gather of every held block
            at = flat_a[held]
            if int(at.min()) < 0 or int(at.max()) + nbytes > self.memory.shape[1]:
                raise DeviceFault(f"host read of {step.tensor} reaches outside tile memory")
            blocks[held] = read_rows(self.memory, flat_t[held], at, 1, nbytes, nbytes)[:, 0]
        return layout.from_blocks(blocks), layout.precision

    def _compute(self, step: Compute, trace: ComputeTrace | None = None, layer: int = 0
                 ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Run a compute set; per-tile cycles of the work each call reported, and the same
        split by kind of work (for the benchmark's record of what limits a program).  With a
        ``trace`` (recording), every tile group's priced work too."""
        busy = np.zeros(self.target.tiles, dtype=np.int64)
        by_kind: dict[str, np.ndarray] = {}
        assert self.program is not None
        with np.errstate(all="ignore"):  # overflow saturates: the check reports it
            for call in step.calls:
                works, placements = self._run_call(call, step.name, layer)
                for work, interleaved in zip(works, placements, strict=True):
                    kind = _work_class(work.kind)
                    if kind not in by_kind:
                        by_kind[kind] = np.zeros_like(busy)
                    groups = ((True, call.tiles),) if interleaved is None else \
                        _placed_groups(call.tiles, interleaved)
                    for placed, members in groups:
                        cycles = pricing.price_work(work, placed)
                        busy[members] += cycles
                        by_kind[kind][members] += cycles
                if trace is not None:
                    _trace_call(trace, self.program.kernels[call.kernel], call.tiles, works, [
                        np.ones(len(call.tiles), dtype=bool) if placed is None else placed
                        for placed in placements])
        return busy, by_kind

    def _run_call(self, call: Call, step: str, layer: int
                  ) -> tuple[list[Work], list[np.ndarray | None]]:
        """One call's kernel over all its tiles at once (tiles differ in addresses, not in
        parameters): what it did, and for AMP work where each tile's weights sit (the
        price depends on it; None for work it does not touch)."""
        assert self.program is not None
        kernel = self.program.kernels[call.kernel]
        addresses = call_addresses(call, self.tables, layer) - self.base
        if self.written is not None:
            self._poison_groups(kernel, call.tiles, addresses, step)
        works = kernel.impl.run(kernel.params, self.memory, call.tiles,
                                [addresses[:, k] for k in range(addresses.shape[1])])
        return works, [None if work.weights < 0 else (
            addresses[:, work.weights] + self.base >= self.target.interleaved_base)
            for work in works]

    def _poison_groups(self, kernel: KernelInstance, tiles: np.ndarray, addresses: np.ndarray,
                       step: str) -> None:
        """Poison mode, around one call: fault on a read of never-written bytes, then mark
        what the call will write (each group of tiles with the same addresses at once)."""
        assert self.written is not None
        unique, inverse = np.unique(addresses, axis=0, return_inverse=True)
        inverse = inverse.ravel()
        for group, row in enumerate(unique):
            self._poison_check(kernel, tiles[inverse == group], row, step)
        for group, row in enumerate(unique):
            members = tiles[inverse == group]
            for region in kernel.impl.regions(kernel.params):
                if region.writes:
                    where = int(row[region.operand]) + region.byte_offsets()
                    self.written[members[:, None], where[None, :]] = True

    def _poison_check(self, kernel: KernelInstance, tiles: np.ndarray, row: np.ndarray,
                      step: str) -> None:
        """Fault if the kernel is about to read a word nothing has written.  Word
        granularity, as for the exchange: a row's last word that its producer wrote in part
        (an odd number of F16 values, the rest row padding) counts as written, so a copy
        that moves whole words of such a row reads no unwritten word."""
        assert self.written is not None
        for region in kernel.impl.regions(kernel.params):
            if region.writes or region.rows * region.row_bytes == 0:
                continue
            where = int(row[region.operand]) + region.byte_offsets()
            first = (where - where % WORD)[None, :]
            written = self.written[tiles[:, None], first]
            for byte in range(1, WORD):
                written |= self.written[tiles[:, None], first + byte]
            unset = ~written
            if unset.any():
                t, b = np.argwhere(unset)[0]
                raise DeviceFault(
                    f"poison: {kernel.name} in {step} on tile {int(tiles[t])} reads address "
                    f"{int(where[b]) + self.base}, which was never written"
                )

    def _move_poisoned(self, step: Exchange, mem32: np.ndarray, src_word: np.ndarray,
                       dst_word: np.ndarray, words: np.ndarray, fanout: np.ndarray
                       ) -> np.ndarray:
        """The exchange's word moves with poison tracking, as a memory checker tracks
        definedness: each destination byte is written exactly where its source byte was, so
        moving bytes nothing wrote is no fault (a reduce-scatter sends a ragged block's
        whole rows, padding columns included, and the reduce reads only the valid ones),
        and the kernel that reads them is (``_poison_check``).  A transfer that sends only
        unwritten words moves nothing anyone wrote, so it is a fault naming it.  Returns the
        words each destination received."""
        assert self.written is not None
        per_tile = self.size // WORD
        total = int(words.sum())
        starts = np.zeros(len(words), dtype=np.int64)
        np.cumsum(words[:-1], out=starts[1:])
        within = np.arange(total, dtype=np.int64) - np.repeat(starts, words)
        gather = np.repeat(src_word, words) + within
        defined = self.written.reshape(-1, WORD)[gather]
        sent = np.ones(len(words), dtype=bool)
        some = words > 0
        if total:
            sent[some] = np.add.reduceat(defined.any(axis=1), starts[some]) > 0
        if not sent.all():
            word = int(src_word[np.argmin(sent)])
            tile, offset = divmod(word, per_tile)
            raise DeviceFault(
                f"poison: exchange {step.name} sends from tile {tile} address "
                f"{offset * WORD + self.base}, which was never written"
            )
        values = mem32[gather]
        dst_words = np.repeat(words, fanout)
        dst_starts = np.repeat(starts, fanout)
        d_total = int(dst_words.sum())
        d_within = np.arange(d_total, dtype=np.int64) - np.repeat(
            np.cumsum(dst_words) - dst_words, dst_words
        )
        scatter = np.repeat(dst_word, dst_words) + d_within
        moved = np.repeat(dst_starts, dst_words) + d_within
        mem32[scatter] = values[moved]
        self.written.reshape(-1, WORD)[scatter] = defined[moved]
        return dst_words

    def _exchange_step(self, step: Exchange, layer: int = 0
                       ) -> tuple[int, np.ndarray, dict[str, Any]]:
        transfers = step.transfers(self.target.tiles)
        words = transfers.words
        ports = np.zeros(self.target.tiles, dtype=np.int64)
        if transfers.count == 0:
            return 0, ports, {}
        fanout = transfers.fanout
        per_tile = self.size // WORD
        mem32 = self.memory.reshape(-1).view(np.uint32)
        src_word = (transfers.src.astype(np.int64) * per_tile
                    + (exchange_sources(step, self.tables, layer) - self.base) // WORD)
        dst_word = (transfers.dst.astype(np.int64) * per_tile
                    + (step.dst_addr - self.base) // WORD)
        if self.written is None:
            move_words(mem32, src_word, words, transfers.dst_offsets, dst_word)
            dst_words = np.repeat(words, fanout)
        else:
            dst_words = self._move_poisoned(step, mem32, src_word, dst_word, words, fanout)
        # a loop body's phase moves the same transfers on every pass (only the addresses
        # differ), so its timing is worked out on the first pass and kept
        timed = self._timed_phases.get(id(step))
        if timed is None:
            timed = self._time_phase(step, dst_words)
            self._timed_phases[id(step)] = timed
        cycles, ports, details = timed
        return cycles, ports, dict(details)

    def _time_phase(self, step: Exchange, dst_words: np.ndarray
                    ) -> tuple[int, np.ndarray, dict[str, Any]]:
        """Cycles, per-tile port words and details of a phase, from the transfers it moved
        and the chunks that moved them."""
        transfers, schedule = step.transfers(self.target.tiles), step.schedule()
        words, tiles = transfers.words, self.target.tiles
        ports = np.bincount(transfers.src, weights=words, minlength=tiles).astype(np.int64)
        recv = np.bincount(transfers.dst, weights=dst_words, minlength=tiles).astype(np.int64)
        details = {"horizon": schedule.horizon, "lower_bound": schedule.lower_bound,
                   "transfers": transfers.count, "chunks": schedule.chunks,
                   "send_words_max": int(ports.max()), "recv_words_max": int(recv.max()),
                   "words": int(words.sum()), "kind": schedule.kind}
        ports = np.maximum(ports, recv)
        ports.flags.writeable = False
        # timed from the chunks that moved the words (the verifier proved at load that they
        # cover every transfer exactly), with the device's own instruction accounting
        cycles, horizon, shifted = pricing.exchange_cycles(
            step.src_tile, step.chunk_transfer, step.chunk_start, step.chunk_words,
            step.chunk_lanes)
        details.update(instruction_horizon=horizon, shifted_sends=shifted)
        return cycles, ports, details


def _placed_groups(tiles: np.ndarray, interleaved: np.ndarray
                   ) -> tuple[tuple[bool, np.ndarray], ...]:
    """The call's tiles split by where their weights sit; nearly every call has them all on
    one side, and then the tiles are taken whole (tens of thousands of small calls)."""
    if interleaved.all():
        return ((True, tiles),)
    if not interleaved.any():
        return ((False, tiles),)
    return ((True, tiles[interleaved]), (False, tiles[~interleaved]))


_WORK_CLASSES = {"amp": "gemm", "cast_from_f8": "cast", "cast_f8": "cast", "cast_f16": "cast",
                 "bias_gelu": "gelu", "gelu_tanh": "gelu", "layer_norm": "layerNorm",
                 "normce": "layerNorm", "normce_rms": "rmsNorm", "rms_sums": "rmsNorm",
                 "rms_scale": "rmsNorm",
                 "rms_norm": "rmsNorm",
                 **dict.fromkeys(timing.ACTIVATION_VERTICES, "activation"), "add": "add",
                 "rope": "rope", "argmax_gather": "argmax", "argmax_sparse": "argmax"}


def _trace_call(trace: ComputeTrace, kernel: KernelInstance, tiles: np.ndarray, works: list,
                placements: list[np.ndarray]) -> None:
    """A recorded call's priced work, per group of tiles priced alike (``placements``: per
    work, whether each tile's weights sit in interleaved memory)."""
    groups: dict[tuple[bool, ...], list[int]] = {}
    for index in range(len(tiles)):
        groups.setdefault(tuple(bool(p[index]) for p in placements), []).append(index)
    for key, members in groups.items():
        priced = [{"kind": w.kind, "cycles": pricing.price_work(w, placed),
                   "counts": _plain(w.counts)} for w, placed in zip(works, key, strict=True)]
        trace.add(kernel.name, tiles[members], priced)


ProbeListener = Callable[[list[tuple[str, StoredTensor]]], None]


def _probe_of(step: Step, layer: int | None) -> int | None:
    """The checkpoint a host read fills on this pass (``None``: an output or none)."""
    if not isinstance(step, HostRead):
        return None
    read = step.on_pass(layer)
    return None if read is None else read.checkpoint


def _last_probe_reads(steps: tuple[Step, ...]) -> dict[int, list[int]]:
    """For each step ordinal, the checkpoints whose last piece it reads."""
    last: dict[int, int] = {}
    for ordinal, (_, step, layer, _loop) in enumerate(execution_order(steps)):
        checkpoint = _probe_of(step, layer)
        if checkpoint is not None:
            last[int(checkpoint)] = ordinal
    complete: dict[int, list[int]] = {}
    for checkpoint, ordinal in last.items():
        complete.setdefault(ordinal, []).append(checkpoint)
    return complete


def _plain(counts: dict[str, Any]) -> dict[str, Any]:
    """Work counts as JSON-ready values (per-worker lists stay lists)."""
    return {k: (list(map(int, v)) if isinstance(v, (list, tuple)) else
                v if isinstance(v, bool) else int(v)) for k, v in counts.items()}


def _work_class(kind: str) -> str:
    """The benchmark's names for what a compute superstep spent its cycles on."""
    return _WORK_CLASSES.get(kind, kind)
