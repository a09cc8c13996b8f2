"""Running the zoo (``benchmarks/zoo.py``): export, import or bench each tower, one JSON line
per run into ``--results``, and the markdown table of ``docs/frontend.md`` (``--onnx``:
through ONNX, ``docs/onnx.md``) at the end."""

from __future__ import annotations

import argparse
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zoo import LAYERS, ZOO, Tower, prepare


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}"[:300]


def export_tower(tower: Tower, batch: int, seed: int, folder: Path, onnx: bool = False
                 ) -> Path:
    """The tower saved as ``.pt2`` by ``torch.export``, or (``onnx``) as ``.onnx`` by
    ``torch.onnx.export`` (opset 18; the TorchScript exporter where the default one fails:
    BEiT's relative position bias) with its biases and norms drawn (``draw_vectors``)."""
    import torch

    torch.manual_seed(seed)
    model = prepare(tower.build(LAYERS))
    pixels = torch.randn(batch, 3, tower.image, tower.image)
    slug = "".join(c if c.isalnum() else "-" for c in tower.name.lower()).strip("-")
    folder.mkdir(parents=True, exist_ok=True)
    if onnx:  # torch.onnx's default exporter; its TorchScript one where that fails
        path = folder / f"{slug}-b{batch}.onnx"
        model = draw_vectors(model)
        try:
            torch.onnx.export(model, (pixels,), str(path), dynamo=True, opset_version=18,
                              input_names=["pixel_values"], verbose=False)
        except Exception:  # noqa: BLE001  (the exporter raises many types for one cause)
            torch.onnx.export(model, (pixels,), str(path), dynamo=False, opset_version=18,
                              input_names=["pixel_values"], verbose=False)
        return path
    path = folder / f"{slug}-b{batch}.pt2"
    torch.export.save(torch.export.export(model, (pixels,)), str(path))
    return path


def draw_vectors(model: Any) -> Any:
    """Biases and norm parameters drawn at random, as a trained model's are: left at their
    init (zeros, ones), torch.onnx stores each distinct value once for all layers, which a
    real checkpoint never does (and the weights, hence the placement, would differ from the
    ``.pt2``'s)."""
    import torch

    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 1:
                parameter.add_(0.02 * torch.randn_like(parameter))
    return model


def imports(path: Path) -> dict[str, Any]:
    """The import and its conversion check, at F16 (no calibration pass)."""
    from ipu_stack.frontend import import_program, imported_workload
    from ipu_stack.frontend.loader import load_program

    if path.suffix == ".onnx":
        workload, base = imported_workload(path)
        workload.build(workload.resolve({**base, "precision": "f16"}))
        imported = next(iter(workload.imports.values()))
    else:
        imported = import_program(load_program(str(path)), precision="f16")
    return {"numericalTest": "IMPORTED", "conversionError": imported.conversion_error}


def run_zoo(args: argparse.Namespace, bench: Callable[..., dict[str, Any]]) -> int:
    folder = Path(args.folder) / "zoo"
    towers = [t for t in ZOO if not args.only or any(o.lower() in t.name.lower()
                                                     for o in args.only)]
    batches = args.batch or [1, 2]
    precisions = args.precision or ["fp8", "f16"]
    rows: list[dict[str, Any]] = []
    for batch in batches:  # every tower at batch 1 first
        for tower in towers:
            started = time.perf_counter()
            try:
                path = export_tower(tower, batch, args.seed, folder, args.onnx)
            except Exception as exc:  # a tower torch.export cannot trace: its reason
                for precision in (["f16"] if args.import_only else precisions):
                    _record(args, rows, _row(tower, batch, precision, {
                        "numericalTest": "ERROR", "reason": "export: " + _one_line(exc)}))
                continue
            for precision in (["f16"] if args.import_only else precisions):
                try:
                    out = folder / f"{path.stem}-{precision}"
                    record = imports(path) if args.import_only else bench(
                        path, precision, out, args.seed, compare=False)
                    shutil.rmtree(out, ignore_errors=True)  # packages: gigabytes over the zoo
                except Exception as exc:
                    record = {"numericalTest": "ERROR", "reason": _one_line(exc)}
                record["seconds"] = round(time.perf_counter() - started, 1)
                _record(args, rows, _row(tower, batch, precision, record))
    print(table(rows))
    passed = sum(r["verdict"] in ("PASS", "IMPORTED") for r in rows)
    print(f"{passed} of {len(rows)} runs pass")
    return 0 if passed == len(rows) else 1


def _record(args: argparse.Namespace, rows: list[dict[str, Any]], row: dict[str, Any]) -> None:
    rows.append(row)
    print(json.dumps(row), flush=True)
    Path(args.results).parent.mkdir(parents=True, exist_ok=True)
    with open(args.results, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(row) + "\n")


def _row(tower: Tower, batch: int, precision: str, record: dict[str, Any]) -> dict[str, Any]:
    reason = record.get("reason") or record.get("failedParts") or ""
    if record.get("numericalTest") == "PASS":
        reason = ""
    return {"tower": tower.name, "checkpoint": tower.checkpoint, "batch": batch,
            "precision": precision, "verdict": record.get("numericalTest"),
            "cycles": record.get("cycles"), "noiseRatio": record.get("noiseRatio"),
            "tailRatio": record.get("tailRatio"), "loopLayers": record.get("loopLayers"),
            "conversionError": record.get("conversionError"), "reason": reason,
            "seconds": record.get("seconds")}


def table_from(path: str) -> str:
    """The table of a results file (the last run of each tower, batch and precision)."""
    return table(list(latest_rows(path).values()))


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table: one line per tower, batch and precision."""
    lines = ["| tower (config of) | batch | precision | verdict | cycles | noiseRatio | "
             "tailRatio | layer loop | reason |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        reason = (r["reason"] or "-").replace("|", "\\|")
        lines.append(f"| {r['tower']} ({r['checkpoint']}) | {r['batch']} | {r['precision']} | "
                     f"{r['verdict']} | {r['cycles'] or '-'} | {r['noiseRatio'] or '-'} | "
                     f"{r['tailRatio'] or '-'} | {r['loopLayers'] or '-'} | {reason} |")
    return "\n".join(lines)


def latest_rows(path: str) -> dict[tuple, dict[str, Any]]:
    latest: dict[tuple, dict[str, Any]] = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        latest[(row["tower"], row["batch"], row["precision"])] = row
    return latest


def comparison_table(onnx_path: str, pt2_path: str) -> str:
    """The zoo through ONNX beside the same towers through ``.pt2`` (docs/onnx.md)."""
    onnx, pt2 = latest_rows(onnx_path), latest_rows(pt2_path)
    lines = ["| tower (config of) | batch | precision | `.pt2` | `.pt2` cycles | ONNX | ONNX "
             "cycles | noiseRatio | why not |", "|---|---|---|---|---|---|---|---|---|"]
    for key, row in onnx.items():
        twin = pt2.get(key, {})
        reason = (row["reason"] or twin.get("reason") or "-").replace("|", "\\|")[:160]
        lines.append(f"| {row['tower']} ({row['checkpoint']}) | {row['batch']} | "
                     f"{row['precision']} | {twin.get('verdict', '-')} | "
                     f"{twin.get('cycles') or '-'} | {row['verdict']} | {row['cycles'] or '-'} | "
                     f"{row['noiseRatio'] or '-'} | {reason} |")
    passed = [sum(r.get("verdict") == "PASS" for r in rows.values()) for rows in (onnx, pt2)]
    lines.append(f"\nPASS: {passed[0]} of {len(onnx)} through ONNX, {passed[1]} of {len(pt2)} "
                 "through `.pt2`.")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    print(table_from(sys.argv[1]) if len(sys.argv) == 2 else
          comparison_table(sys.argv[1], sys.argv[2]))
