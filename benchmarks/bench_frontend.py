"""Full-size imported models: export Hugging Face towers, compile, run, check against torch.

    python benchmarks/bench_frontend.py siglip --layers 1 --precision fp8
    python benchmarks/bench_frontend.py vit --layers 2 --precision f16
    python benchmarks/bench_frontend.py siglip --layers 2 --attention fp8
    python benchmarks/bench_frontend.py all            # the table of docs/frontend.md
    python benchmarks/bench_frontend.py zoo            # every ViT-family tower (zoo.py)
    python benchmarks/bench_frontend.py zoo --import-only --only CLIP
    python benchmarks/bench_frontend.py zoo --onnx     # the same towers through ONNX

Each model is built from its published config with random weights (``torch.manual_seed``),
exported with ``torch.export.export(model.eval(), (pixels,))``, saved as ``.pt2`` and run
through ``ipu-stack bench MODEL.pt2 --json`` exactly as a user would; one JSON line per run
is printed and appended to ``--results``.  Needs the ``[torch]`` extra.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
from pathlib import Path
from typing import Any

MODELS = ("siglip", "siglip-head", "vit")


def build_model(kind: str, layers: int, seed: int) -> tuple[Any, tuple[int, ...]]:
    """The tower (random init, fixed seed) and its input shape."""
    import torch

    torch.manual_seed(seed)
    if kind in ("siglip", "siglip-head"):
        from transformers import SiglipVisionConfig, SiglipVisionModel

        # google/siglip-so400m-patch14-384's vision config; "siglip-head" keeps the
        # attention-pooling head (nn.MultiheadAttention with a learned probe)
        config = SiglipVisionConfig(hidden_size=1152, intermediate_size=4304,
                                    num_hidden_layers=layers, num_attention_heads=16,
                                    patch_size=14, image_size=384,
                                    vision_use_head=kind == "siglip-head")
        return SiglipVisionModel(config).eval(), (1, 3, 384, 384)
    if kind == "vit":
        from transformers import ViTConfig, ViTModel

        # google/vit-base-patch16-224's config; the tanh pooler is left out (no tanh op)
        config = ViTConfig(hidden_size=768, intermediate_size=3072, num_hidden_layers=layers,
                           num_attention_heads=12, patch_size=16, image_size=224)
        return ViTModel(config, add_pooling_layer=False).eval(), (1, 3, 224, 224)
    raise SystemExit(f"unknown model {kind!r}; known: {', '.join(MODELS)}")


def export(kind: str, layers: int, seed: int, folder: Path) -> tuple[Path, float]:
    """Export and save one model; returns its path and the seconds ``export`` took."""
    import torch

    model, shape = build_model(kind, layers, seed)
    pixels = torch.randn(*shape)
    started = time.perf_counter()
    program = torch.export.export(model, (pixels,))
    seconds = time.perf_counter() - started
    path = folder / f"{kind}-{layers}l.pt2"
    folder.mkdir(parents=True, exist_ok=True)
    torch.export.save(program, str(path))
    return path, seconds


def bench(path: Path, precision: str, out: Path, seed: int, compare: bool = True,
          attention: str = "f16") -> dict[str, Any]:
    """``ipu-stack bench MODEL.pt2 --precision P --attention A --json --save-tensors``; the
    parsed record plus (``compare``) the device's error against torch's float32 output on the
    same input."""
    import numpy as np
    import torch

    from ipu_stack.cli import main
    from ipu_stack.frontend import import_program

    buffer, errors = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(errors):
        saving = ["--save-tensors", str(out / "tensors")] if compare else []
        code = main(["--quiet", "bench", str(path), "--precision", precision, "--out", str(out),
                     "--json", *saving, "--seed", str(seed), "--attention", attention])
    lines = [line for line in buffer.getvalue().splitlines() if line.startswith("{")]
    record = json.loads(lines[-1]) if lines else {"numericalTest": "ERROR"}
    record["exitCode"] = code
    reasons = [line for line in errors.getvalue().splitlines() if line.startswith("error:")]
    if reasons:
        record["reason"] = reasons[-1][len("error:"):].strip()
    if lines and compare:  # every output against torch's, laid out as the graph's outputs
        program = torch.export.load(str(path))
        imported = import_program(program, precision=precision, seed=seed, attention=attention)
        device = np.load(out / "tensors" / "outputs.npz")
        diffs, refs = [], []
        for name, expected in imported.torch_outputs.items():
            diffs.append(device[name].reshape(-1).astype(np.float64) - expected.reshape(-1))
            refs.append(expected.reshape(-1).astype(np.float64))
        diff, ref = np.concatenate(diffs), np.concatenate(refs)
        scale = float(np.sqrt(np.mean(ref**2)))
        record["relativeRmsErrorVsTorch"] = float(f"{np.sqrt(np.mean(diff**2)) / scale:.4g}")
        record["maxAbsErrorVsTorch"] = float(f"{np.abs(diff).max():.4g}")
        record["outputs"] = len(imported.torch_outputs)
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=(*MODELS, "all", "zoo"))
    parser.add_argument("--layers", type=int, action="append")
    parser.add_argument("--precision", choices=("fp8", "f16"), action="append")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--attention", choices=("fp8", "f16"), default="f16",
                        help="attention products' operands with --precision fp8")
    parser.add_argument("--folder", default="artifacts/frontend")
    parser.add_argument("--results", default="artifacts/frontend/results.jsonl")
    parser.add_argument("--batch", type=int, action="append", help="zoo: batches (1 and 2)")
    parser.add_argument("--only", action="append", help="zoo: towers whose name contains this")
    parser.add_argument("--import-only", action="store_true",
                        help="zoo: export and import (conversion check) only")
    parser.add_argument("--onnx", action="store_true",
                        help="zoo: export with torch.onnx.export and run the .onnx files")
    args = parser.parse_args(argv)
    if args.model == "zoo":
        from zoo_runs import run_zoo

        return run_zoo(args, bench)
    runs: list[tuple[str, int, str]]
    if args.model == "all":
        runs = [("siglip", n, p) for n in (1, 2) for p in ("fp8", "f16")]
        runs += [("siglip-head", n, p) for n in (1, 2) for p in ("fp8", "f16")]
        runs += [("vit", 2, p) for p in ("fp8", "f16")]
    else:
        runs = [(args.model, n, p) for n in (args.layers or [1])
                for p in (args.precision or ["fp8"])]
    folder = Path(args.folder)
    failed = 0
    for kind, layers, precision in runs:
        path, export_seconds = export(kind, layers, args.seed, folder)
        record = bench(path, precision, folder / f"{kind}-{layers}l-{precision}", args.seed,
                       attention=args.attention)
        summary = {"model": kind, "layers": layers, "precision": precision,
                   "attention": record.get("attention"),
                   "exportSeconds": round(export_seconds, 2),
                   **{k: record.get(k) for k in (
                       "numericalTest", "referenceSource", "cycles", "deviceMicroseconds",
                       "noiseRatio", "tailRatio", "stageAgreement", "relativeRmsErrorVsTorch",
                       "maxAbsErrorVsTorch",
                       "conversionError", "gemmModes", "activeTiles", "peakTileBytes",
                       "compileSeconds", "simulateSeconds", "outputs", "exitCode")}}
        print(json.dumps(summary), flush=True)
        Path(args.results).parent.mkdir(parents=True, exist_ok=True)
        with open(args.results, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(summary) + "\n")
        failed += record.get("numericalTest") != "PASS"
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
