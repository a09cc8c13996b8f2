"""Operand checks: every kernel access and every transfer must lie inside a live allocation.

The package carries the compiler's allocation map (tile, address, bytes, lifetime in steps).
Before running, the device checks each compute call's exact regions and each exchange
transfer's source and destination words against the allocations live at that step on that
tile.  An access that strays outside its placed operands (a wrong address, an overlap with
another value, a use after the value died) is a fault naming tile, address and step, not a
wrong number found later.
"""

from __future__ import annotations

import numpy as np

from ipu_stack.kernels.base import KernelInstance
from ipu_stack.util.errors import DeviceFault, PackageError

SHIFT = np.int64(1 << 32)


class AllocationMap:
    """Allocations as arrays; ``check`` answers for a batch of byte ranges at one step."""

    def __init__(self, arrays: dict[str, np.ndarray], names: dict[str, str], tiles: int) -> None:
        try:
            self.tile = arrays[names["tile"]].astype(np.int64)
            self.address = arrays[names["address"]].astype(np.int64)
            self.bytes = arrays[names["bytes"]].astype(np.int64)
            self.first = arrays[names["first"]].astype(np.int64)
            self.last = arrays[names["last"]].astype(np.int64)
        except (KeyError, TypeError) as exc:
            raise PackageError(f"package allocation map is malformed: {exc!r}") from None
        n = len(self.tile)
        if any(len(a) != n for a in (self.address, self.bytes, self.first, self.last)):
            raise PackageError("package allocation map arrays differ in length")
        if n and (self.tile.min() < 0 or self.tile.max() >= tiles):
            raise PackageError("package allocation map names a tile that does not exist")

        # allocations live to the end (weights) are sorted once, the others per step
        # checked: a tower's per-layer weights are most of the map
        always = self.last == (self.last.max() if n else 0)
        self.always = always
        self.static = self._sorted(always)
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
              what: str) -> None:
        """Fault unless each ``[lo, hi)`` on ``tile`` lies in one allocation live at ``step``."""
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
            raise DeviceFault(
                f"{what} on tile {int(tile[k])} touches [{int(lo[k])}, {int(hi[k])}) at step "
                f"{step}, outside every operand placed there"
            )


def check_call(amap: AllocationMap, step: int, name: str, kernel: KernelInstance,
               tiles: np.ndarray, addresses: np.ndarray) -> None:
    for region in kernel.impl.regions(kernel.params):
        if region.rows * region.row_bytes == 0:
            continue
        lo = addresses[:, region.operand] + region.offset
        hi = lo + (region.rows - 1) * region.pitch + region.row_bytes
        amap.check(step, tiles, lo, hi, f"kernel {kernel.name} in {name}")
