"""Swin Transformer: shifted-window attention over a patch grid that halves at each stage.

* ``swin-l``: Swin-L at 384 (ByteMLPerf's ``swin-large-torch-fp32`` shape, transformers'
  ``SwinModel``): 4 x 4 patches (a 96 x 96 grid), embedding width 192, depths 2-2-18-2,
  heads 6-12-24-48, windows of 12 x 12 tokens, MLP 4 x the width, exact GELU, layer norm
  eps 1e-5, patch merging between stages, the final layer norm (the last hidden state) and
  the pooled mean; with ``--labels N``, ``SwinForImageClassification``'s classifier on the
  pooled rows, its logits the one output (ByteMLPerf's model: 1,000 labels).

**Token order.** Everything in a block but attention works row by row (the norms, the
projections, the MLP and the residual adds). The residual stream stays in raster order; a
block whose windows are not that order moves rows twice (``gather_rows``: an exchange each,
no arithmetic): its first norm's output into its window order for the attention, and the
attention's output back into raster order for the residual add. Those moves do
transformers' roll and window partition (``shifts=(-s, -s)`` then partition, ``s`` = half a
window), and window reverse and roll back: each a fixed permutation of the rows. So every
plain block of a stage moves its rows as every other does, and every shifted block too:
a stage's blocks are one loop from its first (``planning.repeat``), where a stream left in
the last block's window order would make the first block after a patch merging differ from
the rest. Patch merging is one gather: each new row concatenates the 2 x 2 neighbours
``x0 = [0::2, 0::2], x1 = [1::2, 0::2], x2 = [0::2, 1::2], x3 = [1::2, 1::2]``, in the
halved grid's raster order. This is the graph the importer makes of transformers'
``SwinModel`` (``frontend/order.py``), so an exported model and this builtin run the same
program. The pooled output is each image's mean token (``head_matmul pv`` with a constant
mixing input, as for the towers' importer).

**Attention** inside each window is a ``head_matmul`` over ``batch x windows`` sequences of
``window^2`` tokens. The relative position bias (``relative_position_bias_table`` indexed by
``relative_position_index``, a table of ``(2w - 1)^2`` rows a head) and a shifted block's
attention mask (-100 between tokens from different regions of the rolled grid, as
transformers' ``get_attn_mask``) are what the softmax adds: the bias, ``[heads x T, T]``,
repeats every ``heads x T`` rows; a shifted block's mask is summed into it (``[windows x
heads x T, T]``), or held as a second table, ``[windows x T, T]``, each window's block
serving its heads in turn (``biased_softmax`` with ``table_maps``,
``ir.graph.table_row_index``; :func:`split_tables` says which); each call's exchange moves
their rows to the scores'.

A stage whose grid is no larger than a window (Swin-L's last, 12 x 12) runs one window
without shifts, as transformers does. A grid that windows do not tile, or an odd grid before
a patch merging, would need transformers' zero padding: refused in one line (not built).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ipu_stack.ir.graph import Graph
from ipu_stack.ir.precision import F16
from ipu_stack.ir.types import RowIndex, TensorType
from ipu_stack.util.errors import UsageError
from ipu_stack.workloads.base import Parameter, Workload, register, rng_for
from ipu_stack.workloads.footprint import Footprint
from ipu_stack.workloads.transformer import (
    ATTENTION_OPTION,
    KEEP_F16,
    LayerBuilder,
    attention_precision,
    attention_suffix,
    calibrated_build,
)
from ipu_stack.workloads.vision import image_patches

MASKED = -100.0  # transformers' attention mask between regions of a shifted grid


@dataclass(frozen=True)
class SwinStage:
    """One stage's geometry: its grid side, width, heads, blocks and window."""

    side: int
    dim: int
    heads: int
    depth: int
    window: int

    def shift(self, block: int) -> int:
        """A block's shift: half a window on odd blocks, none where one window covers the
        grid (transformers' ``set_shift_and_window_size``)."""
        return self.window // 2 if block % 2 and self.side > self.window else 0


def _int_list(text: str, option: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise UsageError(f"--{option} {text!r} is not a comma-separated list of whole "
                         "numbers") from None
    if not values or min(values) <= 0:
        raise UsageError(f"--{option} {text!r} needs positive numbers")
    return values


def swin_stages(params: dict[str, Any]) -> list[SwinStage]:
    """The stages ``params`` describe, or one line naming what does not fit together."""
    depths, heads = _int_list(params["depths"], "depths"), _int_list(params["stage_heads"], "stage-heads")
    if len(depths) != len(heads):
        raise UsageError(f"--depths has {len(depths)} stages and --stage-heads {len(heads)}")
    if params["image"] % params["patch"]:
        raise UsageError(f"--image {params['image']} is not a multiple of --patch "
                         f"{params['patch']} (transformers pads it: not built)")
    side, dim, stages = params["image"] // params["patch"], params["dim"], []
    for number, (depth, count) in enumerate(zip(depths, heads, strict=True)):
        window = min(params["window"], side)
        if side % window:
            raise UsageError(f"stage {number}'s {side} x {side} grid is not whole windows of "
                             f"{window} (transformers pads it: not built)")
        if dim % count:
            raise UsageError(f"stage {number}'s width {dim} is not a multiple of its {count} "
                             "heads")
        stages.append(SwinStage(side, dim, count, depth, window))
        if number < len(depths) - 1:
            if side % 2:
                raise UsageError(f"stage {number}'s {side} x {side} grid is odd: its patch "
                                 "merging would pad it (not built)")
            side, dim = side // 2, dim * 2
    return stages


def window_order(batch: int, side: int, window: int, shift: int) -> np.ndarray:
    """For each row of the window order, the raster token (``b side^2 + y side + x``) it
    holds: windows in raster order, tokens in raster order inside each, on the grid rolled
    by ``-shift`` in both directions (``torch.roll(x, (-s, -s), (1, 2))`` then transformers'
    ``window_partition``)."""
    b, wy, wx, iy, ix = np.meshgrid(np.arange(batch), np.arange(side // window),
                                    np.arange(side // window), np.arange(window),
                                    np.arange(window), indexing="ij")
    y = (wy * window + iy + shift) % side
    x = (wx * window + ix + shift) % side
    return (b * side * side + y * side + x).reshape(-1)


def merge_order(batch: int, side: int, order: np.ndarray) -> np.ndarray:
    """The raster tokens patch merging concatenates for each token of the halved grid held
    in ``order`` (raster tokens of that grid), four a token: ``x0, x1, x2, x3``."""
    half = side // 2
    b, rest = np.divmod(order, half * half)
    y, x = np.divmod(rest, half)
    base = b * side * side + 2 * y * side + 2 * x
    return np.stack([base, base + side, base + 1, base + side + 1], axis=1).reshape(-1)


def relative_position_index(window: int) -> np.ndarray:
    """transformers' ``relative_position_index``: ``[T, T]`` rows of the bias table."""
    coords = np.stack(np.meshgrid(np.arange(window), np.arange(window), indexing="ij"))
    coords = coords.reshape(2, -1)
    relative = coords[:, :, None] - coords[:, None, :] + (window - 1)
    return relative[0] * (2 * window - 1) + relative[1]


def shift_mask(side: int, window: int, shift: int) -> np.ndarray:
    """transformers' ``get_attn_mask``: ``[windows, T, T]``, -100 between tokens of
    different regions of the rolled grid, 0 elsewhere (all 0 without a shift)."""
    windows = (side // window) ** 2
    if not shift:
        return np.zeros((windows, window * window, window * window), np.float32)
    regions = np.zeros((side, side), np.int64)
    cuts = (slice(0, -window), slice(-window, -shift), slice(-shift, None))
    for number, (rows, cols) in enumerate((r, c) for r in cuts for c in cuts):
        regions[rows, cols] = number
    held = regions.reshape(-1)[window_order(1, side, window, 0)].reshape(windows, -1)
    return np.where(held[:, None, :] != held[:, :, None], MASKED, 0.0).astype(np.float32)


def attention_bias(bias_table: np.ndarray, stage: SwinStage) -> np.ndarray:
    """One layer's relative position bias for scores laid out ``[heads, T, T]`` (as
    ``[heads T, T]`` rows: the period every window and image repeats)."""
    tokens = stage.window ** 2
    bias = bias_table[relative_position_index(stage.window).reshape(-1)]  # [T T, heads]
    return bias.T.reshape(stage.heads * tokens, tokens)


def _parameters() -> tuple[Parameter, ...]:
    return (
        Parameter("batch", int, 1, "images per run"),
        Parameter("image", int, 384, "image side in pixels"),
        Parameter("patch", int, 4, "patch side in pixels"),
        Parameter("window", int, 12, "window side in tokens"),
        Parameter("dim", int, 192, "embedding width (doubles at each patch merging)"),
        Parameter("depths", str, "2,2,18,2", "blocks of each stage"),
        Parameter("stage_heads", str, "6,12,24,48", "attention heads of each stage"),
        Parameter("mlp_ratio", int, 4, "MLP hidden width over the stage's width"),
        Parameter("precision", str, "fp8", "GEMM inputs/weights precision", choices=("fp8", "f16")),
        Parameter("eps", float, 1e-5, "layer norm epsilon", minimum=None, positive=True),
        Parameter("tables", str, "auto", "a shifted block's bias and mask: summed, or split "
                  "(the mask a block a window); auto: split at f16", choices=("auto", "summed",
                                                                             "split")),
        Parameter("labels", int, 0, "the classifier's labels: logits out, as "
                  "SwinForImageClassification (ByteMLPerf's model: 1000); 0: the last hidden "
                  "state and the pooled output, as SwinModel", minimum=0),
        Parameter("seed", int, 0, "seed of inputs and weights", minimum=0, maximum=None),
        ATTENTION_OPTION("fp8"), KEEP_F16,
    )


def _gather(builder: LayerBuilder, x: int, picks: np.ndarray, name: str, group: int = 1) -> int:
    precision = builder.b.graph.value(x).type.precision
    return builder.b.op("gather_rows", [x], precision, name, index=RowIndex(picks),
                        group=group)


def split_tables(precision: str, tables: str = "auto") -> bool:
    """Whether a shifted block holds its bias and mask as two tables (``--tables split``)
    rather than summed (``summed``). By default (``auto``) they are split at F16, where the
    summed tables, ``windows`` times the bias's bytes a shifted layer, leave Swin-L no room
    on one chip, and summed at FP8, where they fit and save each shifted layer the mask's
    copy and add (1.7 % of a Swin-L run at batch 2). The importer asks the same of a
    ``SwinModel`` (``frontend/attention.py``)."""
    if tables == "auto":
        return precision == "f16"
    return tables == "split"


def _attention_table(builder: LayerBuilder, stage: SwinStage, prefix: str, shift: int) -> None:
    """The layer's bias as ``builder.mask`` (the ``[heads T, T]`` rows every window and
    image repeats) and, in a shifted block, its shift mask: summed into the bias
    (``[windows heads T, T]``), or as ``builder.mask_rows``, one ``[T, T]`` block a window
    serving each of the window's heads in turn (:func:`split_tables`)."""
    bias_table = rng_for(builder.p["seed"], f"{prefix}.attn.rel_bias").standard_normal(
        ((2 * stage.window - 1) ** 2, stage.heads)) * 0.02
    bias = attention_bias(bias_table, stage)
    tokens = stage.window ** 2
    mask = shift_mask(stage.side, stage.window, shift) if shift else None
    builder.mask_rows = None
    if mask is not None and not split_tables(builder.p["precision"], builder.p["tables"]):
        bias = (mask[:, None] + bias.reshape(stage.heads, tokens, tokens)[None]).reshape(
            -1, tokens)
    elif mask is not None:
        mask = mask.reshape(-1, tokens)
        builder.tensors[f"{prefix}.attn.mask"] = mask
        builder.mask_rows = (builder.b.weight(f"{prefix}.attn.mask", TensorType(mask.shape, F16)),
                             tokens, stage.heads)
    name = f"{prefix}.attn.table"
    builder.tensors[name] = F16.round_trip(bias.astype(np.float32))
    builder.mask = builder.b.weight(name, TensorType(bias.shape, F16))


def _block(builder: LayerBuilder, x: int, stage: SwinStage, number: int, picks: np.ndarray | None,
           shift: int) -> int:
    """One Swin block on the stream ``x`` (raster order); ``picks``: the raster rows of the
    block's window order, where it is not raster order."""
    prefix = f"layer{number}"
    builder.p = {**builder.p, "dim": stage.dim, "heads": stage.heads,
                 "tokens": stage.window ** 2, "hidden": builder.p["mlp_ratio"] * stage.dim}
    _attention_table(builder, stage, prefix, shift)
    h = builder.norm(x, f"{prefix}.ln1", F16)
    if picks is not None:
        h = _gather(builder, h, picks, f"{prefix}.ln1.rows")
    if builder.fp8_at(prefix):
        h = builder.b.op("cast", [h], builder.act(f"{prefix}.ln1.fp8"), f"{prefix}.ln1.fp8")
    a = builder.attention(h, f"{prefix}.attn", rope=False, bias=True)
    if picks is not None:
        a = _gather(builder, a, np.argsort(picks), f"{prefix}.attn.rows")
    return builder.mlp(builder.b.op("add", [x, a], F16, f"{prefix}.residual1"), prefix)


def _stem(builder: LayerBuilder, seed: int) -> int:
    """Patch rows (raster order) through the patch embedding and its norm."""
    p = builder.p
    batch, patch, dim = p["batch"], p["patch"], p["dim"]
    depth = 3 * patch * patch
    pixels = rng_for(seed, "pixels").uniform(-1.0, 1.0, (batch, 3, p["image"], p["image"]))
    rows = image_patches(pixels, patch)
    precision = builder.act("patches")
    builder.tensors["patches"] = precision.round_trip(rows)
    builder.tensors["pixels"] = pixels.astype(np.float32)
    x = builder.b.input("patches", TensorType(rows.shape, precision))
    weight = builder.weight("patch.w", (depth, dim), 1.0 / np.sqrt(depth))
    stem = builder.b.op("matmul", [x, weight], F16, "patch.mm")
    stem = builder.b.op("bias_add", [stem, builder.weight("patch.b", (dim,), 0.02)], F16,
                        "patch.out")
    return builder.norm(stem, "embed_ln", F16)


def _merge(builder: LayerBuilder, x: int, stage: SwinStage, number: int) -> int:
    """Patch merging of the stream ``x`` (raster order) into the raster order of the halved
    grid."""
    batch = builder.p["batch"]
    picks = merge_order(batch, stage.side, np.arange(batch * (stage.side // 2) ** 2))
    merged = _gather(builder, x, picks, f"merge{number}.rows", group=4)
    name = f"merge{number}"
    normed = builder.norm(merged, f"{name}.ln", builder.act(f"{name}.ln.out"), 4 * stage.dim)
    weight = builder.weight(f"{name}.reduction.w", (4 * stage.dim, 2 * stage.dim),
                            1.0 / np.sqrt(4 * stage.dim))
    return builder.b.op("matmul", [normed, weight], F16, f"{name}.reduction.mm")


def _pool_mix(batch: int, tokens: int) -> np.ndarray:
    """The pooled mean's mixing input: each token row weighs its image's tokens equally."""
    return np.full((batch * tokens, tokens), 1.0 / tokens, np.float32)


def _pooled(builder: LayerBuilder, x: int, tokens: int) -> int:
    """The mean over each image's tokens (transformers' pooler), every row of an image
    holding it: ``head_matmul pv`` with a constant mixing input, as the importer makes it."""
    batch = builder.p["batch"]
    builder.tensors["pool.mix"] = _pool_mix(batch, tokens)
    mix = builder.b.input("pool.mix", TensorType((batch * tokens, tokens), F16))
    return builder.b.op("head_matmul", [mix, x], F16, "pooled", mode="pv", heads=1,
                        tokens=tokens)


def _build_swin(builder: LayerBuilder, seed: int) -> None:
    """The stem, the stages with their merges, the final norm and the pooled mean into
    ``builder``; rows move where a block's windows need another order than raster (the
    moves the importer makes of transformers' ``SwinModel``, ``frontend/order.py``)."""
    stages = swin_stages(builder.p)
    batch = builder.p["batch"]
    x = _stem(builder, seed)
    number = 0
    for index, stage in enumerate(stages):
        if index:
            x = _merge(builder, x, stages[index - 1], index - 1)
        for block in range(stage.depth):
            shift = stage.shift(block)
            order = window_order(batch, stage.side, stage.window, shift)
            picks = None if np.array_equal(order, np.arange(len(order))) else order
            x = _block(builder, x, stage, number, picks, shift)
            number += 1
    x = builder.norm(x, "final_ln", F16, stages[-1].dim)
    pooled = _pooled(builder, x, stages[-1].side ** 2)
    labels = builder.p["labels"]
    if not labels:  # SwinModel: the last hidden state and the pooled output
        builder.b.output(x)
        builder.b.output(pooled)
        return
    # SwinForImageClassification: the classifier on one pooled row an image (every row of
    # an image holds the mean), its logits alone
    batch, tokens = builder.p["batch"], stages[-1].side ** 2
    pooled = _gather(builder, pooled, np.arange(batch) * tokens, "classifier.rows")
    if builder.fp8_at("classifier"):
        pooled = builder.b.op("cast", [pooled], builder.act("classifier.fp8"), "classifier.fp8")
    width = stages[-1].dim
    weight = builder.weight("classifier.w", (width, labels), 1.0 / np.sqrt(width))
    logits = builder.b.op("matmul", [pooled, weight], F16, "classifier.mm")
    builder.b.output(builder.b.op("bias_add", [logits, builder.weight(
        "classifier.b", (labels,), 0.02)], F16, "classifier"))


def build_swin(params: dict[str, Any]) -> tuple[Graph, dict[str, np.ndarray]]:
    """The model's graph and tensors, FP8 scales fitted per role on a calibration image."""
    stages = swin_stages(params)
    tokens = stages[0].side ** 2
    return calibrated_build({**params, "tokens": tokens, "gelu": "erf"}, "swin-l", _build_swin)


def stream_image(params: dict[str, Any], graph: Graph, index: int) -> dict[str, np.ndarray]:
    """Image ``index`` of a stream (``--images``): new pixels as patch rows in raster
    order, and the pooled mean's mixing input."""
    stages = swin_stages(params)
    batch, image, patch = params["batch"], params["image"], params["patch"]
    pixels = rng_for(params["seed"], f"pixels.{index}").uniform(-1.0, 1.0,
                                                                (batch, 3, image, image))
    rows = image_patches(pixels, patch)
    value = graph.by_role("input")[0]
    tokens = stages[-1].side ** 2
    return {value.name: value.type.precision.round_trip(rows).reshape(value.type.shape),
            "pool.mix": _pool_mix(batch, tokens)}


def swin_footprint(params: dict[str, Any]) -> Footprint:
    """Every stage's GEMM weights with the patch embedding's and the attention tables (F16:
    a layer's bias, a shifted block's mask summed in or beside it), and the largest of a
    stage's attention scores (F16) and its first MLP product's input and output."""
    size = 1 if params["precision"] == "fp8" else 2
    stages = swin_stages(params)
    per_layer = [(4 + 2 * params["mlp_ratio"]) * s.dim * s.dim * size for s in stages]
    weights = sum(d * s.depth for d, s in zip(per_layer, stages, strict=True))
    weights += sum(8 * s.dim * s.dim * size for s in stages[:-1])  # the merges' reductions
    weights += 3 * params["patch"] ** 2 * params["dim"] * size
    weights += stages[-1].dim * params["labels"] * size  # the classifier's
    split = split_tables(params["precision"], params["tables"])
    for s in stages:  # F16 bias rows a layer, a shifted block's mask summed in or beside
        windows = (s.side // s.window) ** 2
        shifted = windows + s.heads if split else windows * s.heads  # [T, T] blocks
        weights += sum(s.window ** 4 * 2 * (shifted if s.shift(block) else s.heads)
                       for block in range(s.depth))
    batch = params["batch"]
    largest = max(max(batch * s.side ** 2 * s.heads * s.window ** 2 * 2,
                      batch * s.side ** 2 * s.dim * (1 + params["mlp_ratio"]) * size)
                  for s in stages)
    return Footprint(weights, largest, "a stage's attention scores or MLP input and output",
                     sum(s.depth for s in stages), "depths", max(per_layer))


def _identifier(p: dict[str, Any]) -> str:
    return (f"swin-l-{p['precision']}-b{p['batch']}-i{p['image']}-p{p['patch']}"
            f"-w{p['window']}-d{p['dim']}-n{p['depths'].replace(',', '.')}"
            f"-h{p['stage_heads'].replace(',', '.')}-r{p['mlp_ratio']}{attention_suffix(p, 'fp8')}"
            + ("" if p["tables"] == "auto" else f"-{p['tables']}")
            + (f"-c{p['labels']}" if p["labels"] else ""))


def _fields(p: dict[str, Any]) -> dict[str, Any]:
    stages = swin_stages(p)
    return {"benchmark": f"swin-l-{p['precision']}", "batch": p["batch"], "image": p["image"],
            "patch": p["patch"], "window": p["window"], "tokens": stages[0].side ** 2,
            "rows": p["batch"] * stages[0].side ** 2, "dimension": p["dim"],
            "depths": p["depths"], "heads": p["stage_heads"],
            "layers": sum(s.depth for s in stages), "biases": True,
            "attention": attention_precision(p), "labels": p["labels"]}


register(Workload(
    name="swin-l", description="Swin-L/384 (ByteMLPerf's swin-large-torch-fp32 shape): 4 x 4 "
    "patches, windows of 12, shifted windows, depths 2-2-18-2, patch merging",
    parameters=_parameters(), build=build_swin, identifier=_identifier,
    benchmark_fields=_fields, stream_input=stream_image, footprint=swin_footprint))
