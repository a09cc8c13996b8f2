"""Mutation testing: does the default suite catch small, deliberate faults in the core?

Usage: ``python benchmarks/mutation.py [--only N,M] [--timeout S] [--out FILE]``.

A fixed, documented list of targeted mutations (below) covers the exchange verifier, the
kernels' numerics, the timing model and the simulator's timing, placement, the numerical
verdict and the package reader.  The harness copies the working tree once into a scratch
folder, and for each mutation applies it there (the snippet must occur exactly once), runs
the default suite against the copy (``python -m pytest -x -q``, with the copy's ``src``
first on ``PYTHONPATH``), records whether a test failed (killed) or not (survived), and
restores the file.  It never touches this checkout.  This is a benchmark, not part of CI:
it runs the suite once per mutation.  Results go into docs/testing.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (id, file, original snippet, replacement, what the fault is)
MUTATIONS: list[tuple[str, str, str, str, str]] = [
    # exchange verifier
    ("verify-port-overlap", "exchange/verify.py", "    if clash.size:",
     "    if False and clash.size:", "verifier ignores port collisions"),
    ("verify-uncovered", "exchange/verify.py",
     "    if short.size and (not over.size or short[0] < over[0]):",
     "    if False:", "verifier accepts a transfer whose words are not all sent"),
    # kernel numerics
    ("gemm-fp16-partials", "kernels/gemm.py",
     "        partial = (partial.astype(np.float32) + dot).astype(np.float16)",
     "        partial = (partial.astype(np.float32) + dot).astype(np.float32)",
     "FP8 GEMM keeps F32 partials instead of rounding to FP16 after each pass"),
    ("gemm-transposed", "kernels/gemm.py", "        if params.get(\"b_transposed\"):",
     "        if False:", "B^T operand used untransposed"),
    ("reduce-drops-partial", "kernels/epilogue.py", "    for k in range(parts - 1):",
     "    for k in range(max(parts - 2, 0)):", "reduce drops the last received partial"),
    ("gelu-coefficient", "kernels/elementwise.py", "np.float32(0.044715)",
     "np.float32(0.04471)", "GELU's cubic coefficient off by 1e-4 relative"),
    ("sigmoid-slope", "kernels/elementwise.py", "return special.expit(x).astype",
     "return special.expit(np.float32(1.01) * x).astype", "sigmoid with a 1% steeper slope"),
    ("tanh-sign", "kernels/elementwise.py", "return np.tanh(x).astype(np.float32)",
     "return -np.tanh(x).astype(np.float32)", "tanh with the wrong sign"),
    ("rms-norm-epsilon", "kernels/rowwise.py",
     "                                + np.float32(p[\"eps\"]))",
     "                                + np.float32(p[\"eps\"] * 1.1))",
     "RMS norm's epsilon 10% too large"),
    ("swiglu-gate", "kernels/rowwise.py",
     "(activation(x, \"silu\") if op == \"swiglu\" else x) * y",
     "(activation(x, \"sigmoid\") if op == \"swiglu\" else x) * y",
     "SwiGLU gates with sigmoid(a) instead of silu(a)"),
    ("softmax-scale", "kernels/rowwise.py",
     "        shifted = x * np.float32(p[\"scale\"])", "        shifted = x",
     "softmax ignores its scale"),
    ("layer-norm-beta", "kernels/rowwise.py",
     "np.sqrt(var + np.float32(p[\"eps\"])) * gamma + beta",
     "np.sqrt(var + np.float32(p[\"eps\"])) * gamma", "layer norm drops beta"),
    ("rope-swap", "kernels/rowwise.py",
     "    out = np.stack([even * c - odd * s, even * s + odd * c], axis=-1)",
     "    out = np.stack([even * s - odd * c, even * c + odd * s], axis=-1)",
     "RoPE with cos and sin swapped"),
    ("copy-short", "kernels/copy.py", "    src, dst = addresses\n    rows, row_bytes = "
     "p[\"rows\"], p[\"row_bytes\"]", "    src, dst = addresses\n    rows, row_bytes = "
     "p[\"rows\"], max(p[\"row_bytes\"] - 1, 0)", "local copy moves one byte less per row"),
    ("fp8-no-saturation", "ir/precision.py",
     "            scaled = np.clip(np.ldexp(data, -self.scale_exponent), -limit, limit)",
     "            scaled = np.ldexp(data, -self.scale_exponent)",
     "FP8 quantisation without saturation"),
    # timing model and simulator timing
    ("amp-row-price", "target/timing.py",
     "\"amp_row\": Fact(4,", "\"amp_row\": Fact(3,", "AMP 3 cycles per row instead of 4"),
    ("amp-pass-price", "target/timing.py",
     "\"amp_pass_interleaved\": Fact(\n        160,",
     "\"amp_pass_interleaved\": Fact(\n        150,", "AMP pass 150 instead of 160"),
    ("amp-standard-price", "target/timing.py",
     "        load = p(\"amp_pass_interleaved\") if weights_interleaved else p(\"amp_pass_standard\")"
     "\n        return p(\"amp_call\")",
     "        load = p(\"amp_pass_interleaved\")\n        return p(\"amp_call\")",
     "simulator ignores weights placed in standard memory"),
    ("reduce-partials-price", "target/timing.py",
     "    step = p(\"reduce_step\") + p(\"reduce_partial\") * (parts - 1)\n    return",
     "    step = p(\"reduce_step\")\n    return", "reduce estimate ignores extra partials"),
    ("busiest-floor", "target/timing.py",
     "    return max((cdiv(n, vector) for n in per_worker), default=0)",
     "    return max((n // vector for n in per_worker), default=0)",
     "per-worker steps rounded down instead of up"),
    ("sync-price", "target/timing.py", "\"sync\": Fact(90,", "\"sync\": Fact(80,",
     "sync 80 cycles instead of 90"),
    ("phase-price", "target/timing.py", "        237, \"reference notes 'Layout and barrier",
     "        200, \"reference notes 'Layout and barrier", "exchange phase +200 instead of +237"),
    ("send-alignment", "exchange/instructions.py", "        if at % align != 0:",
     "        if False:", "sends never shifted to an aligned event"),
    ("sim-busiest", "device/simulator.py",
     "                busiest = int(np.argmax(busy)) if busy.size else 0",
     "                busiest = int(np.argmin(busy)) if busy.size else 0",
     "superstep timed by the least busy tile"),
    ("sim-exchange-sync", "device/simulator.py",
     "            report.cycles += cycles + sync", "            report.cycles += cycles",
     "no sync before exchange phases"),
    ("sim-weight-class", "device/simulator.py",
     "int(row[work.weights]) + self.base >= self.target.interleaved_base)",
     "int(row[work.weights]) + self.base >= 0)", "simulator thinks all weights interleaved"),
    ("host-probe-bytes", "device/simulator.py",
     "                if step.get(\"checkpoint\") is None:  # probes are the simulator's, "
     "not traffic", "                if True:", "probe reads counted as host traffic"),
    # placement
    ("placement-alignment", "memory/placement.py",
     "        align = target.alignment(buffer.memory_class)", "        align = 1",
     "placement ignores alignment"),
    ("placement-class", "memory/placement.py",
     "        class_start, class_end = target.class_range(buffer.memory_class)",
     "        class_start, class_end = target.class_range(MemoryClass.STANDARD)",
     "interleaved buffers placed anywhere"),
    ("placement-overlap", "memory/placement.py",
     "            placed[other] for other in placed if _overlaps(by_id[other], buffer)",
     "            placed[other] for other in placed if False",
     "placement ignores live neighbours (overlapping allocations)"),
    # the numerical verdict
    ("verdict-mismatch", "verdict/judge.py", "MISMATCH_LIMIT = 2.0**-7",
     "MISMATCH_LIMIT = 1.0", "any share of differing elements accepted"),
    ("verdict-ulps", "verdict/judge.py", "ULP_LIMIT = {\"F32\": 64, \"F16\": 4,",
     "ULP_LIMIT = {\"F32\": 64, \"F16\": 4000,", "F16 stage results may be 4000 ulps off"),
    ("verdict-noise", "verdict/judge.py", "NOISE_LIMIT = 1.5", "NOISE_LIMIT = 100.0",
     "fidelity's RMS limit 100x"),
    ("verdict-rerun", "verdict/judge.py",
     "    if same_rows and not rows_differ.any():\n        return reference[stage.out]",
     "    if True:\n        return reference[stage.out]",
     "stages never rerun on the device's inputs (judged against the reference's values)"),
    # the package reader
    ("reader-checksum", "package/reader.py",
     "        if hashlib.sha256(body).hexdigest() != entry[\"sha256\"]:",
     "        if False:", "package member checksums not verified"),
    ("reader-version", "package/reader.py", "        if version != FORMAT_VERSION:",
     "        if False:", "any package format version accepted"),
]


def run(only: set[str] | None, timeout: int) -> list[dict]:
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / "tree"
        shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(
            ".git", "artifacts", ".pytest_cache", ".ruff_cache", "*.egg-info"))
        env = {**os.environ, "PYTHONPATH": f"{copy / 'src'}{os.pathsep}{copy}"}
        for ident, rel, old, new, what in MUTATIONS:
            if only and ident not in only:
                continue
            path = copy / "src" / "ipu_stack" / rel
            text = path.read_text()
            if text.count(old) != 1:
                results.append({"id": ident, "what": what, "result": "not applied",
                                "detail": f"snippet found {text.count(old)} times in {rel}"})
                continue
            path.write_text(text.replace(old, new))
            started = time.perf_counter()
            try:
                done = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q",
                                       "-p", "no:cacheprovider"], cwd=copy, env=env,
                                      capture_output=True, text=True, timeout=timeout)
                failed = [line for line in done.stdout.splitlines()
                          if line.startswith(("FAILED", "ERROR"))]
                why = [line.strip() for line in done.stdout.splitlines()
                       if line.startswith("E ")][:1]
                result = "killed" if done.returncode != 0 else "survived"
                detail = " | ".join(failed[:1] + why) if failed else (
                    done.stdout.strip().splitlines()[-1:])
            except subprocess.TimeoutExpired:
                result, detail = "timeout", f"over {timeout} s"
            finally:
                path.write_text(text)
            results.append({"id": ident, "what": what, "result": result,
                            "seconds": round(time.perf_counter() - started, 1),
                            "detail": detail if isinstance(detail, str) else " ".join(detail)})
            print(json.dumps(results[-1]), flush=True)
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", help="comma-separated mutation ids")
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--out", help="also write the results as JSON here")
    args = parser.parse_args()
    chosen = set(args.only.split(",")) if args.only else None
    outcome = run(chosen, args.timeout)
    killed = sum(r["result"] == "killed" for r in outcome)
    applied = sum(r["result"] != "not applied" for r in outcome)
    print(f"mutations={len(outcome)} applied={applied} killed={killed} "
          f"kill_rate={killed / max(applied, 1):.3f}")
    if args.out:
        Path(args.out).write_text(json.dumps(outcome, indent=1) + "\n")
