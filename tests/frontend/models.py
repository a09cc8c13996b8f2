"""Small torch models for the importer's tests: twins of the builtin workloads (same weights,
written the way a user would write them) and a tiny ViT with the eager attention pattern."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812


def _linear(tensors: dict[str, np.ndarray], prefix: str, bias: bool) -> nn.Linear:
    """An nn.Linear holding a builtin's ``[in, out]`` weight (transposed) and bias (a weight
    may be held as its FP8 codes: read through ``np.asarray``, as every reader does)."""
    w = torch.from_numpy(np.ascontiguousarray(np.asarray(tensors[f"{prefix}.w"]).T))
    layer = nn.Linear(w.shape[1], w.shape[0], bias=bias)
    with torch.no_grad():
        layer.weight.copy_(w)
        if bias:
            layer.bias.copy_(torch.from_numpy(tensors[f"{prefix}.b"]))
    return layer


def _norm(tensors: dict[str, np.ndarray], prefix: str, eps: float) -> nn.LayerNorm:
    gamma = torch.from_numpy(tensors[f"{prefix}.gamma"])
    norm = nn.LayerNorm(gamma.shape[0], eps=eps)
    with torch.no_grad():
        norm.weight.copy_(gamma)
        norm.bias.copy_(torch.from_numpy(tensors[f"{prefix}.beta"]))
    return norm


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Perception Encoder's ``rotate_half`` on interleaved pairs: (x0, x1) -> (-x1, x0)."""
    pairs = x.view(*x.shape[:-1], x.shape[-1] // 2, 2)
    x0, x1 = pairs.unbind(-1)
    return torch.stack((-x1, x0), dim=-1).view(x.shape)


class AttentionTwin(nn.Module):
    """The builtins' attention: q/k/v projections, SDPA over heads, output projection; with
    ``rope`` tables (cos, sin ``[T, d/2]``) PE's rotary embedding on queries and keys."""

    def __init__(self, tensors: dict[str, np.ndarray], prefix: str, heads: int, bias: bool,
                 rope: bool = False):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (_linear(tensors, f"{prefix}.{n}", bias)
                                          for n in "qkvo")
        self.rope = rope
        if rope:  # PE's freqs are repeated per pair: "... n -> ... (n r)", r=2
            cos = torch.from_numpy(tensors["rope.cos"]).repeat_interleave(2, dim=-1)
            sin = torch.from_numpy(tensors["rope.sin"]).repeat_interleave(2, dim=-1)
            self.register_buffer("cos", cos)
            self.register_buffer("sin", sin)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        b, t, d = h.shape

        def split(x: torch.Tensor) -> torch.Tensor:
            return x.view(b, t, self.heads, d // self.heads).transpose(1, 2)

        q, k, v = split(self.q(h)), split(self.k(h)), split(self.v(h))
        if self.rope:
            q = q * self.cos + rotate_half(q) * self.sin
            k = k * self.cos + rotate_half(k) * self.sin
        o = F.scaled_dot_product_attention(q, k, v)
        return self.o(o.transpose(1, 2).reshape(b, t, d))


class LayerTwin(nn.Module):
    """``siglip-layer`` / ``vit-layer`` / ``siglip-attention`` / ``pe-block`` (``rope``): a
    pre-norm encoder layer."""

    def __init__(self, tensors: dict[str, np.ndarray], heads: int, eps: float, blocks: int = 1,
                 mlp: bool = True, gelu: str = "tanh", rope: bool = False):
        super().__init__()
        self.mlp, self.gelu = mlp, gelu
        self.ln1 = nn.ModuleList(_norm(tensors, f"layer{i}.ln1", eps) for i in range(blocks))
        self.attn = nn.ModuleList(AttentionTwin(tensors, f"layer{i}.attn", heads, True, rope)
                                  for i in range(blocks))
        if mlp:
            self.ln2 = nn.ModuleList(_norm(tensors, f"layer{i}.ln2", eps) for i in range(blocks))
            self.fc1 = nn.ModuleList(_linear(tensors, f"layer{i}.fc1", True) for i in range(blocks))
            self.fc2 = nn.ModuleList(_linear(tensors, f"layer{i}.fc2", True) for i in range(blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(len(self.attn)):
            x = x + self.attn[i](self.ln1[i](x))
            if self.mlp:
                h = F.gelu(self.fc1[i](self.ln2[i](x)), approximate=self.gelu)
                x = x + self.fc2[i](h)
        return x


class TowerTwin(nn.Module):
    """``siglip-vision`` / ``pe-vision``: patch-embedding conv, (CLS,) position table,
    (``ln_pre``,) the layers and ``post_ln``, holding the builtin's weights.  The builtin
    folds the CLS embedding into the table's first row, so the twin's CLS token is zero."""

    def __init__(self, tensors: dict[str, np.ndarray], params: dict, cls: bool):
        super().__init__()
        dim, patch = params["dim"], params["patch"]
        weight = torch.from_numpy(np.asarray(tensors["patch.w"]).T.copy()).reshape(dim, 3, patch, patch)
        self.embed = nn.Conv2d(3, dim, patch, stride=patch, bias=not cls)
        with torch.no_grad():
            self.embed.weight.copy_(weight)
            if not cls:
                self.embed.bias.copy_(torch.from_numpy(tensors["patch.b"]))
        tokens = tensors["pos"].shape[0] // params["batch"]
        self.pos = nn.Parameter(torch.from_numpy(tensors["pos"][:tokens].copy()))
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim)) if cls else None
        self.ln_pre = _norm(tensors, "ln_pre", params["eps"]) if cls else None
        gelu = "tanh" if params["gelu"] == "tanh" else "none"
        self.layers = LayerTwin(tensors, params["heads"], params["eps"], params["layers"],
                                gelu=gelu, rope=cls)
        self.post_ln = _norm(tensors, "post_ln", params["eps"])

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.embed(pixels).flatten(2).transpose(1, 2)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = x + self.pos
        if self.ln_pre is not None:
            x = self.ln_pre(x)
        return self.post_ln(self.layers(x))


class MlpTwin(nn.Module):
    """``siglip-mlp``: ``fc2(gelu_tanh(fc1(x)))`` without biases."""

    def __init__(self, tensors: dict[str, np.ndarray]):
        super().__init__()
        self.w1 = nn.Parameter(torch.from_numpy(np.asarray(tensors["w1.0"]).T.copy()))
        self.w2 = nn.Parameter(torch.from_numpy(np.asarray(tensors["w2.0"]).T.copy()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(F.gelu(F.linear(x, self.w1), approximate="tanh"), self.w2)


class TinyVit(nn.Module):
    """A tiny ViT written with the eager attention pattern (view, transpose, q @ k^T, scale,
    softmax, @ v): patch embedding conv, optional CLS token, learned positions, pre-norm
    layers, final norm and optional mean pooling.  ``sharpen`` scales the q/k weights so
    the softmax is peaked (errors on the q/k path then show in the output)."""

    def __init__(self, dim: int = 64, heads: int = 4, layers: int = 2, hidden: int = 128,
                 patch: int = 8, image: int = 32, cls: bool = True, pool: bool = False,
                 sharpen: float = 1.0, gelu: str = "none"):
        super().__init__()
        self.heads, self.pool, self.gelu, self.cls_token = heads, pool, gelu, None
        self.embed = nn.Conv2d(3, dim, patch, stride=patch)
        tokens = (image // patch) ** 2 + (1 if cls else 0)
        if cls:
            self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.5)
        self.pos = nn.Parameter(torch.randn(1, tokens, dim) * 0.2)
        self.blocks = nn.ModuleList()
        for _ in range(layers):
            block = nn.ModuleDict({
                "ln1": nn.LayerNorm(dim), "qkv": nn.ModuleList(nn.Linear(dim, dim) for _ in "qkv"),
                "proj": nn.Linear(dim, dim), "ln2": nn.LayerNorm(dim),
                "fc1": nn.Linear(dim, hidden), "fc2": nn.Linear(hidden, dim)})
            with torch.no_grad():
                block["qkv"][0].weight.mul_(sharpen)
                block["qkv"][1].weight.mul_(sharpen)
            self.blocks.append(block)
        self.norm = nn.LayerNorm(dim)

    def attention(self, block: nn.ModuleDict, h: torch.Tensor) -> torch.Tensor:
        b, t, d = h.shape
        hd = d // self.heads
        q, k, v = (lin(h).view(b, t, self.heads, hd).transpose(1, 2) for lin in block["qkv"])
        scores = torch.matmul(q, k.transpose(-2, -1)) / (hd ** 0.5)
        probs = torch.softmax(scores, dim=-1)
        out = torch.matmul(probs, v).transpose(1, 2).contiguous().view(b, t, d)
        return block["proj"](out)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.embed(pixels).flatten(2).transpose(1, 2)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = x + self.pos
        for block in self.blocks:
            x = x + self.attention(block, block["ln1"](x))
            x = x + block["fc2"](F.gelu(block["fc1"](block["ln2"](x)), approximate=self.gelu))
        x = self.norm(x)
        return x.mean(dim=1) if self.pool else x


def export(module: nn.Module, *inputs: torch.Tensor):
    return torch.export.export(module.eval(), tuple(inputs))


class QaLogits(nn.Module):
    """A transformers question-answering model called with ``input_ids`` alone, returning
    its start and end logits as plain tensors (what ``torch.export`` and ONNX take)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.model(input_ids=input_ids)
        return out.start_logits, out.end_logits


def drawn_vectors(module: nn.Module, scale: float = 0.05) -> nn.Module:
    """Biases and norm parameters drawn at random, as a trained model's are: left at their
    init (zeros, ones) an exporter stores each distinct value once for every layer."""
    with torch.no_grad():
        for parameter in module.parameters():
            if parameter.dim() == 1:
                parameter.add_(scale * torch.randn_like(parameter))
    return module
