"""Small random graphs and their independent float64 expected output (the random-graph
fuzz of ``benchmarks/fuzz.py`` and ``tests/reliability/test_random_graphs.py``).

:func:`random_spec` draws a graph description: a chain of 1-3 matmuls with optional bias,
GELU, scale, softmax, layer norm, residual add and FP8 casts, F16 or FP8 F143 storage with
scales from ``fit_scale_exponent``.  :func:`build_random` builds the graph, its host tensors,
and the expected output from plain numpy plus :func:`~ipu_stack.testing.reference.round_to`
(the stored precisions applied where the graph stores values), not from the stack's own
interpreter.

A spec is plain JSON (it is stored in the package manifest as the workload's parameters), so
a failing case is reproduced from the printed spec alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ipu_stack.ir.graph import Graph, GraphBuilder
from ipu_stack.ir.precision import F16, Precision, fit_scale_exponent
from ipu_stack.ir.types import TensorType
from ipu_stack.testing.reference import gelu_tanh_half_loop, round_to
from ipu_stack.workloads.base import Workload

POST_OPS = ("gelu", "softmax", "layer_norm", "add", "scale")
LN_EPS = 1e-6
FP8_PASS = 32  # products one FP8 AMP pass adds to its float16 partial (amp_f8_depth)


def random_spec(rng: np.random.Generator, odd: bool = False) -> dict[str, Any]:
    """A random graph description from a numpy generator (the fuzz driver's source)."""

    def dim() -> int:
        if odd and rng.random() < 0.5:
            return int(rng.integers(1, 70))
        return 4 * int(rng.integers(1, 25))

    layers = []
    for _ in range(int(rng.integers(1, 4))):
        post = [str(p) for p in rng.choice(POST_OPS, size=int(rng.integers(0, 3)), replace=False)]
        layers.append({
            "cols": dim(),
            "weight": str(rng.choice(["F16", "F8F143"])),
            "bias": bool(rng.random() < 0.5),
            "post": post,
            "fp8_next": str(rng.choice(["no", "cast", "direct"])),
        })
    return {
        "batch": int(rng.integers(1, 3)),
        "tokens": dim(),
        "dim": dim(),
        "input": str(rng.choice(["F16", "F8F143"])),
        "layers": layers,
        "seed": int(rng.integers(0, 2**31)),
    }


def _fp8(values: np.ndarray, headroom: float = 2.0) -> Precision:
    return Precision("F8F143", fit_scale_exponent(values, "F8F143", headroom))


class _Builder:
    """Builds the graph and, step by step, the independent float64 value of every op."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.rng = np.random.default_rng(int(spec["seed"]))
        self.b = GraphBuilder("random")
        self.tensors: dict[str, np.ndarray] = {}
        self.expected: dict[int, np.ndarray] = {}  # value id -> float64 [rows, cols], rounded
        self.precisions: dict[int, Precision] = {}
        self.ops = 0  # the next operation's id

    def _leaf(self, name: str, data: np.ndarray, precision: Precision, role: str,
              shape: tuple[int, ...] | None = None) -> int:
        stored = precision.round_trip(data.astype(np.float32))
        self.tensors[name] = stored.reshape(shape) if shape else stored
        ttype = TensorType(shape or data.shape, precision)
        vid = self.b.input(name, ttype) if role == "input" else self.b.weight(name, ttype)
        self.expected[vid] = stored.astype(np.float64).reshape(-1, data.shape[-1]) \
            if data.ndim > 1 else stored.astype(np.float64)
        self.precisions[vid] = precision
        return vid

    def weight(self, name: str, data: np.ndarray, kind: str) -> int:
        precision = F16 if kind == "F16" else Precision("F8F143", fit_scale_exponent(data))
        return self._leaf(name, data, precision, "weight")

    def op(self, kind: str, inputs: list[int], precision: Precision | None, name: str, *,
           value: np.ndarray, **attrs: Any) -> int:
        """Add ``kind``; ``value`` is its float64 result before rounding to ``precision``
        (``None``: FP8 F143 with a scale fitted to ``value``)."""
        if precision is None:
            precision = _fp8(value)
        vid = self.b.op(kind, inputs, precision, name, **attrs)
        self.ops += 1
        self.expected[vid] = round_to(value, precision.to_json())
        self.precisions[vid] = precision
        return vid


def fp16_partial_product(a: np.ndarray, b: np.ndarray, depth_block: int) -> np.ndarray:
    """``a @ b`` with the FP8 mode's partial sums: each ``depth_block`` of the depth added
    32 products at a time to a partial held in float16, the blocks' partials then added
    (in float64 here; the device adds them in float32)."""
    total = np.zeros((a.shape[0], b.shape[1]))
    for block in range(0, a.shape[1], depth_block):
        partial = np.zeros_like(total, dtype=np.float16)
        for lo in range(block, min(block + depth_block, a.shape[1]), FP8_PASS):
            hi = min(lo + FP8_PASS, block + depth_block, a.shape[1])
            partial = (partial + a[:, lo:hi] @ b[lo:hi]).astype(np.float16)
        total += partial
    return total


def one_pass_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """A layer norm of F16 rows in the one-pass form the device runs them in (the vendor's
    ``NormCE``, docs/machine.md): the mean rounded to float16, ``E[x^2] - mean^2`` plus eps,
    its inverse root rounded to float16, then ``(x - mean) r gamma + beta`` with every
    operation rounded to float16 (the sums here in float64, the device's in float32)."""
    def half(values: np.ndarray) -> np.ndarray:
        return values.astype(np.float16).astype(np.float64)

    mean = half(x.mean(axis=-1, keepdims=True))
    variance = np.maximum((x * x).mean(axis=-1, keepdims=True) - mean * mean, 0) + LN_EPS
    inverse = half(1 / np.sqrt(variance))
    return half(half(half(half(x - mean) * inverse) * gamma) + beta)


def build_random(spec: dict[str, Any], gemm_modes: dict[str, dict] | None = None
                 ) -> tuple[Graph, dict[str, np.ndarray], np.ndarray]:
    """The graph, its host tensors and the independently computed float64 expected output.

    Every value is rounded to its stored precision at the point the graph stores it, exactly
    as the float64 forward passes of the tests do; FP8 activations get the scale that
    fits their own data with 2x headroom.  A matmul that ``gemm_modes`` (a package's record,
    by operation id) runs in the FP8 mode sums its products as that mode does
    (:func:`fp16_partial_product`): its partials' float16 rounding is part of the program,
    and near an FP8 rounding boundary it decides which way a stored value rounds.  The graph
    output is always F16 (an FP8 output would turn one rounding flip into a 1/8 relative
    error, outside any sane tolerance).
    """
    bld = _Builder(spec)
    rng = bld.rng
    batch, tokens, dim = int(spec["batch"]), int(spec["tokens"]), int(spec["dim"])
    x = rng.standard_normal((batch * tokens, dim))
    x_prec = F16 if spec["input"] == "F16" else Precision("F8F143", fit_scale_exponent(x))
    current = bld._leaf("x", x, x_prec, "input", shape=(batch, tokens, dim))
    pool = {dim: current}  # cols -> the latest layer output of that width (residual partner)
    cols = dim
    layers = spec["layers"]
    for index, layer in enumerate(layers):
        out_cols = int(layer["cols"])
        plan = ["matmul", *(["bias_add"] if layer["bias"] else [])]
        plan += [p for p in layer["post"] if p != "add" or out_cols in pool]
        fp8_next = layer["fp8_next"] if index + 1 < len(layers) else "no"
        if fp8_next == "cast":
            plan.append("cast")

        def precision(step: int, plan: list[str] = plan, fp8_next: str = fp8_next) -> Any:
            last = step == len(plan) - 1
            return None if last and fp8_next != "no" else F16

        w = rng.standard_normal((cols, out_cols)) / np.sqrt(cols)
        w_id = bld.weight(f"w{index}", w, layer["weight"])
        for step, kind in enumerate(plan):
            name, prec = f"{kind}{index}.{step}", precision(step)
            v = bld.expected[current]
            if kind == "matmul":
                mode = (gemm_modes or {}).get(str(bld.ops), {})
                product = v @ bld.expected[w_id] if mode.get("mode") != "fp8" else \
                    fp16_partial_product(v, bld.expected[w_id], int(mode["depth_block"]))
                current = bld.op("matmul", [current, w_id], prec, name, value=product)
                cols = out_cols
            elif kind == "bias_add":
                bias = bld.weight(f"b{index}", rng.standard_normal(cols) * 0.1, "F16")
                current = bld.op("bias_add", [current, bias], prec, name,
                                 value=v + bld.expected[bias])
            elif kind == "gelu":
                current = bld.op("gelu", [current], prec, name, value=gelu_tanh_half_loop(v),
                                 approximate="tanh")
            elif kind == "scale":
                current = bld.op("scale", [current], prec, name, value=v * 0.5, factor=0.5)
            elif kind == "softmax":
                z = v * 0.5
                e = np.exp(z - z.max(axis=-1, keepdims=True))
                current = bld.op("softmax", [current], prec, name,
                                 value=e / e.sum(axis=-1, keepdims=True), scale=0.5)
            elif kind == "layer_norm":
                g = bld.weight(f"gamma{index}.{step}", 1.0 + 0.1 * rng.standard_normal(cols), "F16")
                beta = bld.weight(f"beta{index}.{step}", 0.1 * rng.standard_normal(cols), "F16")
                if bld.precisions[current].kind == "F16" and cols % 4 == 0 and cols < 8192:
                    norm = one_pass_norm(v, bld.expected[g], bld.expected[beta])
                else:
                    mean = v.mean(axis=-1, keepdims=True)
                    var = ((v - mean) ** 2).mean(axis=-1, keepdims=True)
                    norm = (v - mean) / np.sqrt(var + LN_EPS) * bld.expected[g] + \
                        bld.expected[beta]
                current = bld.op("layer_norm", [current, g, beta], prec, name, value=norm,
                                 eps=LN_EPS)
            elif kind == "add":
                other = pool[cols]
                current = bld.op("add", [other, current], prec, name, value=bld.expected[other] + v)
            elif kind == "cast":
                current = bld.op("cast", [current], prec, name, value=v)
        pool[cols] = current
    bld.b.output(current)
    return bld.b.build(), bld.tensors, bld.expected[current]


def random_workload(spec: dict[str, Any]) -> Workload:
    """``spec`` as a :class:`Workload` (its parameters are the spec itself)."""

    def build(params: dict[str, Any]) -> tuple[Graph, dict[str, np.ndarray]]:
        graph, tensors, _ = build_random(params)
        return graph, tensors

    return Workload(name="random-graph", description="reliability fuzz graph", parameters=(),
                    build=build, identifier=lambda p: f"random-{p['seed']}")
