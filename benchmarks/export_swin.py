"""Export transformers' Swin-L at 384 (ByteMLPerf's ``swin-large-torch-fp32`` shape) with
``torch.export``, for ``ipu-stack bench MODEL.pt2`` (docs/benchmarks.md, "Swin-L beside
the vendor's C600 figures").

Usage: ``python benchmarks/export_swin.py --batch B --out MODEL.pt2 [--classify]``
(``--classify``: ``SwinForImageClassification`` with ImageNet's 1,000 labels; else
``SwinModel``, returning the last hidden state and the pooled output); an ``--out
MODEL.onnx`` is written by torch.onnx's TorchScript exporter instead (opset 18: the default
exporter cannot decompose Swin's window partition), for ``ipu-stack bench MODEL.onnx``
(docs/onnx.md).  Random init
(``torch.manual_seed(0)``) at the real widths, the relative position bias tables drawn as
N(0, 0.02) (transformers starts them at zero, which would leave the bias untested).  About
800 MB on disk; needs the ``torch`` extra (transformers).
"""

from __future__ import annotations

import argparse

import torch

from ipu_stack.testing.models import swin


def swin_large(classify: bool) -> torch.nn.Module:
    """Swin-L/384: patch 4, embedding 192, depths 2-2-18-2, heads 6-12-24-48, window 12."""
    return swin(classify, image_size=384, patch_size=4, embed_dim=192, depths=[2, 2, 18, 2],
                num_heads=[6, 12, 24, 48], window_size=12, num_labels=1000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--out", required=True)
    parser.add_argument("--classify", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = swin_large(args.classify)
    pixels = torch.randn(args.batch, 3, 384, 384)
    if args.out.endswith(".onnx"):
        torch.onnx.export(model.eval(), (pixels,), args.out, dynamo=False, opset_version=18,
                          input_names=["pixel_values"], verbose=False)
    else:
        torch.export.save(torch.export.export(model, (pixels,)), args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
