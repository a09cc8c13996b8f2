"""Export transformers' SmolVLM as its two programs, for ``ipu-stack bench IMAGE.pt2`` and
``ipu-stack generate DECODER.pt2 --image-program IMAGE.pt2``.

Usage: ``python benchmarks/export_smolvlm.py DIR [--vision-layers 12] [--layers 30]
[--context 160]`` (needs the ``torch`` extra and transformers).
``SmolVLMForConditionalGeneration`` at SmolVLM-256M-Instruct's widths (random weights, seed
0), written as ``DIR/image.pt2`` (the SigLIP tower and the pixel-shuffle connector joined:
one 512 x 512 image in, its 64 rows at the decoder's width out; the program of the builtin
``smolvlm-256m --part vision``) and ``DIR/decoder.pt2`` (its text model and LM head as
transformers' ``TorchExportableModuleForDecoderOnlyLM`` exports a decoder, with a static
cache of ``--context`` positions, taking ``inputs_embeds`` of any length so that a prompt can
open with the image's rows; docs/language-models.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from ipu_stack.testing.models import export_smolvlm_parts, smolvlm


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the folder for image.pt2 and decoder.pt2")
    parser.add_argument("--vision-layers", type=int, default=12)
    parser.add_argument("--layers", type=int, default=30, help="the decoder's layers")
    parser.add_argument("--context", type=int, default=160, help="the decoder's cache")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    model = smolvlm({"num_hidden_layers": args.vision_layers},
                    {"num_hidden_layers": args.layers})
    args.out.mkdir(parents=True, exist_ok=True)
    for name, program in zip(("image", "decoder"), export_smolvlm_parts(model, args.context),
                             strict=True):
        torch.export.save(program, str(args.out / f"{name}.pt2"))
        print(f"wrote {args.out / name}.pt2")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
