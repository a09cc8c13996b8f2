"""The ipu21 (and ipu2) machine descriptions.

Each :class:`Fact` carries its value and its source, so ``ipu-stack inspect --target`` and the
docs can print where every number comes from.  Values marked ``assumed`` have no primary source.
What work costs (kernels, exchange phases, syncs, the host link) is in ``target.timing``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from ipu_stack.util.errors import UsageError


@dataclass(frozen=True)
class Fact:
    """One machine number and where it comes from."""

    value: int | float
    source: str


class MemoryClass(str, Enum):
    """Tile memory classes as the reference names them."""

    STANDARD = "Ipu21Standard"
    INTERLEAVED = "Ipu21Interleaved"


@dataclass(frozen=True)
class Target:
    """A tile machine: sizes, rates and overheads, each with its source."""

    name: str
    facts: dict[str, Fact] = field(repr=False)

    def __getattr__(self, key: str) -> int | float:
        facts = object.__getattribute__(self, "facts")
        if key in facts:
            return facts[key].value
        raise AttributeError(key)

    def __hash__(self) -> int:
        return hash(self.name)

    # Convenience accessors with precise types -------------------------------------------
    @property
    def tiles(self) -> int:
        return int(self.facts["tiles"].value)

    @property
    def memory_base(self) -> int:
        return int(self.facts["memory_base"].value)

    @property
    def tile_bytes(self) -> int:
        return int(self.facts["tile_bytes"].value)

    @property
    def memory_end(self) -> int:
        """One past the highest usable tile address."""
        return int(self.facts["memory_end"].value)

    @property
    def interleaved_base(self) -> int:
        return int(self.facts["interleaved_base"].value)

    @property
    def workers(self) -> int:
        return int(self.facts["workers"].value)

    @property
    def clock_hz(self) -> float:
        return float(self.facts["clock_hz"].value)

    def alignment(self, memory_class: MemoryClass) -> int:
        key = "interleaved_alignment" if memory_class is MemoryClass.INTERLEAVED else "standard_alignment"
        return int(self.facts[key].value)

    def class_range(self, memory_class: MemoryClass) -> tuple[int, int]:
        """Addresses a value of ``memory_class`` may occupy: ``[start, end)``."""
        if memory_class is MemoryClass.INTERLEAVED:
            return self.interleaved_base, self.memory_end
        return self.memory_base, self.memory_end

    def peak_flops(self) -> float:
        """Peak FP16 FLOP/s: tiles x clock x 2 x FP16 MACs per cycle."""
        return self.tiles * self.clock_hz * 2 * float(self.facts["amp_f16_macs_per_cycle"].value)

    def cycles_to_us(self, cycles: int) -> float:
        return cycles / (self.clock_hz / 1e6)

    def with_tiles(self, tiles: int) -> Target:
        """The machine seen by a program that owns only ``tiles`` of its tiles (a pipeline
        group): every other fact is the chip's.  The exchange model prices a phase by its
        transfers' tiles and words, never by where the tiles sit, so a group's program
        costs the same at any tile offset."""
        if not 1 <= tiles <= self.tiles:
            raise UsageError(f"a tile group of {tiles} tiles does not fit {self.name}'s "
                             f"{self.tiles}")
        if tiles == self.tiles:
            return self
        facts = dict(self.facts)
        facts["tiles"] = Fact(tiles, f"a group of {tiles} of the chip's {self.tiles} tiles")
        return Target(self.name, facts)


_LOG004 = "reference log 004"

_IPU21_FACTS: dict[str, Fact] = {
    "tiles": Fact(1472, "reference logs (tile_count=1472); GC200/C600 datasheets"),
    "clock_hz": Fact(1.5e9, f"{_LOG004}: 204006 cycles = 136.004 us"),
    "workers": Fact(6, "Graphcore assembly programming guide; PopLibs numWorkerContexts"),
    "amp_f16_macs_per_cycle": Fact(
        64, "peak 282.624 TFLOPS = 1472 x 1.5e9 x 128 (log 004); PopLibs maxMACsPerCyclePerTile"
    ),
    "amp_f8_macs_per_cycle": Fact(128, "C600: 560 TFLOPS FP8; PopLibs quarter vertex types"),
    "tile_bytes": Fact(638976, "624 KiB: 900 MB per chip / 1472"),
    "memory_base": Fact(0x4C000, "assumed (unverified third-party linker note)"),
    "memory_end": Fact(949168, "reference logs: tile addresses run to 949168"),
    "interleaved_base": Fact(0x80000, "reference logs (Ipu21Interleaved >= 524288); Poplar IPUModel docs"),
    "standard_alignment": Fact(8, "reference log 000 (alignment 8)"),
    "interleaved_alignment": Fact(32, "reference log 000 (alignment 32)"),
    "runtime_support_bytes": Fact(
        7688, f"{_LOG004}: linked_end=318984 - memory_base 311296 = 7688 bytes of runtime"
    ),
    "exchange_bytes_per_cycle": Fact(
        4, "PopLibs exchangeBytesPerCycle; reference endpoint_lower_bound in words"
    ),
    "tiles_per_shared_exchange_bus": Fact(
        2, "PopLibs getTilesPerSharedExchangeBus() == 2 and supportsSuperTileSendReceive: a "
        "tile pair sends 64 bits per cycle and both tiles of a pair take 64 bits per cycle "
        "of data both receive. Hardware evidence: the reference's production width selection "
        "pairs every eligible multicast, and its hardware replays of whole QKV, MLP-up and "
        "MAP-KV phases pass with them paired, their scheduled horizons 10 772 -> 8 501, "
        "15 854 -> 13 276 and 13 499 -> 9 229 (reference notes, \"Paired sender lane "
        "reservation\"; SDK 3.4.0 programs with four paired 352-word multicasts pass on C600 "
        "hardware). On by default (`--no-paired-exchange` turns it off)"
    ),
    "exchange_table_bytes_per_send": Fact(
        8, "reference (decoded vendor exchange programs): a send (sendpicp) is a two-word "
        "instruction; a receiver's mux switch is counted at the same size (assumed)"
    ),
    "host_link_bytes_per_second": Fact(32e9, "C600 datasheet: PCIe Gen4 x16, 32 GB/s"),
}

IPU21 = Target("ipu21", _IPU21_FACTS)
IPU2 = Target(
    "ipu2",
    {
        **_IPU21_FACTS,
        "clock_hz": Fact(1.33e9, "GC200 datasheet: 250 TFLOPS FP16 / (1472 x 128)"),
        "amp_f8_macs_per_cycle": Fact(64, "GC200 has no FP8 AMP: FP8 runs at the FP16 rate"),
    },
)

_TARGETS = {t.name: t for t in (IPU21, IPU2)}


def get_target(name: str) -> Target:
    """Look a target up by name, with a one-line error naming the known ones."""
    try:
        return _TARGETS[name]
    except KeyError:
        raise UsageError(f"unknown target {name!r}; known targets: {', '.join(_TARGETS)}") from None

