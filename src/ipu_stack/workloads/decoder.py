"""Decoder language models: a prompt's pass (prefill), token ids in, logits out.

* ``smollm2-135m``: HuggingFaceTB/SmolLM2-135M's configuration (the Llama family): a
  49,152-row token table, 30 layers of width 576, 9 query and 3 key/value heads of 64,
  SwiGLU 1,536, RMS norm (eps 1e-5), RoPE (theta 100,000, ``rotate_half`` pairs), a causal
  mask, the final norm and the LM head; random weights stand in for every weight.

With ``--context S`` the graph is the decode step instead: one new token a sequence, each
layer's keys and values written into a KV cache of ``S`` positions (a resident state the
step updates in place, ``cache_write``) and attention over the whole cache, positions after
the token's masked.  The host gives each step its token, its cache slots, the mask row and
the RoPE angles of its position (:func:`step_inputs`).
* ``tinyllama-1.1b``: TinyLlama/TinyLlama-1.1B's: a 32,000-row table, 22 layers of width
  2,048, 32 query and 4 key/value heads, SwiGLU 5,632, RoPE theta 10,000; its FP8 weights
  (1.2 GB) need two chips.

The layer is the graph ``LlamaForCausalLM`` imports to (docs/frontend.md), operation for
operation: RMS norm; the q, k and v products; grouped-query attention's key and value heads
repeated by a 0/1 selection product; RoPE on the queries and the repeated keys; the scores,
the causal softmax, the context, the output product and the residual; RMS norm, the gate
and up products, SwiGLU, the down product and the residual.  So the builtin and an exported
model of the same shape take the same cycles, and benchmarks need no torch.  The decode
step reads the cache's key/value heads directly (``head_matmul``'s ``kv_heads``), with no
repeat.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ipu_stack.ir.graph import POSITION_GRAIN, Graph, choose_on_device
from ipu_stack.ir.precision import F16, F32, I32, Precision
from ipu_stack.ir.rope_pairs import interleave_rope_pairs
from ipu_stack.ir.types import TensorType
from ipu_stack.util.errors import UsageError
from ipu_stack.workloads.base import CHOOSE, Parameter, Workload, register, rng_for
from ipu_stack.workloads.footprint import Footprint
from ipu_stack.workloads.text import causal_mask, sequence_fields, sequence_identifier
from ipu_stack.workloads.transformer import (
    ATTENTION_OPTION,
    KEEP_F16,
    LayerBuilder,
    calibrated_build,
)


def decoder_parameters() -> tuple[Parameter, ...]:
    """A decoder's options (defaults: SmolLM2-135M's)."""
    return (
        Parameter("batch", int, 1, "sequences per run"),
        Parameter("tokens", int, 128, "prompt tokens per sequence", minimum=1),
        Parameter("context", int, 0, "KV cache positions (rounded up to 32): with --tokens 1 "
                  "the decode step, else the prompt's pass filling the cache (0: no cache)",
                  minimum=0),
        Parameter("vocab", int, 49152, "vocabulary (rows of the token table)", minimum=2),
        Parameter("layers", int, 30, "decoder layers"),
        Parameter("dim", int, 576, "model dimension"),
        Parameter("heads", int, 9, "query heads"),
        Parameter("kv_heads", int, 3, "key/value heads (grouped-query attention)"),
        Parameter("head_dim", int, 0, "width of a head (0: --dim over --heads; Qwen3's are "
                  "wider)", minimum=0),
        Parameter("qk_norm", str, "none", "an RMS norm of each head of q and k before RoPE "
                  "(Qwen3's)", choices=("none", "heads")),
        Parameter("hidden", int, 1536, "SwiGLU hidden dimension"),
        Parameter("precision", str, "fp8", "GEMM inputs/weights precision", choices=("fp8", "f16")),
        Parameter("eps", float, 1e-5, "RMS norm epsilon", minimum=None, positive=True),
        Parameter("theta", float, 100000.0, "RoPE base", minimum=None, positive=True),
        Parameter("seed", int, 0, "seed of inputs and weights", minimum=0, maximum=None),
        CHOOSE,
        ATTENTION_OPTION("f16"), KEEP_F16,
    )


def head_width(params: dict[str, Any]) -> int:
    """A head's width: ``--head-dim``, or the model's width over its heads."""
    return int(params.get("head_dim") or params["dim"] // params["heads"])


def rope_1d_tables(batch: int, tokens: int, head_dim: int, theta: float
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Llama's RoPE angles, ``position * theta^(-2i/d)``, one row a token of every
    sequence (``[B T, d/2]`` cos and sin, float32)."""
    inverse = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.outer(np.arange(tokens), inverse)
    return (np.tile(np.cos(angles), (batch, 1)).astype(np.float32),
            np.tile(np.sin(angles), (batch, 1)).astype(np.float32))


def head_selection(kv_heads: int, repeats: int, head_dim: int) -> np.ndarray:
    """The 0/1 ``[kv d, kv n d]`` matrix that repeats each key/value head ``n`` times."""
    select = np.zeros((kv_heads * head_dim, kv_heads * repeats * head_dim), np.float32)
    for head in range(kv_heads * repeats):
        group = head // repeats
        select[group * head_dim:(group + 1) * head_dim,
               head * head_dim:(head + 1) * head_dim] = np.eye(head_dim)
    return select


@dataclass(frozen=True)
class StepValues:
    """A decode step's host inputs every layer reads (value ids): the cache slots, the
    additive mask row of each head, the RoPE angles of the step's position."""

    slots: int
    mask: int
    cos: int
    sin: int


class DecoderLayers:
    """The decoder's layers into a :class:`LayerBuilder`'s graph."""

    def __init__(self, builder: LayerBuilder) -> None:
        self.builder, self.b, self.p = builder, builder.b, builder.p
        p = self.p
        self.head_dim = head_width(p)
        self.width = p["heads"] * self.head_dim  # q's and the context's (Qwen3: not dim)
        self.repeats = p["heads"] // p["kv_heads"]
        self.mask: int | None = None  # the causal mask, one table every layer reads

    def causal_mask(self) -> int:
        """The prompt's causal mask (``[B H T, T]``, F16): the layers share one table, as
        an imported model's layers share the one its program builds."""
        if self.mask is None:
            p = self.p
            self.mask = self.constant("causal_mask", causal_mask(p["batch"], p["heads"],
                                                                 p["tokens"]), F16)
        return self.mask

    def constant(self, name: str, values: np.ndarray, precision: Precision) -> int:
        """A weight whose values the model defines (tables, the selection matrix)."""
        self.builder.tensors[name] = precision.round_trip(values)
        return self.b.weight(name, TensorType(values.shape, precision))

    def rms_norm(self, x: int, name: str) -> int:
        """RMS norm, F16, and (with FP8) its cast for the products that read it."""
        gamma = self.builder.weight(f"{name}.gamma", (self.p["dim"],), 0.1, offset=1.0)
        return self.gemm_input(self.b.op("rms_norm", [x, gamma], F16, f"{name}.out",
                                         eps=self.p["eps"]), f"{name}.fp8")

    def head_norm(self, x: int, name: str, heads: int) -> int:
        """Qwen3's RMS norm of each head of q or k (``--qk-norm heads``): one head's scale
        for every head, as the importer maps ``q_norm`` and ``k_norm``."""
        if self.p["qk_norm"] != "heads":
            return x
        d = self.head_dim
        one_head = rng_for(self.p["seed"], f"{name}.gamma").normal(1.0, 0.1, d)
        gamma = self.constant(f"{name}.gamma", np.tile(one_head, heads), F16)
        return self.b.op("rms_norm", [x, gamma], F16, f"{name}.out", eps=self.p["eps"], group=d)

    def gemm_input(self, value: int, name: str) -> int:
        """``value`` cast to FP8 where the products run FP8, as the importer casts them."""
        builder = self.builder
        return self.b.op("cast", [value], builder.act(name), name) if builder.fp8_at(name) \
            else value

    def linear(self, x: int, din: int, dout: int, name: str, out: Precision = F16) -> int:
        return self.builder.linear(x, din, dout, name, out, bias=False)

    def attention(self, h: int, prefix: str, tables: tuple[int, int]) -> int:
        p, b, d = self.p, self.b, self.head_dim
        q, k, v = self.projections(h, prefix)
        select = head_selection(p["kv_heads"], self.repeats, d)
        cos, sin = tables
        if p["context"]:  # the keys turned before they are repeated, and both kept
            k = b.op("rope", [k, cos, sin], F16, f"{prefix}.k.rope", head_dim=d,
                     pairs="halves")
            self.fill_cache(prefix, k, v)
        k = b.op("matmul", [k, self.constant(f"{prefix}.k.select", select, F16)], F16,
                 f"{prefix}.k.repeat")
        v = b.op("matmul", [v, self.constant(f"{prefix}.v.select", select, F16)], F16,
                 f"{prefix}.v.repeat")
        q = b.op("rope", [q, cos, sin], F16, f"{prefix}.q.rope", head_dim=d, pairs="halves")
        if not p["context"]:
            k = b.op("rope", [k, cos, sin], F16, f"{prefix}.k.rope", head_dim=d,
                     pairs="halves")
        scores = b.op("head_matmul", [q, k], F16, f"{prefix}.scores", mode="qk",
                      heads=p["heads"], tokens=p["tokens"])
        probs = b.op("biased_softmax", [scores, self.causal_mask()], F16, f"{prefix}.probs",
                     scale=1.0 / float(np.sqrt(d)))
        context = b.op("head_matmul", [probs, v], F16, f"{prefix}.context", mode="pv",
                       heads=p["heads"], tokens=p["tokens"])
        return self.linear(self.gemm_input(context, f"{prefix}.context.fp8"), self.width,
                           p["dim"], f"{prefix}.o")

    def projections(self, h: int, prefix: str) -> tuple[int, int, int]:
        """q, k and v of the layer's normalised rows (q and k each normalised a head at a
        time with ``--qk-norm heads``), in the importer's order."""
        p = self.p
        kv = p["kv_heads"] * self.head_dim
        q = self.head_norm(self.linear(h, p["dim"], self.width, f"{prefix}.q"),
                           f"{prefix}.q_norm", p["heads"])
        k = self.head_norm(self.linear(h, p["dim"], kv, f"{prefix}.k"), f"{prefix}.k_norm",
                           p["kv_heads"])
        return q, k, self.linear(h, p["dim"], kv, f"{prefix}.v")

    def cache_state(self, prefix: str, name: str) -> int:
        """The layer's key or value cache (``[batch x context, kv heads x head width]``,
        F16), a resident state whose initial bytes are zeros."""
        p = self.p
        shape = (p["batch"] * cache_positions(p), p["kv_heads"] * self.head_dim)
        return self.constant(f"{prefix}.{name}_cache", np.zeros(shape, np.float32), F16)

    def fill_cache(self, prefix: str, keys: int, values: int) -> None:
        """The prompt's keys (turned) and values written into the layer's caches at the
        positions they fill, for the decode steps after it."""
        for name, rows in (("k", keys), ("v", values)):
            self.b.op("cache_fill", [self.cache_state(prefix, name), rows], F16,
                      f"{prefix}.{name}_cache.filled", positions=cache_positions(self.p),
                      kv_heads=self.p["kv_heads"])

    def cached_attention(self, h: int, prefix: str, step: StepValues) -> int:
        """One new token's attention: its key and value rows written into the layer's cache
        at the step's slots, then its query against every cached position."""
        p, b, d = self.p, self.b, self.head_dim
        positions = cache_positions(p)
        q, k, v = self.projections(h, prefix)
        q = b.op("rope", [q, step.cos, step.sin], F16, f"{prefix}.q.rope", head_dim=d,
                 pairs="halves")
        k = b.op("rope", [k, step.cos, step.sin], F16, f"{prefix}.k.rope", head_dim=d,
                 pairs="halves")
        cached = []
        for name, rows in (("k", k), ("v", v)):
            cached.append(b.op("cache_write", [self.cache_state(prefix, name), rows,
                                               step.slots], F16,
                               f"{prefix}.{name}_cache.written", positions=positions,
                               kv_heads=p["kv_heads"]))
        heads = {"heads": p["heads"], "tokens": 1, "kv_heads": p["kv_heads"],
                 "kv_tokens": positions}
        scores = b.op("head_matmul", [q, cached[0]], F16, f"{prefix}.scores", mode="qk",
                      **heads)
        probs = b.op("biased_softmax", [scores, step.mask], F16, f"{prefix}.probs",
                     scale=1.0 / float(np.sqrt(d)))
        context = b.op("head_matmul", [probs, cached[1]], F16, f"{prefix}.context",
                       mode="pv", **heads)
        return self.linear(self.gemm_input(context, f"{prefix}.context.fp8"), self.width,
                           p["dim"], f"{prefix}.o")

    def layer(self, x: int, index: int, tables: tuple[int, int] | StepValues) -> int:
        p, b, prefix = self.p, self.b, f"layer{index}"
        act = self.builder.act
        h = self.rms_norm(x, f"{prefix}.ln1")
        attended = self.cached_attention(h, f"{prefix}.attn", tables) \
            if isinstance(tables, StepValues) else self.attention(h, f"{prefix}.attn", tables)
        x = b.op("add", [x, attended], F16, f"{prefix}.residual1")
        h = self.rms_norm(x, f"{prefix}.ln2")
        gate = self.linear(h, p["dim"], p["hidden"], f"{prefix}.gate")
        up = self.linear(h, p["dim"], p["hidden"], f"{prefix}.up")
        g = b.op("swiglu", [gate, up], act(f"{prefix}.swiglu"), f"{prefix}.swiglu")
        down = self.linear(g, p["hidden"], p["dim"], f"{prefix}.down")
        return b.op("add", [x, down], F16, f"{prefix}.residual2")


def token_ids(seed: int, stream: str, batch: int, tokens: int, vocab: int) -> np.ndarray:
    """A random prompt (``[batch, tokens, 1]`` ids, whole numbers held as float32)."""
    ids = rng_for(seed, stream).integers(0, vocab, (batch, tokens, 1))
    return ids.astype(np.float32)


def _build(builder: LayerBuilder, seed: int) -> None:
    p, b = builder.p, builder.b
    layers = DecoderLayers(builder)
    batch, tokens, dim = p["batch"], p["tokens"], p["dim"]
    builder.tensors["ids"] = token_ids(seed, "ids", batch, tokens, p["vocab"])
    ids = b.input("ids", TensorType((batch, tokens, 1), I32))
    h = b.op("embedding", [ids, token_table(layers)], F16, "token_embedding.out")
    if p.get("image_tokens"):  # a VLM's prompt: the connector's rows where the image is
        builder.tensors["ids"][:, :p["image_tokens"]] = p["image_token"]
        builder.tensors["image"] = image_rows(batch, tokens, rng_for(seed, "image").normal(
            0.0, 0.5, (batch, p["image_tokens"], dim)))
        h = b.op("add", [h, b.input("image", TensorType((batch, tokens, dim), F16))], F16,
                 "image_embedding")
    cos, sin = rope_1d_tables(batch, tokens, layers.head_dim, p["theta"])
    tables = (layers.constant("rope.cos", cos, F32), layers.constant("rope.sin", sin, F32))
    for index in range(p["layers"]):
        h = layers.layer(h, index, tables)
    if p["context"]:  # filling a cache for the steps after: only the last token's logits
        builder.tensors["last"] = last_rows(batch, tokens)
        last = b.input("last", TensorType((batch, 1, 1), I32))
        h = b.op("embedding", [last, h], F16, "last_token")
    h = layers.rms_norm(h, "final_norm")
    lm_head(builder, h)


def lm_head(builder: LayerBuilder, h: int) -> None:
    """The logits, the program's output (``--choose device`` follows them by an argmax:
    :func:`~ipu_stack.ir.graph.choose_on_device`)."""
    p = builder.p
    builder.b.output(builder.b.op("matmul", [h, builder.weight(
        "lm_head.w", (p["dim"], p["vocab"]), 1.0 / np.sqrt(p["dim"]))], F16, "logits"))


def token_table(layers: DecoderLayers) -> int:
    """The token table; a VLM's (``image_token`` set) holds zeros in the image token's row,
    so the image's positions take the connector's rows as they are (the model replaces
    their embeddings with them)."""
    builder, p = layers.builder, layers.p
    if p.get("image_token") is None:
        return builder.weight("token_embedding", (p["vocab"], p["dim"]), 0.02, precision=F16)
    table = rng_for(p["seed"], "token_embedding").normal(0.0, 0.02, (p["vocab"], p["dim"]))
    table[p["image_token"]] = 0.0
    return layers.constant("token_embedding", table.astype(np.float32), F16)


def image_rows(batch: int, tokens: int, image: np.ndarray) -> np.ndarray:
    """A VLM prompt's ``image`` input ``[batch, tokens, dim]``: the connector's rows
    (``[batch, n, dim]``) at the first ``n`` positions, zeros at the text's."""
    rows = np.zeros((batch, tokens, image.shape[-1]), np.float32)
    rows[:, :image.shape[1]] = np.asarray(image, np.float32).reshape(batch, -1, image.shape[-1])
    return rows


def last_rows(batch: int, tokens: int) -> np.ndarray:
    """Each sequence's last row of a prompt's pass (``[batch, 1, 1]``, whole numbers)."""
    return (np.arange(batch) * tokens + tokens - 1).astype(np.float32).reshape(batch, 1, 1)


def prompt_inputs(params: dict[str, Any], prompt: np.ndarray, image: np.ndarray | None = None
                  ) -> dict[str, np.ndarray]:
    """The inputs of the prompt's pass that fills the KV cache: the prompt's ids
    (``[batch, tokens]``) and each sequence's last row; for a VLM, the connector's rows
    ``image`` (``[batch x n, dim]``) at the image's positions."""
    batch, tokens = prompt.shape
    inputs = {"ids": prompt.astype(np.float32).reshape(batch, tokens, 1),
              "last": last_rows(batch, tokens)}
    if image is not None:
        inputs["image"] = image_rows(batch, tokens, image.reshape(batch, -1, image.shape[-1]))
    return inputs


def cache_positions(params: dict[str, Any]) -> int:
    """The KV cache's positions: ``--context`` rounded up to whole blocks of the cache's
    holders (``ir.graph.POSITION_GRAIN``); the ones past it stay masked."""
    return -(-params["context"] // POSITION_GRAIN) * POSITION_GRAIN


def step_inputs(params: dict[str, Any], tokens: np.ndarray, position: int, first: int = 0
                ) -> dict[str, np.ndarray]:
    """The decode step's inputs for ``tokens`` (one id a sequence) at ``position``: the ids,
    each sequence's cache row (``b x context + first + position``), the mask row (every
    position before ``first`` or after ``first + position`` masked), and the position's RoPE
    angles.  ``first`` is where the sequence's positions begin in its cache: a micro-batch's
    range when several micro-batches share the cache (``generation``), 0 otherwise."""
    batch, positions, heads = params["batch"], cache_positions(params), params["heads"]
    if not 0 <= first + position < params["context"] or position < 0:
        raise UsageError(f"position {first + position} is outside the KV cache's "
                         f"{params['context']} positions")
    ids = np.asarray(tokens, dtype=np.float32).reshape(batch, 1, 1)
    slots = (np.arange(batch) * positions + first + position).astype(np.float32).reshape(
        batch, 1, 1)
    seen = np.arange(positions) - first
    row = np.where((seen < 0) | (seen > position), -np.inf, 0.0).astype(np.float32)
    head_dim = head_width(params)
    inverse = 1.0 / params["theta"] ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.tile(position * inverse, (batch, 1))
    return {"ids": ids, "slots": slots, "mask": np.tile(row, (batch * heads, 1)),
            "rope.cos": np.cos(angles).astype(np.float32),
            "rope.sin": np.sin(angles).astype(np.float32)}


def _build_step(builder: LayerBuilder, seed: int) -> None:
    """The decode step's graph: the step's inputs (:func:`step_inputs`, a random token at
    position 0 by default), every layer over its KV cache, the final norm and the logits."""
    p, b = builder.p, builder.b
    layers = DecoderLayers(builder)
    batch, heads = p["batch"], p["heads"]
    first = rng_for(seed, "ids").integers(0, p["vocab"], batch)
    inputs = step_inputs(p, first, 0)
    builder.tensors.update(inputs)
    ids = b.input("ids", TensorType((batch, 1, 1), I32))
    step = StepValues(
        b.input("slots", TensorType((batch, 1, 1), I32)),
        b.input("mask", TensorType((batch * heads, cache_positions(p)), F16)),
        b.input("rope.cos", TensorType(inputs["rope.cos"].shape, F32)),
        b.input("rope.sin", TensorType(inputs["rope.sin"].shape, F32)))
    h = b.op("embedding", [ids, token_table(layers)], F16, "token_embedding.out")
    for index in range(p["layers"]):
        h = layers.layer(h, index, step)
    h = layers.rms_norm(h, "final_norm")
    lm_head(builder, h)


def build_decoder(kind: str, params: dict[str, Any]) -> tuple[Graph, dict[str, np.ndarray]]:
    """The prefill graph and tensors, FP8 scales fitted per role on a calibration prompt;
    with ``context``, the decode step, calibrated on the model's prompt pass."""
    if (params["dim"] % params["heads"] and not params["head_dim"]) or \
            params["heads"] % params["kv_heads"]:
        raise UsageError(f"--heads {params['heads']} must divide --dim {params['dim']} (or "
                         f"give --head-dim) and be a multiple of --kv-heads "
                         f"{params['kv_heads']}")
    if head_width(params) % 2:
        raise UsageError("the head dimension must be even (RoPE rotates pairs)")
    if params["context"] and params["tokens"] > params["context"]:
        raise UsageError(f"--tokens {params['tokens']} do not fit a KV cache of --context "
                         f"{params['context']} positions")
    if params["context"]:  # a prompt's pass filling the cache, or a decode step
        # calibrated on a prompt's pass of up to 128 tokens, past a VLM's image rows
        prompt = {**params, "context": 0, "tokens": min(
            params["context"], max(128, params.get("image_tokens", 0) + 1))}
        make = _build_step if params["tokens"] == 1 else _build
        built = calibrated_build(params, kind, make, calibration=(prompt, _build))
    elif params["tokens"] < 2:
        raise UsageError("the prompt's pass needs --tokens of at least 2 (one token a step "
                         "is the decode step: --context)")
    else:
        built = calibrated_build(params, kind, _build)
    if params.get("choose") == "device":  # the greedy token chosen where the logits lie
        choose_on_device(built[0])
    interleave_rope_pairs(*built)  # q's and k's rotation pairs side by side (ir.rope_pairs)
    return built


def decoder_footprint(params: dict[str, Any]) -> Footprint:
    """Every 2-D weight of the graph (the layers' products and selection matrices, the
    causal mask, the token table, the LM head, the RoPE tables) and the largest pair of
    activations: the logits with the final norm's output, or a layer's scores, or the
    SwiGLU products' input and output."""
    p = params
    weight = 1 if p["precision"] == "fp8" else 2
    rows, dim, hidden, vocab = p["batch"] * p["tokens"], p["dim"], p["hidden"], p["vocab"]
    head_dim = head_width(p) if p["heads"] else 0
    kv, width = p["kv_heads"] * head_dim, p["heads"] * head_dim
    keys = cache_positions(p) or p["tokens"]
    scores = p["batch"] * p["heads"] * p["tokens"] * keys * 2
    # the prompt's pass: the selection matrices, and one causal mask the layers share; a
    # step: its KV cache
    held = 2 * p["batch"] * keys * kv * 2 if p["context"] else 2 * kv * width * 2
    per_layer = (2 * dim * width + 2 * dim * kv + 3 * dim * hidden) * weight + held
    tables = vocab * dim * 2 + dim * vocab * weight + 2 * rows * (head_dim // 2) * 4 + (
        0 if p["context"] else scores)
    logits = rows * (vocab * 2 + dim * weight)
    mlp = rows * (dim + hidden) * weight
    largest = max((logits, "the logits and the final norm's output"),
                  (scores, "one layer's attention scores"),
                  (mlp, "the SwiGLU products' input and output"))
    return Footprint(p["layers"] * per_layer + tables, largest[0], largest[1], p["layers"],
                     "layers", per_layer, cache_bytes=p["layers"] * held if p["context"] else 0,
                     part_bytes=vocab * dim * 2, part_what="its token table (F16)")


def _stream(params: dict[str, Any], graph: Graph, index: int) -> dict[str, np.ndarray]:
    return {"ids": token_ids(params["seed"], f"ids.{index}", params["batch"], params["tokens"],
                             params["vocab"])}


def _register(kind: str, description: str, positions: int, **defaults: Any) -> None:
    parameters = tuple(replace(q, default=defaults.get(q.name, q.default))
                       for q in decoder_parameters())
    register(Workload(
        name=kind, description=description, parameters=parameters,
        build=lambda params: build_decoder(kind, params),
        identifier=sequence_identifier(kind), benchmark_fields=sequence_fields(kind, False),
        stream_input=_stream, footprint=decoder_footprint, step_inputs=step_inputs,
        prompt_inputs=prompt_inputs, positions=positions))


_register("smollm2-135m", "SmolLM2-135M (Llama family): the prompt's pass, token ids in, "
          "logits out, or with --context S --tokens 1 a decode step over a KV cache "
          "(ipu-stack generate); 30 layers of width 576, grouped-query attention (9 / 3 "
          "heads), RoPE, SwiGLU", positions=8192)
_register("tinyllama-1.1b", "TinyLlama-1.1B, as smollm2-135m: 22 layers of width 2048, "
          "grouped-query attention (32 / 4 heads), SwiGLU 5632, a 32,000-row table; two chips "
          "(--chips 2)",
          positions=2048, vocab=32000, layers=22, dim=2048, heads=32, kv_heads=4, hidden=5632,
          theta=10000.0)
_register("qwen3-0.6b", "Qwen3-0.6B, as smollm2-135m with an RMS norm of each head of q and "
          "k: 28 layers of width 1024, 16 / 8 heads of 128, SwiGLU 3072, a 151,936-row table; "
          "two chips (--chips 2)",
          positions=40960, vocab=151936, layers=28, dim=1024, heads=16, kv_heads=8,
          head_dim=128, qk_norm="heads", hidden=3072, theta=1000000.0, eps=1e-6)
