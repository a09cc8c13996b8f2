"""Tensors held in the precision they are stored in, decoded to float32 when read.

A whole tower's run holds every stage's value three ways: the host reference's, the device's
probe read, and the weights.  Held as float32 they would be 1.6 GB of weights and about
2.7 GB each of activations for SigLIP so400m (27 layers); held as their FP8 or F16 codes they
are a quarter or half of that.  Every value of the graph is exactly representable in its stored
precision (the reference and the device round to it), so keeping the codes loses nothing:
:class:`StoredTensor` decodes on every read (a table lookup; its time an element is in
docs/benchmarks.md, "The simulator and the verdict at BLAS speed").
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ipu_stack.ir import rounding
from ipu_stack.ir.graph import Graph
from ipu_stack.ir.precision import Precision


class StoredTensor:
    """A tensor as its storage codes; ``np.asarray(tensor)`` gives its float32 values."""

    __slots__ = ("precision", "stored")

    def __init__(self, precision: Precision, stored: np.ndarray) -> None:
        self.precision = precision
        self.stored = stored

    @staticmethod
    def of(values: np.ndarray, precision: Precision) -> StoredTensor:
        """Store ``values``, which must be exactly representable in ``precision``."""
        return StoredTensor(precision, precision.quantize(values))

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.stored.shape)

    @property
    def nbytes(self) -> int:
        return int(self.stored.nbytes)

    def values(self) -> np.ndarray:
        return self.precision.dequantize(self.stored)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        if dtype is not None and np.dtype(dtype) == np.float64 and self.precision.kind != "F32":
            # the float64 model's weights: decoded straight to float64, the same values
            return rounding.decode_float64(self.stored, self.precision.kind,
                                           self.precision.scale_exponent)
        values = self.values()
        return values if dtype is None else values.astype(dtype, copy=False)

    def __len__(self) -> int:
        return self.shape[0]


class CompactValues(MutableMapping):
    """Named values kept as :class:`StoredTensor`; reading one gives float32 values.

    Values that are not exactly representable in the precision they are given with are
    kept as float32, unchanged (nothing is ever rounded by being stored here)."""

    def __init__(self) -> None:
        self._held: dict[str, StoredTensor | np.ndarray] = {}
        self.nbytes = 0  # what the held values take, kept up to date

    def _keep(self, name: str, held: StoredTensor | np.ndarray) -> None:
        if name in self._held:
            del self[name]
        self._held[name] = held
        self.nbytes += int(held.nbytes)

    def put(self, name: str, values: np.ndarray, precision: Precision) -> None:
        self._keep(name, _compact(np.asarray(values, dtype=np.float32), precision))

    def hold(self, name: str, stored: StoredTensor | np.ndarray) -> None:
        """Keep an already stored tensor (or float32 values, F32's) as it is."""
        self._keep(name, stored)

    def held(self, name: str) -> StoredTensor | np.ndarray:
        """A value as it is kept (its storage codes, when it has them), not decoded: the
        verdict compares codes where it can, a quarter of the bytes of FP8's values."""
        return self._held[name]

    def __getitem__(self, name: str) -> np.ndarray:
        held = self._held[name]
        return held.values() if isinstance(held, StoredTensor) else held

    def __setitem__(self, name: str, values: np.ndarray) -> None:
        self._keep(name, np.asarray(values, dtype=np.float32))

    def __contains__(self, name: object) -> bool:
        return name in self._held  # without decoding (Mapping's default reads the value)

    def __delitem__(self, name: str) -> None:
        self.nbytes -= int(self._held.pop(name).nbytes)

    def __iter__(self) -> Iterator[str]:
        return iter(self._held)

    def __len__(self) -> int:
        return len(self._held)


def stored_round_trip(values: np.ndarray, precision: Precision
                      ) -> tuple[np.ndarray, StoredTensor | np.ndarray]:
    """``precision.round_trip(values)`` and what :meth:`CompactValues.put` would keep of it,
    from one encoding: the round trip's values are exactly representable by construction, so
    they need not be encoded, decoded and compared again to be kept as codes."""
    if precision.is_fp8:
        stored = StoredTensor(precision, precision.quantize(values))
        return stored.values(), stored
    rounded = precision.round_trip(values)
    if precision.kind == "F32":
        return rounded, rounded
    return rounded, StoredTensor(precision, precision.quantize(rounded))


def as_precision(data: Any, precision: Precision) -> np.ndarray:
    """``precision.round_trip(np.asarray(data))`` (float32): a tensor already stored in
    ``precision`` (a compacted weight) is its decoded codes as they are, since rounding an
    exactly representable value changes nothing; that saves an encode and a decode of every
    weight each time a reference or a stage rerun reads it."""
    if isinstance(data, StoredTensor) and data.precision == precision:
        return data.values()
    return precision.round_trip(np.asarray(data))


def _compact(values: np.ndarray, precision: Precision) -> StoredTensor | np.ndarray:
    if precision.kind == "F32":
        return values
    stored = StoredTensor.of(values, precision)
    decoded = stored.values()
    same = (decoded == values) | (np.isnan(decoded) & np.isnan(values))
    return stored if bool(same.all()) else values


def compact_weights(graph: Graph, tensors: MutableMapping[str, Any]) -> int:
    """Replace, in place, each weight of ``tensors`` that its precision represents exactly
    by its :class:`StoredTensor` (the float32 copies are freed when nothing else holds
    them); returns the bytes the stored forms take."""
    store = weight_storer(graph)
    held = 0
    for value in graph.by_role("weight"):
        data = tensors.get(value.name)
        if data is None:
            continue
        if not isinstance(data, StoredTensor):
            data = tensors[value.name] = store(value.name, data)
        held += int(data.nbytes)
    return held


def weight_storer(graph: Graph) -> Callable[[str, np.ndarray], Any]:
    """``store(name, value)`` for :meth:`DeferredTensors.make_all`: a weight as the
    :class:`StoredTensor` :func:`compact_weights` would make of it; anything else as is."""
    precisions = {v.name: v.type.precision for v in graph.by_role("weight")}

    def store(name: str, value: np.ndarray) -> Any:
        precision = precisions.get(name)
        if precision is None or isinstance(value, StoredTensor):
            return value
        return _compact(np.asarray(value, dtype=np.float32), precision)
    return store


class _Deferred:
    """A value not made yet: ``make()`` makes it."""

    __slots__ = ("make",)

    def __init__(self, make: Callable[[], np.ndarray]) -> None:
        self.make = make


class DeferredTensors(MutableMapping):
    """Host tensors whose weights are made when first read, not when the workload is built.

    A compile reads only the graph (the FP8 scales come from the calibration cache), never a
    weight's values: a 27-layer tower's 410 M weights took most of a warm compile to
    generate.  A run makes them all at once on every core (:meth:`make_all`) before it
    loads them; a single read makes just that one.  Values do not depend on when or in what
    order they are made (each weight has its own random stream), and the keys keep the
    order the workload gave them.
    """

    def __init__(self) -> None:
        self._items: dict[str, Any] = {}

    def defer(self, name: str, make: Callable[[], np.ndarray]) -> None:
        self._items[name] = _Deferred(make)

    def __getitem__(self, name: str) -> Any:
        value = self._items[name]
        if isinstance(value, _Deferred):
            value = self._items[name] = value.make()
        return value

    def __setitem__(self, name: str, value: Any) -> None:
        self._items[name] = value

    def then(self, name: str, change: Callable[[Any], Any]) -> None:
        """``change`` applied to a value when it is made (at once when it already is), so a
        rewrite of the graph's weights does not make them at compile time."""
        value = self._items[name]
        if isinstance(value, _Deferred):
            make = value.make
            self._items[name] = _Deferred(lambda: change(make()))
        else:
            self._items[name] = change(value)

    def __delitem__(self, name: str) -> None:
        del self._items[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    @property
    def pending(self) -> int:
        """How many values are still to be made."""
        return sum(isinstance(v, _Deferred) for v in self._items.values())

    def make_all(self, threads: int,
                 store: Callable[[str, np.ndarray], Any] | None = None,
                 only: Collection[str] | None = None) -> int:
        """Make every pending value on ``threads`` worker threads (numpy's generator and
        ufuncs release the GIL); how many were made.  ``store(name, value)``, when given,
        turns each value into what is kept (its storage codes) as soon as it is made, so at
        most one float32 copy a thread is alive: a giant tower's float32 weights (7.5 GB for
        pe-giant) never exist at once.  ``only``: just those names (a chip's worker makes
        its own chip's weights)."""
        pending = [(name, value.make) for name, value in self._items.items()
                   if isinstance(value, _Deferred) and (only is None or name in only)]
        if not pending:
            return 0

        def make(item: tuple[str, Callable[[], np.ndarray]]) -> Any:
            value = item[1]()
            return value if store is None else store(item[0], value)

        pool = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="weights")
        try:
            made = list(pool.map(make, pending))
        finally:  # interrupted (Ctrl-C, SIGTERM): the values not started are not made
            pool.shutdown(wait=True, cancel_futures=True)
        for (name, _), value in zip(pending, made, strict=True):
            self._items[name] = value
        return len(pending)


def reorder_columns(tensors: MutableMapping[str, Any], name: str, order: np.ndarray) -> None:
    """Tensor ``name``'s last axis reordered in place in ``tensors`` (column ``j`` becomes
    old column ``order[j]``), as it is held: storage codes stay codes, a weight not made yet
    is reordered when it is made."""
    def reorder(value: Any) -> Any:
        if isinstance(value, StoredTensor):
            return StoredTensor(value.precision, np.ascontiguousarray(value.stored[..., order]))
        return np.ascontiguousarray(np.asarray(value)[..., order])

    if isinstance(tensors, DeferredTensors):
        tensors.then(name, reorder)
    elif isinstance(tensors, CompactValues):
        tensors.hold(name, reorder(tensors.held(name)))
    else:
        tensors[name] = reorder(tensors[name])
