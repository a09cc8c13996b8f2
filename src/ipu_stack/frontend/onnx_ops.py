"""ONNX operators as torch calls: the translation the ONNX frontend traces.

Each entry of ``TRANSLATIONS`` runs one ONNX node with torch functions, so that tracing the
translated graph with ``torch.export`` gives the same ATen operations the torch importer
already maps (``aten.linear``-style products, ``layer_norm``, ``softmax``, views): the ONNX
frontend shares every pattern of the torch one instead of repeating them.  A node whose
inputs are all constants is run once, eagerly, before tracing (``onnx_program``); the
entries below serve both.  Operands that ONNX passes as tensors but torch takes as Python
values (a reshape's shape, a slice's bounds, a scalar factor) are read from the constant.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ipu_stack.util.errors import CompileError

# ONNX TensorProto element types as torch dtype names
DTYPES = {1: "float32", 10: "float32", 11: "float32", 16: "float32", 6: "int32", 7: "int64",
          9: "bool", 2: "uint8", 3: "int8"}


@dataclass
class NodeCall:
    """One node's operands: traced tensors, their constant values (``None`` for a value
    that depends on a graph input), and the node's attributes."""

    torch: Any
    op_type: str
    inputs: list[Any]
    consts: list[np.ndarray | None]
    attrs: dict[str, Any]

    def const(self, index: int, what: str) -> np.ndarray:
        if index >= len(self.consts) or self.consts[index] is None:
            raise CompileError(f"{self.op_type} with a computed {what} (input {index}); the "
                               "importer needs it constant")
        return self.consts[index]

    def ints(self, index: int, what: str) -> list[int]:
        return [int(v) for v in np.asarray(self.const(index, what)).reshape(-1)]

    def optional_ints(self, index: int, attr: str) -> list[int] | None:
        """An operand that opset 13+ moved from an attribute to an optional input."""
        if index < len(self.consts) and self.inputs[index] is not None:
            return self.ints(index, attr)
        value = self.attrs.get(attr)
        return None if value is None else [int(v) for v in value]

    def operand(self, index: int) -> Any:
        """The input as a Python number when it is a one-element constant (a scalar factor
        the importer folds), else the tensor.  Exporters write scalars as ``[1]`` too: one
        of those is a number where the other operands are tensors of at least its rank, so
        that the result's shape is the same either way."""
        const = self.consts[index]
        if const is None or const.size != 1:
            return self.inputs[index]
        ranks = [x.dim() for i, x in enumerate(self.inputs) if i != index and hasattr(
            x, "dim") and (self.consts[i] is None or self.consts[i].size != 1)]
        if np.ndim(const) == 0 or (ranks and np.ndim(const) <= min(ranks)):
            return const.item()
        return self.inputs[index]


def _tensor(call: NodeCall, out: Any) -> Any:
    """``out`` as a tensor: an operation on two scalar operands gives a Python number,
    which the fold cannot size."""
    return out if hasattr(out, "dim") else call.torch.as_tensor(out)


def _binary(fn: Callable[[Any, Any], Any]) -> Callable[[NodeCall], Any]:
    def run(call: NodeCall) -> Any:
        return _tensor(call, fn(call.operand(0), call.operand(1)))
    return run


def _is_integer(value: Any) -> bool:
    if isinstance(value, (bool, int)):
        return True
    return hasattr(value, "is_floating_point") and not value.is_floating_point()


def _div(call: NodeCall) -> Any:
    """ONNX divides integers with truncation (shape arithmetic), floats exactly."""
    a, b = call.operand(0), call.operand(1)
    if _is_integer(a) and _is_integer(b):
        return call.torch.div(call.torch.as_tensor(a), b, rounding_mode="trunc")
    return _tensor(call, a / b)


def _unary(name: str) -> Callable[[NodeCall], Any]:
    def run(call: NodeCall) -> Any:
        return getattr(call.torch, name)(call.inputs[0])
    return run


def _cast(call: NodeCall) -> Any:
    to = int(call.attrs["to"])
    if to not in DTYPES:
        raise CompileError(f"Cast to ONNX type {to}, which the importer does not read")
    return call.inputs[0].to(getattr(call.torch, DTYPES[to]))


def _cast_like(call: NodeCall) -> Any:
    return call.inputs[0].to(call.inputs[1].dtype)


def _reshape(call: NodeCall) -> Any:
    x, shape = call.inputs[0], call.ints(1, "shape")
    if not call.attrs.get("allowzero", 0):
        shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return x.reshape(shape)


def _gemm(call: NodeCall) -> Any:
    t, a, b = call.torch, call.inputs[0], call.inputs[1]
    if call.attrs.get("transA", 0):
        a = a.t()
    weight = b if call.attrs.get("transB", 0) else b.t()
    alpha, beta = float(call.attrs.get("alpha", 1.0)), float(call.attrs.get("beta", 1.0))
    bias = call.inputs[2] if len(call.inputs) > 2 else None
    out = t.nn.functional.linear(a, weight, bias if beta == 1.0 else None)
    if alpha != 1.0:
        out = out * alpha
    if bias is not None and beta != 1.0:
        out = out + beta * bias
    return out


def _softmax(call: NodeCall) -> Any:
    return call.torch.softmax(call.inputs[0], int(call.attrs.get("axis", -1)))


def _layer_norm(call: NodeCall) -> Any:
    x = call.inputs[0]
    axis = int(call.attrs.get("axis", -1)) % x.dim()
    bias = call.inputs[2] if len(call.inputs) > 2 else None
    return call.torch.nn.functional.layer_norm(x, tuple(x.shape[axis:]), call.inputs[1], bias,
                                               float(call.attrs.get("epsilon", 1e-5)))


def _gelu(call: NodeCall) -> Any:
    return call.torch.nn.functional.gelu(call.inputs[0],
                                         approximate=call.attrs.get("approximate", "none"))


def _reduce(name: str) -> Callable[[NodeCall], Any]:
    def run(call: NodeCall) -> Any:
        x, keep = call.inputs[0], bool(call.attrs.get("keepdims", 1))
        axes = call.optional_ints(1, "axes")
        if not axes:
            axes = list(range(x.dim()))
        return getattr(call.torch, name)(x, dim=tuple(axes), keepdim=keep)
    return run


def _transpose(call: NodeCall) -> Any:
    """``permute``; where torch.onnx merged two of torch's layout changes into one, the two
    as torch wrote them: ``[1, 2, 0]`` is ``nn.MultiheadAttention``'s ``k.transpose(0, 1)``
    then ``.transpose(-2, -1)``, ``[2, 0, 1, 3]`` a sequence-first attention's (MLCD's)
    ``transpose(1, 2)`` then ``permute(1, 0, 2, 3)``."""
    x = call.inputs[0]
    perm = [int(p) for p in call.attrs.get("perm") or list(reversed(range(x.dim())))]
    if perm == [1, 2, 0]:
        return x.transpose(0, 1).transpose(-2, -1)
    if perm == [2, 0, 1, 3]:
        return x.transpose(1, 2).permute(1, 0, 2, 3)
    return x.permute(perm)


def _flatten(call: NodeCall) -> Any:
    """``Flatten`` to two axes; from axis 1 as ``torch.flatten(x, 1)``, the call it is
    exported from (a pooled head's)."""
    x = call.inputs[0]
    axis = int(call.attrs.get("axis", 1)) % max(x.dim(), 1)
    if axis == 1:
        return call.torch.flatten(x, 1)
    outer = int(np.prod(x.shape[:axis], dtype=np.int64))
    return x.reshape(outer, -1)


def _squeeze(call: NodeCall) -> Any:
    x, axes = call.inputs[0], call.optional_ints(1, "axes")
    if axes is None:
        return x.squeeze()
    for axis in sorted((a % x.dim() for a in axes), reverse=True):
        x = x.squeeze(axis)
    return x


def _unsqueeze(call: NodeCall) -> Any:
    x, axes = call.inputs[0], call.optional_ints(1, "axes") or []
    rank = x.dim() + len(axes)
    for axis in sorted(a % rank for a in axes):
        x = x.unsqueeze(axis)
    return x


def _concat(call: NodeCall) -> Any:
    return call.torch.cat([x for x in call.inputs if x is not None], int(call.attrs["axis"]))


def _split(call: NodeCall) -> Any:
    x, axis = call.inputs[0], int(call.attrs.get("axis", 0))
    sizes = call.optional_ints(1, "split")
    if sizes is None:
        parts = int(call.attrs.get("num_outputs", 0)) or len(call.attrs["_outputs"])
        return tuple(call.torch.chunk(x, parts, axis))
    return tuple(call.torch.split(x, sizes, axis))


def _slice(call: NodeCall) -> Any:
    x = call.inputs[0]
    starts, ends = call.ints(1, "starts"), call.ints(2, "ends")
    axes = call.ints(3, "axes") if len(call.inputs) > 3 and call.inputs[3] is not None \
        else list(range(len(starts)))
    steps = call.ints(4, "steps") if len(call.inputs) > 4 and call.inputs[4] is not None \
        else [1] * len(starts)
    index: list[Any] = [slice(None)] * x.dim()
    reversed_axes: list[tuple[int, list[int]]] = []
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        if step == 0:
            raise CompileError("Slice with a step of 0")
        size = x.shape[axis]
        start, end = start + size if start < 0 else start, end + size if end < 0 else end
        if step > 0:
            index[axis % x.dim()] = slice(max(0, min(size, start)), max(0, min(size, end)),
                                          step)
        else:  # ONNX clamps a backward slice's start to [0, size - 1], its end to [-1, ...]
            picked = list(range(max(0, min(size - 1, start)), max(-1, min(size - 1, end)),
                                step))
            reversed_axes.append((axis % x.dim(), picked))
    out = x[tuple(index)]
    for axis, picked in reversed_axes:  # torch slices forward only: picked positions
        out = out.index_select(axis, call.torch.as_tensor(picked, dtype=call.torch.long))
    return out


def _expand(call: NodeCall) -> Any:
    x = call.inputs[0]
    shape = np.broadcast_shapes(tuple(x.shape), tuple(call.ints(1, "shape")))
    return x.expand(shape)


def _gather(call: NodeCall) -> Any:
    t, data, indices = call.torch, call.inputs[0], call.inputs[1]
    axis = int(call.attrs.get("axis", 0)) % data.dim()
    const = call.consts[1]
    size = data.shape[axis]
    if const is not None and const.size and not (-size <= const.min() and const.max() < size):
        wrong = const[(const < -size) | (const >= size)].reshape(-1)[0]
        raise CompileError(f"index {wrong} is outside axis {axis} of size {size} (ONNX "
                           f"allows {-size} to {size - 1})")
    if const is not None and const.ndim == 0:  # one position: a select
        return data.select(axis, int(const) % size)
    if call.consts[0] is not None and call.consts[1] is None and axis == 0 and data.dim() == 2:
        return t.nn.functional.embedding(indices.long(), data)  # a token table
    if const is not None:
        flat = t.as_tensor(np.where(const < 0, const + size, const).reshape(-1))
        picked = data.index_select(axis, flat)
        return picked.reshape(*data.shape[:axis], *const.shape, *data.shape[axis + 1:])
    return t.index_select(data, axis, indices.reshape(-1).long()).reshape(
        *data.shape[:axis], *indices.shape, *data.shape[axis + 1:])


def _gather_nd(call: NodeCall) -> Any:
    data, indices = call.inputs[0], call.inputs[1].long()
    if int(call.attrs.get("batch_dims", 0)):
        raise CompileError("GatherND with batch_dims")
    return data[tuple(indices[..., k] for k in range(indices.shape[-1]))]


def _gather_elements(call: NodeCall) -> Any:
    """``GatherElements``: torch's ``gather`` (a position table's rows picked by position,
    as BERT's token types are taken from their buffer), negative indices wrapped."""
    data, index = call.inputs[0], call.inputs[1].long()
    axis = int(call.attrs.get("axis", 0)) % data.dim()
    if call.consts[1] is not None:
        const = np.asarray(call.consts[1]).astype(np.int64)
        index = call.torch.as_tensor(np.where(const < 0, const + data.shape[axis], const))
    return call.torch.gather(data, axis, index)


def _cumsum(call: NodeCall) -> Any:
    """``CumSum`` over a constant axis, with its ``exclusive`` and ``reverse`` forms
    (RoBERTa's position ids count the tokens that are not padding)."""
    x, axis = call.inputs[0], call.ints(1, "axis")[0]
    t = call.torch
    if call.attrs.get("reverse", 0):
        x = t.flip(x, (axis,))
    out = t.cumsum(x, axis)
    if call.attrs.get("exclusive", 0):
        out = out - x
    if call.attrs.get("reverse", 0):
        out = t.flip(out, (axis,))
    return out.to(call.inputs[0].dtype)


def _mod(call: NodeCall) -> Any:
    """``Mod``: the sign of the divisor (``remainder``) unless ``fmod`` asks for the
    dividend's (``fmod``), as ONNX defines the two."""
    a, b = call.operand(0), call.operand(1)
    t = call.torch
    a = a if hasattr(a, "dim") else t.as_tensor(a)
    return t.fmod(a, b) if call.attrs.get("fmod", 0) else t.remainder(a, b)


PAD_MODES = ("constant", "reflect", "edge")


def _pad(call: NodeCall) -> Any:
    """``Pad`` (constant, reflect, edge): ONNX lists every axis's start pads, then every end
    pad (a negative one crops).  Non-negative constant pads are torch's ``pad`` (the call
    torch exports); otherwise axis by axis (:func:`_pad_axis`)."""
    x, pads = call.inputs[0], call.ints(1, "pads")
    mode = call.attrs.get("mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if mode not in PAD_MODES:
        raise CompileError(f"Pad with mode {mode!r} (constant, reflect and edge are read)")
    axes = call.ints(3, "axes") if len(call.inputs) > 3 and call.inputs[3] is not None \
        else list(range(x.dim()))
    axes = [a % x.dim() for a in axes]
    if len(pads) != 2 * len(axes) or len(set(axes)) != len(axes):
        raise CompileError(f"Pad with {len(pads)} pads for the axes {axes}")
    value = 0.0
    if len(call.inputs) > 2 and call.inputs[2] is not None:
        value = float(np.asarray(call.const(2, "constant_value")).reshape(-1)[0])
    starts = dict(zip(axes, pads[:len(axes)], strict=True))
    ends = dict(zip(axes, pads[len(axes):], strict=True))
    if not any(pads):
        return x
    if mode == "constant" and min(pads) >= 0:
        pairs = [p for axis in reversed(range(x.dim())) for p in (starts.get(axis, 0),
                                                                  ends.get(axis, 0))]
        return call.torch.nn.functional.pad(x, pairs, mode="constant", value=value)
    for axis in axes:
        x = _pad_axis(call, x, axis, starts[axis], ends[axis], mode, value)
    return x


def _pad_axis(call: NodeCall, x: Any, axis: int, begin: int, end: int, mode: str,
              value: float) -> Any:
    """One axis of a ``Pad``, as onnxruntime runs it: the positive pads filled first (with
    ``value``, the edge's element, or the reflection: numpy's ``pad`` of the positions,
    gathered), then the negative ones cropped from what that made."""
    size = x.shape[axis]
    grown, low = max(begin, 0), max(-begin, 0)
    length = size + begin + end
    if length < 0:
        raise CompileError(f"Pad crops {-begin - end} elements of axis {axis}, which holds "
                           f"{size}")
    after = max(end, 0)
    if mode == "constant" and (grown or after):
        pairs = [0, 0] * (x.dim() - 1 - axis) + [grown, after]
        x = call.torch.nn.functional.pad(x, pairs, mode="constant", value=value)
    elif grown or after:
        if size == 0 or (mode == "reflect" and max(grown, after) >= size):
            raise CompileError(f"Pad in mode {mode} of {max(grown, after)} beside the {size} "
                               f"elements of axis {axis}")
        index = np.pad(np.arange(size), (grown, after),
                       mode="edge" if mode == "edge" else "reflect")
        x = x.index_select(axis, call.torch.as_tensor(index))
    return x.narrow(axis, low, length) if (low, length) != (0, x.shape[axis]) else x


def _global_average_pool(call: NodeCall) -> Any:
    """``GlobalAveragePool``: the mean over every axis after the channels, kept; over one
    axis as torch's ``adaptive_avg_pool1d(x, 1)``, the call it was exported from (Swin's
    pooler)."""
    x, functional = call.inputs[0], call.torch.nn.functional
    if x.dim() == 3:
        return functional.adaptive_avg_pool1d(x, 1)
    return x.mean(dim=tuple(range(2, x.dim())), keepdim=True)


def _scatter_nd(call: NodeCall) -> Any:
    """``ScatterND`` without reduction: ``data`` with ``updates`` written at ``indices`` (a
    relative position index built in place, folded as a constant)."""
    if call.attrs.get("reduction", "none") != "none":
        raise CompileError(f"ScatterND with reduction {call.attrs['reduction']}")
    out, index = call.inputs[0].clone(), call.inputs[1].long()
    out[tuple(index[..., k] for k in range(index.shape[-1]))] = call.inputs[2]
    return out


def _argmax(call: NodeCall) -> Any:
    if call.attrs.get("select_last_index", 0):
        raise CompileError("ArgMax with select_last_index")
    return call.torch.argmax(call.inputs[0], int(call.attrs.get("axis", 0)),
                             keepdim=bool(call.attrs.get("keepdims", 1)))


def _where(call: NodeCall) -> Any:
    t = call.torch
    a, b = call.operand(1), call.operand(2)
    return t.where(call.inputs[0], t.as_tensor(a) if isinstance(a, (int, float, bool)) else a, b)


def _conv(call: NodeCall) -> Any:
    x, weight = call.inputs[0], call.inputs[1]
    bias = call.inputs[2] if len(call.inputs) > 2 else None
    if call.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        raise CompileError(f"Conv with auto_pad={call.attrs['auto_pad']}")
    pads = call.attrs.get("pads") or [0] * (2 * (weight.dim() - 2))
    half = len(pads) // 2
    if list(pads[:half]) != list(pads[half:]):
        raise CompileError("Conv with asymmetric padding")
    if weight.dim() != 4:
        raise CompileError(f"Conv over {weight.dim() - 2} spatial dimensions")
    return call.torch.nn.functional.conv2d(
        x, weight, bias, stride=list(call.attrs.get("strides") or [1, 1]),
        padding=list(pads[:half]), dilation=list(call.attrs.get("dilations") or [1, 1]),
        groups=int(call.attrs.get("group", 1)))


def constant_of(node_attrs: dict[str, Any]) -> np.ndarray:
    """A ``Constant`` node's value, from whichever attribute holds it."""
    for key in ("value", "value_float", "value_int", "value_floats", "value_ints"):
        if key in node_attrs:
            return np.asarray(node_attrs[key])
    raise CompileError("a Constant node with no value this importer reads")


def _constant(call: NodeCall) -> Any:
    return call.torch.from_numpy(np.array(constant_of(call.attrs)))


def _shape(call: NodeCall) -> Any:
    shape = list(call.inputs[0].shape)
    start, end = int(call.attrs.get("start", 0)), call.attrs.get("end")
    return call.torch.tensor(shape[start:None if end is None else int(end)], dtype=call.torch.int64)


def _constant_of_shape(call: NodeCall) -> Any:
    value = call.attrs.get("value")
    fill = np.asarray(value).reshape(-1)[0] if value is not None else 0.0
    return call.torch.full(call.ints(0, "shape"), fill.item() if hasattr(fill, "item") else fill)


def _range(call: NodeCall) -> Any:
    start, limit, delta = (call.const(i, "bound").item() for i in range(3))
    return call.torch.arange(start, limit, delta)


def _trilu(call: NodeCall) -> Any:
    k = call.ints(1, "k")[0] if len(call.inputs) > 1 and call.inputs[1] is not None else 0
    fn = call.torch.triu if call.attrs.get("upper", 1) else call.torch.tril
    return fn(call.inputs[0], k)


def _tile(call: NodeCall) -> Any:
    return call.inputs[0].repeat(call.ints(1, "repeats"))


RESIZE_MODES = {"nearest": "nearest", "linear": "bilinear", "cubic": "bicubic"}


def _resize(call: NodeCall) -> Any:
    """``Resize`` as ``F.interpolate`` (torch's exporter's own mapping): 2-D, no antialias,
    half-pixel (``align_corners=False``) or align-corners coordinates."""
    x, mode = call.inputs[0], RESIZE_MODES.get(call.attrs.get("mode", "nearest"))
    where = call.attrs.get("coordinate_transformation_mode", "half_pixel")
    if mode is None or x.dim() != 4 or call.attrs.get("antialias", 0) or where not in (
            "half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"):
        raise CompileError(f"Resize {call.attrs.get('mode')} with {where} coordinates on a "
                           f"{x.dim()}-D tensor")
    if mode == "nearest" and where != "asymmetric" or mode != "nearest" and where == "asymmetric":
        raise CompileError(f"Resize {call.attrs.get('mode')} with {where} coordinates")
    corners = None if mode == "nearest" else where == "align_corners"
    if len(call.inputs) > 3 and call.inputs[3] is not None:
        size = call.ints(3, "sizes")[2:]
        return call.torch.nn.functional.interpolate(x, size=size, mode=mode,
                                                    align_corners=corners)
    scales = [float(v) for v in call.const(2, "scales").reshape(-1)][2:]
    return call.torch.nn.functional.interpolate(x, scale_factor=scales, mode=mode,
                                                align_corners=corners)


def roll_idiom(call: NodeCall) -> Any:
    """``roll(x, -shift, axis)``: the idiom ``Concat(x[shift:], x[:shift])`` read back
    (``onnx_program``); the concatenation is ``x`` itself where a slice is empty."""
    x, shift, axis = call.inputs[0], call.attrs["shift"], call.attrs["axis"]
    return x if abs(shift) >= x.shape[axis] else call.torch.roll(x, -shift, axis)


def _pow(call: NodeCall) -> Any:
    return call.torch.pow(call.inputs[0], call.operand(1))


TRANSLATIONS: dict[str, Callable[[NodeCall], Any]] = {
    "Identity": lambda call: call.inputs[0],
    "Dropout": lambda call: call.inputs[0],
    "Cast": _cast, "CastLike": _cast_like,
    "Add": _binary(operator.add), "Sub": _binary(operator.sub), "Mul": _binary(operator.mul),
    "Div": _div, "Pow": _pow,
    "Equal": _binary(operator.eq), "Less": _binary(operator.lt),
    "Greater": _binary(operator.gt), "And": _binary(operator.and_),
    "GreaterOrEqual": _binary(operator.ge), "LessOrEqual": _binary(operator.le),
    "Or": _binary(operator.or_), "Not": lambda call: ~call.inputs[0],
    "Max": lambda call: call.torch.maximum(call.inputs[0], call.inputs[1]),
    "Min": lambda call: call.torch.minimum(call.inputs[0], call.inputs[1]),
    "Neg": lambda call: -call.inputs[0],
    "Sqrt": _unary("sqrt"), "Reciprocal": _unary("reciprocal"), "Exp": _unary("exp"),
    "Log": _unary("log"), "Tanh": _unary("tanh"), "Sigmoid": _unary("sigmoid"),
    "Erf": _unary("erf"), "Relu": _unary("relu"), "Abs": _unary("abs"),
    "IsNaN": _unary("isnan"), "Cos": _unary("cos"), "Sin": _unary("sin"),
    "Gelu": _gelu, "MatMul": lambda call: call.torch.matmul(call.inputs[0], call.inputs[1]),
    "Gemm": _gemm, "Softmax": _softmax, "LayerNormalization": _layer_norm,
    "ReduceMean": _reduce("mean"), "ReduceSum": _reduce("sum"),
    "Reshape": _reshape, "Transpose": _transpose, "Flatten": _flatten,
    "Squeeze": _squeeze, "Unsqueeze": _unsqueeze, "Concat": _concat, "Split": _split,
    "Slice": _slice, "Expand": _expand, "Gather": _gather, "GatherND": _gather_nd,
    "ArgMax": _argmax, "Where": _where, "Conv": _conv, "Constant": _constant,
    "Shape": _shape, "ConstantOfShape": _constant_of_shape, "Range": _range,
    "Trilu": _trilu, "Tile": _tile, "Resize": _resize,
    "ScatterND": _scatter_nd, "GatherElements": _gather_elements, "CumSum": _cumsum,
    "Mod": _mod, "Pad": _pad, "GlobalAveragePool": _global_average_pool,
}
"""Every ONNX operator (default domain) the importer reads."""


# The calls of the idioms ``onnx_program.rewrite_idioms`` recognises in a file's nodes.
def _reshaped(shape: list[int], source: list[int]) -> list[int]:
    """The shape ONNX's ``Reshape`` (``allowzero`` 0) gives ``source``: a 0 copies the
    source's axis, a -1 takes what the others leave."""
    dims = [source[axis] if size == 0 else size for axis, size in enumerate(shape)]
    if -1 in dims:
        known = int(np.prod([d for d in dims if d != -1]))
        dims[dims.index(-1)] = int(np.prod(source)) // max(known, 1)
    return dims


def _swap_last_call(call: NodeCall) -> Any:
    """``k.transpose(-2, -1)`` when the final shape is ``k``'s with its last two axes
    swapped, its leading axes merged or split as the final shape has them (grouped-query
    attention's repeated key heads ``[B, kv, n, T, d]`` end as ``[B, kv n, d, T]``);
    otherwise the three operations as written (a patch grid's reshape)."""
    x, first, shape = call.inputs[0], call.ints(1, "shape"), call.ints(2, "shape")
    source = [int(d) for d in x.shape]
    flat = _reshaped(first, source)
    if len(flat) == 3 and flat[1:] == source[-2:]:
        final = _reshaped(shape, [flat[0], flat[2], flat[1]])
        lead = final[:-2]
        if final[-2:] == source[:-3:-1] and int(np.prod(lead)) == flat[0]:
            rows = x if lead == source[:-2] else x.reshape(*lead, *source[-2:])
            return rows.transpose(-2, -1)
    turned = x.reshape(flat).permute(0, 2, 1)
    return turned.reshape(_reshaped(shape, [int(d) for d in turned.shape]))


def _unflatten_call(call: NodeCall) -> Any:
    x, shape = call.inputs[0], call.ints(1, "shape")
    if len(shape) != x.dim() + 1 or list(shape[:-2]) != list(x.shape[:-1]) or \
            shape[-2] * shape[-1] != x.shape[-1]:
        return x.reshape(shape)  # not a split of the last axis: the reshape as written
    return x.unflatten(-1, (shape[-2], shape[-1]))


def _safe_softmax(call: NodeCall) -> Any:
    return call.torch.ops.aten._safe_softmax(call.inputs[0], int(call.attrs.get("axis", -1)))


def _pick_rows(call: NodeCall) -> Any:
    """``x[arange(B), argmax(ids, -1)]``, where the file's arange column (or, on the
    flattened rows, ``arange(B) * T``) is checked."""
    t, data, rows, ids = call.torch, call.inputs[0], call.consts[1], call.inputs[2]
    batch = data.shape[0]
    step = data.shape[1] if call.attrs.get("flat") else 1
    if rows is None or not np.array_equal(rows.reshape(-1), np.arange(batch) * step):
        raise CompileError("a row gather whose offsets are not arange(batch) x tokens")
    return data[t.arange(batch), t.argmax(ids, -1)]


def _linear_call(call: NodeCall) -> Any:
    """``linear`` where ``W [in, out]`` and ``b [out]``; otherwise the two operations as
    written (a broadcast bias, a batched weight)."""
    x, weight, bias = call.inputs
    if weight.dim() == 2 and bias.dim() == 1 and bias.shape[0] == weight.shape[1]:
        return call.torch.nn.functional.linear(x, weight.t(), bias)
    return call.torch.matmul(x, weight) + bias


IDIOMS = {"SafeSoftmax": _safe_softmax, "PickRows": _pick_rows, "Linear": _linear_call,
          "Rsqrt": lambda call: call.torch.rsqrt(call.inputs[0]), "SwapLast": _swap_last_call,
          "Silu": lambda call: call.torch.nn.functional.silu(call.inputs[0]),
          "Unflatten": _unflatten_call,
          "NotEqual": _binary(operator.ne), "Roll": roll_idiom}
