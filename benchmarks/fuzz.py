"""A longer fuzz run of the whole stack: random graphs and mutated packages.

Usage::

    python benchmarks/fuzz.py [--graphs N] [--odd-graphs N] [--packages N] [--systems N]
                              [--onnx N] [--seed S] [--json]

* **random graphs** (``--graphs`` with sizes that are multiples of 4, ``--odd-graphs`` with any
  sizes from 1 to 69): compile, load, run and check each on the simulated ipu21, then compare
  the output with the independent float64 evaluation of ``ipu_stack.testing.graphs``.
  Outcomes: ``passed``, ``refused`` (a clean ``CompileError``), ``failed`` (numerical check)
  or ``crashed`` (any other exception).
* **fixed attacks**: every container attack (truncations, bit flips, hostile member names,
  zip bomb, missing members, other format version/target) and every hand-crafted content
  attack of ``ipu_stack.testing.mutations`` through ``ipu-stack run``; ``KNOWN_BUGS`` are
  tried and counted separately.
* **random package mutations** (``--packages``): half byte-level (flips, overwrites,
  truncation, insertion, deletion), half content-level (an array element, a step field, a kernel
  parameter or a manifest entry set to a hostile value, written as a valid container), each
  through ``ipu-stack run``.  Outcomes: ``rejected`` (exit 2, exactly one ``error:`` line),
  ``harmless`` (a flip in a byte ZIP ignores: same content, normal run), ``ran`` (a content
  change the device cannot tell from a real program, e.g. another in-range address: the run
  finished with exit 0), ``ran-FAIL`` (the same, and the verdict caught the changed numbers:
  exit 1, the verdict's own warnings such as "stage agreement broke" on stderr) or
  ``crashed`` (an exception or traceback, a hang of more than 60 s, another exit code, or
  stderr that is neither one ``error:`` line nor the tool's log lines).
* **ONNX mutations** (``--onnx``, with the ``[onnx]`` extra): a small ONNX model (two
  products, a layer norm, weights inline) with its bytes mutated (``mutate_bytes``), through
  ``ipu-stack compile``: ``rejected`` (exit 2, one ``error:`` line), ``ran`` (the mutation
  left a model that compiles) or ``crashed``.
* **random system mutations** (``--systems``): a field of a two-chip system package's own
  records (its groups, hand-offs and their arrays, steps, chips) set to a hostile value or
  deleted, through ``ipu-stack run``, with the same outcomes.

Prints one line per category with its counts, then each distinct crash signature with one
reproducer; ``--json`` prints the counts as one JSON object instead.  Exit status 1 when any
graph failed or crashed, any fixed attack was not refused, or any mutation crashed.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import re
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from ipu_stack.package import read_package
from ipu_stack.pipeline import CompileOptions, compile_workload
from ipu_stack.runtime.execute import run_package
from ipu_stack.runtime.session import load_package
from ipu_stack.testing.graphs import build_random, random_spec, random_workload
from ipu_stack.testing.mutations import (
    KNOWN_BUGS,
    container_attacks,
    content_attacks,
    craft,
    mutate_bytes,
    mutate_content,
    mutate_system,
)
from ipu_stack.testing.runner import cli
from ipu_stack.util import log
from ipu_stack.util.errors import CompileError
from ipu_stack.verdict.tolerance import compare

CASE_SECONDS = 60
SOURCES = {
    "siglip-mlp": ["siglip-mlp", "--tokens", "16", "--dim", "64", "--hidden", "64"],
    "attention": ["attention", "--tokens", "17", "--dim", "64", "--heads", "4"],
    # a decode step: KV cache states, MultiUpdate calls and the loop's slot reads
    "decode-step": ["smollm2-135m", "--vocab", "50", "--dim", "16", "--hidden", "24",
                    "--heads", "4", "--kv-heads", "2", "--tokens", "1", "--context", "32",
                    "--batch", "2"],
}
# a system package: a small tower over two chips, two groups a chip (on-chip hand-offs, a
# link hand-off, two group programs)
SYSTEM_SOURCE = ["siglip-vision", "--layers", "4", "--image", "28", "--patch", "7", "--dim", "64",
                 "--hidden", "96", "--heads", "4", "--chips", "2", "--groups", "2"]


class Hang(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise Hang(f"no answer within {CASE_SECONDS} s")


def signature(exc: BaseException) -> str:
    """Exception type and the innermost ipu_stack frame: one line per distinct crash."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "ipu_stack" in f.filename]
    where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno} {frames[-1].name}" \
        if frames else "?"
    return f"{type(exc).__name__} at {where}"


class Tally:
    def __init__(self) -> None:
        self.counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.crashes: dict[str, str] = {}

    def add(self, category: str, outcome: str, crash: str | None = None, case: str = "") -> None:
        """Count one case; a crash is keyed by its signature (text after a tab is detail)."""
        self.counts[category][outcome] += 1
        if crash is not None:
            key, _, detail = crash.partition("\t")
            self.crashes.setdefault(f"[{category}] {key}", f"{case} ({detail})" if detail else case)


# ----------------------------------------------------------------------------- graphs


def fuzz_graphs(tally: Tally, rng: np.random.Generator, count: int, odd: bool, work: Path) -> None:
    category = "graphs-odd" if odd else "graphs"
    for index in range(count):
        spec = random_spec(rng, odd=odd)
        folder = work / f"{category}-{index}"
        signal.alarm(CASE_SECONDS)
        try:
            result = compile_workload(random_workload(spec), spec, folder,
                                      CompileOptions(cache_dir=str(work / "cache"), finalists=2))
            package = load_package(result.package)
            run = run_package(package, result.graph, result.tensors, work / "device.lock")
            _, _, expected = build_random(spec, package.manifest.get("gemm_modes"))
            (device,) = run.outputs.values()
            independent = compare(device.reshape(expected.shape), expected)
            if run.passed and independent.passed:
                tally.add(category, "passed")
            else:
                tally.add(category, "failed", f"numerical FAIL (runtime {run.passed}, float64 "
                          f"{independent.passed})", json.dumps(spec))
        except CompileError:
            tally.add(category, "refused")
        except Exception as exc:  # noqa: BLE001 - a crash is what we are looking for
            tally.add(category, "crashed", signature(exc), f"{exc!r:.100} <- {json.dumps(spec)}")
        finally:
            signal.alarm(0)


# ----------------------------------------------------------------------------- packages


def run_cli(path: Path, lock: Path) -> tuple[int, str, str]:
    signal.alarm(CASE_SECONDS)
    try:
        return cli(["--quiet", "run", str(path), "--lock", str(lock)])
    finally:
        signal.alarm(0)


LOG_LINE = re.compile(r"^ *(WARNING|ERROR|INFO|DEBUG) ipu_stack(\.\w+)*: ")


def classify(path: Path, lock: Path, original: Any | None) -> tuple[str, str | None]:
    """Outcome of ``ipu-stack run`` on ``path``: (outcome, crash signature or None).

    A numerical FAIL (exit 1) is the verdict working, not a crash: with ``--quiet`` its
    warnings ("stage agreement broke ...") are the tool's own log lines.  Anything else on
    stderr (a traceback, a stray print) is a crash whatever the exit code."""
    try:
        code, _, err = run_cli(path, lock)
    except Exception as exc:  # noqa: BLE001
        return "crashed", f"{signature(exc)}\t{str(exc)[:80]}"
    lines = err.splitlines()
    if code == 2 and len(lines) == 1 and lines[0].startswith("error: "):
        return "rejected", None
    logs_only = "Traceback" not in err and all(LOG_LINE.match(line) for line in lines)
    if code == 1 and logs_only and original is None:
        return "ran-FAIL", None
    if code in (0, 1) and logs_only:
        if original is not None:  # a byte mutation that still reads: content must be unchanged
            same = read_package(path, expected_target="ipu21")
            if same.manifest != original.manifest or same.arrays.keys() != original.arrays.keys():
                return "crashed", "byte mutation changed the content and was accepted"
            return "harmless", None
        return "ran", None
    return "crashed", f"exit {code} with stderr {err.strip()[:100]!r}"


def onnx_source() -> bytes:
    """A small supported ONNX model: ``LN(x @ W1 + b1) @ W2``, weights inline."""
    from onnx import TensorProto, helper, numpy_helper

    gen = np.random.default_rng(0)
    weights = [numpy_helper.from_array(a.astype(np.float32), name) for name, a in (
        ("fc1.weight", gen.standard_normal((16, 16)) * 0.2), ("fc1.bias", gen.standard_normal(16)),
        ("ln.weight", np.ones(16)), ("ln.bias", np.zeros(16)),
        ("fc2.weight", gen.standard_normal((16, 16)) * 0.2))]
    nodes = [helper.make_node("MatMul", ["x", "fc1.weight"], ["h"], name="/fc1/MatMul"),
             helper.make_node("Add", ["h", "fc1.bias"], ["h1"], name="/fc1/Add"),
             helper.make_node("LayerNormalization", ["h1", "ln.weight", "ln.bias"], ["n"],
                              name="/ln/LayerNormalization", epsilon=1e-5),
             helper.make_node("MatMul", ["n", "fc2.weight"], ["y"], name="/fc2/MatMul")]
    graph = helper.make_graph(
        nodes, "fuzz", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]
                             ).SerializeToString()


def fuzz_onnx(tally: Tally, rng: np.random.Generator, count: int, work: Path) -> None:
    if count <= 0:
        return
    try:
        original = onnx_source()
    except ImportError:
        print("onnx mutations skipped: the [onnx] extra is not installed")
        return
    victim = work / "victim.onnx"
    for _ in range(count):
        case, body = mutate_bytes(original, rng)
        victim.write_bytes(body)
        signal.alarm(CASE_SECONDS)
        try:
            code, _, err = cli(["--quiet", "compile", str(victim), "-o", str(work / "onnx-out"),
                                "--cache-dir", str(work / "cache")])
        except Exception as exc:  # noqa: BLE001
            tally.add("onnx", "crashed", f"{signature(exc)}\t{str(exc)[:80]}", case)
            continue
        finally:
            signal.alarm(0)
        lines = err.splitlines()
        if code == 2 and len(lines) == 1 and lines[0].startswith("error: "):
            tally.add("onnx", "rejected")
        elif code == 0 and "Traceback" not in err and all(LOG_LINE.match(x) for x in lines):
            tally.add("onnx", "ran")
        else:
            tally.add("onnx", "crashed", f"exit {code} with stderr {err.strip()[:100]!r}", case)


def fuzz_systems(tally: Tally, rng: np.random.Generator, count: int, work: Path) -> None:
    """``count`` random mutations of a system package's records (groups, hand-offs and
    their arrays, steps, chips), each through ``ipu-stack run``."""
    if not count:
        return
    out, lock = work / "source-system", work / "device.lock"
    code, _, err = cli(["--quiet", "compile", *SYSTEM_SOURCE, "--finalists", "1", "-o", str(out),
                        "--cache-dir", str(work / "cache")])
    if code != 0:
        raise SystemExit(f"cannot build the system source package: {err}")
    package = read_package(out / "model.ipuexe")
    victim = work / "system-victim.ipuexe"
    for _ in range(count):
        try_edit(tally, "mutated-system", package, *mutate_system(package, rng), victim, lock)


def try_edit(tally: Tally, category: str, package: Any, case: str, edit: Any, victim: Path,
             lock: Path) -> None:
    """``edit`` applied to ``package``, written to ``victim`` and run; its outcome tallied
    under ``category`` (``unwritable`` when the writer refuses it: not a package)."""
    try:
        craft(package, edit, victim)
    except Exception:  # noqa: BLE001 - the writer refused it
        tally.add(category, "unwritable")
        return
    outcome, crash = classify(victim, lock, None)
    tally.add(category, outcome, crash, case)


def fuzz_packages(tally: Tally, rng: np.random.Generator, count: int, work: Path) -> None:
    lock = work / "device.lock"
    victim = work / "victim" / "model.ipuexe"
    victim.parent.mkdir()
    sources = {}
    for name, argv in SOURCES.items():
        out = work / f"source-{name}"
        code, _, err = cli(["--quiet", "compile", *argv, "--finalists", "1", "-o", str(out),
                            "--cache-dir", str(work / "cache")])
        if code != 0:
            raise SystemExit(f"cannot build the {name} source package: {err}")
        data = (out / "model.ipuexe").read_bytes()
        sources[name] = (data, read_package(out / "model.ipuexe"))
    # the fixed tables: every one must be refused
    for name, (data, package) in sources.items():
        for case, body in container_attacks(data):
            victim.write_bytes(body)
            outcome, crash = classify(victim, lock, package)
            if outcome == "rejected" or outcome == "harmless":
                tally.add("fixed-container", outcome)
            else:
                tally.add("fixed-container", "NOT refused", crash or outcome, f"{name}: {case}")
        for case, body in content_attacks(data, work / "craft"):
            victim.write_bytes(body)
            outcome, crash = classify(victim, lock, None)
            tally.add("fixed-content", outcome if outcome == "rejected" else "NOT refused",
                      None if outcome == "rejected" else (crash or outcome), f"{name}: {case}")
        for _case, edit, _ in KNOWN_BUGS:
            try:
                craft(package, edit, victim)
            except Exception:  # noqa: BLE001 - not applicable to this source package
                continue
            outcome, _ = classify(victim, lock, None)
            tally.add("known-bugs", "refused" if outcome == "rejected" else "not refused: " + outcome)
    # random mutations
    names = sorted(sources)
    for index in range(count):
        data, package = sources[names[index % len(names)]]
        if rng.random() < 0.5:
            case, body = mutate_bytes(data, rng)
            victim.write_bytes(body)
            outcome, crash = classify(victim, lock, package)
            tally.add("mutated-bytes", outcome, crash, case)
        else:
            try_edit(tally, "mutated-content", package, *mutate_content(package, rng), victim,
                     lock)


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--graphs", type=int, default=40, help="random graphs, sizes multiple of 4")
    parser.add_argument("--odd-graphs", type=int, default=20, help="random graphs, any sizes")
    parser.add_argument("--packages", type=int, default=200, help="random package mutations")
    parser.add_argument("--systems", type=int, default=40,
                        help="random mutations of a two-chip system package's records")
    parser.add_argument("--onnx", type=int, default=40, help="random ONNX byte mutations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    log.configure(logging.ERROR)
    signal.signal(signal.SIGALRM, _alarm)
    rng = np.random.default_rng(args.seed)
    tally = Tally()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ipu-stack-fuzz-") as scratch:
        work = Path(scratch)
        fuzz_graphs(tally, rng, args.graphs, False, work)
        fuzz_graphs(tally, rng, args.odd_graphs, True, work)
        fuzz_packages(tally, rng, args.packages, work)
        fuzz_systems(tally, rng, args.systems, work)
        fuzz_onnx(tally, rng, args.onnx, work)
    seconds = time.perf_counter() - start
    counts = {k: dict(sorted(v.items())) for k, v in tally.counts.items()}
    if args.json:
        print(json.dumps({"seed": args.seed, "seconds": round(seconds, 1), "counts": counts,
                          "crashes": tally.crashes}))
    else:
        for category, outcomes in counts.items():
            total = sum(outcomes.values())
            parts = " ".join(f"{k}={v}" for k, v in outcomes.items())
            print(f"{category:16} run={total} {parts}")
        for crash, case in sorted(tally.crashes.items()):
            print(f"CRASH {crash}\n      reproducer: {case}")
        print(f"seed={args.seed} seconds={seconds:.1f}")
    bad = sum(v for c in counts.values() for k, v in c.items()
              if k in ("failed", "crashed", "NOT refused"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
