"""The one verifier of a device program against a machine.

It runs twice: at the end of ``emit_tile_code`` (a compiler bug stops the compile, not a
run) and again when the device loads a package (a package from anywhere is checked before
a byte moves).  What it checks, for every step and, inside the layer loop, for every pass
whose addresses differ:

* every tile named exists;
* every kernel access and every host block lies inside tile memory, and operands the
  hardware only takes from interleaved memory (AMP weights) sit there;
* with the compiler's allocation map: every access lies inside an allocation live at that
  step on that tile (a stray address is a fault naming tile, address and step);
* every exchange schedule covers its transfers and is free of port conflicts
  (:func:`ipu_stack.exchange.verify_schedule`).

Field types and bounds were checked when the program was read (:mod:`.parse`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ipu_stack.contract.program import (
    Allocations,
    Compute,
    DeviceProgram,
    Exchange,
    HostRead,
    HostWrite,
    Loop,
    Step,
    call_addresses,
    exchange_sources,
    per_layer,
    read_addresses,
)
from ipu_stack.exchange import verify_schedule
from ipu_stack.exchange.model import ScheduleError
from ipu_stack.kernels.base import KernelInstance, Region
from ipu_stack.target import Target
from ipu_stack.util.errors import DeviceFault, PackageError

WORD = 4
SHIFT = np.int64(1 << 32)


class AllocationMap:
    """Allocations as sorted arrays; ``check`` answers for a batch of byte ranges at one
    step (the allocations live to the end, a tower's per-layer weights, are sorted once)."""

    def __init__(self, allocations: Allocations, tiles: int) -> None:
        self.tile, self.address, self.bytes = (allocations.tile, allocations.address,
                                               allocations.bytes)
        self.first, self.last = allocations.first, allocations.last
        n = len(self.tile)
        if n and (self.tile.min() < 0 or self.tile.max() >= tiles):
            raise PackageError("package allocation map names a tile that does not exist")
        self.always = self.last == (self.last.max() if n else 0)
        self.static = self._sorted(self.always)
        self.step: int | None = None
        self.dynamic = self._sorted(np.zeros(n, dtype=bool))

    def _sorted(self, chosen: np.ndarray) -> tuple[np.ndarray, ...]:
        keys = self.tile[chosen] * SHIFT + self.address[chosen]
        order = np.argsort(keys, kind="stable")
        ends = (self.address[chosen] + self.bytes[chosen])[order]
        return keys[order], ends, self.tile[chosen][order], self.first[chosen][order]

    @staticmethod
    def _inside(table: tuple[np.ndarray, ...], step: int, tile: np.ndarray, lo: np.ndarray,
                hi: np.ndarray) -> np.ndarray:
        keys, ends, owners, firsts = table
        if not len(keys):
            return np.zeros(len(tile), dtype=bool)
        index = np.searchsorted(keys, tile * SHIFT + lo, side="right") - 1
        safe = np.clip(index, 0, len(keys) - 1)
        return (index >= 0) & (owners[safe] == tile) & (hi <= ends[safe]) & (firsts[safe] <= step)

    def check(self, step: int, tile: np.ndarray, lo: np.ndarray, hi: np.ndarray,
              what: str | Callable[[int], str]) -> None:
        """Fault unless each ``[lo, hi)`` on ``tile`` lies in one allocation live at ``step``
        (``what`` names the access, or gives the name of access ``k``: built only for the
        fault's message)."""
        if len(tile) == 0:
            return
        if self.step != step:
            live = ~self.always & (self.first <= step) & (step <= self.last)
            self.dynamic, self.step = self._sorted(live), step
        tile = tile.astype(np.int64)
        inside = self._inside(self.dynamic, step, tile, lo, hi)
        if not inside.all():
            inside |= self._inside(self.static, step, tile, lo, hi)
        if not inside.all():
            k = int(np.argmin(inside))
            name = what if isinstance(what, str) else what(k)
            raise DeviceFault(
                f"{name} on tile {int(tile[k])} touches [{int(lo[k])}, {int(hi[k])}) at step "
                f"{step}, outside every operand placed there"
            )


class Verifier:
    """Checks one program against one machine (see the module docstring)."""

    def __init__(self, program: DeviceProgram, target: Target) -> None:
        self.program, self.target = program, target
        self.base, self.end = target.memory_base, target.memory_end
        self.allocations = (None if program.allocations is None
                            else AllocationMap(program.allocations, target.tiles))
        self.tables: tuple[np.ndarray, ...] = ()
        self.kernel_facts: dict[int, tuple[KernelInstance, list, list[Region]]] = {}

    def run(self) -> None:
        offset = 0
        for name in ("initialize", "run"):
            steps = self.program.program(name)
            layers, body_end = 1, -1
            for index, step in enumerate(steps):
                if isinstance(step, Loop):
                    self._loop(step, f"{name} step {index}")
                    self.tables = step.slots
                    layers, body_end = step.count, index + step.length
                    continue
                passes = layers if index <= body_end and per_layer(step) else 1
                for layer in range(passes):
                    where = f"{name} step {index} ({step.kind})" + (
                        f" on layer {layer}" if layer else "")
                    self._step(step, where, layer, offset + index)
            offset += len(steps)

    def _loop(self, step: Loop, where: str) -> None:
        for number, table in enumerate(step.slots):
            if table.shape != (step.count, self.target.tiles):
                raise PackageError(
                    f"package program is invalid: {where}: slot {number} table is "
                    f"{list(table.shape)}, not [{step.count}, {self.target.tiles}]")

    def _tiles(self, tiles: np.ndarray, where: str) -> None:
        tiles = tiles[tiles >= 0] if tiles.ndim > 1 else tiles
        if tiles.size and (tiles.min() < 0 or tiles.max() >= self.target.tiles):
            bad = int(tiles[(tiles < 0) | (tiles >= self.target.tiles)][0])
            raise PackageError(f"{where} names tile {bad}, which does not exist on ipu21")

    def _range(self, addr: np.ndarray, nbytes: np.ndarray | int, where: str) -> None:
        end = addr + nbytes
        bad = (addr < self.base) | (end > self.end)
        if np.any(bad):
            first = int(np.flatnonzero(bad.ravel())[0])
            raise PackageError(
                f"{where} accesses address {int(addr.ravel()[first])} outside tile memory "
                f"[{self.base}, {self.end})")

    def _step(self, step: Step, where: str, layer: int, index: int) -> None:
        if isinstance(step, (HostWrite, HostRead)):
            self._tiles(step.tiles, where)
            addresses = step.addresses
            if isinstance(step, HostRead) and step.slot is not None:
                if step.slot >= len(self.tables) or np.any(
                        self.tables[step.slot][0, step.tiles[step.tiles >= 0]] < 0):
                    raise PackageError(f"package program is invalid: {where} reads slot "
                                       f"{step.slot}, which its tiles do not hold")
                addresses = read_addresses(step, self.tables, layer)
            self._range(addresses[step.tiles >= 0], step.layout.block_bytes, where)
        elif isinstance(step, Compute):
            self._compute(step, where, layer, index)
        elif isinstance(step, Exchange):
            self._exchange(step, where, layer, index)

    def _kernel(self, index: int) -> tuple[KernelInstance, list, list[Region]]:
        """A kernel with its accesses and exact regions, worked out once per program."""
        if index not in self.kernel_facts:
            kernel = self.program.kernels[index]
            self.kernel_facts[index] = (kernel, kernel.impl.accesses(kernel.params),
                                        [r for r in kernel.impl.regions(kernel.params)
                                         if r.rows * r.row_bytes])
        return self.kernel_facts[index]

    def _compute(self, step: Compute, where: str, layer: int, index: int) -> None:
        """Every call of the step at once: the calls' accesses are gathered into flat arrays
        (a tower's compute steps hold thousands of small copy calls) and checked together;
        a fault names the first bad call's kernel."""
        # on later passes of the loop only the calls with per-layer operands move
        calls = step.calls if layer == 0 else [c for c in step.calls if c.slots]
        if not calls:
            return
        tiles: list[np.ndarray] = []
        starts: list[np.ndarray] = []
        lengths: list[int] = []
        owners: list[int] = []  # per access: the call's kernel
        low_interleaved: list[tuple[KernelInstance, int, int]] = []
        spans: list[tuple[np.ndarray, np.ndarray, int, int]] = []  # regions: lo, tiles, ...
        for call in calls:
            kernel, accesses, regions = self._kernel(call.kernel)
            if layer:  # the other operands are where they were on layer 0, already checked
                moved = {operand for operand, _ in call.slots}
                accesses = [a for a in accesses if a[0] in moved]
                regions = [r for r in regions if r.operand in moved]
            for _, slot in call.slots:
                if slot >= len(self.tables) or np.any(self.tables[slot][0, call.tiles] < 0):
                    raise PackageError(
                        f"a call names slot {slot} on a tile that does not hold it")
            addresses = call_addresses(call, self.tables, layer)
            tiles.append(call.tiles)
            for operand, length, _ in accesses:
                if length > 0:
                    starts.append(addresses[:, operand])
                    lengths.append(length)
                    owners.append(call.kernel)
            for operand in kernel.impl.interleaved:  # checked after the ranges, below
                low_interleaved.append((kernel, operand, int(addresses[:, operand].min())))
            for region in regions:
                spans.append((addresses[:, region.operand] + region.offset, call.tiles,
                              (region.rows - 1) * region.pitch + region.row_bytes,
                              call.kernel))
        self._tiles(np.concatenate(tiles), where)
        if starts:
            counts = [len(a) for a in starts]
            at = np.concatenate(starts)
            ends = at + np.repeat(np.asarray(lengths, dtype=np.int64), counts)
            bad = (at < self.base) | (ends > self.end)
            if np.any(bad):
                k = int(np.argmax(bad))
                kernel = self.program.kernels[int(np.repeat(owners, counts)[k])]
                raise PackageError(f"{where} {kernel.name} accesses address {int(at[k])} "
                                   f"outside tile memory [{self.base}, {self.end})")
        for kernel, operand, low in low_interleaved:
            if low < self.target.interleaved_base:
                raise PackageError(
                    f"{where} {kernel.name}: operand {operand} at address {low} must be "
                    f"in interleaved memory (>= {self.target.interleaved_base})")
        if self.allocations is not None and spans:
            counts = [len(lo) for lo, _, _, _ in spans]
            lo = np.concatenate([lo for lo, _, _, _ in spans])
            extent = np.repeat(np.asarray([e for _, _, e, _ in spans], dtype=np.int64), counts)
            owner = np.repeat(np.asarray([k for _, _, _, k in spans]), counts)
            self.allocations.check(
                index, np.concatenate([t for _, t, _, _ in spans]), lo, lo + extent,
                lambda k: f"kernel {self.program.kernels[int(owner[k])].name} in {step.name}")

    def _exchange(self, step: Exchange, where: str, layer: int, index: int) -> None:
        nbytes = step.words * WORD
        src = exchange_sources(step, self.tables, layer)
        if layer:  # only the sends of per-layer weights move on later passes
            assert step.src_slot is not None
            moved = step.src_slot >= 0
            self._range(src[moved], nbytes[moved], where)
            if self.allocations is not None:
                self.allocations.check(index, step.src_tile[moved], src[moved],
                                       src[moved] + nbytes[moved],
                                       f"exchange {step.name} source")
            return
        transfers = step.transfers(self.target.tiles)
        self._tiles(step.src_tile, where)
        self._tiles(step.dst_tile, where)
        self._range(src, nbytes, where)
        dst_bytes = np.repeat(nbytes, transfers.fanout)
        self._range(step.dst_addr, dst_bytes, where)
        try:  # the schedule is the same on every pass
            verify_schedule(transfers, step.schedule())
        except ScheduleError as exc:
            raise DeviceFault(f"{where}: exchange schedule fault: {exc}") from None
        if self.allocations is not None:
            self.allocations.check(index, step.src_tile, src, src + nbytes,
                                   f"exchange {step.name} source")
            self.allocations.check(index, step.dst_tile, step.dst_addr,
                                   step.dst_addr + dst_bytes,
                                   f"exchange {step.name} destination")


def verify_program(program: DeviceProgram, target: Target) -> None:
    """Raise :class:`PackageError` or :class:`DeviceFault` (one line) on the first step the
    machine could not run exactly as written."""
    Verifier(program, target).run()
