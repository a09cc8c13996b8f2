"""Benchmark the exchange scheduler and verifier on the synthetic plan families.

Usage: ``PYTHONPATH=src python benchmarks/bench_exchange.py [--quick]``.  Prints one row per
(family, size) and an aggregate line (sum of horizons over sum of lower bounds).  Multicast
families stop at a smaller size because the list scheduler is event-driven (see
docs/exchange.md).
"""

from __future__ import annotations

import argparse
import time

from ipu_stack.exchange import schedule_exchange, verify_schedule
from ipu_stack.exchange.families import FAMILIES

UNICAST_SIZES = [1_000, 10_000, 100_000, 454_896]
MULTICAST_SIZES = [1_000, 10_000]
QUICK_SIZES = [1_000, 5_000]
MULTICAST = {"gemm-broadcast", "random-multicast"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes only")
    args = parser.parse_args()
    header = (
        f"{'family':<17} {'transfers':>9} {'bound':>7} {'horizon':>7} {'ratio':>6} "
        f"{'chunks/t':>8} {'kind':<24} {'sched_s':>7} {'verify_s':>8}"
    )
    print(header)
    total_h = total_l = 0
    for name, gen in FAMILIES.items():
        sizes = QUICK_SIZES if args.quick else (MULTICAST_SIZES if name in MULTICAST else UNICAST_SIZES)
        for n in sizes:
            t = gen(n)
            began = time.perf_counter()
            s = schedule_exchange(t)
            mid = time.perf_counter()
            verify_schedule(t, s)
            done = time.perf_counter()
            total_h += s.horizon
            total_l += s.lower_bound
            print(
                f"{name:<17} {t.count:>9} {s.lower_bound:>7} {s.horizon:>7} {s.ratio:>6.3f} "
                f"{s.chunks / max(t.count, 1):>8.3f} {s.kind:<24} {mid - began:>7.2f} "
                f"{done - mid:>8.2f}",
                flush=True,
            )
    print(f"aggregate horizon/lower_bound = {total_h}/{total_l} = {total_h / total_l:.4f}")


if __name__ == "__main__":
    main()
