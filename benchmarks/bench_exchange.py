"""Benchmark the exchange scheduler and verifier on the synthetic plan families.

Usage: ``python benchmarks/bench_exchange.py [--quick] [--paired] [--families a,b]
[--sizes n,m]``.  Prints one row per (family, size): bound, horizon, ratio, chunks per
transfer, the largest per-tile exchange-table size the chunks imply (8 bytes per chunk on
the source and on every destination), the strategy and the schedule and verify times; then
aggregate lines (sum of horizons over sum of lower bounds), overall and for unicast and
multicast families separately, since the targets differ (1.05 and 1.15).  ``--paired``
schedules under the paired-tiles option (bounds are then the paired bounds).
"""

from __future__ import annotations

import argparse
import time

from ipu_stack.exchange import schedule_exchange, table_bytes, verify_schedule
from ipu_stack.exchange.families import FAMILIES

SIZES = [1_000, 10_000, 100_000, 454_896]
QUICK_SIZES = [1_000, 5_000]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes only")
    parser.add_argument("--families", default=",".join(FAMILIES), help="comma-separated names")
    parser.add_argument("--sizes", default="", help="comma-separated transfer counts")
    parser.add_argument("--paired", action="store_true", help="paired-tiles option")
    args = parser.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")] if args.sizes else (QUICK_SIZES if args.quick else SIZES)
    header = (
        f"{'family':<17} {'transfers':>9} {'bound':>7} {'horizon':>7} {'ratio':>6} "
        f"{'chunks/t':>8} {'table_kb':>8} {'kind':<24} {'sched_s':>7} {'verify_s':>8}"
    )
    print(header)
    totals = {"unicast": [0, 0], "multicast": [0, 0]}
    families: dict[str, list[int]] = {}
    for name in args.families.split(","):
        gen = FAMILIES[name]
        for n in sizes:
            t = gen(n)
            began = time.perf_counter()
            s = schedule_exchange(t, paired=args.paired)
            mid = time.perf_counter()
            verify_schedule(t, s)
            done = time.perf_counter()
            group = totals["unicast" if t.is_unicast() else "multicast"]
            group[0] += s.horizon
            group[1] += s.lower_bound
            family = families.setdefault(name, [0, 0])
            family[0] += s.horizon
            family[1] += s.lower_bound
            print(
                f"{name:<17} {t.count:>9} {s.lower_bound:>7} {s.horizon:>7} {s.ratio:>6.3f} "
                f"{s.chunks / max(t.count, 1):>8.3f} {table_bytes(s, t).max() / 1024:>8.1f} "
                f"{s.kind:<24} {mid - began:>7.2f} "
                f"{done - mid:>8.2f}",
                flush=True,
            )
    for label, (h, lb) in {**families, **totals}.items():
        if lb:
            print(f"aggregate {label} horizon/lower_bound = {h}/{lb} = {h / lb:.4f}")
    h = sum(v[0] for v in totals.values())
    lb = sum(v[1] for v in totals.values())
    print(f"aggregate horizon/lower_bound = {h}/{lb} = {h / max(lb, 1):.4f}")


if __name__ == "__main__":
    main()
