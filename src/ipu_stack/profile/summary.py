"""What a profile says: where the cycles go, what limits the run, and how two runs differ.

Shared by ``ipu-stack profile`` (text) and ``report.html``: the split of the cycles into
compute, exchange and sync (and the host link beside them), the time tiles spend waiting at
syncs, the longest supersteps and why, the kernels ranked by their share of the critical path
(the busiest tile of every compute superstep), and the exchange phases against their lower
bounds.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ipu_stack.profile.record import Profile, Step
from ipu_stack.target.timing import p


def waiting_cycles(profile: Profile) -> float:
    """Mean, over the tiles that did anything, of the cycles spent waiting at syncs for the
    slowest tile of each superstep (a tile's own count capped at its superstep's length)."""
    active = profile.active_tiles()
    if active.size == 0:
        return 0.0
    waiting = np.zeros(active.size, dtype=np.float64)
    for step in profile.supersteps:
        if step.tile_cycles is not None:
            waiting += step.cycles - np.minimum(step.tile_cycles[active], step.cycles)
    return float(waiting.mean())


def explain(step: Step) -> str:
    """Why a superstep takes as long as it does, from what its critical tile did."""
    if step.kind == "exchange":
        e = step.exchange
        bound = max(int(e.get("lower_bound", 0)), 1)
        return (f"exchange: {e.get('transfers', 0)} transfers, busiest tile moves "
                f"{max(e.get('send_words_max', 0), e.get('recv_words_max', 0))} words; "
                f"horizon {e.get('horizon', 0)} = {e.get('horizon', 0) / bound:.3f}x the "
                f"lower bound, {e.get('instruction_horizon', 0)} as instructions")
    parts = []
    by_kernel: dict[str, int] = {}
    for item in step.busiest_work:
        by_kernel[item["kernel"]] = by_kernel.get(item["kernel"], 0) + int(item["cycles"])
    for item in step.busiest_work:
        counts = item.get("counts", {})
        if item["kind"] == "amp":
            multiply = p("amp_row") * int(counts.get("rows", 0)) * int(counts.get("passes", 0))
            parts.append(f"AMP {counts.get('passes')} passes x {counts.get('rows')} rows: "
                         f"{multiply} of {item['cycles']} cycles multiply "
                         f"({100 * multiply / max(int(item['cycles']), 1):.0f} %), the rest "
                         "weight loads, worker syncs and launches")
            break
    top = max(by_kernel.items(), key=lambda kv: kv[1], default=("-", 0))
    parts.append(f"tile {step.busiest_tile} runs {top[0]} for {top[1]} cycles")
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(step.by_kind.items(), key=lambda kv: -kv[1]))
    return f"compute ({kinds}): " + "; ".join(parts)


def _kernel_rows(profile: Profile) -> list[dict[str, Any]]:
    """Kernels by their cycles on the busiest tile of each compute superstep, each with the
    model parts it ran for there (the three largest shares first)."""
    kernels: dict[str, dict[str, int]] = {}
    for step in profile.supersteps:
        for item in step.busiest_work:
            where = kernels.setdefault(item["kernel"], {})
            where[step.label] = where.get(step.label, 0) + int(item["cycles"])
    rows = [{"kernel": k, "cycles": sum(w.values()), "share": sum(w.values()) / max(profile.cycles, 1),
             "parts": [label for label, _ in sorted(w.items(), key=lambda kv: -kv[1])[:3]],
             "part_count": len(w)} for k, w in kernels.items()]
    return sorted(rows, key=lambda r: (-r["cycles"], r["kernel"]))


def summary(profile: Profile) -> dict[str, Any]:
    """The figures the text summary and the report show: the run's cycles split into
    compute, exchange and sync (shares of the run, summing to 100 %); host transfers apart
    (outside the run's cycles); supersteps numbered as ``Profile.superstep_numbers``."""
    cycles = max(profile.cycles, 1)
    numbers = profile.superstep_numbers()
    longest = sorted(profile.supersteps, key=lambda s: -s.length)[:3]
    exchanges = [{
        "number": numbers[id(s)], "name": s.name, "label": s.label, "cycles": s.cycles,
        "horizon": s.exchange.get("horizon", 0), "lower_bound": s.exchange.get("lower_bound", 0),
        "ratio": s.exchange.get("horizon", 0) / max(s.exchange.get("lower_bound", 0), 1),
        "instruction_horizon": s.exchange.get("instruction_horizon", 0),
        "chunks": s.exchange.get("chunks", 0), "transfers": s.exchange.get("transfers", 0),
    } for s in profile.supersteps if s.kind == "exchange"]
    waiting = waiting_cycles(profile)
    return {
        "cycles": profile.cycles,
        "split": {"compute": profile.compute_cycles, "exchange": profile.exchange_cycles,
                  "sync": profile.sync_cycles},
        "shares": {"compute": profile.compute_cycles / cycles,
                   "exchange": profile.exchange_cycles / cycles,
                   "sync": profile.sync_cycles / cycles, "waiting": waiting / cycles},
        "waiting": round(waiting),
        "host": {"cycles": profile.host_cycles, "bytes": profile.host_bytes,
                 "microseconds": profile.host_cycles / profile.clock_hz * 1e6
                 if profile.clock_hz > 0 else 0.0},
        "longest": [{"number": numbers[id(s)], "name": s.name, "label": s.label,
                     "kind": s.kind, "cycles": s.length, "share": s.length / cycles,
                     "why": explain(s)} for s in longest],
        "kernels": _kernel_rows(profile),
        "exchanges": exchanges,
        "active_tiles": int(profile.active_tiles().size),
        "figures": profile.figures,
    }


def format_summary(profile: Profile) -> str:
    """The summary as text (``ipu-stack profile PROFILE``)."""
    data = summary(profile)
    cycles = data["cycles"]
    lines = [f"profile {profile.workload}: {cycles} cycles "
             f"({cycles / profile.clock_hz * 1e6:.3f} us at {profile.clock_hz / 1e9:g} GHz), "
             f"{len(profile.supersteps)} supersteps, {data['active_tiles']} active tiles"]
    figures = data["figures"]
    if "efficiencyPercent" in figures:
        lines.append(f"efficiency {figures['efficiencyPercent']} % of the FP16 peak; "
                     f"estimated {figures.get('estimatedCycles')} cycles")
    lines.append("split: " + ", ".join(f"{k} {v} ({100 * v / max(cycles, 1):.1f} %)"
                                       for k, v in data["split"].items())
                 + f"; tiles wait at syncs {data['waiting']} cycles on average")
    host = data["host"]
    if host["cycles"]:
        lines.append(f"host transfers, outside the run: {host['cycles']} cycles "
                     f"({host['microseconds']:.3f} us) for {host['bytes']} bytes")
    lines.append("longest supersteps:")
    for entry in data["longest"]:
        lines.append(f"  #{entry['number']} {entry['label']} ({entry['name']}): "
                     f"{entry['cycles']} cycles ({100 * entry['share']:.1f} %) - {entry['why']}")
    lines.append("kernels by share of the critical path:")
    for entry in data["kernels"][:8]:
        lines.append(f"  {entry['kernel']}: {entry['cycles']} ({100 * entry['share']:.1f} %) "
                     f"in {', '.join(entry['parts'])}"
                     + (f" and {entry['part_count'] - 3} more" if entry["part_count"] > 3 else ""))
    lines.append("exchange phases (horizon / lower bound):")
    for e in data["exchanges"]:
        lines.append(f"  #{e['number']} {e['label']}: {e['horizon']} / {e['lower_bound']} = "
                     f"{e['ratio']:.3f}; {e['instruction_horizon']} as instructions, "
                     f"{e['chunks']} chunks")
    return "\n".join(lines)


def _by_step(profile: Profile) -> dict[tuple[str, str, int], Any]:
    """A run's supersteps keyed by name, kind and which of that name and kind it is: a
    GEMM's reduce is an exchange phase and a compute set of one name, and a layer loop
    runs its steps once a pass."""
    seen: dict[tuple[str, str], int] = {}
    out = {}
    for step in profile.supersteps:
        count = seen[(step.name, step.kind)] = seen.get((step.name, step.kind), 0) + 1
        out[(step.name, step.kind, count)] = step
    return out


def compare(a: Profile, b: Profile) -> list[dict[str, Any]]:
    """Supersteps of both runs (by name, kind and pass), with the change from ``a`` to
    ``b``; steps only one run has show ``None`` for the other.  Unchanged steps are left
    out, so the rows' changes (syncs included) add up to the runs' difference."""
    first, second = _by_step(a), _by_step(b)
    rows = []
    for key in list(first) + [k for k in second if k not in first]:
        x = first[key].length if key in first else None
        y = second[key].length if key in second else None
        if x == y:
            continue
        delta = (y or 0) - (x or 0)
        name, kind, count = key
        label = (first.get(key) or second[key]).label
        rows.append({"name": f"{name} [{kind}{f' {count}' if count > 1 else ''}]",
                     "label": label, "a": x, "b": y, "delta": delta,
                     "percent": None if not x or y is None else 100 * delta / x})
    return sorted(rows, key=lambda r: -abs(r["delta"]))


def format_compare(a: Profile, b: Profile) -> str:
    """``ipu-stack profile A B``: the runs' totals and every superstep that changed."""
    rows = compare(a, b)
    lines = [f"A {a.workload}: {a.cycles} cycles; B {b.workload}: {b.cycles} cycles; "
             f"B - A = {b.cycles - a.cycles:+d} ({100 * (b.cycles - a.cycles) / max(a.cycles, 1):+.2f} %)",
             f"{len(rows)} supersteps differ" + (":" if rows else "")]
    for r in rows:
        change = "only in B" if r["a"] is None else "only in A" if r["b"] is None else (
            f"{r['delta']:+d} ({r['percent']:+.1f} %) {'slower' if r['delta'] > 0 else 'faster'}")
        part = f" ({r['label']})" if r["label"] != r["name"] else ""
        cycles = (f"{r['a']} cycles" if r["b"] is None else f"{r['b']} cycles"
                  if r["a"] is None else f"{r['a']} -> {r['b']}")
        lines.append(f"  {r['name']}{part}: {cycles}  {change}")
    return "\n".join(lines)
