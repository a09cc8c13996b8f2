"""Whole vision towers: patch embedding, position embeddings, N identical layers, final norm.

* ``siglip-vision``: SigLIP so400m/14 at 384 (729 patches, no CLS token, 1152 dims, 16 heads,
  MLP 4304, 27 layers, tanh GELU, eps 1e-6): ``post_layernorm`` ends the tower.  The
  attention-pooling head is not built (it is optional in the issue; see docs/benchmarks.md).
* ``pe-vision``: Perception Encoder Core L/14 at 336 (CLS + 576 patches, 1024 dims, 16 heads,
  MLP 4096, 24 layers, exact GELU, eps 1e-5, 2D RoPE, ``ln_pre`` and ``ln_post``).

**Stem.**  The patch embedding is a convolution whose stride equals its kernel, so it is a
GEMM: each patch's ``3 x P x P`` pixels (channel, row, column order, as PyTorch flattens a
conv weight) times ``patch.w`` ``[3 P P, dim]``.  There are ``image // P`` patches a side:
like the unpadded conv, a 384-pixel SigLIP image drops its last 6 rows and columns.  The
host writes the image to the device as those patch rows (``patches``, a reordering of the
input's bytes, no arithmetic); the image itself is kept beside the tensors (``pixels``) so a
check can convolve it independently.  With a CLS token the host adds an all-zero patch row
at the front of each image: the GEMM maps it to 0 (PE's patch conv has no bias) and the position table's first
row carries ``class_embedding + pos[0]``, so the CLS concatenation costs no device step.
The position table is written once per image of the batch.

Every layer has the same shapes, so the compiler runs the 24 or 27 layers as one loop body
(``planning.repeat``); only the weights are per layer.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ipu_stack.ir.graph import Graph
from ipu_stack.ir.precision import F16
from ipu_stack.ir.types import TensorType
from ipu_stack.util.errors import UsageError
from ipu_stack.workloads.base import Parameter, Workload, register, rng_for
from ipu_stack.workloads.footprint import tower_footprint
from ipu_stack.workloads.transformer import (
    ATTENTION_OPTION,
    GELU_OPTION,
    KEEP_F16,
    LayerBuilder,
    attention_precision,
    attention_suffix,
    calibrated_build,
)


def _parameters(image: int, layers: int, dim: int, heads: int, hidden: int, eps: float,
                gelu: str, patch: int = 14) -> tuple[Parameter, ...]:
    return (
        Parameter("batch", int, 1, "images per run"),
        Parameter("image", int, image, "image side in pixels"),
        Parameter("patch", int, patch, "patch side in pixels (the conv's kernel and stride)"),
        Parameter("layers", int, layers, "encoder layers"),
        Parameter("dim", int, dim, "model dimension"),
        Parameter("heads", int, heads, "attention heads"),
        Parameter("hidden", int, hidden, "MLP hidden dimension"),
        Parameter("precision", str, "fp8", "GEMM inputs/weights precision", choices=("fp8", "f16")),
        Parameter("eps", float, eps, "layer norm epsilon", minimum=None, positive=True),
        Parameter("seed", int, 0, "seed of inputs and weights", minimum=0, maximum=None),
        GELU_OPTION(gelu),
        ATTENTION_OPTION("fp8"), KEEP_F16,
    )


def image_patches(pixels: np.ndarray, patch: int | tuple[int, int],
                  leading: int = 0, trailing: int = 0) -> np.ndarray:
    """``[B, C, H, W]`` -> ``[B, leading + T + trailing, C P Q]`` float32 patch rows in
    (channel, row, column) order, patches in raster order, the image's unpadded ``P x Q``
    windows (what a convolution with stride equal to its kernel reads); ``leading`` all-zero
    rows (a CLS token's) come first in each image, ``trailing`` ones (YOLOS's detection
    tokens) last."""
    p, q = (patch, patch) if isinstance(patch, int) else patch
    batch, channels, height, width = pixels.shape
    grid_h, grid_w = height // p, width // q
    pixels = np.asarray(pixels, np.float32)[:, :, : grid_h * p, : grid_w * q]
    rows = pixels.reshape(batch, channels, grid_h, p, grid_w, q)
    rows = rows.transpose(0, 2, 4, 1, 3, 5).reshape(batch, grid_h * grid_w, -1)
    zeros = np.zeros((batch, leading, rows.shape[-1]), np.float32)
    after = np.zeros((batch, trailing, rows.shape[-1]), np.float32)
    return np.concatenate([zeros, rows, after], axis=1)


def _has_cls(kind: str) -> bool:
    """The Perception Encoder towers have a CLS token (and 2D RoPE, ln_pre); SigLIP's not."""
    return kind.startswith("pe-")


def tower_tokens(params: dict[str, Any], cls: bool) -> int:
    """The tower's tokens: its patches, and a CLS token when it has one."""
    image, patch = params["image"], params["patch"]
    if image < patch:
        raise UsageError(f"--image {image} is smaller than one --patch {patch}")
    if params["dim"] % params["heads"]:
        raise UsageError(f"--dim {params['dim']} is not a multiple of --heads {params['heads']}")
    return (image // patch) ** 2 + int(cls)


def _build_tower(kind: str, builder: LayerBuilder, seed: int) -> None:
    """Stem, layers and final norm into ``builder`` (module docstring)."""
    builder.b.output(tower_into(kind, builder, seed))


def tower_into(kind: str, builder: LayerBuilder, seed: int) -> int:
    """The tower's stem, layers and final norm into ``builder``'s graph (``builder.p`` with
    ``tokens`` set): the final norm's value, for a graph that goes on from it (a VLM's
    connector, ``workloads/vlm.py``)."""
    p = builder.p
    cls = _has_cls(kind)
    batch, dim, patch = p["batch"], p["dim"], p["patch"]
    tokens = p["tokens"]
    depth = 3 * patch * patch
    pixels = rng_for(seed, "pixels").uniform(-1.0, 1.0, (batch, 3, p["image"], p["image"]))
    patches_precision = builder.act("patches")
    rows = image_patches(pixels, patch, int(cls))
    builder.tensors["patches"] = patches_precision.round_trip(rows)
    builder.tensors["pixels"] = pixels.astype(np.float32)
    x = builder.b.input("patches", TensorType((batch, tokens, depth), patches_precision))
    weight = builder.weight("patch.w", (depth, dim), 1.0 / np.sqrt(depth))
    stem = builder.b.op("matmul", [x, weight], F16, "patch.mm")
    if not cls:
        bias = builder.weight("patch.b", (dim,), 0.02)
        stem = builder.b.op("bias_add", [stem, bias], F16, "patch.out")
    positions = rng_for(p["seed"], "pos").standard_normal((tokens, dim)) * 0.02
    if cls:
        positions[0] += rng_for(p["seed"], "cls").standard_normal(dim) * 0.02
    table = F16.round_trip(np.tile(positions, (batch, 1)).astype(np.float32))
    builder.tensors["pos"] = table
    pos = builder.b.weight("pos", TensorType(table.shape, F16))
    h = builder.b.op("add", [stem, pos], F16, "embed")
    if cls:
        h = builder.norm(h, "ln_pre", F16)
    for index in range(p["layers"]):
        h = builder.layer(h, index, rope=cls)
    return builder.norm(h, "post_ln", F16)


def build_tower(kind: str, params: dict[str, Any]) -> tuple[Graph, dict[str, np.ndarray]]:
    """The tower's graph and tensors, FP8 scales fitted per role on a calibration image."""
    params = {**params, "tokens": tower_tokens(params, _has_cls(kind))}
    return calibrated_build(params, kind, lambda builder, seed: _build_tower(kind, builder, seed))


def stream_image(kind: str, params: dict[str, Any], graph: Graph, index: int
                 ) -> dict[str, np.ndarray]:
    """Image ``index`` of a stream (``--images``): new pixels from their own random stream,
    cut into patch rows and rounded to the input's precision (its scale was fitted on the
    first image; the pixels are drawn from the same range)."""
    batch, image, patch = params["batch"], params["image"], params["patch"]
    pixels = rng_for(params["seed"], f"pixels.{index}").uniform(-1.0, 1.0,
                                                                (batch, 3, image, image))
    rows = image_patches(pixels, patch, int(_has_cls(kind)))
    value = graph.by_role("input")[0]
    return {value.name: value.type.precision.round_trip(rows).reshape(value.type.shape)}


def _identifier(kind: str):
    def make(p: dict[str, Any]) -> str:
        return (f"{kind}-{p['precision']}-b{p['batch']}-i{p['image']}-p{p['patch']}"
                f"-d{p['dim']}-h{p['heads']}-f{p['hidden']}-n{p['layers']}"
                f"{attention_suffix(p, 'fp8')}")
    return make


def _fields(kind: str):
    def make(p: dict[str, Any]) -> dict[str, Any]:
        tokens = tower_tokens(p, _has_cls(kind))
        return {"benchmark": f"{kind}-{p['precision']}", "batch": p["batch"],
                "image": p["image"], "patch": p["patch"], "tokens": tokens,
                "rows": p["batch"] * tokens, "dimension": p["dim"], "heads": p["heads"],
                "hiddenDimension": p["hidden"], "layers": p["layers"], "biases": True,
                "attention": attention_precision(p)}
    return make


def _register(kind: str, description: str, parameters: tuple[Parameter, ...]) -> None:
    register(Workload(name=kind, description=description, parameters=parameters,
                      build=lambda params: build_tower(kind, params),
                      identifier=_identifier(kind), benchmark_fields=_fields(kind),
                      stream_input=lambda params, graph, index: stream_image(kind, params, graph,
                                                                             index),
                      footprint=lambda params: tower_footprint(params, _has_cls(kind))))


_register("siglip-vision", "SigLIP so400m/14-384 vision tower: patch embedding, 27 layers, "
          "post layer norm", _parameters(384, 27, 1152, 16, 4304, 1e-6, "tanh"))
_register("pe-vision", "Perception Encoder Core L/14-336 vision tower: CLS, 2D RoPE, 24 layers, "
          "ln_pre and ln_post", _parameters(336, 24, 1024, 16, 4096, 1e-5, "erf"))
# the giant towers do not fit one chip's memory (1.16 GB and 1.88 GB of FP8 weights): they
# are the multi-chip workloads (--chips N; docs/multichip.md)
_register("siglip2-giant", "SigLIP2 giant-opt/16-384 vision tower: patch 16, 576 tokens, width "
          "1536, 40 layers, MLP 6144, post layer norm (1.16 B parameters)",
          _parameters(384, 40, 1536, 16, 6144, 1e-6, "tanh", patch=16))
_register("pe-giant", "Perception Encoder Core G/14-448 vision tower: CLS + 1024 patches, 2D "
          "RoPE, width 1536, 50 layers, MLP 8960, ln_pre and ln_post (1.88 B parameters)",
          _parameters(448, 50, 1536, 16, 8960, 1e-5, "erf"))
