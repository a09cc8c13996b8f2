"""Measure greedy generation (``ipu-stack generate``) and print docs/benchmarks.md's rows.

Usage: ``python benchmarks/bench_generate.py [--only NAME ...] [--records DIR | --keep DIR]``.
Each case runs ``/usr/bin/time -v ipu-stack --quiet generate ... --json`` (about 20 minutes on 2
cores for all of them; a model file's case exports its files first, with the ``[torch]``
extra) and keeps its record and the time's report in a temporary folder, or in ``DIR``
with ``--keep DIR``; with ``--records DIR`` holding them from an earlier run, the rows are
printed from them without running anything.  The table is the one in docs/benchmarks.md,
"Language models: generation".
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

STEP_FILE = "smollm2_step.pt2"
DYNAMIC_FILE = "smollm2_dynamic.pt2"
VLM_FOLDER = "smolvlm"
CASES: dict[str, tuple[str, ...]] = {
    "smollm2-fp8": ("smollm2-135m", "--prompt-tokens", "128", "--new-tokens", "32"),
    "smollm2-f16": ("smollm2-135m", "--prompt-tokens", "128", "--new-tokens", "32",
                    "--precision", "f16"),
    "smollm2-b32": ("smollm2-135m", "--prompt-tokens", "32", "--new-tokens", "8",
                    "--batch", "32"),
    "smollm2-b32-2chips": ("smollm2-135m", "--chips", "2", "--prompt-tokens", "32",
                           "--new-tokens", "8", "--batch", "32"),
    "tinyllama-fp8": ("tinyllama-1.1b", "--chips", "2", "--prompt-tokens", "128",
                      "--new-tokens", "32"),
    "tinyllama-b32": ("tinyllama-1.1b", "--chips", "3", "--prompt-tokens", "16",
                      "--new-tokens", "8", "--batch", "32"),
    "tinyllama-f16": ("tinyllama-1.1b", "--chips", "4", "--prompt-tokens", "16",
                      "--new-tokens", "8", "--precision", "f16"),
    "smolvlm": ("smolvlm-256m", "--prompt-tokens", "64", "--new-tokens", "32"),
    # LlamaForCausalLM at SmolLM2-135M's widths exported with a static cache of 160
    # positions (benchmarks/export_llama_step.py, into the records folder): a token a step
    "smollm2-pt2": (STEP_FILE, "--prompt-tokens", "128", "--new-tokens", "32"),
    # the same exported with a dynamic sequence length: the prompt's pass from the file
    "smollm2-pt2-dynamic": (DYNAMIC_FILE, "--prompt-tokens", "128", "--new-tokens", "32"),
    # transformers' SmolVLM at SmolVLM-256M's widths as its two programs
    # (benchmarks/export_smolvlm.py, into the records folder)
    "smolvlm-pt2": (f"{VLM_FOLDER}/decoder.pt2", "--image-program",
                    f"{VLM_FOLDER}/image.pt2", "--prompt-tokens", "64", "--new-tokens", "32"),
}
# each model file's exporter and its options, run once into the records folder (needs the
# [torch] extra)
EXPORTS = {STEP_FILE: ("export_llama_step.py",),
           DYNAMIC_FILE: ("export_llama_step.py", "--dynamic"),
           VLM_FOLDER: ("export_smolvlm.py",)}


def run_case(name: str, folder: Path) -> None:
    """One generation under ``/usr/bin/time -v``: its record and the time's report."""
    case = list(CASES[name])
    for index, argument in enumerate(case):
        exported = argument.split("/")[0]
        if exported in EXPORTS:  # a model file, exported once
            if not (folder / exported).exists():
                script, *options = EXPORTS[exported]
                subprocess.run([sys.executable, str(Path(__file__).with_name(script)),
                                str(folder / exported), *options], check=True,
                               capture_output=True)
            case[index] = str(folder / argument)
    command = ["/usr/bin/time", "-v", sys.executable, "-m", "ipu_stack.cli", "--quiet",
               "generate", *case, "--json"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    (folder / f"{name}.json").write_text(done.stdout)
    (folder / f"{name}.time").write_text(done.stderr)
    if done.returncode not in (0, 1):
        raise SystemExit(f"{name}: {done.stderr.strip().splitlines()[-1]}")


def _wall(report: str) -> str:
    found = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\d+):(\d+)", report)
    return f"{found.group(1)} min {round(float(found.group(2)))} s" if found else "-"


def _rss(report: str) -> str:
    found = re.search(r"Maximum resident set size \(kbytes\): (\d+)", report)
    return f"{int(found.group(1)) / 1e6:.2f} GB" if found else "-"


def _spaced(value: float) -> str:
    return f"{value:,}".replace(",", " ")


def row(name: str, folder: Path) -> str:
    """The case's table row, from its record and the time's report."""
    r = json.loads((folder / f"{name}.json").read_text())
    report = (folder / f"{name}.time").read_text()
    differ, ties = r["tokensDiffering"], r["tokensTied"]
    total = r["batch"] * r["newTokens"]
    tokens = f"{differ} of {total}" + (", all ties" if differ and differ == ties else "")
    return (f"| `generate {' '.join(CASES[name])}` | {r['ttftMicroseconds'] / 1000:.2f} ms | "
            f"{r['tpotMicroseconds']:.0f} µs | **{_spaced(r['tokensPerSecond'])}** | "
            f"{_spaced(r['decodeCycles'])} | {_spaced(r['prefillCycles'])} | {tokens} | "
            f"{r['kvCacheBytes'] / 1e6:.1f} MB | {_spaced(r['peakTileBytes'])} | "
            f"{r['simulateSeconds']} | {r['verdictSeconds']} | {_wall(report)} | "
            f"{_rss(report)} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="*", choices=sorted(CASES), help="these cases")
    parser.add_argument("--records", type=Path, help="print from these records, run nothing")
    parser.add_argument("--keep", type=Path, help="run, and keep the records here")
    args = parser.parse_args(argv)
    names = args.only or list(CASES)
    with tempfile.TemporaryDirectory(prefix="bench-generate-") as scratch:
        folder = args.records or args.keep or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        if args.records is None:
            for name in names:
                run_case(name, folder)
        print("| command | TTFT | TPOT | tokens/s | decode step cycles | prompt pass cycles | "
              "tokens | KV cache | peak tile bytes | simulate s | verdict s | wall | "
              "peak RSS |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for name in names:
            print(row(name, folder))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
