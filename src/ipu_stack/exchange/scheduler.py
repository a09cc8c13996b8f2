"""Strategy selection, schedule reuse and the reference log lines for one exchange phase.

Unicast phases go to the exact scheduler (``full-duplex``: every port sends and receives at
once, finishing at the endpoint bound).  Multicast phases whose destinations fall into
replica groups (the common case in compiled plans) reduce to unicast over one virtual
receiver per group (``groups.py``) and meet the bound when some member of each group
receives all of the group's words.  Other multicast phases are scheduled by rounds of global
rematching (``multicast.py``) with two priorities (``compact-streams``,
``balanced-compact-streams``); the shorter wins and the count of candidates that beat the
first is logged as ``neighborhood_improvements``.  With the paired-tiles option, a ``paired``
candidate (two-lane chunks, ``paired.py``) is compared with the best ordinary schedule,
both against the paired lower bound.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ipu_stack.exchange.groups import group_reduction, layers, subset
from ipu_stack.exchange.instructions import instruction_horizon
from ipu_stack.exchange.model import (
    PAIR_LANES,
    Schedule,
    Transfers,
    chunk_cycles,
    endpoint_lower_bound,
    pair_eligible,
    paired_lower_bound,
)
from ipu_stack.exchange.multicast import schedule_multicast
from ipu_stack.exchange.paired import chunk_words, pair_level, schedule_paired
from ipu_stack.exchange.unicast import schedule_unicast
from ipu_stack.util.log import event

logger = logging.getLogger("ipu_stack.exchange")

LARGE_PHASE = 1000
SECOND_PRIORITY_LIMIT = 200_000  # try the second multicast priority only below this many transfers
COMPACT_BALANCE = 0.3  # weight of the summed port loads in the plain priority (1.0: balanced)
CHUNK_BUDGET = 2  # chunks per transfer beyond which a single-chunk schedule is also tried
NO_ROUNDS = 2**40  # a round length no phase reaches: plain list scheduling, one chunk each


def _level(t: Transfers) -> int:
    return logging.INFO if t.count >= LARGE_PHASE else logging.DEBUG


def _grouped(t: Transfers, bound: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Chunks via the replica-group reduction, exact at ``t``'s own bound (computed unless
    given), or None when some group has no member that receives all of it (the reduction
    would lose)."""
    grouped = group_reduction(t)
    bound = endpoint_lower_bound(t) if bound is None else bound
    if grouped is None or endpoint_lower_bound(grouped) > bound:
        return None
    transfer, start, words, _ = schedule_unicast(grouped, bound)
    return transfer, start, words


def _layered(
    t: Transfers, split: list[np.ndarray] | None, paired: bool = False
) -> tuple[np.ndarray, ...] | None:
    """Layers of non-overlapping replica groups (``split``, from ``layers``), each reduced,
    run one after another: chunks ``(transfer, start, words, lanes)``, lanes None unless
    ``paired``.  With ``paired``, a layer whose transfers are all eligible runs on the pair
    machine instead; on a GEMM grid whose row groups are pair-aligned and column groups are
    not, every tile receives one group per layer, so the paired bound is the sum over layers
    and this meets it up to rounding."""
    if split is None or len(split) < 2:
        return None
    parts: list[tuple[np.ndarray, ...]] = []
    offset = 0
    for rows in split:
        part = subset(t, rows)
        if paired and pair_eligible(part).all():
            transfer, start, words, lanes = _on_pair_machine(part)
        else:
            chunks = _grouped(part)
            if chunks is None:
                return None
            transfer, start, words = chunks
            lanes = np.ones(transfer.size, dtype=np.int64)
        parts.append((rows[transfer], start + offset, words, lanes))
        offset += int((start + chunk_cycles(words, lanes)).max())
    transfer, start, words, lanes = (np.concatenate(c) for c in zip(*parts, strict=True))
    return transfer, start, words, (lanes if paired else None)


def _candidates(t: Transfers, bound: int) -> list[Schedule]:
    if t.is_unicast():
        transfer, start, words, _ = schedule_unicast(t, bound)
        return [Schedule.from_chunks(bound, "full-duplex", transfer, start, words)]
    out: list[Schedule] = []
    for make in (lambda: _grouped(t, bound), lambda: _layered(t, layers(t))):
        chunks = make()
        if chunks is not None:
            out.append(Schedule.from_chunks(bound, "compact-streams", *chunks))
            if out[-1].horizon <= bound:
                return out[-1:]  # at the bound: nothing can beat it
    priorities = [("compact-streams", COMPACT_BALANCE), ("balanced-compact-streams", 1.0)]
    if t.count > SECOND_PRIORITY_LIMIT:
        priorities = priorities[1:]
    # the kernel releases the GIL, so the two priorities run on two cores at once
    with ThreadPoolExecutor(max_workers=len(priorities)) as pool:
        runs = list(pool.map(lambda p: schedule_multicast(t, p[1]), priorities))
    out += [Schedule.from_chunks(bound, kind, *chunks)
            for (kind, _), chunks in zip(priorities, runs, strict=True)]
    if min(s.chunks for s in out) > CHUNK_BUDGET * t.count:
        # rounds cut too often: one chunk per transfer (no rematching) keeps tables small
        chunks = schedule_multicast(t, 1.0, round_cycles=NO_ROUNDS)
        out.append(Schedule.from_chunks(bound, "compact-streams", *chunks))
    return out


def _on_pair_machine(t: Transfers) -> tuple[np.ndarray, ...]:
    """Two-lane chunks ``(transfer, start, words, lanes)`` for a phase whose transfers are all
    eligible: scheduled on the pair machine by the ordinary strategies and mapped back."""
    pairs = pair_level(t)
    best = min(_candidates(pairs, endpoint_lower_bound(pairs)), key=lambda s: (s.horizon, s.chunks))
    lanes = np.full(t.count, PAIR_LANES, dtype=np.int64)
    return chunk_words(best.chunk_transfer, best.chunk_start, best.chunk_words, lanes,
                       t.words.astype(np.int64))


def _paired_candidate(t: Transfers, bound: int, eligible: np.ndarray) -> Schedule:
    """Transfers to whole tile pairs (``eligible``) in two lanes, the rest in one.

    Exact strategies first: a phase whose transfers are all eligible runs on the pair
    machine; one that splits into replica layers runs each layer exactly.  The rounds
    kernel (both kinds of transfer as tasks) is tried too below 200 000 transfers, or when
    neither exact strategy applies; the shorter wins."""
    found: list[Schedule] = []
    exact = _on_pair_machine(t) if eligible.all() else _layered(t, layers(t), paired=True)
    if exact is not None:
        found.append(Schedule.from_chunks(bound, "paired", *exact))
    if not found or t.count <= SECOND_PRIORITY_LIMIT:
        # (the pair machine reserves a source's own receive port; the rounds kernel does not)
        found.append(Schedule.from_chunks(bound, "paired", *schedule_paired(t, eligible=eligible)))
    return min(found, key=lambda s: (s.horizon, s.chunks))


def schedule_exchange(t: Transfers, *, phase: int | None = None, paired: bool = False) -> Schedule:
    """Schedule one phase (validated first); the result always passes ``verify_schedule``."""
    t.validate()
    bound = endpoint_lower_bound(t)
    level = _level(t)
    if phase is not None and t.count >= LARGE_PHASE:
        event(
            logger,
            "prepared large physical exchange phase",
            level,
            phase=phase,
            transfers=t.count,
            maximum_identical_destinations=int(t.fanout.max()),
        )
    candidates = _candidates(t, bound)
    initial = candidates[0]
    best = min(candidates, key=lambda s: (s.horizon, s.chunks))
    improvements = sum(1 for s in candidates[1:] if s.horizon < initial.horizon)
    if paired:
        # the paired model has its own (lower) bound; ordinary schedules stay valid in it
        eligible = pair_eligible(t)  # once: the bound and the candidate both need it
        bound = paired_lower_bound(t, eligible)
        best = best.as_paired(bound)
        paired_best = _paired_candidate(t, bound, eligible) if eligible.any() else None
        use_paired = paired_best is not None and paired_best.horizon < best.horizon
        if phase is not None:
            event(
                logger,
                "compared ordinary and paired exchange schedules",
                level,
                phase=phase,
                candidates=len(candidates) + (paired_best is not None),
                eligible_transfers=int(eligible.sum()),
                ordinary_horizon=best.horizon,
                paired_horizon=best.horizon if paired_best is None else paired_best.horizon,
                use_paired=use_paired,
            )
        if use_paired and paired_best is not None:
            best = paired_best
    if phase is not None:
        event(
            logger,
            "optimized physical exchange schedule",
            level,
            phase=phase,
            initial_horizon=initial.horizon,
            selected_horizon=best.horizon,
            instruction_horizon=instruction_horizon(best, t)[0],
            endpoint_lower_bound=bound,
            lower_bound_gap=best.horizon - bound,
            selected_kind=best.kind,
            neighborhood_improvements=improvements,
        )
    return best


def _same_shape(a: Transfers, b: Transfers) -> bool:
    """Same transfers in the same order: source, destination set and words (addresses may
    differ, and destinations may be listed in another order)."""
    if a.tiles != b.tiles or a.count != b.count:
        return False
    if not (np.array_equal(a.src, b.src) and np.array_equal(a.words, b.words)):
        return False
    if not np.array_equal(a.dst_offsets, b.dst_offsets):
        return False
    owner = a.dst_transfer()
    return bool(np.array_equal(a.dst[np.lexsort((a.dst, owner))], b.dst[np.lexsort((b.dst, owner))]))


def reuse_schedule(
    old_t: Transfers, old_s: Schedule, new_t: Transfers, *, phase: int | None = None
) -> Schedule | None:
    """Reuse ``old_s`` for relocated rows: same transfers, only addresses changed.

    Port occupancy depends only on (source, destination set, words) per transfer, so when
    those match the old schedule is valid as it stands and rescheduling would be wasted work.
    """
    if not _same_shape(old_t, new_t):
        return None
    if phase is not None:
        event(
            logger,
            "reused exchange optimization after validating relocated rows",
            _level(new_t),
            phase=phase,
        )
    return old_s.with_kind("reused")
