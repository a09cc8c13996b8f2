"""Write docs/c600-comparison.md: the transformers ByteMLPerf measured on a real C600 with the
vendor's compiler (PopRT), beside what this compiler's builtins of the same shapes do.

Usage: ``python benchmarks/c600_comparison.py [--out docs/c600-comparison.md]
[--records DIR]``.  Each row runs ``ipu-stack bench WORKLOAD ... --json`` (about fifteen
minutes on 2 cores for all of them) and keeps its record in ``DIR`` (a temporary folder by
default) as ``<row>.json``; a row whose record ``DIR`` already holds is not run again.
PopRT's figures are ByteMLPerf's (``byte_mlperf/reports/IPU/*/result*.json``, MACHINE.md):
QPS include their host runtime, so ours are set beside them as ``qpsWithHost`` (the batch
over the device's time plus the host transfers at the PCIe rate, not overlapped).  A batch
larger than one program holds runs as micro-batches (``--images``), and its latency is all
of them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ipu_stack.target import get_target
from ipu_stack.util.files import write_bytes_atomic

CLOCK_HZ = get_target("ipu21").clock_hz


@dataclass(frozen=True)
class Row:
    """One ByteMLPerf row and the command of ours that stands beside it."""

    key: str
    model: str
    precision: str
    batch: str
    poprt_qps: float | None  # None: ByteMLPerf has no row at this batch
    poprt_latency_ms: float | None
    command: tuple[str, ...]
    note: str = ""


PACKED = ("PopRT's sequences are packed (several short SQuAD sequences in each 384-token "
          "pack); ours are 384 real tokens each, so ours do more work a sequence. ")
MICRO = ("One program holds {micro} of them ({leanest}); the batch runs as {passes} "
         "micro-batches of {micro}, one after another on the loaded chip, each judged, and the "
         "latency is all of them")
CLASSIFIER = ("The model ByteMLPerf ran: its 1,000-label classifier, logits out "
              "(`model_zoo/swin-large-torch-fp32.json`), as SwinForImageClassification. ")
ROWS = (
    Row("clip4", "CLIP text encoder (Stable Diffusion), 77 tokens", "FP16", "4", 2674, 4.44,
        ("clip-text", "--batch", "4")),
    Row("clip40", "CLIP text encoder (Stable Diffusion), 77 tokens", "FP16", "40", 7305, 16.23,
        ("clip-text", "--batch", "40")),
    Row("bert20", "BERT-base, SQuAD, 384 tokens", "FP16", "20 (2 x 10)", 2867, 24.08,
        ("bert-base", "--batch", "10", "--images", "2"),
        PACKED + MICRO.format(micro=10, passes=2, leanest="a batch of 20 in one program needs "
                              "338,304 bytes a tile in the planner's leanest plans; 10 takes "
                              "the fewest cycles a sequence of those that fit")),
    Row("bert40", "BERT-base, SQuAD, 384 tokens", "FP16", "40 (4 x 10)", 3134, 50.42,
        ("bert-base", "--batch", "10", "--images", "4"),
        PACKED + MICRO.format(micro=10, passes=4, leanest="as the row above")),
    Row("roberta20", "RoBERTa-base, SQuAD, 384 tokens", "FP16", "20 (2 x 10)", None, None,
        ("roberta-base", "--batch", "10", "--images", "2"),
        "ByteMLPerf has no RoBERTa row at 20. " + MICRO.format(
            micro=10, passes=2, leanest="as BERT's")),
    Row("roberta40", "RoBERTa-base, SQuAD, 384 tokens", "FP16", "packs of 40 (4 x 10)", 2883,
        24.77, ("roberta-base", "--batch", "10", "--images", "4"),
        "packed, as BERT's row. " + MICRO.format(micro=10, passes=4, leanest="as BERT's")),
    Row("swin4", "Swin-L/384 (window 12, depths 2-2-18-2)", "FP8", "4 (2 x 2)", 480, 32.91,
        ("swin-l", "--batch", "2", "--images", "2", "--labels", "1000"),
        CLASSIFIER + MICRO.format(micro=2, passes=2, leanest="at 4, stage 1's 1,536 window-and-head "
                     "products run in two waves, but the leanest plans do not place: 546 "
                     "tiles need up to 37,840 bytes more than a tile holds, 191 KB of "
                     "exchange tables on the first that fails")),
    Row("swin2f16", "Swin-L/384 (window 12, depths 2-2-18-2)", "FP16", "2 (2 x 1)", 315, 25.03,
        ("swin-l", "--precision", "f16", "--batch", "1", "--images", "2", "--labels", "1000"),
        CLASSIFIER + MICRO.format(micro=1, passes=2, leanest="at batch 2 the leanest plans do not "
                     "place: 1,089 tiles need up to 54,768 bytes more than a tile holds, "
                     "137 KB of exchange tables on the first that fails; at batch 1 a "
                     "tile's AMP gets 10 rows a call, docs/benchmarks.md")),
)
def run_row(row: Row, folder: Path) -> dict:
    """``ipu-stack bench`` of the row with ``--json``; its record (kept in ``folder``)."""
    done = subprocess.run([sys.executable, "-m", "ipu_stack.cli", "bench", *row.command,
                           "--json", "--out", str(folder / row.key)],
                          capture_output=True, text=True, check=False)
    if done.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(row.command)}: {done.stderr.strip().splitlines()[-1]}")
    record = json.loads(done.stdout.strip().splitlines()[-1])
    (folder / f"{row.key}.json").write_text(json.dumps(record))
    return record


def recorded(row: Row, folder: Path) -> dict:
    """The row's record from ``folder``, run and kept there when it is not yet."""
    path = folder / f"{row.key}.json"
    return json.loads(path.read_text()) if path.exists() else run_row(row, folder)


def check(records: dict[str, dict]) -> None:
    """Every row must pass its verdict with the planner's estimate equal to its cycles,
    as the document says; anything else stops the script."""
    for row in ROWS:
        r = records[row.key]
        if r["numericalTest"] != "PASS" or r["cycles"] != r["estimatedCycles"]:
            raise SystemExit(f"{' '.join(row.command)}: {r['numericalTest']}, {r['cycles']} "
                             f"cycles, estimated {r['estimatedCycles']}")


def table(records: dict[str, dict]) -> list[str]:
    """The comparison's rows, one per ByteMLPerf row."""
    lines = ["| model | precision | batch | PopRT QPS | PopRT latency | ours `qpsWithHost` | "
             "ours `qps` | latency | cycles a program run | roofline (its precision) | verdict | "
             "notes |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in ROWS:
        r = records[row.key]
        poprt, ratio = "- | -", ""
        if row.poprt_qps is not None:
            poprt = f"{row.poprt_qps:,.0f} | {row.poprt_latency_ms} ms"
            ratio = f" ({r['qpsWithHost'] / row.poprt_qps:.2f}x)"
        # the batch's latency: every micro-batch of it, one after another
        latency = r.get("totalCycles", r["cycles"]) / CLOCK_HZ * 1000
        lines.append(
            f"| {row.model} | {row.precision} | {row.batch} | {poprt} | "
            f"**{r['qpsWithHost']:,.1f}**{ratio} | {r['qps']:,.1f} | {latency:.2f} ms | "
            f"{r['cycles']:,} | {r['rooflinePercent']} % | {r['numericalTest']} | {row.note} |")
    return lines


def document(records: dict[str, dict], commit: str) -> str:
    commands = "\n".join(f"    ipu-stack bench {' '.join(row.command)} --json" for row in ROWS)
    return "\n".join([
        "# The transformers measured on a real C600, beside this compiler",
        "",
        "ByteMLPerf ran its inference suite on a Graphcore C600 with the vendor's compiler,",
        "PopRT; its transformer rows are below with the builtins of the same shapes",
        "(random weights at the real widths; `docs/benchmarks.md`). PopRT's QPS include the",
        "host runtime: ours are compared as `qpsWithHost`, the batch over the device's time",
        "plus the batch's host transfers at the PCIe rate, not overlapped. Cycles are the",
        "simulator's, from the price table (docs/machine.md), and equal the planner's",
        "estimate on every row. Every row passes its verdict against the float64 model.",
        "transformers' `CLIPTextModel` exported at the same shape and imported",
        "(`ipu-stack bench clip_text_b4.pt2 --precision f16`) passes against torch as the",
        "builtin's program, in its cycles: 1,291,169 at batch 4 and 7,044,107 at 40 (at",
        "`9b2a393` and `a765146`; docs/benchmarks.md). transformers'",
        "`SwinForImageClassification` at Swin-L's shape, the model the Swin rows' `--labels",
        "1000` builds, passes against torch in the F16 row's cycles, 4,640,761 at batch 1",
        "(`ipu-stack bench swin_cls_b1.pt2 --precision f16`, at `38b62df`), and transformers'",
        "BERT encoder with its token types in `bert-base --batch 8`'s 8,418,857",
        "(`bert_encoder_b8.pt2 --precision f16`); its `SwinModel` (`swin_l_b2.pt2 --precision",
        "fp8 --attention fp8`) ran the builtin's program when last measured (docs/benchmarks.md).",
        "",
        *table(records),
        "",
        f"Written by `python benchmarks/c600_comparison.py` at `{commit}`, which runs:",
        "",
        commands,
        "",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/c600-comparison.md")
    parser.add_argument("--records", default=None,
                        help="a folder of <row>.json records: those missing are run and kept")
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=False).stdout.strip() or "unknown"
    if args.records:
        folder = Path(args.records)
        folder.mkdir(parents=True, exist_ok=True)
        records = {row.key: recorded(row, folder) for row in ROWS}
    else:
        with tempfile.TemporaryDirectory() as temp:
            records = {row.key: run_row(row, Path(temp)) for row in ROWS}
    check(records)
    write_bytes_atomic(Path(args.out), document(records, commit).encode())
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
