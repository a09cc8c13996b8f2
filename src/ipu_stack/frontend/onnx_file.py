"""Reading an ONNX file the user names: hostile input, bounded before anything is sized.

An ``.onnx`` file is a protobuf ``ModelProto``, and its weights may live in external-data
files beside it.  ``load_onnx`` refuses, in one line each (``UsageError``): a missing or
oversized file, bytes that do not parse, an opset older than 17, a tensor whose element
count or byte count is out of bounds (checked from its dims, before any array exists),
external data that points outside the model's folder or past the end of its file, and a
graph whose nodes read values no earlier node defined (a cycle, or a dangling name).  Only
then are the external bytes read, each region exactly as long as its tensor.

onnx and onnxruntime are an optional extra (``pip install 'ipu-stack[onnx]'``), imported
only when asked; onnxruntime on the CPU is an ONNX program's reference
(``referenceSource=onnxruntime``), as PyTorch is a ``.pt2``'s.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ipu_stack.frontend.loader import file_sha256, refuse_unless_file
from ipu_stack.util.errors import UsageError, first_line

MIN_OPSET = 17
MAX_FILE_BYTES = 2**31 - 1  # protobuf's own limit on one message
MAX_ELEMENTS = 2**32  # per tensor; the largest model of the zoo holds 2^28
MAX_EXTERNAL_BYTES = 2**36  # all external data together (64 GiB, far past one C600)
MAX_RANK = 8
INPUT_DTYPES = {1: np.float32, 10: np.float16, 11: np.float64, 6: np.int32, 7: np.int64,
                9: np.bool_}


def require_onnx() -> Any:
    """The ``onnx`` module, or a UsageError saying how to install it."""
    try:
        import onnx
    except ImportError:
        raise UsageError("reading an ONNX model needs onnx: pip install 'ipu-stack[onnx]'"
                         ) from None
    return onnx


@dataclass(frozen=True)
class GraphInput:
    """One input the user feeds: its name, dtype and dims (a string for a symbolic one)."""

    name: str
    dtype: Any
    dims: tuple[int | str, ...]

    @property
    def integer(self) -> bool:
        return np.issubdtype(self.dtype, np.integer)


@dataclass
class OnnxModel:
    """A checked ONNX file: the ``ModelProto`` (its initializers without their bytes) and
    every initializer as an array (F16 and BF16 widened to float32), each held once."""

    proto: Any
    weights: dict[str, np.ndarray]

    @property
    def graph(self) -> Any:
        return self.proto.graph


def load_onnx(path: str | Path) -> OnnxModel:
    """The checked model of ``path`` and its weights, external ones read from their files."""
    onnx = require_onnx()
    path = Path(path)
    refuse_unless_file(path)
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise UsageError(f"{path}: {size:,} bytes, over protobuf's 2 GiB limit for one model "
                         "(keep the weights as external data)")
    try:
        model = onnx.load_model_from_string(path.read_bytes())
    except Exception as exc:  # protobuf raises DecodeError, RuntimeWarning-derived types, ...
        raise UsageError(f"{path}: not an ONNX model ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0][:120] if str(exc) else 'unreadable'})"
                         ) from None
    if not model.HasField("graph"):
        raise UsageError(f"{path}: an ONNX ModelProto without a graph (truncated?)")
    check_opset(path, model)
    tensors = list(all_tensors(model.graph))
    for tensor in tensors:
        check_tensor(path, tensor)
    regions = {id(t): external_region(path, t) for t in tensors if t.data_location == 1}
    if sum(length for _, _, length in regions.values()) > MAX_EXTERNAL_BYTES:
        raise UsageError(f"{path}: over 64 GiB of external data")
    check_order(path, model.graph)
    try:  # by path: external data is checked where it lies, and no weight is copied
        onnx.checker.check_model(str(path))
    except Exception as exc:  # ValidationError, or a C++ error for malformed protos
        raise UsageError(f"{path}: fails the ONNX checker: "
                         f"{(str(exc).strip().splitlines() or ['?'])[0][:200]}") from None
    weights = {t.name: tensor_array(path, t, regions.get(id(t))) for t in model.graph.initializer}
    for tensor in tensors:  # a Constant node's value, when external, is read into the node
        if id(tensor) in regions and tensor.name not in weights:
            target, offset, length = regions[id(tensor)]
            with open(target, "rb") as handle:
                handle.seek(offset)
                tensor.raw_data = handle.read(length)
            del tensor.external_data[:]
            tensor.data_location = 0
    for tensor in model.graph.initializer:
        for field_name in ("raw_data", "float_data", "int32_data", "int64_data",
                           "double_data"):
            tensor.ClearField(field_name)
    return OnnxModel(model, weights)


def onnx_sha256(path: str | Path, proto: Any = None) -> str:
    """The SHA-256 of the model and of every external-data file it names, in name order:
    a package compiled from it is refused once either changes (a weights file replaced
    beside an unchanged ``.onnx`` would otherwise run with the new weights unnoticed).
    ``proto``: the model ``load_onnx`` already parsed (its external-data entries kept), so
    a compile parses the file once; a run's check parses it here."""
    path = Path(path)
    if proto is None:
        refuse_unless_file(path)
        if path.stat().st_size > MAX_FILE_BYTES:
            raise UsageError(f"{path}: over protobuf's 2 GiB limit for one model")
        try:
            proto = require_onnx().load_model_from_string(path.read_bytes())
        except Exception:  # load_onnx has said why when the model was compiled
            raise UsageError(f"{path}: not an ONNX model") from None
    files = sorted({external_region(path, t)[0] for t in all_tensors(proto.graph)
                    if t.data_location == 1})
    digest = hashlib.sha256(bytes.fromhex(file_sha256(path)))
    for external in files:
        digest.update(external.name.encode() + b"\0" + bytes.fromhex(file_sha256(external)))
    return digest.hexdigest()


def tensor_array(path: Path, tensor: Any, region: tuple[Path, int, int] | None) -> np.ndarray:
    """An initializer's values: read from its external file's region (checked), else from
    the model; floats narrower than 32 bits widened to float32."""
    onnx = require_onnx()
    if region is None:
        try:  # typed fields (float_data, ...) whose length the dims do not match
            array = onnx.numpy_helper.to_array(tensor)
        except (ValueError, TypeError) as exc:
            raise UsageError(f"{path}: tensor {tensor.name!r} cannot be read: "
                             f"{str(exc)[:120]}") from None
    else:
        target, offset, length = region
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type))
        array = np.fromfile(target, dtype=dtype, count=length // dtype.itemsize,
                            offset=offset).reshape(tuple(tensor.dims))
    if array.dtype.kind not in "biuf" and array.dtype.name != "bfloat16":
        raise UsageError(f"{path}: tensor {tensor.name!r} holds {array.dtype} values, not "
                         "numbers")
    if array.dtype.kind == "f" and array.dtype != np.float32 or array.dtype.name == "bfloat16":
        array = array.astype(np.float32)
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        raise UsageError(f"{path}: weight {tensor.name!r} holds NaN or infinite values")
    return array


def check_opset(path: Path, model: Any) -> None:
    versions = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    version = versions.get("ai.onnx")
    if version is None:
        raise UsageError(f"{path}: imports no default ONNX opset")
    if version < MIN_OPSET:
        raise UsageError(f"{path}: opset {version}; the importer reads opset {MIN_OPSET} and "
                         "later (re-export with opset_version>=17, or run "
                         "onnx.version_converter)")


def all_tensors(graph: Any) -> Any:
    """Every tensor of the graph: initializers and Constant nodes' values."""
    yield from graph.initializer
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == 4:  # TENSOR
                yield attribute.t


def element_count(path: Path, name: str, dims: Any) -> int:
    if len(dims) > MAX_RANK:
        raise UsageError(f"{path}: tensor {name!r} has {len(dims)} dimensions (at most "
                         f"{MAX_RANK})")
    count = 1
    for dim in dims:
        if dim < 0:
            raise UsageError(f"{path}: tensor {name!r} has a negative dimension {dim}")
        count *= int(dim)
        if count > MAX_ELEMENTS:
            raise UsageError(f"{path}: tensor {name!r} of shape {list(dims)} has "
                             f"{np.prod([float(d) for d in dims]):.3g} elements, over the "
                             f"bound of 2^32")
    return count


def itemsize(path: Path, tensor: Any) -> int:
    onnx = require_onnx()
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        raise UsageError(f"{path}: tensor {tensor.name!r} has data type {tensor.data_type}, "
                         "which the importer does not read") from None


def check_tensor(path: Path, tensor: Any) -> None:
    """The tensor's dims bounded and its inline bytes as long as its dims say."""
    count = element_count(path, tensor.name, tensor.dims)
    size = itemsize(path, tensor)
    if tensor.data_location != 1 and tensor.HasField("raw_data") and \
            len(tensor.raw_data) != count * size:
        raise UsageError(f"{path}: tensor {tensor.name!r} holds {len(tensor.raw_data):,} bytes; "
                         f"its shape {list(tensor.dims)} needs {count * size:,}")


def external_region(path: Path, tensor: Any) -> tuple[Path, int, int]:
    """(file, offset, length) of an external tensor, checked to lie inside the model's
    folder and inside that file, and to be exactly as long as the tensor."""
    entries = {e.key: e.value for e in tensor.external_data}
    location = entries.get("location", "")
    folder = path.resolve().parent
    target = (folder / location).resolve()
    if not location or Path(location).is_absolute() or not target.is_relative_to(folder):
        raise UsageError(f"{path}: tensor {tensor.name!r} points at external data "
                         f"{location!r}, outside the model's folder")
    if not target.is_file():
        what = "is missing" if not target.exists() else "is not a regular file"
        raise UsageError(f"{path}: external data {location!r} of tensor {tensor.name!r} "
                         f"{what}")
    try:
        offset = int(entries.get("offset", "0"))
        needed = element_count(path, tensor.name, tensor.dims) * itemsize(path, tensor)
        length = int(entries.get("length", str(needed)))
    except ValueError:
        raise UsageError(f"{path}: tensor {tensor.name!r} has a malformed external offset "
                         "or length") from None
    if offset < 0:
        raise UsageError(f"{path}: tensor {tensor.name!r} has a negative external offset "
                         f"{offset:,}")
    if length != needed:
        raise UsageError(f"{path}: tensor {tensor.name!r} declares {length:,} external bytes "
                         f"at offset {offset:,}; its shape needs {needed:,}")
    if offset + length > target.stat().st_size:
        raise UsageError(f"{path}: tensor {tensor.name!r} reads past the end of {location!r} "
                         f"({offset + length:,} > {target.stat().st_size:,} bytes)")
    return target, offset, length


def check_order(path: Path, graph: Any) -> None:
    """Every node reads only graph inputs, initializers and earlier nodes' outputs: ONNX
    requires topological order, and a cycle cannot satisfy it."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    for index, node in enumerate(graph.node):
        texts = (node.name, node.op_type, node.domain, *node.input, *node.output,
                 *(p.value for p in node.metadata_props))
        if not all(isinstance(text, str) for text in texts):
            raise UsageError(f"{path}: node {index} has a name that is not UTF-8 text")
        for name in node.input:
            if name not in defined:
                later = any(name in n.output for n in graph.node[index:])
                why = "defined by a later node (a cycle, or nodes out of order)" if later \
                    else "defined nowhere"
                raise UsageError(f"{path}: node {node.name or index} ({node.op_type}) reads "
                                 f"{name!r}, {why}")
        defined.update(node.output)
    for output in graph.output:
        if output.name not in defined:
            raise UsageError(f"{path}: graph output {output.name!r} is defined nowhere")


def type_name(elem_type: int) -> str:
    """TensorProto's name of an element type (``STRING``), or its number if it has none."""
    try:
        return str(require_onnx().TensorProto.DataType.Name(elem_type))
    except ValueError:
        return str(elem_type)


def graph_inputs(model: Any) -> list[GraphInput]:
    """The inputs the user feeds (graph inputs that are not initializers)."""
    weights = {t.name for t in model.graph.initializer}
    out = []
    for value in model.graph.input:
        if value.name in weights:
            continue
        kind = value.type.tensor_type
        dtype = INPUT_DTYPES.get(kind.elem_type)
        if dtype is None:
            name = type_name(kind.elem_type)
            raise UsageError(f"graph input {value.name!r} has element type {name}, not a "
                             "float, integer or bool tensor")
        dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                     for d in kind.shape.dim)
        if len(dims) > MAX_RANK:
            raise UsageError(f"graph input {value.name!r} has {len(dims)} dimensions (at most "
                             f"{MAX_RANK})")
        out.append(GraphInput(value.name, dtype, dims))
    return out


def concrete_shape(spec: GraphInput, batch: int, tokens: int) -> tuple[int, ...]:
    """The input's shape with a symbolic first dimension set to ``batch`` and any other to
    ``tokens`` (refused when ``tokens`` is 0: the file does not say the size)."""
    shape = []
    for axis, dim in enumerate(spec.dims):
        if isinstance(dim, int) and axis == 0 and batch not in (0, dim):
            raise UsageError(f"--batch {batch}: graph input {spec.name} has a fixed batch of "
                             f"{dim} (export it with a symbolic first dimension)")
        if isinstance(dim, int) and dim < 0:
            raise UsageError(f"graph input {spec.name} has a negative dimension {dim} "
                             f"({list(spec.dims)})")
        if isinstance(dim, int):
            shape.append(dim)
        elif axis == 0:
            shape.append(batch or 1)
        elif tokens:
            shape.append(tokens)
        else:
            raise UsageError(f"graph input {spec.name} has a symbolic dimension {dim!r} "
                             f"(axis {axis}): give its size with --tokens N")
    return tuple(shape)


HALF_TYPES = {10: "float16", 16: "bfloat16"}  # TensorProto's FLOAT16 and BFLOAT16


def float_kinds(proto: Any) -> frozenset[str]:
    """The half-precision types the file computes in (its weights, inputs, outputs, values
    or casts), as onnxruntime runs it: the conversion check's bound loosens for them."""
    graph = proto.graph
    types = {t.data_type for t in graph.initializer}
    types |= {v.type.tensor_type.elem_type
              for v in (*graph.input, *graph.output, *graph.value_info)}
    types |= {int(a.i) for n in graph.node if n.op_type == "Cast" for a in n.attribute
              if a.name == "to"}
    return frozenset(HALF_TYPES[t] for t in types if t in HALF_TYPES)


def onnxruntime_session(path: Path) -> Any:
    """onnxruntime on the CPU, the reference of an ONNX program, reading the file (and its
    external data, which ``load_onnx`` checked) itself."""
    try:
        import onnxruntime
    except ImportError:
        raise UsageError("the reference of an ONNX model is onnxruntime: "
                         "pip install 'ipu-stack[onnx]'") from None
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4  # its errors reach the user as one line, below
    # one run per import: no arena or planned pattern kept after it (the CLIP text encoder
    # at batch 40 peaked 0.26 GB higher with them)
    options.enable_cpu_mem_arena = False
    options.enable_mem_pattern = False
    try:
        return onnxruntime.InferenceSession(str(path), options,
                                            providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime's own checks of the graph: its types, attributes
        raise UsageError(f"{path.name}: onnxruntime, the reference, cannot load it: "
                         f"{first_line(exc)}") from exc


def onnxruntime_outputs(session: Any, feeds: dict[str, np.ndarray], name: str
                        ) -> list[np.ndarray]:
    """The reference's outputs as float32; onnxruntime's failure on these inputs (an index
    out of range) in one line naming the file."""
    try:
        return [np.asarray(o, np.float32) for o in session.run(None, feeds)]
    except Exception as exc:
        raise UsageError(f"{name}: onnxruntime, the reference, fails on it: "
                         f"{first_line(exc)}") from exc
