"""Export transformers' SmolVLM image program (the SigLIP tower and the pixel-shuffle
connector, joined in one module) with ``torch.export``, for ``ipu-stack bench MODEL.pt2``.

Usage: ``python benchmarks/export_smolvlm.py --out IMAGE.pt2 [--layers 12]`` (needs the
``torch`` extra and transformers).  ``SmolVLMForConditionalGeneration`` at
SmolVLM-256M-Instruct's widths (random weights, seed 0): one 512 x 512 image in, its 64
image rows at the decoder's width out.  ``ipu-stack bench IMAGE.pt2`` runs the program of
the builtin ``smolvlm-256m --part vision`` (docs/language-models.md).
"""

from __future__ import annotations

import argparse

import torch

from ipu_stack.testing.models import smolvlm, smolvlm_image_part


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--layers", type=int, default=12, help="the vision tower's layers")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    model = smolvlm({"num_hidden_layers": args.layers}, {"num_hidden_layers": 1})
    program = torch.export.export(smolvlm_image_part(model), (torch.randn(1, 3, 512, 512),),
                                  strict=False)
    torch.export.save(program, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
