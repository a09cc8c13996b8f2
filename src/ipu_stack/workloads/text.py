"""Text encoders: token ids in, a causal transformer, the last hidden state out.

* ``clip-text``: the CLIP ViT-L/14 text encoder of Stable Diffusion (the shape ByteMLPerf
  measured on a C600 with PopRT, ``clip-onnx-fp32``): 77 tokens, vocabulary 49,408, width
  768, 12 heads, MLP 3,072, 12 layers, quick GELU (``x sigmoid(1.702 x)``), layer norm eps
  1e-5, a causal mask, the final layer norm.
* ``bert-base`` and ``roberta-base``: the encoders of ByteMLPerf's SQuAD rows at 384 tokens,
  width 768, 12 heads, MLP 3,072, 12 post-norm layers (``LN(x + attention(x))``, then
  ``LN(x + MLP(x))``), exact GELU. BERT (vocabulary 30,522, eps 1e-12) adds a token-type
  lookup (question 0, context 1); RoBERTa (vocabulary 50,265, eps 1e-5) has one token type,
  so its type row and its positions are one constant table (random values stand in for
  both, as for every weight). Every token is real: no padding mask (PopRT's figures are on packed SQuAD,
  which has no padding either). The question-answering head (a 768 x 2 product) is not
  built.

**Embeddings.**  The ids are the program's input (I32, ``[batch, tokens, 1]``); the token
table (F16) is looked up on the device by popops ``MultiSlice`` (``lowering.lookup``), and the
position table (F16, written once per sequence of the batch) is added to it, as CLIP adds
``position_embedding(position_ids)``: its positions are the constant 0..76, so it is a table.
**The mask** is CLIP's causal mask, an additive F16 table (0 on and below the diagonal,
-inf above) the softmax adds (``biased_softmax``), one for every layer. **The pooled
output** is each sequence's first end-of-text row: the host finds the positions in the ids
(host preprocessing, as transformers' CLIP computes them from the ids) and a device lookup
gathers those rows of the final hidden states, as the importer does for ``CLIPTextModel``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from ipu_stack.ir.graph import Graph
from ipu_stack.ir.precision import F16, I32
from ipu_stack.ir.types import TensorType
from ipu_stack.util.errors import UsageError
from ipu_stack.workloads.base import Parameter, Workload, choose_suffix, register, rng_for
from ipu_stack.workloads.footprint import layer_footprint
from ipu_stack.workloads.transformer import (
    ATTENTION_OPTION,
    KEEP_F16,
    QUICK_GELU,
    LayerBuilder,
    attention_precision,
    attention_suffix,
    calibrated_build,
)

BOS, EOS = 49406, 49407  # CLIP's start and end of text


def _parameters() -> tuple[Parameter, ...]:
    return (
        Parameter("batch", int, 1, "sequences per run"),
        Parameter("tokens", int, 77, "tokens per sequence", minimum=2),
        Parameter("vocab", int, 49408, "vocabulary (rows of the token table)", minimum=3),
        Parameter("layers", int, 12, "encoder layers"),
        Parameter("dim", int, 768, "model dimension"),
        Parameter("heads", int, 12, "attention heads"),
        Parameter("hidden", int, 3072, "MLP hidden dimension"),
        Parameter("precision", str, "f16", "GEMM inputs/weights precision", choices=("fp8", "f16")),
        Parameter("eps", float, 1e-5, "layer norm epsilon", minimum=None, positive=True),
        Parameter("seed", int, 0, "seed of inputs and weights", minimum=0, maximum=None),
        ATTENTION_OPTION("f16"), KEEP_F16,
    )


def special_tokens(vocab: int) -> tuple[int, int]:
    """CLIP's start and end of text, the table's last two rows when it is smaller than
    CLIP's (small test sizes keep the two apart, so the pooled row is found)."""
    return min(BOS, vocab - 2), min(EOS, vocab - 1)


def token_ids(seed: int, stream: str, batch: int, tokens: int, vocab: int) -> np.ndarray:
    """Random prompts as CLIP's tokenizer lays them out: start of text, words, end of text,
    then end-of-text padding (``[batch, tokens, 1]``, whole numbers held as float32)."""
    rng = rng_for(seed, stream)
    bos, eos = special_tokens(vocab)
    ids = rng.integers(0, bos, (batch, tokens))
    ends = rng.integers(2, tokens + 1, batch)  # the end-of-text token's position + 1
    for row, end in enumerate(ends):
        ids[row, 0] = bos
        ids[row, end - 1:] = eos
    return ids.reshape(batch, tokens, 1).astype(np.float32)


def end_of_text_rows(ids: np.ndarray, vocab: int) -> np.ndarray:
    """The row of each sequence's first end-of-text token in the ``[B T, D]`` hidden states,
    as CLIP's pooler picks it (``argmax(ids == eos)``): host preprocessing, ``[B, 1]``."""
    batch, tokens = ids.shape[:2]
    position = np.argmax(ids.reshape(batch, tokens) == special_tokens(vocab)[1], axis=-1)
    return (np.arange(batch) * tokens + position).astype(np.float32).reshape(batch, 1)


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
    h = builder.norm(h, "final_ln", F16)
    builder.b.output(h)
    builder.tensors["pooled.rows"] = end_of_text_rows(builder.tensors["ids"], vocab)
    rows = builder.b.input("pooled.rows", TensorType((batch, 1), I32))
    builder.b.output(builder.b.op("embedding", [rows, h], F16, "pooled"))


def build_text(params: dict[str, Any]) -> tuple[Graph, dict[str, np.ndarray]]:
    """The encoder's graph and tensors, FP8 scales (with ``--precision fp8``) fitted per
    role on a calibration prompt."""
    if params["dim"] % params["heads"]:
        raise UsageError(f"--dim {params['dim']} is not a multiple of --heads {params['heads']}")
    return calibrated_build({**params, "gelu": QUICK_GELU}, "clip-text", _build_text)


def stream_prompt(params: dict[str, Any], graph: Graph, index: int) -> dict[str, np.ndarray]:
    """Prompt batch ``index`` of a stream (``--images``): new ids from their own stream."""
    ids = token_ids(params["seed"], f"ids.{index}", params["batch"], params["tokens"],
                    params["vocab"])
    return {"ids": ids, "pooled.rows": end_of_text_rows(ids, params["vocab"])}


def sequence_identifier(kind: str) -> Callable[[dict[str, Any]], str]:
    """The identifier of a token model (text encoders, decoders: ``-kv`` where the
    key/value heads are their own parameter, ``-c`` a KV cache's positions)."""
    def make(p: dict[str, Any]) -> str:
        kv = f"-kv{p['kv_heads']}" if "kv_heads" in p else ""
        kv += f"-hd{p['head_dim']}" if p.get("head_dim") else ""  # a head's own width (Qwen3)
        kv += "-qk" if p.get("qk_norm") == "heads" else ""  # its q and k normalised a head
        cache = f"-c{p['context']}" if p.get("context") else ""
        return (f"{kind}-{p['precision']}-b{p['batch']}-t{p['tokens']}{cache}-v{p['vocab']}"
                f"-d{p['dim']}-h{p['heads']}{kv}-f{p['hidden']}-n{p['layers']}"
                f"{attention_suffix(p, 'f16')}{choose_suffix(p)}")
    return make


def sequence_fields(kind: str, biases: bool = True) -> Callable[[dict[str, Any]],
                                                                 dict[str, Any]]:
    """A token model's record fields (``kvHeads`` where they are their own parameter)."""
    def make(p: dict[str, Any]) -> dict[str, Any]:
        kv = {"kvHeads": p["kv_heads"]} if "kv_heads" in p else {}
        return {"benchmark": f"{kind}-{p['precision']}", "batch": p["batch"],
                "tokens": p["tokens"], **({"context": p["context"]} if p.get("context")
                                          else {}),
                "rows": p["batch"] * p["tokens"],
                "vocabulary": p["vocab"], "dimension": p["dim"], "heads": p["heads"], **kv,
                "hiddenDimension": p["hidden"], "layers": p["layers"], "biases": biases,
                "attention": attention_precision(p)}
    return make


def _footprint(extra_rows: int) -> Callable[[dict[str, Any]], Any]:
    """The layers' GEMM weights and the lookup tables (F16: the vocabulary and
    ``extra_rows`` more, BERT's token types): at least what the chip holds."""
    def make(params: dict[str, Any]) -> Any:
        return layer_footprint(params, params["layers"], "layers", params["tokens"],
                               (params["vocab"] + extra_rows) * params["dim"] * 2)
    return make


def bert_inputs(seed: int, stream: str, batch: int, tokens: int, vocab: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """SQuAD-like ids and token types, ``[batch, tokens, 1]`` each: ``[CLS]`` question
    ``[SEP]`` context ``[SEP]``, the question's tokens of type 0 and the context's of type 1."""
    rng = rng_for(seed, stream)
    cls, sep = min(101, vocab - 2), min(102, vocab - 1)  # [CLS], [SEP]
    ids = rng.integers(min(1000, vocab // 2), vocab, (batch, tokens))
    types = np.ones((batch, tokens), dtype=np.int64)
    for row in range(batch):
        question = min(int(rng.integers(4, max(5, tokens // 6))), tokens - 3)
        ids[row, 0], ids[row, question + 1], ids[row, -1] = cls, sep, sep
        types[row, : question + 2] = 0
    return (ids.reshape(batch, tokens, 1).astype(np.float32),
            types.reshape(batch, tokens, 1).astype(np.float32))


def _post_norm_layer(builder: LayerBuilder, x: int, index: int) -> int:
    """``LN(x + attention(x))`` then ``LN(x + MLP(x))``: BERT's post-norm layer. The GEMMs
    read the residual stream itself (cast to FP8 first with ``--precision fp8``)."""
    p, b = builder.p, builder.b
    prefix = f"layer{index}"

    def gemm_input(value: int, name: str) -> int:
        return b.op("cast", [value], builder.act(name), name) if builder.fp8_at(name) else value

    a = builder.attention(gemm_input(x, f"{prefix}.in"), f"{prefix}.attn", rope=False,
                          bias=True)
    x = builder.norm(b.op("add", [x, a], F16, f"{prefix}.residual1"), f"{prefix}.ln1", F16)
    f1 = builder.linear(gemm_input(x, f"{prefix}.mid"), p["dim"], p["hidden"],
                        f"{prefix}.fc1", F16, True)
    g = b.op("gelu", [f1], builder.act(f"{prefix}.gelu"), f"{prefix}.gelu", approximate="none")
    m = builder.linear(g, p["hidden"], p["dim"], f"{prefix}.fc2", F16, True)
    return builder.norm(b.op("add", [x, m], F16, f"{prefix}.residual2"), f"{prefix}.ln2", F16)


def _build_bert(kind: str, builder: LayerBuilder, seed: int) -> None:
    """Word (and, for BERT, token-type) lookups, positions, the embedding norm, the layers."""
    p, b = builder.p, builder.b
    batch, tokens, dim, vocab = p["batch"], p["tokens"], p["dim"], p["vocab"]
    ids_values, types_values = bert_inputs(seed, "ids", batch, tokens, vocab)
    builder.tensors["ids"] = ids_values
    ids = b.input("ids", TensorType((batch, tokens, 1), I32))
    words = builder.weight("word_embeddings", (vocab, dim), 0.02, precision=F16)
    h = b.op("embedding", [ids, words], F16, "word_embeddings.out")
    if kind == "bert-base":
        builder.tensors["token_types"] = types_values
        types = b.input("token_types", TensorType((batch, tokens, 1), I32))
        table = builder.weight("token_type_embeddings", (2, dim), 0.02, precision=F16)
        h = b.op("add", [h, b.op("embedding", [types, table], F16,
                                 "token_type_embeddings.out")], F16, "embeddings.sum")
    positions = rng_for(p["seed"], "pos").standard_normal((tokens, dim)) * 0.02
    builder.tensors["pos"] = F16.round_trip(np.tile(positions, (batch, 1)).astype(np.float32))
    pos = b.weight("pos", TensorType((batch * tokens, dim), F16))
    h = builder.norm(b.op("add", [h, pos], F16, "embed"), "embeddings.ln", F16)
    for index in range(p["layers"]):
        h = _post_norm_layer(builder, h, index)
    b.output(h)


def build_bert(kind: str, params: dict[str, Any]) -> tuple[Graph, dict[str, np.ndarray]]:
    """A BERT-family encoder's graph and tensors."""
    if params["dim"] % params["heads"]:
        raise UsageError(f"--dim {params['dim']} is not a multiple of --heads {params['heads']}")
    return calibrated_build(params, kind, lambda builder, seed: _build_bert(kind, builder, seed))


def stream_squad(kind: str, params: dict[str, Any], graph: Graph, index: int
                 ) -> dict[str, np.ndarray]:
    """Batch ``index`` of a stream (``--images``): new ids and types from their own stream."""
    ids, types = bert_inputs(params["seed"], f"ids.{index}", params["batch"],
                             params["tokens"], params["vocab"])
    return {"ids": ids, "token_types": types} if kind == "bert-base" else {"ids": ids}


def _bert_parameters(vocab: int, eps: float) -> tuple[Parameter, ...]:
    defaults = {"tokens": 384, "vocab": vocab, "eps": eps}
    least = {"tokens": 4}  # [CLS], a question token, [SEP], a context token
    return tuple(replace(q, default=defaults.get(q.name, q.default),
                         minimum=least.get(q.name, q.minimum)) for q in _parameters())


def _register_bert(kind: str, description: str, vocab: int, eps: float) -> None:
    register(Workload(
        name=kind, description=description, parameters=_bert_parameters(vocab, eps),
        build=lambda params: build_bert(kind, params), identifier=sequence_identifier(kind),
        benchmark_fields=sequence_fields(kind),
        stream_input=lambda params, graph, index: stream_squad(kind, params, graph, index),
        footprint=_footprint(2 if kind == "bert-base" else 0)))


register(Workload(
    name="clip-text", description="CLIP ViT-L/14 text encoder of Stable Diffusion (ByteMLPerf's "
    "clip-onnx-fp32 shape): token ids, 77 tokens, width 768, 12 causal layers, quick GELU",
    parameters=_parameters(), build=build_text, identifier=sequence_identifier("clip-text"),
    benchmark_fields=sequence_fields("clip-text"), stream_input=stream_prompt,
    footprint=_footprint(0)))
_register_bert("bert-base", "BERT-base encoder for SQuAD (ByteMLPerf's bert-torch-fp32 shape): "
               "384 tokens, word and token-type lookups, 12 post-norm layers", 30522, 1e-12)
_register_bert("roberta-base", "RoBERTa-base encoder for SQuAD (ByteMLPerf's roberta-torch-fp32 "
               "shape): 384 tokens, a word lookup, 12 post-norm layers", 50265, 1e-5)
