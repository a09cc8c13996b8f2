"""A system package's groups loaded on devices of their tiles, and an image run through them.

Each group's program (a package inside the system package) is loaded on a simulated device of
the group's tiles, which holds only that group's tile memories; the groups share no memory,
which is what makes them independent on the chip.  An image enters group 0, and each group's
output moves into the next group's input: the bytes the device read out of the sending
group's tiles are written, unchanged, into the receiving group's input blocks (the same values
the hand-off exchange or link moves; its cycles are the hand-off's, verified and priced by the
device's own exchange and link accounting).  A package compiled for the whole chip is one
group on every tile (``contract.system.single_group``), loaded the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ipu_stack.contract import from_manifest
from ipu_stack.contract.handoff import handoff_transfers, same_transfers
from ipu_stack.contract.program import RESIDENT_ROLES
from ipu_stack.contract.system import (
    GroupSpec,
    Handoff,
    SystemProgram,
    single_group,
    system_from_manifest,
    verify_system,
)
from ipu_stack.device import SimulatedIpu
from ipu_stack.device.pricing import exchange_cycles, link_cycles
from ipu_stack.device.simulator import CallReport
from ipu_stack.ir.graph import Graph
from ipu_stack.package import Package, read_package_bytes
from ipu_stack.target import get_target, timing
from ipu_stack.util.errors import PackageError


def read_system(package: Package) -> SystemProgram:
    """The package's system program, read and verified (a whole-chip program: one group)."""
    target = get_target(package.target)
    if "pipeline" not in package.manifest:
        return single_group(target)
    system = system_from_manifest(package.manifest, package.arrays, package.target)
    verify_system(system, target)
    return system


def group_programs(package: Package, system: SystemProgram,
                   only: set[int] | None = None) -> dict[int, Package]:
    """The system's group programs by slot (``only``: just those), each read and verified as
    a package of its own (a whole-chip package is its own one program)."""
    if "pipeline" not in package.manifest:
        return {0: package}
    programs = {}
    for k in range(system.programs):
        if only is not None and k not in only:
            continue
        data = package.arrays.get(f"program.{k}")
        if data is None:
            raise PackageError(f"system package lacks its group program {k}")
        programs[k] = read_package_bytes(f"group program {k}", data.tobytes(),
                                         expected_target=package.target)
    return programs


class LoadedGroup:
    """A group's program loaded on a device of its tiles, with the names it uses."""

    def __init__(self, spec: GroupSpec, package: Package, target_name: str,
                 recording: bool = False, device: bool = True, poison: bool = False) -> None:
        self.spec = spec
        self.index = spec.index
        self.package = package
        self.device = SimulatedIpu(get_target(target_name).with_tiles(spec.tiles),
                                   record=recording, poison=poison)
        if device:  # without: the program described, not loaded on tiles
            self.device.load(package)
        tensors = package.manifest.get("tensors", {})
        self.weights = [name for name, info in tensors.items()
                        if info.get("role") in RESIDENT_ROLES]
        self.inputs = [name for name, info in tensors.items() if info.get("role") == "input"]

    def tower(self, name: str) -> str:
        return self.spec.tower(name)

    def initialize(self, tensors: Mapping[str, Any]) -> CallReport:
        """Load this group's weights (``tensors`` by the tower's names)."""
        return self.device.call("initialize", {w: tensors[self.tower(w)] for w in self.weights})


def load_groups(package: Package, system: SystemProgram, recording: bool = False,
                chip: int | None = None, devices: bool = True,
                poison: bool = False) -> list[LoadedGroup]:
    """The groups (``chip``: only that chip's) loaded on devices of their tiles (without
    ``devices``: only their programs read)."""
    specs = [g for g in system.groups if chip is None or g.chip == chip]
    programs = group_programs(package, system, {g.program for g in specs})
    groups = [LoadedGroup(g, programs[g.program], package.target, recording, devices, poison)
              for g in specs]
    check_handoffs(groups, system.handoffs)
    return groups


def check_handoffs(groups: list[LoadedGroup], handoffs: tuple[Handoff, ...]) -> None:
    """Each group's output is the next group's input: the same tensor, shape and precision
    (between the groups loaded here)."""
    loaded = {g.index: g for g in groups}
    for h in handoffs:
        if h.sender not in loaded or h.receiver not in loaded:
            continue
        sender, receiver = loaded[h.sender], loaded[h.receiver]
        sent = sender.package.manifest["tensors"].get(sender.spec.local(h.tensor))
        taken = receiver.package.manifest["tensors"].get(receiver.spec.local(h.tensor))
        if sent is None or taken is None or sent.get("shape") != taken.get("shape") or \
                sent.get("precision") != taken.get("precision"):
            raise PackageError(f"pipeline hand-off {h.tensor} from group {sender.index} to "
                               f"{receiver.index}: the programs disagree on its type")


def check_tower(groups: list[LoadedGroup], graph: Graph) -> None:
    """Every tensor a group program names is the tower's value of that name and type, named
    by no other group (but the hand-off, by its two; weights may be shared); every tower
    weight is loaded by some group; and each GEMM mode a program records names,
    through its group's ``source_ops``, a matmul of the tower (the host reference rounds that
    matmul by it)."""
    values = {v.name: v for v in graph.values}
    matmuls = {op.id for op in graph.operations if op.kind in ("matmul", "head_matmul")}
    holder: dict[str, int] = {}
    named: dict[str, int] = {}  # each tower tensor: the group that names it first
    for group in groups:
        for name, info in group.package.manifest["tensors"].items():
            value = values.get(group.tower(name))
            if value is None or info.get("shape") != list(value.type.shape) or \
                    info.get("precision") != value.type.precision.to_json():
                raise PackageError(f"pipeline group {group.index} does not match its tower: "
                                   f"tensor {group.tower(name)}")
        for name, info in group.package.manifest["tensors"].items():
            if info.get("role") in RESIDENT_ROLES:  # a weight may serve several groups
                continue
            tower = group.tower(name)
            earlier = named.setdefault(tower, group.index)
            if earlier != group.index and tower != group.spec.input and \
                    values[tower].role != "input":  # the host gives every group its inputs
                raise PackageError(f"pipeline groups {earlier} and {group.index} both name "
                                   f"the tower's tensor {tower}")
        for name in group.weights:
            holder[group.tower(name)] = group.index
        source = group.spec.source_ops
        if source and max(source) >= len(graph.operations):
            raise PackageError(f"pipeline group {group.index} names operation {max(source)}, "
                               f"the tower has {len(graph.operations)}")
        for op in group.package.manifest.get("gemm_modes", {}):
            if source and (int(op) >= len(source) or source[int(op)] not in matmuls):
                raise PackageError(f"pipeline group {group.index}: its GEMM mode of operation "
                                   f"{op} names no matmul of the tower")
    if len(groups) > 1 and len(holder) != len(graph.by_role("weight")):
        missing = sorted({v.name for v in graph.by_role("weight")} - set(holder))
        raise PackageError(f"no pipeline group loads the tower's weight {missing[0]}")


def handoff_phase_cycles(handoff: Handoff) -> int:
    """An on-chip hand-off as the device prices it: timed from its verified chunks (+ the
    superstep's sync)."""
    schedule = handoff.schedule
    assert schedule is not None  # verify_system: every on-chip hand-off has one
    cycles, _, _ = exchange_cycles(handoff.transfers.src.astype(np.int64),
                                   schedule.chunk_transfer, schedule.chunk_start,
                                   schedule.chunk_words, None)
    return int(cycles) + timing.p("sync")


def verify_handoffs(system: SystemProgram, programs: dict[int, Package],
                    clock_hz: float) -> list[tuple[int, int]]:
    """Every hand-off, derived again from the two programs it joins, is the package's (the
    same transfers in the same order, the same bytes): the groups, and over a link the
    chips, agree on what crosses.  Returns each link's ``(cycles, bytes)`` as the device
    prices it."""
    priced = []
    for h in system.handoffs:
        sender, receiver = system.groups[h.sender], system.groups[h.receiver]
        where = (f"hand-off of {h.tensor} from chip {h.chips[0]} to chip {h.chips[1]}" if h.link
                 else f"hand-off of {h.tensor} from group {h.sender} to group {h.receiver}")
        send_program, receive_program = programs[sender.program], programs[receiver.program]
        derived, nbytes = handoff_transfers(
            from_manifest(send_program.manifest, send_program.arrays),
            sender.local(sender.output),
            from_manifest(receive_program.manifest, receive_program.arrays),
            receiver.local(receiver.input or ""), sender.tile_base, receiver.tile_base,
            system.chip_tiles)
        if nbytes != h.nbytes:
            raise PackageError(f"{where}: the programs move {nbytes} bytes, the package "
                               f"says {h.nbytes}")
        if not same_transfers(derived, h.transfers):
            raise PackageError(f"{where}: the {'chips' if h.link else 'groups'}' programs "
                               "disagree with the package on its blocks or their order")
        if h.link:
            t = h.transfers
            priced.append(link_cycles(t.src, t.dst_offsets, t.dst, t.words, clock_hz))
    return priced


def tower_gemm_modes(groups: list[LoadedGroup]) -> dict[str, dict]:
    """Each group's GEMM modes keyed by the tower's operation ids."""
    modes: dict[str, dict] = {}
    for group in groups:
        source = group.spec.source_ops
        for op, mode in group.package.manifest.get("gemm_modes", {}).items():
            modes[str(source[int(op)]) if source else op] = mode
    return dict(sorted(modes.items(), key=lambda item: int(item[0])))


def renamed(put: Callable[[list], None], group: LoadedGroup) -> Callable[[list], None]:
    """Hand ``put`` (a host side's, or a chip worker's) a group's probe reads under the
    tower's names."""
    def forward(items: list) -> None:
        put([(group.tower(name), values) for name, values in items])
    return forward


def run_through(groups: list[LoadedGroup], inputs: Mapping[str, Any],
                on_probes: Callable[[list], None]
                ) -> tuple[dict[str, np.ndarray], list[CallReport]]:
    """One image through ``groups`` in order (one chip's).  Each group is fed from the one
    before; its probe reads go to ``on_probes`` under the tower's names as they arrive, and so
    does each hand-off between the groups, as soon as it is made (the verdict judges the next
    group's first stage on it while the device runs).  Returns the last group's output (tower
    names) and each group's run report, in order."""
    carried: dict[str, Any] = {}
    reports: list[CallReport] = []
    for position, group in enumerate(groups):
        # a group reads the one before's output, and the tower's inputs it reads itself
        available = {**inputs, **carried}
        feed = {name: available[group.tower(name)] for name in group.inputs}
        report = group.device.call("run", feed, on_probes=renamed(on_probes, group))
        carried = {group.tower(k): v for k, v in report.outputs.items()}
        if position < len(groups) - 1:
            on_probes(list(carried.items()))
        reports.append(report)
    return carried, reports


def chip_weight_names(package: Package, system: SystemProgram, chip: int) -> list[str]:
    """The tower's names of the weights the groups on ``chip`` load: all a worker that does
    not share the coordinator's memory needs."""
    specs = system.on_chip(chip)
    programs = group_programs(package, system, {g.program for g in specs})
    names: list[str] = []
    for spec in specs:
        tensors = programs[spec.program].manifest.get("tensors", {})
        names += [spec.tower(name) for name, info in tensors.items()
                  if info.get("role") in RESIDENT_ROLES]
    return names


__all__ = ["LoadedGroup", "check_handoffs", "check_tower", "chip_weight_names",
           "group_programs", "handoff_phase_cycles", "load_groups", "read_system", "renamed",
           "run_through", "tower_gemm_modes", "verify_handoffs"]
