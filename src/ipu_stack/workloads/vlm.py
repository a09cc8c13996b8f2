"""SmolVLM-256M: an image and a prompt in, tokens out (``ipu-stack generate smolvlm-256m``).

HuggingFaceTB/SmolVLM-256M-Instruct's configuration: a SigLIP tower (B/16 at 512: 1,024
patches, width 768, 12 layers, 12 heads, MLP 3,072, GELU tanh, post layer norm), the
pixel-shuffle connector (scale 4: each output row is 16 neighbouring patches' rows side by
side, ``[64, 12,288]``, then one product to the decoder's width, no bias) and the
SmolLM2-135M decoder (vocabulary 49,280).  One 512 x 512 image (no splitting into tiles)
gives 64 image tokens ahead of the prompt's text.  Random weights stand in for every weight.

Two programs: ``--part vision``, the tower and the connector (patches in, the image's 64
rows a sequence out), and the decoder (``workloads/decoder.py``): its prompt's pass reads
the connector's rows at the image's positions (an input added to the token lookup, whose
image-token row holds zeros: the model replaces those positions' embeddings), and its decode
step is SmolLM2-135M's.  The connector's pixel shuffle moves whole rows (each output row
is 16 of the tower's rows side by side), so it is one ``gather_rows`` (an exchange, no
arithmetic) into ``[64, 12,288]`` rows and one product: the program the importer makes of
transformers' ``SmolVLMConnector`` (``frontend/order.py``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from ipu_stack.ir.graph import Graph
from ipu_stack.ir.precision import F16
from ipu_stack.ir.types import RowIndex
from ipu_stack.util.errors import UsageError
from ipu_stack.workloads.base import Parameter, Workload, register
from ipu_stack.workloads.decoder import (
    build_decoder,
    decoder_footprint,
    decoder_parameters,
    prompt_inputs,
    step_inputs,
)
from ipu_stack.workloads.footprint import Footprint, tower_footprint
from ipu_stack.workloads.text import sequence_fields, sequence_identifier
from ipu_stack.workloads.transformer import LayerBuilder, attention_suffix, calibrated_build
from ipu_stack.workloads.vision import tower_into, tower_tokens

# SmolVLM's <image> token, 49,190 of 49,280: 90 rows before the table's end
IMAGE_TOKEN_FROM_END = 90
VISION = {"dim": 768, "heads": 12, "hidden": 3072, "eps": 1e-6, "gelu": "tanh"}


def _parameters() -> tuple[Parameter, ...]:
    decoder = tuple(replace(q, default={"vocab": 49280}.get(q.name, q.default))
                    for q in decoder_parameters())
    return (*decoder,
            Parameter("part", str, "decoder", "the program: the decoder (the prompt's pass "
                      "over the image's rows and the text, or a decode step) or the vision "
                      "tower with the connector", choices=("decoder", "vision")),
            Parameter("image", int, 512, "image side in pixels"),
            Parameter("patch", int, 16, "patch side in pixels (the conv's kernel and stride)"),
            Parameter("shuffle", int, 4, "the connector's pixel-shuffle scale"),
            Parameter("vision_layers", int, 12, "the vision tower's layers"))


def image_tokens(params: dict[str, Any]) -> int:
    """The image's tokens ahead of the text: its patches over the shuffle's square."""
    side, scale = params["image"] // params["patch"], params["shuffle"]
    if side % scale:
        raise UsageError(f"--shuffle {scale} must divide the {side} patches of a side")
    return (side // scale) ** 2


def shuffle_sources(side: int, scale: int) -> np.ndarray:
    """``[side^2 / scale^2, scale^2]``: the patch whose row fills each output row's column
    block, as SmolVLM's ``pixel_shuffle`` moves them (its views and permutes, run here on
    the patch indices)."""
    index = np.arange(side * side).reshape(1, side, side // scale, scale)
    index = index.transpose(0, 2, 1, 3).reshape(1, side // scale, side // scale, scale * scale)
    return index.transpose(0, 2, 1, 3).reshape(-1, scale * scale)


def image_prompt(params: dict[str, Any]) -> tuple[int, int]:
    """The image's tokens ahead of the text, and the token id they hold (``<image>``)."""
    return image_tokens(params), image_token(params)


def image_token(params: dict[str, Any]) -> int:
    if params["vocab"] <= IMAGE_TOKEN_FROM_END:
        raise UsageError(f"--vocab {params['vocab']} has no room for the <image> token "
                         f"({IMAGE_TOKEN_FROM_END} rows before the table's end)")
    return params["vocab"] - IMAGE_TOKEN_FROM_END


def _vision_params(params: dict[str, Any]) -> dict[str, Any]:
    tower = {**params, **VISION, "layers": params["vision_layers"]}
    return {**tower, "tokens": tower_tokens(tower, False)}


def _build_vision(builder: LayerBuilder, seed: int) -> None:
    """The tower, then the connector: the pixel shuffle as one row gather (each output row
    its 16 patches' rows side by side), then one product."""
    p, b = builder.p, builder.b
    rows = tower_into("siglip-vision", builder, seed)
    side, scale, batch = p["image"] // p["patch"], p["shuffle"], p["batch"]
    sources = shuffle_sources(side, scale)
    picks = (np.arange(batch)[:, None, None] * side * side + sources[None]).reshape(-1)
    shuffled = b.op("gather_rows", [rows], F16, "connector.rows", index=RowIndex(picks),
                    group=scale * scale)
    if builder.fp8_at("connector"):
        shuffled = b.op("cast", [shuffled], builder.act("connector.fp8"), "connector.fp8")
    width = p["dim"] * scale * scale
    weight = builder.weight("connector.w", (width, p["model_dim"]), 1.0 / np.sqrt(width))
    b.output(b.op("matmul", [shuffled, weight], F16, "connector.proj"))


def build_vlm(params: dict[str, Any]) -> tuple[Graph, dict[str, np.ndarray]]:
    """The part's graph and tensors: the tower and connector, or the decoder with the
    image's rows ahead of the prompt's text."""
    count = image_tokens(params)
    if params["part"] == "vision":
        vision = {**_vision_params(params), "model_dim": params["dim"]}
        return calibrated_build(vision, "smolvlm-256m-vision", _build_vision)
    decoder = {**params, "image_tokens": count, "image_token": image_token(params)}
    if params["tokens"] > 1:  # the prompt's pass: the image's tokens, then the text's
        decoder["tokens"] = params["tokens"] + count
    return build_decoder("smolvlm-256m", decoder)


def vision_params(params: dict[str, Any]) -> dict[str, Any]:
    """The parameters of the model's image program (``--part vision``)."""
    return {**params, "part": "vision", "tokens": 1, "context": 0, "choose": "host"}


def _footprint(params: dict[str, Any]) -> Footprint:
    """The part's: the tower's layers and patch embedding with the connector's weights (its
    gathered blocks' products), or the decoder's over the image's and the text's tokens."""
    if params["part"] == "vision":
        tower = _vision_params(params)
        connector = tower["dim"] * params["dim"] * params["shuffle"] ** 2 * (
            1 if params["precision"] == "fp8" else 2)
        found = tower_footprint(tower, False)
        return replace(found, weight_bytes=found.weight_bytes + connector,
                       layer_parameter="vision_layers")
    tokens = params["tokens"] + image_tokens(params) if params["tokens"] > 1 else 1
    return decoder_footprint({**params, "tokens": tokens})


def _identifier(params: dict[str, Any]) -> str:
    if params["part"] == "vision":
        return (f"smolvlm-256m-vision-{params['precision']}-b{params['batch']}-i"
                f"{params['image']}-p{params['patch']}-s{params['shuffle']}"
                f"-n{params['vision_layers']}{attention_suffix(params, 'f16')}")
    return sequence_identifier("smolvlm-256m")(params)


def _fields(params: dict[str, Any]) -> dict[str, Any]:
    count = image_tokens(params)
    if params["part"] == "vision":
        vision = _vision_params(params)
        return {"benchmark": f"smolvlm-256m-vision-{params['precision']}",
                "batch": params["batch"], "image": params["image"], "patch": params["patch"],
                "tokens": vision["tokens"], "dimension": vision["dim"],
                "layers": vision["layers"], "part": "vision", "imageTokens": count}
    fields = sequence_fields("smolvlm-256m", False)(params)
    return {**fields, "part": "decoder", "imageTokens": count}


register(Workload(
    name="smolvlm-256m",
    description="SmolVLM-256M: a SigLIP B/16-512 tower, the pixel-shuffle connector (64 image "
    "tokens) and the SmolLM2-135M decoder; ipu-stack generate smolvlm-256m (--part vision: "
    "the tower and connector alone)",
    parameters=_parameters(), build=build_vlm, identifier=_identifier,
    benchmark_fields=_fields, footprint=_footprint, step_inputs=step_inputs, prompt_inputs=prompt_inputs,
    vision=vision_params, image_prompt=image_prompt, positions=8192))
