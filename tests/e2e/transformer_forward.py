"""An independent float64 forward pass of the transformer workloads from saved tensors.

Written against the saved ``.npz`` files only (nothing from the stack but the independent
``round_to`` of ``ipu_stack.testing.reference``: ml_dtypes for the storage formats), so it
checks the device result the way a user with plain numpy would.
With ``rounded=True`` every value is rounded to the precision the saved ``__precisions__``
metadata gives it, and each FP8 GEMM keeps FP16 partials as the saved ``__gemm_modes__`` say
(``float64_forward.gemm``), at the same points the graph stores values (GEMM results, bias sums,
RoPE outputs, scores, probabilities, contexts, layer norms, GELU, residuals); with
``rounded=False`` it is the ideal float64 answer from the same (already rounded) inputs and
weights.

What the npz files do not hold is passed in: ``heads``, ``eps`` and the GELU form.  The
layout of the workload is read from the tensor names: ``attn.*`` (the bare attention
block, no norm, biases or residual) or ``layer{i}.*`` (pre-norm layers; a stored
``.q.rope`` value means 2D RoPE on queries and keys, ``fc1.w`` means an MLP after the
attention).  The RoPE angles are computed here from Perception Encoder's definition
(``rope_2d_angles``), never read from the saved tables, so a wrong table is caught.
"""

from __future__ import annotations

import json
import math

import numpy as np

from ipu_stack.testing.reference import gelu_tanh_half_loop, layer_norm_normce
from tests.e2e.float64_forward import gemm, gemm_modes, round_to


def rope_2d_angles(tokens: int, head_dim: int) -> np.ndarray:
    """``[tokens, head_dim / 2]`` rotation angles of PE's ``Rope2D``: a CLS token (when
    ``tokens`` is ``1 + g*g``) gets angle 0 and the patches of the ``g x g`` grid positions
    counted from 1; without CLS (``g*g``) from 0.  Pairs ``0 .. P/2`` turn with the column at
    frequencies ``10000^(-2i/(P))`` per axis of ``P = head_dim / 2`` dims, the rest with the row."""
    axis_dim = head_dim // 2
    freqs = 1.0 / 10000.0 ** (np.arange(0, axis_dim, 2) / axis_dim)
    side = math.isqrt(tokens)
    cls = side * side != tokens
    if cls:
        side = math.isqrt(tokens - 1)
        assert side * side == tokens - 1, f"{tokens} tokens form no grid"
    rows, cols = np.divmod(np.arange(side * side), side)
    angles = np.concatenate([np.outer(cols + cls, freqs), np.outer(rows + cls, freqs)], axis=1)
    return np.concatenate([np.zeros((1, head_dim // 2)), angles]) if cls else angles


class Forward:
    """One pass over the saved tensors; ``store`` rounds a value the graph stores by name."""

    def __init__(self, saved: dict[str, np.ndarray], heads: int, eps: float, gelu: str,
                 rounded: bool, rope: bool | None = None) -> None:
        self.saved = saved
        self.meta = json.loads(str(saved["__precisions__"]))
        self.modes = gemm_modes(saved)
        self.heads = heads
        self.eps = eps
        self.gelu_form = gelu
        self.rounded = rounded
        self.rope_enabled = rope
        batch, tokens, dim = saved["x"].shape if "x" in saved else saved["patches"].shape
        if "patch.w" in saved:  # a tower: the model dimension is the patch embedding's width
            dim = saved["patch.w"].shape[1]
        self.batch, self.tokens, self.dim = batch, tokens, dim
        if dim % heads:
            raise ValueError(f"dim {dim} is not a multiple of heads {heads}")
        self.head_dim = dim // heads

    def w(self, name: str) -> np.ndarray:
        return self.saved[name].astype(np.float64)

    def has(self, name: str) -> bool:
        return name in self.saved

    def store(self, values: np.ndarray, name: str) -> np.ndarray:
        """The value ``name`` as the graph stores it (rounded mode) or as is (ideal mode)."""
        if not self.rounded:
            return values
        if name not in self.meta:
            raise KeyError(f"no stored precision for value {name!r}")
        return round_to(values, self.meta[name])

    # ------------------------------------------------------------------ operations
    def linear(self, x: np.ndarray, name: str) -> np.ndarray:
        mm = f"{name}.mm"
        y = self.store(gemm(x, self.w(f"{name}.w"), self.modes.get(mm), self.rounded), mm)
        if self.has(f"{name}.b"):
            y = self.store(y + self.w(f"{name}.b")[None, :], f"{name}.out")
        return y

    def layer_norm(self, x: np.ndarray, name: str) -> np.ndarray:
        if self.rounded and x.shape[1] % 4 == 0:  # F16 rows: the vendor's NormCE
            y = layer_norm_normce(x, self.w(f"{name}.gamma"), self.w(f"{name}.beta"), self.eps)
            return self.store(y, f"{name}.out")
        mean = x.sum(axis=1, keepdims=True) / x.shape[1]
        centred = x - mean
        var = (centred * centred).sum(axis=1, keepdims=True) / x.shape[1]
        y = centred / np.sqrt(var + self.eps) * self.w(f"{name}.gamma")[None, :]
        return self.store(y + self.w(f"{name}.beta")[None, :], f"{name}.out")

    def rope(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray, name: str) -> np.ndarray:
        """Rotate pairs ``(2i, 2i+1)`` of each head by row angle ``i`` of the tables."""
        out = np.empty_like(x)
        for h in range(self.heads):
            for i in range(self.head_dim // 2):
                e = h * self.head_dim + 2 * i
                a, b = x[:, e], x[:, e + 1]
                out[:, e] = a * cos[:, i] - b * sin[:, i]
                out[:, e + 1] = a * sin[:, i] + b * cos[:, i]
        return self.store(out, name)

    def gelu(self, x: np.ndarray) -> np.ndarray:
        if self.gelu_form == "tanh" and self.rounded:  # the device's F16 loop
            return gelu_tanh_half_loop(x)
        if self.gelu_form == "tanh":
            return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
        erf = np.array([math.erf(v / math.sqrt(2.0)) for v in x.ravel()]).reshape(x.shape)
        return 0.5 * x * (1.0 + erf)

    def attention(self, x: np.ndarray, prefix: str) -> np.ndarray:
        q = self.linear(x, f"{prefix}.q")
        k = self.linear(x, f"{prefix}.k")
        v = self.linear(x, f"{prefix}.v")
        uses_rope = f"{prefix}.q.rope" in self.meta
        if uses_rope if self.rope_enabled is None else self.rope_enabled:
            angles = np.tile(rope_2d_angles(self.tokens, self.head_dim), (self.batch, 1))
            cos, sin = np.cos(angles), np.sin(angles)
            q = self.rope(q, cos, sin, f"{prefix}.q.rope")
            k = self.rope(k, cos, sin, f"{prefix}.k.rope")
        t, d, hd = self.tokens, self.dim, self.head_dim
        scores = np.empty((self.batch * self.heads * t, t))
        for b in range(self.batch):
            for h in range(self.heads):
                rows = slice((b * self.heads + h) * t, (b * self.heads + h + 1) * t)
                qh = q[b * t : (b + 1) * t, h * hd : (h + 1) * hd]
                kh = k[b * t : (b + 1) * t, h * hd : (h + 1) * hd]
                scores[rows] = gemm(qh, kh.T, self.modes.get(f"{prefix}.scores"),
                                    self.rounded)
        scores = self.store(scores, f"{prefix}.scores")
        logits = scores / math.sqrt(hd)
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs = self.store(e / e.sum(axis=1, keepdims=True), f"{prefix}.probs")
        context = np.empty((self.batch * t, d))
        for b in range(self.batch):
            for h in range(self.heads):
                p = probs[(b * self.heads + h) * t : (b * self.heads + h + 1) * t]
                vh = v[b * t : (b + 1) * t, h * hd : (h + 1) * hd]
                context[b * t : (b + 1) * t, h * hd : (h + 1) * hd] = gemm(
                    p, vh, self.modes.get(f"{prefix}.context"), self.rounded)
        context = self.store(context, f"{prefix}.context")
        if f"{prefix}.context8" in self.meta:
            context = self.store(context, f"{prefix}.context8")
        return self.linear(context, f"{prefix}.o")

    def layer(self, x: np.ndarray, index: int) -> np.ndarray:
        p = f"layer{index}"
        a = self.attention(self.layer_norm(x, f"{p}.ln1"), f"{p}.attn")
        x = self.store(x + a, f"{p}.residual1")
        if not self.has(f"{p}.fc1.w"):
            return x
        h = self.linear(self.layer_norm(x, f"{p}.ln2"), f"{p}.fc1")
        g = self.store(self.gelu(h), f"{p}.gelu")
        m = self.linear(g, f"{p}.fc2")
        return self.store(x + m, f"{p}.residual2")

    def run(self) -> np.ndarray:
        x = self.w("x").reshape(self.batch * self.tokens, self.dim)
        if self.has("attn.q.w"):
            return self.attention(x, "attn")
        index = 0
        while self.has(f"layer{index}.attn.q.w"):
            x = self.layer(x, index)
            index += 1
        if index == 0:
            raise ValueError("saved tensors hold neither attn.* nor layer0.* weights")
        return x


def transformer_forward(saved: dict[str, np.ndarray], heads: int, eps: float,
                        gelu: str = "tanh", rounded: bool = True,
                        rope: bool | None = None) -> np.ndarray:
    """The workload's output as ``[batch * tokens, dim]`` float64; ``gelu`` is ``tanh`` or
    ``erf``; ``rope=False`` leaves queries and keys unrotated (``None``: as the graph did)."""
    return Forward(saved, heads, eps, gelu, rounded, rope).run()


def patch_rows(pixels: np.ndarray, patch: int, cls: bool) -> np.ndarray:
    """The convolution's input windows, window by window in raster order, each flattened in
    (channel, row, column) order like a PyTorch conv weight; an all-zero row first per
    image with a CLS token (its embedding rides in the saved position table's first row)."""
    batch, _, height, width = pixels.shape
    rows = []
    for b in range(batch):
        if cls:
            rows.append(np.zeros(3 * patch * patch))
        for gy in range(height // patch):
            for gx in range(width // patch):
                window = pixels[b, :, gy * patch : (gy + 1) * patch, gx * patch : (gx + 1) * patch]
                rows.append(window.reshape(-1))
    return np.array(rows, dtype=np.float64)


def tower_forward(saved: dict[str, np.ndarray], heads: int, eps: float, gelu: str, patch: int,
                  rounded: bool = True) -> np.ndarray:
    """A vision tower from the saved image: patch convolution, position table, (``ln_pre``),
    every ``layer{i}``, ``post_ln``; ``[batch * tokens, dim]`` float64."""
    forward = Forward(saved, heads, eps, gelu, rounded)
    cls = "ln_pre.gamma" in saved
    rows = patch_rows(saved["pixels"].astype(np.float64), patch, cls)
    if rounded:
        rows = round_to(rows, forward.meta["patches"])
    x = forward.linear(rows, "patch")
    x = forward.store(x + forward.w("pos"), "embed")
    if cls:
        x = forward.layer_norm(x, "ln_pre")
    index = 0
    while forward.has(f"layer{index}.attn.q.w"):
        x = forward.layer(x, index)
        index += 1
    return forward.layer_norm(x, "post_ln")
