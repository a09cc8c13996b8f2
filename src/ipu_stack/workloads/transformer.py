"""Transformer workloads: pre-norm encoder layers and attention blocks.

* ``siglip-layer``: SigLIP-so400m encoder layer (729 tokens, 1152 dims, 16 heads, MLP 4304),
  pre-norm, biases, GELU tanh; ``--blocks N`` stacks layers.
* ``pe-block``: Perception Encoder L/14-336 layer (577 tokens = CLS + 24 x 24 patches, 1024
  dims, 16 heads, MLP 4096), layer norm eps 1e-5, exact GELU and 2D RoPE on queries and keys
  (patch positions from 1 after the CLS token, as PE's ``Rope2D`` does).
* ``siglip-attention``: SigLIP's attention sub-layer (norm, q/k/v, attention, output
  projection, residual).
* ``attention``: the diagnostic attention block of reference log 001 (7 operations:
  q, k, v projections, Q.K^T, softmax, P.V, output projection).
* ``vit-layer``: a generic pre-norm ViT layer with ViT's exact (erf) GELU.

With ``--precision fp8`` GEMM inputs and weights are FP8 F143; activations that feed a GEMM
are stored in FP8 with a static scale exponent fitted on a calibration input drawn from
another seed (two-pass build: the graph is interpreted in float64 on the calibration input,
then every FP8 activation gets the exponent that fits its largest magnitude with 2x
headroom).  Attention (Q.K^T, softmax, P.V) and the residual stream stay in F16.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ipu_stack.ir.graph import Graph, GraphBuilder
from ipu_stack.ir.interpret import evaluate_float64
from ipu_stack.ir.precision import F16, F32, Precision, fit_scale_exponent
from ipu_stack.ir.types import TensorType
from ipu_stack.util.errors import UsageError
from ipu_stack.workloads.base import Parameter, Workload, register, rng_for


def _common(tokens: int, dim: int, heads: int, hidden: int, eps: float) -> tuple[Parameter, ...]:
    return (
        Parameter("batch", int, 1, "images per run"),
        Parameter("tokens", int, tokens, "tokens per image"),
        Parameter("dim", int, dim, "model dimension"),
        Parameter("heads", int, heads, "attention heads"),
        Parameter("hidden", int, hidden, "MLP hidden dimension"),
        Parameter("blocks", int, 1, "stacked layers"),
        Parameter("precision", str, "fp8", "GEMM inputs/weights precision", choices=("fp8", "f16")),
        Parameter("eps", float, eps, "layer norm epsilon", minimum=None),
        Parameter("seed", int, 0, "seed of inputs and weights", minimum=0),
    )


def patch_grid(tokens: int) -> tuple[int, bool]:
    """The side ``g`` of the square patch grid and whether a CLS token leads: ``tokens`` must
    be ``g*g`` or ``1 + g*g``; anything else forms no grid, so 2D RoPE has no positions."""
    side = int(round(np.sqrt(tokens)))
    if side * side == tokens:
        return side, False
    side = int(round(np.sqrt(tokens - 1)))
    if tokens > 1 and side * side == tokens - 1:
        return side, True
    raise UsageError(f"--tokens {tokens} forms no patch grid for 2D RoPE: it must be g*g or "
                     f"1 + g*g (a CLS token and g x g patches), e.g. 576 or 577")


def rope_2d_tables(tokens: int, head_dim: int, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """2D RoPE angles as Perception Encoder defines them: the first half of the pairs rotate
    by the patch's column, the second half by its row, frequencies ``10000^(-i/half)``.  With a
    CLS token the patch positions start at 1 and the CLS token (first) keeps the zero rotation;
    without one they start at 0."""
    pairs = head_dim // 2
    side, cls = patch_grid(tokens)
    index = np.arange(side * side)
    xs, ys = index % side + int(cls), index // side + int(cls)
    if cls:
        xs, ys = np.concatenate([[0], xs]), np.concatenate([[0], ys])
    half = pairs // 2
    freq_x = 10000.0 ** (-np.arange(half) / max(half, 1))
    freq_y = 10000.0 ** (-np.arange(pairs - half) / max(pairs - half, 1))
    angles = np.concatenate([xs[:, None] * freq_x, ys[:, None] * freq_y], axis=1)
    angles = np.tile(angles, (batch, 1))
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


GELU_FORMS = {"tanh": "tanh", "erf": "none"}  # option name -> the graph's ``approximate``


class LayerBuilder:
    """Builds layers into one graph; ``scales`` maps activation names to FP8 exponents."""

    def __init__(self, params: dict[str, Any], scales: dict[str, int], name: str) -> None:
        self.p = params
        self.scales = scales
        self.fp8 = params["precision"] == "fp8"
        self.b = GraphBuilder(name)
        self.tensors: dict[str, np.ndarray] = {}
        self.rows = params["batch"] * params["tokens"]

    def act(self, name: str) -> Precision:
        """Precision of an activation that feeds a GEMM."""
        return Precision("F8F143", self.scales.get(name, 0)) if self.fp8 else F16

    def weight(self, name: str, shape: tuple[int, ...], std: float, precision: Precision | None
               = None, offset: float = 0.0) -> int:
        value = rng_for(self.p["seed"], name).standard_normal(shape) * std + offset
        if precision is None:
            if self.fp8 and len(shape) == 2:
                precision = Precision("F8F143", fit_scale_exponent(value))
            else:
                precision = F16
        self.tensors[name] = precision.round_trip(value.astype(np.float32))
        return self.b.weight(name, TensorType(shape, precision))

    def linear(self, x: int, din: int, dout: int, name: str, out: Precision, bias: bool) -> int:
        w = self.weight(f"{name}.w", (din, dout), 1.0 / np.sqrt(din))
        y = self.b.op("matmul", [x, w], F16 if bias else out, f"{name}.mm")
        if bias:
            bv = self.weight(f"{name}.b", (dout,), 0.02)
            y = self.b.op("bias_add", [y, bv], out, f"{name}.out")
        return y

    def norm(self, x: int, name: str, out: Precision) -> int:
        d = self.p["dim"]
        g = self.weight(f"{name}.gamma", (d,), 0.1, offset=1.0)
        beta = self.weight(f"{name}.beta", (d,), 0.1)
        return self.b.op("layer_norm", [x, g, beta], out, f"{name}.out", eps=self.p["eps"])

    def attention(self, h: int, prefix: str, rope: bool, bias: bool) -> int:
        p = self.p
        d, heads, tokens = p["dim"], p["heads"], p["tokens"]
        head_dim = d // heads
        q = self.linear(h, d, d, f"{prefix}.q", F16, bias)
        k = self.linear(h, d, d, f"{prefix}.k", F16, bias)
        v = self.linear(h, d, d, f"{prefix}.v", F16, bias)
        if rope:
            cos, sin = rope_2d_tables(tokens, head_dim, p["batch"])
            self.tensors[f"{prefix}.rope.cos"] = cos
            self.tensors[f"{prefix}.rope.sin"] = sin
            table = TensorType(cos.shape, F32)
            c = self.b.weight(f"{prefix}.rope.cos", table)
            s = self.b.weight(f"{prefix}.rope.sin", table)
            q = self.b.op("rope", [q, c, s], F16, f"{prefix}.q.rope", head_dim=head_dim)
            k = self.b.op("rope", [k, c, s], F16, f"{prefix}.k.rope", head_dim=head_dim)
        scores = self.b.op("head_matmul", [q, k], F16, f"{prefix}.scores", mode="qk",
                           heads=heads, tokens=tokens)
        probs = self.b.op("softmax", [scores], F16, f"{prefix}.probs",
                          scale=1.0 / float(np.sqrt(head_dim)))
        o = self.b.op("head_matmul", [probs, v], F16, f"{prefix}.context", mode="pv",
                      heads=heads, tokens=tokens)
        if self.fp8:
            o = self.b.op("cast", [o], self.act(f"{prefix}.context8"), f"{prefix}.context8")
        return self.linear(o, d, d, f"{prefix}.o", F16, bias)

    def layer(self, x: int, index: int, rope: bool, mlp: bool = True) -> int:
        prefix = f"layer{index}"
        p = self.p
        h = self.norm(x, f"{prefix}.ln1", self.act(f"{prefix}.ln1.out"))
        a = self.attention(h, f"{prefix}.attn", rope, bias=True)
        x = self.b.op("add", [x, a], F16, f"{prefix}.residual1")
        if not mlp:
            return x
        h = self.norm(x, f"{prefix}.ln2", self.act(f"{prefix}.ln2.out"))
        f1 = self.linear(h, p["dim"], p["hidden"], f"{prefix}.fc1", F16, True)
        g = self.b.op("gelu", [f1], self.act(f"{prefix}.gelu"), f"{prefix}.gelu",
                      approximate=GELU_FORMS[p.get("gelu", "tanh")])
        m = self.linear(g, p["hidden"], p["dim"], f"{prefix}.fc2", F16, True)
        return self.b.op("add", [x, m], F16, f"{prefix}.residual2")


def _input(builder: LayerBuilder, seed: int, precision: Precision) -> tuple[int, np.ndarray]:
    p = builder.p
    x = rng_for(seed, "x").standard_normal((builder.rows, p["dim"])).astype(np.float32)
    return builder.b.input("x", TensorType((p["batch"], p["tokens"], p["dim"]), precision)), x


def _build(kind: str, params: dict[str, Any], scales: dict[str, int], seed: int
           ) -> tuple[Graph, dict[str, np.ndarray]]:
    builder = LayerBuilder(params, scales, kind)
    if kind == "attention":
        x_id, x = _input(builder, seed, builder.act("x"))
        builder.tensors["x"] = builder.act("x").round_trip(x)
        y = builder.attention(x_id, "attn", rope=False, bias=False)
    else:
        x_id, x = _input(builder, seed, F16)
        builder.tensors["x"] = F16.round_trip(x)
        y = x_id
        for block in range(params["blocks"]):
            y = builder.layer(y, block, rope=kind == "pe-block", mlp=kind != "siglip-attention")
    builder.b.output(y)
    builder.tensors["x"] = builder.tensors["x"].reshape(params["batch"], params["tokens"], -1)
    return builder.b.build(), builder.tensors


def build_transformer(kind: str, params: dict[str, Any]) -> tuple[Graph, dict[str, np.ndarray]]:
    """Two-pass build: fit FP8 activation scales on a calibration input, then build."""
    if params["dim"] % params["heads"]:
        raise UsageError(f"--dim {params['dim']} is not a multiple of --heads {params['heads']}")
    scales: dict[str, int] = {}
    if params["precision"] == "fp8":
        calibration_params = {**params, "batch": 1}
        graph, tensors = _build(kind, calibration_params, {}, params["seed"] + 1)
        ideal = evaluate_float64(graph, tensors)
        for value in graph.values:
            if value.type.precision.is_fp8 and value.role == "intermediate" or (
                value.role == "input" and value.type.precision.is_fp8
            ):
                scales[value.name] = fit_scale_exponent(ideal[value.name], headroom=2.0)
    return _build(kind, params, scales, params["seed"])


def _identifier(kind: str):
    def make(p: dict[str, Any]) -> str:
        if kind == "attention":
            return (f"{kind}-{p['precision']}-b{p['batch']}-t{p['tokens']}-d{p['dim']}"
                    f"-h{p['heads']}")
        return (f"{kind}-{p['precision']}-b{p['batch']}-t{p['tokens']}-d{p['dim']}"
                f"-h{p['heads']}-f{p['hidden']}-n{p['blocks']}")
    return make


def _fields(kind: str):
    def make(p: dict[str, Any]) -> dict[str, Any]:
        return {"benchmark": f"{kind}-{p['precision']}", "batch": p["batch"],
                "tokens": p["tokens"], "rows": p["batch"] * p["tokens"], "dimension": p["dim"],
                "heads": p["heads"], "hiddenDimension": p.get("hidden", 0),
                "blocks": p.get("blocks", 1), "biases": kind != "attention"}
    return make


def GELU_OPTION(default: str) -> Parameter:  # noqa: N802  (reads as a constant)
    """The ``--gelu`` option: ``erf`` is the exact GELU, ``tanh`` its tanh approximation."""
    return Parameter("gelu", str, default, "GELU activation: erf (exact) or tanh (approximation)",
                     choices=tuple(GELU_FORMS))


def _register(kind: str, description: str, parameters: tuple[Parameter, ...]) -> None:
    register(Workload(
        name=kind, description=description, parameters=parameters,
        build=lambda params: build_transformer(kind, params),
        identifier=_identifier(kind), benchmark_fields=_fields(kind),
    ))


_register("siglip-layer", "SigLIP-so400m encoder layer (pre-norm, biases, GELU tanh)",
          _common(729, 1152, 16, 4304, 1e-6))
_register("pe-block", "Perception Encoder L/14-336 layer with 2D RoPE (eps 1e-5, exact GELU)",
          (*_common(577, 1024, 16, 4096, 1e-5), GELU_OPTION("erf")))
_register("siglip-attention", "SigLIP attention sub-layer: norm, q/k/v, attention, out, residual",
          _common(729, 1152, 16, 4304, 1e-6))
_register("attention", "diagnostic attention block of reference log 001 (7 operations)",
          tuple(p for p in _common(197, 768, 12, 3072, 1e-6)
                if p.name not in ("hidden", "blocks", "eps")))
_register("vit-layer", "generic pre-norm ViT layer (exact GELU, as ViT defines it)",
          (*_common(197, 768, 12, 3072, 1e-6), GELU_OPTION("erf")))
