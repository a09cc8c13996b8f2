"""``siglip-mlp``: SigLIP's MLP, ``fc2(gelu_tanh(fc1(x)))``, the workload of reference log 004.

Defaults are SigLIP-so400m's: 729 tokens, dimension 1152, hidden 4304.  With ``--precision
fp8`` inputs, weights and the GELU output are FP8 F143 with power-of-two scales and the GEMM
results F16; with ``f16`` everything is F16.  ``--blocks N`` stacks N MLPs (each block's F16
output is cast to the next block's input precision).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ipu_stack.ir.graph import Graph, GraphBuilder
from ipu_stack.ir.precision import F16, Precision, fit_scale_exponent
from ipu_stack.ir.types import TensorType
from ipu_stack.workloads.base import Parameter, Workload, register, rng_for
from ipu_stack.workloads.footprint import mlp_footprint

PARAMETERS = (
    Parameter("batch", int, 1, "images per run"),
    Parameter("tokens", int, 729, "tokens per image"),
    Parameter("dim", int, 1152, "model dimension"),
    Parameter("hidden", int, 4304, "MLP hidden dimension"),
    Parameter("blocks", int, 1, "stacked MLP blocks"),
    Parameter("precision", str, "fp8", "inputs/weights precision", choices=("fp8", "f16")),
    Parameter("biases", bool, False, "add fc1/fc2 biases", minimum=None),
    Parameter("seed", int, 0, "seed of inputs and weights", minimum=0, maximum=None),
)


def _storage(kind: str, values: np.ndarray, headroom: float = 1.0) -> Precision:
    if kind == "f16":
        return F16
    return Precision("F8F143", fit_scale_exponent(values, "F8F143", headroom))


def _gelu_tanh64(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def _add_bias(
    b: GraphBuilder, tensors: dict[str, np.ndarray], seed: int, name: str, out: str,
    value: int, calibration: np.ndarray,
) -> tuple[int, np.ndarray]:
    """An F16 bias weight added to ``value``; the calibration activations follow it."""
    size = calibration.shape[-1]
    bias = (rng_for(seed, name).standard_normal(size) * 0.1).astype(np.float32)
    tensors[name] = F16.round_trip(bias)
    weight = b.weight(name, TensorType((size,), F16))
    return b.op("bias_add", [value, weight], F16, out), calibration + tensors[name]


def build_mlp(params: dict[str, Any]) -> tuple[Graph, dict[str, np.ndarray]]:
    """The graph and its host tensors (float32 values exactly representable on the device)."""
    seed, kind = params["seed"], params["precision"]
    rows, dim, hidden = params["batch"] * params["tokens"], params["dim"], params["hidden"]
    tensors: dict[str, np.ndarray] = {}
    x = rng_for(seed, "x").standard_normal((rows, dim)).astype(np.float32)
    calibration = rng_for(seed + 1, "x").standard_normal((min(rows, 256), dim))
    b = GraphBuilder(f"siglip-mlp-{kind}")
    x_prec = _storage(kind, x)
    current = b.input("x", TensorType((params["batch"], params["tokens"], dim), x_prec))
    tensors["x"] = x_prec.round_trip(x).reshape(params["batch"], params["tokens"], dim)
    calib = x_prec.round_trip(calibration.astype(np.float32)).astype(np.float64)
    for block in range(params["blocks"]):
        w1 = (rng_for(seed, f"w1.{block}").standard_normal((dim, hidden)) / np.sqrt(dim))
        w2 = (rng_for(seed, f"w2.{block}").standard_normal((hidden, dim)) / np.sqrt(hidden))
        weights = {"w1": w1.astype(np.float32), "w2": w2.astype(np.float32)}
        ids = {}
        for name, value in weights.items():
            precision = _storage(kind, value)
            tensors[f"{name}.{block}"] = precision.round_trip(value)
            ids[name] = b.weight(f"{name}.{block}", TensorType(value.shape, precision))
        h = b.op("matmul", [current, ids["w1"]], F16, f"fc1.{block}")
        calib_h = calib @ tensors[f"w1.{block}"].astype(np.float64)
        if params["biases"]:
            h, calib_h = _add_bias(b, tensors, seed, f"b1.{block}", f"fc1_bias.{block}", h, calib_h)
        calib_g = _gelu_tanh64(calib_h)
        g_prec = _storage(kind, calib_g, headroom=2.0)
        g = b.op("gelu", [h], g_prec, f"gelu.{block}", approximate="tanh")
        y = b.op("matmul", [g, ids["w2"]], F16, f"fc2.{block}")
        calib_y = g_prec.round_trip(calib_g.astype(np.float32)).astype(np.float64) @ tensors[
            f"w2.{block}"
        ].astype(np.float64)
        if params["biases"]:
            y, calib_y = _add_bias(b, tensors, seed, f"b2.{block}", f"fc2_bias.{block}", y, calib_y)
        if block + 1 < params["blocks"] and kind == "fp8":
            y_prec = _storage(kind, calib_y, headroom=2.0)
            y = b.op("cast", [y], y_prec, f"cast.{block}")
            calib_y = y_prec.round_trip(calib_y.astype(np.float32)).astype(np.float64)
        current = y
        calib = calib_y
    b.output(current)
    return b.build(), tensors


def _identifier(p: dict[str, Any]) -> str:
    return (
        f"siglip-mlp-{p['precision']}-b{p['batch']}-t{p['tokens']}-d{p['dim']}"
        f"-h{p['hidden']}-n{p['blocks']}"
    )


def _fields(p: dict[str, Any]) -> dict[str, Any]:
    return {
        "benchmark": f"siglip-mlp-{p['precision']}",
        "batch": p["batch"],
        "tokens": p["tokens"],
        "rows": p["batch"] * p["tokens"],
        "dimension": p["dim"],
        "hiddenDimension": p["hidden"],
        "blocks": p["blocks"],
        "biases": p["biases"],
    }


SIGLIP_MLP = register(
    Workload(
        name="siglip-mlp",
        description="SigLIP MLP: fc1 -> GELU(tanh) -> fc2 (reference log 004)",
        parameters=PARAMETERS,
        build=build_mlp,
        identifier=_identifier,
        benchmark_fields=_fields,
        footprint=mlp_footprint,
    )
)
