"""An ONNX model as a workload: read and bounded (``onnx_file``), traced into a torch
program at the run's sizes (``onnx_program``), imported by the torch importer, and checked
against onnxruntime on the CPU (``referenceSource=onnxruntime``).

The file's symbolic dimensions are set from the run: from the ``--inputs`` file's arrays
when one is given, else the first of an input from ``--batch`` (1 when not given) and any
other from ``--tokens``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ipu_stack.frontend.input_file import read_input_arrays, refuse_past_a_chip
from ipu_stack.frontend.listing import list_operations
from ipu_stack.frontend.onnx_file import (
    GraphInput,
    concrete_shape,
    float_kinds,
    graph_inputs,
    load_onnx,
    onnx_sha256,
    onnxruntime_outputs,
    onnxruntime_session,
)
from ipu_stack.frontend.onnx_ops import TRANSLATIONS
from ipu_stack.frontend.onnx_program import NodeFailed, export_onnx, node_scope, operator_kind
from ipu_stack.frontend.options import program_parameters
from ipu_stack.frontend.workload import ImportedWorkload, Reference, make_workload
from ipu_stack.ir.names import name_layer
from ipu_stack.util.errors import IpuStackError, UsageError, first_line
from ipu_stack.workloads.base import Parameter


def onnx_parameters() -> tuple[Parameter, ...]:
    """An imported program's options, for a file whose sizes may be symbolic."""
    base = tuple(replace(p, help="the .onnx file") if p.name == "model" else
                 replace(p, help="sha256 of the .onnx file (checked when re-imported)")
                 if p.name == "sha256" else
                 replace(p, help="sequences or images per run (0: the file's batch, 1 where "
                         "it is symbolic)") if p.name == "batch" else p
                 for p in program_parameters())
    return (*base, Parameter("tokens", int, 0, "size of the file's other symbolic "
                                               "dimensions (sequence length)", minimum=0))


def example_feeds(specs: list[GraphInput], batch: int, tokens: int,
                  shapes: dict[str, tuple[int, ...]] | None = None) -> dict[str, np.ndarray]:
    """Zeros of each input's concrete shape and dtype: what the program is traced at (the
    inputs file's shape where it gives one)."""
    shapes = shapes or {}
    if tokens and not any(isinstance(d, str) for s in specs for d in s.dims[1:]):
        raise UsageError(f"--tokens {tokens}: the model's inputs have no symbolic dimension "
                         "to size (" + ", ".join(f"{s.name} {list(s.dims)}" for s in specs)
                         + ")")
    for spec in specs:  # an inputs file's sizes agree with --batch and --tokens where given
        for axis, dim in enumerate(spec.dims if spec.name in shapes else ()):
            asked, option = (batch, "--batch") if axis == 0 else (tokens, "--tokens")
            if isinstance(dim, str) and asked and shapes[spec.name][axis] != asked:
                raise UsageError(f"--inputs: {spec.name} is {list(shapes[spec.name])}, not "
                                 f"{asked} along {dim!r} as {option} {asked} asks")
    sized = {s.name: shapes.get(s.name) or concrete_shape(s, batch, tokens) for s in specs}
    for name, shape in sized.items():  # before a byte is allocated: a chip holds each input
        refuse_past_a_chip(f"graph input {name}", shape)
    return {s.name: np.zeros(sized[s.name], s.dtype) for s in specs}


def shapes_from_file(specs: list[GraphInput], path: str) -> dict[str, tuple[int, ...]]:
    """The shapes an ``--inputs`` file gives the model's inputs (by name, else ``arr_i``),
    checked against the file's fixed dimensions; its symbolic ones take the array's."""
    data = read_input_arrays(path)
    shapes = {}
    for index, spec in enumerate(specs):
        key = spec.name if spec.name in data else f"arr_{index}"
        if key not in data:
            continue  # inputs_from_file names what is missing
        shape = tuple(int(d) for d in data[key].shape)
        if len(shape) != len(spec.dims) or any(isinstance(d, int) and d != got
                                               for d, got in zip(spec.dims, shape, strict=True)):
            raise UsageError(f"--inputs {path}: {spec.name} is {list(shape)}; the model takes "
                             f"{list(spec.dims)}")
        shapes[spec.name] = shape
    return shapes


def trace_file(model: Any, path: Path, feeds: dict[str, np.ndarray]) -> Any:
    """The file's graph traced into a torch program at the shapes of ``feeds``; where a
    node's values or torch's trace fail at them, one line naming the shapes."""
    at = ", ".join(f"{k} {list(v.shape)}" for k, v in feeds.items())
    try:
        return export_onnx(model, path, feeds)
    except NodeFailed as exc:  # a node's values at these sizes
        raise UsageError(f"{path.name} does not run at {at}: {exc}") from None
    except IpuStackError:
        raise
    except Exception as exc:  # torch's trace of the graph at these sizes failed
        raise UsageError(f"{path.name} does not run at {at}: {first_line(exc)}") from exc


def onnx_workload(path: str | Path) -> tuple[ImportedWorkload, dict[str, Any]]:
    """The workload of an ``.onnx`` file and its base parameters (absolute path, sha256)."""
    path = Path(path).resolve()
    model = load_onnx(path)
    specs = graph_inputs(model)

    def sized(params: dict[str, Any]) -> Any:
        shapes = shapes_from_file(specs, params["inputs"]) if params.get("inputs") else {}
        return trace_file(model, path, example_feeds(specs, params["batch"],
                                                 params.get("tokens", 0), shapes))

    def outputs(program: Any, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """onnxruntime's outputs, from a session opened for the call: one held through the
        compile and run kept its copy of the weights (1.3 GB for Swin-L) alive beside
        them, where opening one again takes seconds."""
        feeds = {s.name: np.asarray(a).astype(s.dtype) for s, a in zip(specs, inputs,
                                                                        strict=True)}
        return onnxruntime_outputs(onnxruntime_session(path), feeds, path.name)

    digest = onnx_sha256(path, model.proto)
    gemms = tuple((node.name, name_layer(node_scope(node))) for node in model.graph.node
                  if node.op_type in ("MatMul", "Gemm"))
    workload = make_workload(None, path.stem, str(path), digest, sized=sized,
                             reference=Reference("onnxruntime", outputs,
                                                 float_kinds(model.proto)),
                             parameters=onnx_parameters(), source_gemms=gemms)
    return workload, {"model": str(path), "sha256": digest}


def list_onnx_operations(path: str | Path, tokens: int = 0) -> list[dict[str, Any]]:
    """One row per ONNX node, as ``ipu-stack ops`` prints them for a ``.pt2``: the node's
    operator, name, scope and status, judged by the torch importer's own listing of the
    ATen calls traced from it (a node is supported when all of them are)."""
    path = Path(path)
    model = load_onnx(path)
    protos = list(model.graph.node)
    missing = {operator_kind(p) for p in protos} - set(TRANSLATIONS)
    per_node: dict[str, list[dict[str, Any]]] = {}
    if not missing:
        program = trace_file(model, path, example_feeds(graph_inputs(model), 0, tokens))
        onnx_names = {n.name: n.meta.get("onnx_node") for n in program.graph.nodes}
        for row in list_operations(program, path.name):
            per_node.setdefault(onnx_names.get(row["node"]) or "", []).append(row)
    rows = []
    names = [proto.name or f"{proto.op_type}_{index}" for index, proto in enumerate(protos)]
    untraced = untraced_statuses(model, names, set(per_node))
    for index, proto in enumerate(protos):
        name, kind = names[index], operator_kind(proto)
        traced = per_node.get(name, [])
        bad = next((r for r in traced if not r["supported"]), None)
        if kind in missing:
            status, supported = "unsupported: no translation of this ONNX operator", False
        elif missing:
            status, supported = "translation exists (not traced: see the unsupported rows)", True
        elif bad is not None:
            status, supported = f"{bad['status']} ({bad['target']})", False
        elif traced:
            status, supported = ", ".join(sorted({r["status"] for r in traced})), True
        else:
            status, supported = untraced[index], True
        rows.append({"target": kind, "node": name, "module": node_scope(proto) or "<top>",
                     "source": f"{path.name}:{index + 1}", "supported": supported,
                     "status": status})
    return rows


def untraced_statuses(model: Any, names: list[str], traced: set[str]) -> list[str]:
    """What became of each node that left no call in the traced program: ``folded
    (constant)`` where every input is an initializer, a shape or another folded node's output,
    else ``absorbed into NAME (OP)``: the first later node reading it (through other
    absorbed ones) that did leave calls, as an idiom's nodes (GELU written out, a
    reshape before attention) become the one operation their last node's call holds."""
    protos = list(model.graph.node)
    constant = {i.name for i in model.graph.initializer}
    readers: dict[str, list[int]] = {}
    for index, proto in enumerate(protos):
        for value in proto.input:
            readers.setdefault(value, []).append(index)
        # a shape is fixed at the run's sizes: what is computed from it folds
        if proto.op_type in ("Shape", "Size") or all(not value or value in constant
                                                     for value in proto.input):
            constant.update(proto.output)
    statuses = []
    for index, proto in enumerate(protos):
        if all(value in constant for value in proto.output):
            statuses.append("folded (constant)")
            continue
        seen, frontier, found = set(), [index], None
        while frontier and found is None:
            current = min(frontier)  # the earliest reader first: the graph is in order
            frontier.remove(current)
            for value in protos[current].output:
                for reader in readers.get(value, []):
                    if reader in seen:
                        continue
                    seen.add(reader)
                    if names[reader] in traced:
                        found = reader if found is None else min(found, reader)
                    else:
                        frontier.append(reader)
        statuses.append("absorbed into a later node" if found is None else
                        f"absorbed into {names[found]} ({protos[found].op_type})")
    return statuses
