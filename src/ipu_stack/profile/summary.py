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
    slowest tile of each superstep."""
    active = profile.active_tiles()
    if active.size == 0:
        return 0.0
    waiting = np.zeros(active.size, dtype=np.float64)
    for step in profile.supersteps:
        if step.tile_cycles is not None:
            waiting += step.cycles - step.tile_cycles[active]
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


def summary(profile: Profile) -> dict[str, Any]:
    """The figures the text summary and the report show."""
    cycles = max(profile.cycles, 1)
    longest = sorted(profile.supersteps, key=lambda s: -s.length)[:3]
    kernels: dict[str, int] = {}
    for step in profile.supersteps:
        for item in step.busiest_work:
            kernels[item["kernel"]] = kernels.get(item["kernel"], 0) + int(item["cycles"])
    exchanges = [{
        "name": s.name, "cycles": s.cycles, "horizon": s.exchange.get("horizon", 0),
        "lower_bound": s.exchange.get("lower_bound", 0),
        "ratio": s.exchange.get("horizon", 0) / max(s.exchange.get("lower_bound", 0), 1),
        "instruction_horizon": s.exchange.get("instruction_horizon", 0),
        "chunks": s.exchange.get("chunks", 0), "transfers": s.exchange.get("transfers", 0),
    } for s in profile.supersteps if s.kind == "exchange"]
    waiting = waiting_cycles(profile)
    return {
        "cycles": profile.cycles,
        "split": {
            "compute": profile.compute_cycles, "exchange": profile.exchange_cycles,
            "sync": profile.sync_cycles, "host (outside cycles)": profile.host_cycles,
            "mean tile waiting at syncs": round(waiting),
        },
        "shares": {"compute": profile.compute_cycles / cycles,
                   "exchange": profile.exchange_cycles / cycles,
                   "sync": profile.sync_cycles / cycles, "waiting": waiting / cycles},
        "longest": [{"name": s.name, "kind": s.kind, "cycles": s.length,
                     "share": s.length / cycles, "why": explain(s)} for s in longest],
        "kernels": [{"kernel": k, "cycles": v, "share": v / cycles}
                    for k, v in sorted(kernels.items(), key=lambda kv: (-kv[1], kv[0]))],
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
    lines.append("split: " + ", ".join(f"{k} {v}" for k, v in data["split"].items()))
    lines.append("longest supersteps:")
    for entry in data["longest"]:
        lines.append(f"  {entry['name']}: {entry['cycles']} cycles "
                     f"({100 * entry['share']:.1f} %) - {entry['why']}")
    lines.append("kernels by share of the critical path:")
    for entry in data["kernels"][:8]:
        lines.append(f"  {entry['kernel']}: {entry['cycles']} ({100 * entry['share']:.1f} %)")
    lines.append("exchange phases (horizon / lower bound):")
    for e in data["exchanges"]:
        lines.append(f"  {e['name']}: {e['horizon']} / {e['lower_bound']} = {e['ratio']:.3f}; "
                     f"{e['instruction_horizon']} as instructions, {e['chunks']} chunks")
    return "\n".join(lines)


def compare(a: Profile, b: Profile) -> list[dict[str, Any]]:
    """Supersteps by name in both runs, with the change from ``a`` to ``b``; steps only one
    run has show ``None`` for the other.  Unchanged steps are left out."""
    first = {s.name: s.length for s in a.supersteps}
    second = {s.name: s.length for s in b.supersteps}
    rows = []
    for name in list(first) + [n for n in second if n not in first]:
        x, y = first.get(name), second.get(name)
        if x == y:
            continue
        delta = (y or 0) - (x or 0)
        rows.append({"name": name, "a": x, "b": y, "delta": delta,
                     "percent": None if not x or y is None else 100 * delta / x})
    return sorted(rows, key=lambda r: -abs(r["delta"]))


def format_compare(a: Profile, b: Profile) -> str:
    """``ipu-stack profile A B``: the runs' totals and every superstep that changed."""
    rows = compare(a, b)
    lines = [f"A {a.workload}: {a.cycles} cycles; B {b.workload}: {b.cycles} cycles; "
             f"B - A = {b.cycles - a.cycles:+d} ({100 * (b.cycles - a.cycles) / max(a.cycles, 1):+.2f} %)",
             f"{len(rows)} supersteps differ:"]
    for r in rows:
        change = "only in B" if r["a"] is None else "only in A" if r["b"] is None else (
            f"{r['delta']:+d} ({r['percent']:+.1f} %) {'slower' if r['delta'] > 0 else 'faster'}")
        lines.append(f"  {r['name']}: {r['a']} -> {r['b']}  {change}")
    return "\n".join(lines)
