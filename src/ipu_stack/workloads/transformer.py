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
another seed (two-pass build: the graph is interpreted unrounded, in float32, on the calibration input,
then every FP8 activation gets the exponent that fits its largest magnitude with 2x
headroom).  Attention (Q.K^T, softmax, P.V) and the residual stream stay in F16.

Scale exponents are fitted per *role* (``attn.q.w``, ``ln1.out``, ...) over all layers, not
per layer: identical layers then have identical kernels (a scale is a kernel parameter) and
run as one loop body.  FP8's relative precision does not depend on the exponent, so a layer
whose values are smaller than the largest layer's only gives up range it does not use.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from ipu_stack.ir.graph import Graph, GraphBuilder
from ipu_stack.ir.interpret import fit_scales
from ipu_stack.ir.names import fp8_allowed, layer_set
from ipu_stack.ir.precision import F16, F32, Precision, fit_scale_exponent
from ipu_stack.ir.types import TensorType
from ipu_stack.ir.values import DeferredTensors, StoredTensor
from ipu_stack.util.errors import UsageError
from ipu_stack.util.forked import call_forked
from ipu_stack.util.log import event
from ipu_stack.workloads import calibration as calibration_cache
from ipu_stack.workloads.base import Parameter, Workload, register, rng_for
from ipu_stack.workloads.footprint import layer_footprint

LOG = logging.getLogger("ipu_stack.workloads")


def role(name: str) -> str:
    """A tensor's name without its layer: ``layer3.attn.q.w`` -> ``attn.q.w``."""
    return re.sub(r"^layer\d+\.", "", name)


def _common(tokens: int, dim: int, heads: int, hidden: int, eps: float) -> tuple[Parameter, ...]:
    return (
        Parameter("batch", int, 1, "images per run"),
        Parameter("tokens", int, tokens, "tokens per image"),
        Parameter("dim", int, dim, "model dimension"),
        Parameter("heads", int, heads, "attention heads"),
        Parameter("hidden", int, hidden, "MLP hidden dimension"),
        Parameter("blocks", int, 1, "stacked layers"),
        Parameter("precision", str, "fp8", "GEMM inputs/weights precision", choices=("fp8", "f16")),
        Parameter("eps", float, eps, "layer norm epsilon", minimum=None, positive=True),
        Parameter("seed", int, 0, "seed of inputs and weights", minimum=0, maximum=None),
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
QUICK_GELU = "quick"  # the --gelu of CLIP's x sigmoid(1.702 x), an activation, not a GELU


def _normals(seed: int, name: str, shape: tuple[int, ...], std: float,
             offset: float) -> np.ndarray:
    """The float64 values of a weight: ``std * N(0, 1) + offset`` from its own stream."""
    value = rng_for(seed, name).standard_normal(shape)
    value *= std  # in place: the same float64 operations, no temporaries
    value += offset
    return value


def _weight_values(seed: int, name: str, shape: tuple[int, ...], std: float, offset: float,
                   precision: Precision) -> np.ndarray:
    values = _normals(seed, name, shape, std, offset).astype(np.float32)
    return precision.round_trip(values)


class LayerBuilder:
    """Builds layers into one graph; ``scales`` maps activation names to FP8 exponents."""

    def __init__(self, params: dict[str, Any], scales: dict[str, int], name: str,
                 weight_scales: dict[str, int] | None = None) -> None:
        self.p = params
        self.scales = scales  # activation role -> FP8 exponent
        self.weight_scales = weight_scales or {}  # weight role -> FP8 exponent, when fitted
        self.fitted: dict[str, int] = {}  # what this build fitted, per weight role
        # name -> (precision, stored values): a calibration build's weights, which the real
        # build reuses when the precision it chooses is the same (no second generation)
        self.made: dict[str, tuple[Precision, np.ndarray]] = {}
        self.fp8 = params["precision"] == "fp8"
        self.kept = layer_set(params.get("keep_f16", ""))  # layers an FP8 recipe keeps F16
        self.b = GraphBuilder(name)
        # weights whose precision is known before their values are made when first read
        # (a compile reads none of them); the others, fitted here, are made at once
        self.tensors = DeferredTensors()
        self.deferred: dict[str, Precision] = {}
        self.rows = params["batch"] * params["tokens"]
        # an additive attention mask (a causal one: CLIP's text encoder), [B H T, T] F16, or
        # the rows that repeat over the scores' (a Swin layer's bias)
        self.mask: int | None = None
        # a second table the softmax adds, with its rows' (block, repeat): a Swin layer's
        # shift mask, [windows T, T], each window's block serving its heads
        self.mask_rows: tuple[int, int, int] | None = None

    def fp8_at(self, name: str) -> bool:
        """Whether the value or weight ``name`` is FP8: ``--precision fp8``, outside the
        layers ``--keep-f16`` names."""
        return self.fp8 and fp8_allowed(name, self.kept)

    def act(self, name: str) -> Precision:
        """Precision of an activation that feeds a GEMM."""
        return Precision("F8F143", self.scales.get(role(name), 0)) if self.fp8_at(name) \
            else F16

    def weight(self, name: str, shape: tuple[int, ...], std: float, precision: Precision | None
               = None, offset: float = 0.0) -> int:
        made = self.made.get(name)
        if made is not None and (precision is None or precision == made[0]) and (
                not made[0].is_fp8 or self.weight_scales.get(role(name)) == made[0].scale_exponent):
            self.tensors[name] = made[1]
            return self.b.weight(name, TensorType(shape, made[0]))
        seed = self.p["seed"]
        fitting = precision is None and self.fp8_at(name) and len(shape) == 2
        if fitting and role(name) in self.weight_scales:
            precision, fitting = Precision("F8F143", self.weight_scales[role(name)]), False
        if not fitting:  # the values are not needed to build: made when first read
            precision = precision or F16
            self.tensors.defer(name, partial(_weight_values, seed, name, shape, std, offset,
                                             precision))
            self.deferred[name] = precision
            return self.b.weight(name, TensorType(shape, precision))
        value = _normals(seed, name, shape, std, offset)
        key = role(name)
        fitted = fit_scale_exponent(value)
        self.fitted[key] = max(self.fitted.get(key, fitted), fitted)
        precision = Precision("F8F143", self.weight_scales.get(key, fitted))
        # held as its storage codes (a byte a weight): a calibration build of a giant tower
        # makes every GEMM weight here, 4.6 GB in float32 for siglip2-giant's
        self.tensors[name] = StoredTensor(precision, precision.quantize(value.astype(np.float32)))
        self.made[name] = (precision, self.tensors[name])
        return self.b.weight(name, TensorType(shape, precision))

    def make_weights(self) -> DeferredTensors:
        """Every deferred weight made now, on every core (a calibration build evaluates the
        graph at once), and remembered for the real build to reuse."""
        self.tensors.make_all(os.cpu_count() or 1)
        for name, precision in self.deferred.items():
            self.made[name] = (precision, self.tensors[name])
        return self.tensors

    def linear(self, x: int, din: int, dout: int, name: str, out: Precision, bias: bool) -> int:
        w = self.weight(f"{name}.w", (din, dout), 1.0 / np.sqrt(din))
        y = self.b.op("matmul", [x, w], F16 if bias else out, f"{name}.mm")
        if bias:
            bv = self.weight(f"{name}.b", (dout,), 0.02)
            y = self.b.op("bias_add", [y, bv], out, f"{name}.out")
        return y

    def norm(self, x: int, name: str, out: Precision, width: int | None = None) -> int:
        """A layer norm over ``width`` columns (the model dimension unless given: a Swin
        patch merging's norm is four times it)."""
        d = width or self.p["dim"]
        g = self.weight(f"{name}.gamma", (d,), 0.1, offset=1.0)
        beta = self.weight(f"{name}.beta", (d,), 0.1)
        return self.b.op("layer_norm", [x, g, beta], out, f"{name}.out", eps=self.p["eps"])

    def rope_tables(self, head_dim: int) -> tuple[int, int]:
        """The 2D RoPE cos and sin tables (F32), one pair shared by every layer."""
        if "rope.cos" not in self.tensors:
            cos, sin = rope_2d_tables(self.p["tokens"], head_dim, self.p["batch"])
            self.tensors["rope.cos"], self.tensors["rope.sin"] = cos, sin
            table = TensorType(cos.shape, F32)
            self.rope_ids = (self.b.weight("rope.cos", table), self.b.weight("rope.sin", table))
        return self.rope_ids

    def attention(self, h: int, prefix: str, rope: bool, bias: bool) -> int:
        p = self.p
        d, heads, tokens = p["dim"], p["heads"], p["tokens"]
        head_dim = d // heads
        # FP8 operands (ATTENTION_OPTION): the projections (or RoPE after them) round
        # q, k and v to FP8, and the softmax its probabilities
        fp8 = self.fp8_at(prefix) and p.get("attention", "f16") == "fp8"

        def operand(name: str) -> Precision:
            return self.act(name) if fp8 else F16

        q = self.linear(h, d, d, f"{prefix}.q", F16 if rope else operand(f"{prefix}.q.out"), bias)
        k = self.linear(h, d, d, f"{prefix}.k", F16 if rope else operand(f"{prefix}.k.out"), bias)
        v = self.linear(h, d, d, f"{prefix}.v", operand(f"{prefix}.v.out"), bias)
        if rope:
            c, s = self.rope_tables(head_dim)
            q = self.b.op("rope", [q, c, s], operand(f"{prefix}.q.rope"), f"{prefix}.q.rope",
                          head_dim=head_dim)
            k = self.b.op("rope", [k, c, s], operand(f"{prefix}.k.rope"), f"{prefix}.k.rope",
                          head_dim=head_dim)
        scores = self.b.op("head_matmul", [q, k], F16, f"{prefix}.scores", mode="qk",
                           heads=heads, tokens=tokens)
        scale = 1.0 / float(np.sqrt(head_dim))
        if self.mask is None:
            probs = self.b.op("softmax", [scores], operand(f"{prefix}.probs"), f"{prefix}.probs",
                              scale=scale)
        else:
            tables, maps = [self.mask], [[1, 1]]
            if self.mask_rows is not None:
                tables.append(self.mask_rows[0])
                maps.append(list(self.mask_rows[1:]))
            more = {"table_maps": maps} if len(maps) > 1 else {}
            probs = self.b.op("biased_softmax", [scores, *tables], operand(f"{prefix}.probs"),
                              f"{prefix}.probs", scale=scale, **more)
        o = self.b.op("head_matmul", [probs, v], F16, f"{prefix}.context", mode="pv",
                      heads=heads, tokens=tokens)
        if self.fp8_at(prefix):
            o = self.b.op("cast", [o], self.act(f"{prefix}.context8"), f"{prefix}.context8")
        return self.linear(o, d, d, f"{prefix}.o", F16, bias)

    def layer(self, x: int, index: int, rope: bool, mlp: bool = True) -> int:
        prefix = f"layer{index}"
        h = self.norm(x, f"{prefix}.ln1", self.act(f"{prefix}.ln1.out"))
        a = self.attention(h, f"{prefix}.attn", rope, bias=True)
        x = self.b.op("add", [x, a], F16, f"{prefix}.residual1")
        return self.mlp(x, prefix) if mlp else x

    def mlp(self, x: int, prefix: str) -> int:
        """``x + fc2(gelu(fc1(ln2(x))))``: a pre-norm layer's second half."""
        p = self.p
        h = self.norm(x, f"{prefix}.ln2", self.act(f"{prefix}.ln2.out"))
        f1 = self.linear(h, p["dim"], p["hidden"], f"{prefix}.fc1", F16, True)
        if p.get("gelu") == QUICK_GELU:
            g = self.b.op("activation", [f1], self.act(f"{prefix}.gelu"), f"{prefix}.gelu",
                          function="quick_gelu")
        else:
            g = self.b.op("gelu", [f1], self.act(f"{prefix}.gelu"), f"{prefix}.gelu",
                          approximate=GELU_FORMS[p.get("gelu", "tanh")])
        m = self.linear(g, p["hidden"], p["dim"], f"{prefix}.fc2", F16, True)
        return self.b.op("add", [x, m], F16, f"{prefix}.residual2")


def _input(builder: LayerBuilder, seed: int, precision: Precision) -> tuple[int, np.ndarray]:
    p = builder.p
    x = rng_for(seed, "x").standard_normal((builder.rows, p["dim"])).astype(np.float32)
    return builder.b.input("x", TensorType((p["batch"], p["tokens"], p["dim"]), precision)), x


def _build(kind: str, builder: LayerBuilder, seed: int) -> None:
    """The graph of a layer workload into ``builder`` (inputs from ``seed``)."""
    params = builder.p
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


def _calibrate(params: dict[str, Any], name: str, make: Callable[[LayerBuilder, int], None]
               ) -> tuple[dict[str, int], dict[str, int], dict[str, tuple[Precision, Any]]]:
    """The calibration pass: the workload built on a calibration input (seed + 1, batch 1),
    evaluated unrounded, every FP8 activation's and weight's exponent fitted per role.
    Returns the activation and weight exponents, and the weights it made (storage codes)."""
    calibration = LayerBuilder({**params, "batch": 1}, {}, name)
    make(calibration, params["seed"] + 1)
    graph = calibration.b.build()
    calibration.make_weights()
    scales = fit_scales(graph, calibration.tensors,
                        [v.name for v in graph.values if v.type.precision.is_fp8
                         and v.role in ("intermediate", "input")], role)
    # a giant tower's float32 weights are gigabytes: kept as their storage codes
    made = {name: (precision, StoredTensor.of(values, precision)
                   if precision.is_fp8 and not isinstance(values, StoredTensor) else values)
            for name, (precision, values) in calibration.made.items()}
    return scales, calibration.fitted, made


def calibrated_build(
    params: dict[str, Any], name: str, make: Callable[[LayerBuilder, int], None],
    calibration: tuple[dict[str, Any], Callable[[LayerBuilder, int], None]] | None = None,
) -> tuple[Graph, dict[str, np.ndarray]]:
    """Two-pass build: with FP8, a calibration pass (:func:`_calibrate`) fits every FP8
    activation's and weight's exponent per role, then the build for real.  The fitted
    exponents are cached on disk (``workloads.calibration``) when the compile sets a cache
    folder.

    The calibration pass runs in a forked child (``util.forked``) and hands back only the
    exponents, so this process builds as it does from the cache: its weights made when
    first read, not held from the pass.  Its memory (all the weights and the model's
    float32 activations) then never becomes part of this process, nor of the chip workers
    and host sides forked from it.  Where the child cannot run, the pass runs here and the
    real build reuses the weights it made.  ``calibration``: the parameters and builder the
    pass runs instead (a decode step is calibrated on its model's prompt pass, so both
    programs round the same roles alike)."""
    fit_params, fit_make = calibration or (params, make)
    scales: dict[str, int] = {}
    weight_scales: dict[str, int] | None = None
    made: dict[str, tuple[Precision, Any]] = {}
    cached = calibration_cache.load(name, fit_params) if params["precision"] == "fp8" else None
    if cached is not None:
        scales, weight_scales = cached["activations"], cached["weights"]
    elif params["precision"] == "fp8":
        started = time.perf_counter()
        apart = call_forked(lambda: _calibrate(fit_params, name, fit_make)[:2])
        if apart.ok:
            scales, weight_scales = apart.result
            event(LOG, "calibration fitted in a child process", workload=name,
                  roles=len(scales) + len(weight_scales),
                  seconds=round(time.perf_counter() - started, 2),
                  child_peak_bytes=apart.peak_bytes)
        else:
            event(LOG, "calibration fitted in this process", workload=name,
                  reason=apart.failure)
            scales, weight_scales, made = _calibrate(fit_params, name, fit_make)
        calibration_cache.store(name, fit_params, {"activations": scales,
                                                   "weights": weight_scales})
    builder = LayerBuilder(params, scales, name, weight_scales)
    builder.made = made
    make(builder, params["seed"])
    return builder.b.build(), builder.tensors


def build_transformer(kind: str, params: dict[str, Any]) -> tuple[Graph, dict[str, np.ndarray]]:
    """A layer workload, its FP8 scales fitted on a calibration input."""
    if params["dim"] % params["heads"]:
        raise UsageError(f"--dim {params['dim']} is not a multiple of --heads {params['heads']}")
    return calibrated_build(params, kind, lambda builder, seed: _build(kind, builder, seed))


def _identifier(kind: str):
    def make(p: dict[str, Any]) -> str:
        if kind == "attention":
            return (f"{kind}-{p['precision']}-b{p['batch']}-t{p['tokens']}-d{p['dim']}"
                    f"-h{p['heads']}")
        return (f"{kind}-{p['precision']}-b{p['batch']}-t{p['tokens']}-d{p['dim']}"
                f"-h{p['heads']}-f{p['hidden']}-n{p['blocks']}{attention_suffix(p, 'f16')}")
    return make


def attention_precision(p: dict[str, Any]) -> str:
    """The precision the attention products run in: ``--attention`` with FP8 GEMMs, else
    F16."""
    return str(p.get("attention", "f16")) if p["precision"] == "fp8" else "f16"


def attention_suffix(p: dict[str, Any], default: str) -> str:
    """The identifier's mark of an attention precision other than the workload's default,
    and of layers kept F16 (identifiers name artifact folders: two builds that differ must
    not share one)."""
    chosen = attention_precision(p)
    kept = sorted(layer_set(p.get("keep_f16", ""))) if p["precision"] == "fp8" else []
    keep = f"-keepf16-{'.'.join(map(str, kept))}" if kept else ""
    return keep if chosen == default or p["precision"] != "fp8" else f"-attn{chosen}{keep}"


KEEP_F16 = Parameter("keep_f16", str, "", "layers kept F16 when --precision is fp8, e.g. "
                     "3,7 or 0-2 (an FP8 recipe: ipu-stack fp8-recipe)")


def _fields(kind: str):
    def make(p: dict[str, Any]) -> dict[str, Any]:
        return {"benchmark": f"{kind}-{p['precision']}", "batch": p["batch"],
                "tokens": p["tokens"], "rows": p["batch"] * p["tokens"], "dimension": p["dim"],
                "heads": p["heads"], "hiddenDimension": p.get("hidden", 0),
                "blocks": p.get("blocks", 1), "biases": kind != "attention",
                "attention": attention_precision(p)}
    return make


def ATTENTION_OPTION(default: str) -> Parameter:  # noqa: N802  (reads as a constant)
    """The ``--attention`` option: the precision of the attention products' operands when the
    GEMMs run in FP8.  ``fp8``: q, k, v and the probabilities are FP8 (each with its own
    calibrated scale) and both products run in the AMP's native FP8 mode with FP16 partials;
    ``f16``: F16 operands, products in the F16 mode with F32 partials (the reference's
    mixed FP8 + F16 build of seed 003).  docs/tolerance.md has what each costs in accuracy."""
    return Parameter("attention", str, default, "attention products' operands when "
                     "--precision is fp8: fp8 (native FP8 AMP, FP16 partials) or f16",
                     choices=("fp8", "f16"))


def GELU_OPTION(default: str) -> Parameter:  # noqa: N802  (reads as a constant)
    """The ``--gelu`` option: ``erf`` is the exact GELU, ``tanh`` its tanh approximation."""
    return Parameter("gelu", str, default, "GELU activation: erf (exact) or tanh (approximation)",
                     choices=tuple(GELU_FORMS))


def _register(kind: str, description: str, parameters: tuple[Parameter, ...]) -> None:
    register(Workload(
        name=kind, description=description, parameters=parameters,
        build=lambda params: build_transformer(kind, params),
        identifier=_identifier(kind), benchmark_fields=_fields(kind),
        footprint=lambda params: layer_footprint(
            {**params, "hidden": 0 if kind in ("attention", "siglip-attention")
             else params["hidden"]}, params.get("blocks", 1), "blocks", params["tokens"]),
    ))


# the layer workloads keep the reference's F16 attention (seed 003) by default, so their
# figures compare with its logs; the towers (workloads.vision) run it in FP8
_register("siglip-layer", "SigLIP-so400m encoder layer (pre-norm, biases, GELU tanh)",
          (*_common(729, 1152, 16, 4304, 1e-6), ATTENTION_OPTION("f16"), KEEP_F16))
_register("pe-block", "Perception Encoder L/14-336 layer with 2D RoPE (eps 1e-5, exact GELU)",
          (*_common(577, 1024, 16, 4096, 1e-5), GELU_OPTION("erf"), ATTENTION_OPTION("f16"),
           KEEP_F16))
_register("siglip-attention", "SigLIP attention sub-layer: norm, q/k/v, attention, out, residual",
          (*_common(729, 1152, 16, 4304, 1e-6), ATTENTION_OPTION("f16"), KEEP_F16))
_register("attention", "diagnostic attention block of reference log 001 (7 operations)",
          tuple(p for p in _common(197, 768, 12, 3072, 1e-6)
                if p.name not in ("hidden", "blocks", "eps")))
_register("vit-layer", "generic pre-norm ViT layer (exact GELU, as ViT defines it)",
          (*_common(197, 768, 12, 3072, 1e-6), GELU_OPTION("erf"), ATTENTION_OPTION("f16"),
           KEEP_F16))
