"""Text encoders: token ids in, a causal transformer, the last hidden state out.

* ``clip-text``: the CLIP ViT-L/14 text encoder of Stable Diffusion (the shape ByteMLPerf
  measured on a C600 with PopRT, ``clip-onnx-fp32``): 77 tokens, vocabulary 49,408, width
  768, 12 heads, MLP 3,072, 12 layers, quick GELU (``x sigmoid(1.702 x)``), layer norm eps
  1e-5, a causal mask, the final layer norm.

**Embeddings.**  The ids are the program's input (I32, ``[batch, tokens, 1]``); the token
table (F16) is looked up on the device by popops ``MultiSlice`` (``lowering.lookup``), and the
position table (F16, written once per sequence of the batch) is added to it, as CLIP adds
``position_embedding(position_ids)``: its positions are the constant 0..76, so it is a table.
**The mask** is CLIP's causal mask, an additive F16 table (0 on and below the diagonal,
-inf above) the softmax adds (``biased_softmax``), one for every layer. The pooled output
(the end-of-text token's row, a data-dependent gather) is not built.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ipu_stack.ir.graph import Graph
from ipu_stack.ir.precision import F16, Precision
from ipu_stack.ir.types import TensorType
from ipu_stack.util.errors import UsageError
from ipu_stack.workloads.base import Parameter, Workload, register, rng_for
from ipu_stack.workloads.footprint import layer_footprint
from ipu_stack.workloads.transformer import (
    ATTENTION_OPTION,
    QUICK_GELU,
    LayerBuilder,
    attention_precision,
    attention_suffix,
    calibrated_build,
)

I32 = Precision("I32")
BOS, EOS = 49406, 49407  # CLIP's start and end of text


def _parameters() -> tuple[Parameter, ...]:
    return (
        Parameter("batch", int, 1, "sequences per run"),
        Parameter("tokens", int, 77, "tokens per sequence"),
        Parameter("vocab", int, 49408, "vocabulary (rows of the token table)"),
        Parameter("layers", int, 12, "encoder layers"),
        Parameter("dim", int, 768, "model dimension"),
        Parameter("heads", int, 12, "attention heads"),
        Parameter("hidden", int, 3072, "MLP hidden dimension"),
        Parameter("precision", str, "f16", "GEMM inputs/weights precision", choices=("fp8", "f16")),
        Parameter("eps", float, 1e-5, "layer norm epsilon", minimum=None),
        Parameter("seed", int, 0, "seed of inputs and weights", minimum=0, maximum=None),
        ATTENTION_OPTION("f16"),
    )


def token_ids(seed: int, stream: str, batch: int, tokens: int, vocab: int) -> np.ndarray:
    """Random prompts as CLIP's tokenizer lays them out: start of text, words, end of text,
    then end-of-text padding (``[batch, tokens, 1]``, whole numbers held as float32)."""
    rng = rng_for(seed, stream)
    ids = rng.integers(0, min(vocab, BOS), (batch, tokens))
    ends = rng.integers(2, tokens + 1, batch)  # the end-of-text token's position + 1
    for row, end in enumerate(ends):
        ids[row, 0] = min(BOS, vocab - 1)
        ids[row, end - 1:] = min(EOS, vocab - 1)
    return ids.reshape(batch, tokens, 1).astype(np.float32)


def causal_mask(batch: int, heads: int, tokens: int) -> np.ndarray:
    """CLIP's additive causal mask laid out as the scores are, ``[B H T, T]``."""
    upper = np.triu(np.ones((tokens, tokens), dtype=bool), 1)
    table = np.where(upper, -np.inf, 0.0).astype(np.float32)
    return np.tile(table, (batch * heads, 1))


def _build_text(builder: LayerBuilder, seed: int) -> None:
    """Embeddings, the causal layers and the final norm into ``builder``."""
    p = builder.p
    batch, tokens, dim, vocab = p["batch"], p["tokens"], p["dim"], p["vocab"]
    builder.tensors["ids"] = token_ids(seed, "ids", batch, tokens, vocab)
    ids = builder.b.input("ids", TensorType((batch, tokens, 1), I32))
    table = builder.weight("token_embedding", (vocab, dim), 0.02, precision=F16)
    tokens_in = builder.b.op("embedding", [ids, table], F16, "token_embedding.out")
    positions = rng_for(p["seed"], "pos").standard_normal((tokens, dim)) * 0.01
    builder.tensors["pos"] = F16.round_trip(np.tile(positions, (batch, 1)).astype(np.float32))
    pos = builder.b.weight("pos", TensorType((batch * tokens, dim), F16))
    h = builder.b.op("add", [tokens_in, pos], F16, "embed")
    builder.tensors["causal_mask"] = causal_mask(batch, p["heads"], tokens)
    builder.mask = builder.b.weight("causal_mask", TensorType(
        builder.tensors["causal_mask"].shape, F16))
    for index in range(p["layers"]):
        h = builder.layer(h, index, rope=False)
    builder.b.output(builder.norm(h, "final_ln", F16))


def build_text(params: dict[str, Any]) -> tuple[Graph, dict[str, np.ndarray]]:
    """The encoder's graph and tensors, FP8 scales (with ``--precision fp8``) fitted per
    role on a calibration prompt."""
    if params["dim"] % params["heads"]:
        raise UsageError(f"--dim {params['dim']} is not a multiple of --heads {params['heads']}")
    return calibrated_build({**params, "gelu": QUICK_GELU}, "clip-text", _build_text)


def stream_prompt(params: dict[str, Any], graph: Graph, index: int) -> dict[str, np.ndarray]:
    """Prompt batch ``index`` of a stream (``--images``): new ids from their own stream."""
    return {"ids": token_ids(params["seed"], f"ids.{index}", params["batch"],
                             params["tokens"], params["vocab"])}


def _identifier(p: dict[str, Any]) -> str:
    return (f"clip-text-{p['precision']}-b{p['batch']}-t{p['tokens']}-v{p['vocab']}-d{p['dim']}"
            f"-h{p['heads']}-f{p['hidden']}-n{p['layers']}{attention_suffix(p, 'f16')}")


def _fields(p: dict[str, Any]) -> dict[str, Any]:
    return {"benchmark": f"clip-text-{p['precision']}", "batch": p["batch"],
            "tokens": p["tokens"], "rows": p["batch"] * p["tokens"], "vocabulary": p["vocab"],
            "dimension": p["dim"], "heads": p["heads"], "hiddenDimension": p["hidden"],
            "layers": p["layers"], "biases": True, "attention": attention_precision(p)}


def _footprint(params: dict[str, Any]) -> Any:
    """The layers' GEMM weights and the token table (F16): at least what the chip holds."""
    return layer_footprint(params, params["layers"], "layers", params["tokens"],
                           params["vocab"] * params["dim"] * 2)


register(Workload(
    name="clip-text", description="CLIP ViT-L/14 text encoder of Stable Diffusion (ByteMLPerf's "
    "clip-onnx-fp32 shape): token ids, 77 tokens, width 768, 12 causal layers, quick GELU",
    parameters=_parameters(), build=build_text, identifier=_identifier,
    benchmark_fields=_fields, stream_input=stream_prompt, footprint=_footprint))
