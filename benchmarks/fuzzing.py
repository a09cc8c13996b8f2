"""The fuzz generators shared by ``benchmarks/fuzz.py`` and the reliability tests
(``tests/reliability``):

* :func:`random_spec` / :func:`build_random` make a small random graph (a chain of 1-3
  matmuls with optional bias, GELU, cast, softmax, layer norm and residual add; F16 or FP8
  F143 storage with scales from ``fit_scale_exponent``) and its host tensors, while an
  **independent float64 evaluation** (plain numpy plus ``round_to`` from
  ``tests/e2e/float64_forward.py``) computes the expected output;
* :func:`package_attacks` turns one real package into a list of malformed ones (container
  damage and hand-crafted manifests/arrays written with ``write_package``);

The independent float64 references (``round_to``, ``gelu_tanh``) are the tests' own
(``tests/e2e/float64_forward.py``, ``tests/helpers.py``), so a fuzz case is judged by the same
code as the suite; run from the repository root, which puts both packages on the path.

A spec is plain JSON (it is stored in the package manifest as the workload's parameters), so a
failing fuzz case is reproduced from the printed spec alone.
"""

from __future__ import annotations

import copy
import io
import json
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from tests.e2e.float64_forward import round_to
from tests.helpers import gelu_tanh

from ipu_stack.ir.graph import Graph, GraphBuilder
from ipu_stack.ir.precision import F16, Precision, fit_scale_exponent
from ipu_stack.ir.types import TensorType
from ipu_stack.package import read_package, write_package
from ipu_stack.workloads.base import Workload

POST_OPS = ("gelu", "softmax", "layer_norm", "add", "scale")
LN_EPS = 1e-6


# ----------------------------------------------------------------------------- random graphs


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
        self.expected[vid] = round_to(value, precision.to_json())
        self.precisions[vid] = precision
        return vid


def build_random(spec: dict[str, Any]) -> tuple[Graph, dict[str, np.ndarray], np.ndarray]:
    """The graph, its host tensors and the independently computed float64 expected output.

    Every value is rounded to its stored precision at the point the graph stores it, exactly
    as ``tests/e2e/float64_forward.py`` does for the MLP; FP8 activations get the scale that
    fits their own data with 2x headroom.  The graph output is always F16 (an FP8 output would
    turn one rounding flip into a 1/8 relative error, outside any sane tolerance).
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
                current = bld.op("matmul", [current, w_id], prec, name, value=v @ bld.expected[w_id])
                cols = out_cols
            elif kind == "bias_add":
                bias = bld.weight(f"b{index}", rng.standard_normal(cols) * 0.1, "F16")
                current = bld.op("bias_add", [current, bias], prec, name,
                                 value=v + bld.expected[bias])
            elif kind == "gelu":
                current = bld.op("gelu", [current], prec, name, value=gelu_tanh(v),
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
                mean = v.mean(axis=-1, keepdims=True)
                var = ((v - mean) ** 2).mean(axis=-1, keepdims=True)
                norm = (v - mean) / np.sqrt(var + LN_EPS) * bld.expected[g] + bld.expected[beta]
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


# ----------------------------------------------------------------------------- the CLI


def clean_rejection(code: int, stderr: str) -> str | None:
    """``None`` when the command failed the documented way (exit 2, exactly one ``error:``
    line, no traceback); otherwise what was wrong."""
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    if "Traceback" in stderr:
        return "traceback on stderr"
    if code != 2:
        return f"exit code {code}, expected 2"
    if len(errors) != 1:
        return f"{len(errors)} error lines"
    return None


# ----------------------------------------------------------------------------- package attacks


def _zip_members(data: bytes) -> list[tuple[str, bytes]]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return [(info.filename, archive.read(info)) for info in archive.infolist()]


def _build_zip(members: list[tuple[str, bytes]]) -> bytes:
    """A ZIP holding exactly these (possibly hostile) member names, in order."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, body in members:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, body)
    return buffer.getvalue()


Members = list[tuple[str, bytes]]


def _rezip(data: bytes, edit: Callable[[Members], Members]) -> bytes:
    return _build_zip(edit(_zip_members(data)))


def _first_array(members: Members) -> str:
    return next(name for name, _ in members if name.startswith("arrays/"))


def _edit_header(key: str, value: Any) -> Callable[[Members], Members]:
    def edit(members: Members) -> Members:
        out = []
        for name, body in members:
            if name == "header.json":
                header = json.loads(body)
                header[key] = value
                body = json.dumps(header).encode()
            out.append((name, body))
        return out

    return edit


def container_attacks(original: bytes) -> list[tuple[str, bytes]]:
    """Damage to the file itself: truncation, bit flips, hostile ZIP members.

    Bit flips can land in bytes the ZIP format ignores (a local header's timestamp); callers
    must accept such a file only if it reads back with unchanged content.
    """
    n = len(original)
    cases: list[tuple[str, bytes]] = [("empty file", b""), ("not a zip", b"no package\n" * 40)]
    for cut in (1, 4, 22, 30, 100, n // 3, n // 2, n - 100, n - 23, n - 1):
        cases.append((f"truncated to {cut} of {n} bytes", original[:cut]))
    for at in np.linspace(0, n - 1, 24).astype(int):
        flipped = bytearray(original)
        flipped[int(at)] ^= 0x10
        cases.append((f"bit flip at byte {int(at)}", bytes(flipped)))

    def add(name: str, body: bytes = b"escape") -> Callable[[Members], Members]:
        return lambda m: [*m, (name, body)]

    def drop(pick: Callable[[Members], str]) -> Callable[[Members], Members]:
        return lambda m: [e for e in m if e[0] != pick(m)]

    def bomb(m: Members) -> Members:  # 64 MiB of zeros deflate about 1000:1
        first = _first_array(m)
        return [(k, b"\0" * (64 << 20) if k == first else v) for k, v in m]

    edits: list[tuple[str, Callable[[Members], Members]]] = [
        ("member ../x", add("../x")),
        ("member arrays/../../x.npy", add("arrays/../../x.npy")),
        ("absolute member /tmp/ipu-stack-pwned", add("/tmp/ipu-stack-pwned")),
        ("drive-letter member C:/x", add("C:/x")),
        ("backslash member arrays\\x.npy", add("arrays\\x.npy")),
        ("unexpected member extra.txt", add("extra.txt", b"hi")),
        ("missing manifest.json", drop(lambda m: "manifest.json")),
        ("missing header.json", drop(lambda m: "header.json")),
        ("missing array member", drop(_first_array)),
        ("zip bomb: 64 MiB of zeros in an array member", bomb),
        ("a zip with no members", lambda m: []),
        ("format version 2", _edit_header("format_version", 2)),
        ("format version '1' (a string)", _edit_header("format_version", "1")),
        ("another format name", _edit_header("format", "onnx")),
        ("header target ipu2 (hashes intact)", _edit_header("target", "ipu2")),
    ]
    cases += [(name, _rezip(original, edit)) for name, edit in edits]
    return cases


def _steps(manifest: dict, kind: str) -> list[dict]:
    return [s for p in ("initialize", "run") for s in manifest["programs"][p] if s["kind"] == kind]


def _set(name_of: Callable[[dict], str], value: Callable[[np.ndarray, dict], int] | int,
         index: int = 0) -> Callable[[dict, dict], None]:
    """An array edit: element ``index`` of the array a step names becomes ``value``."""

    def edit(manifest: dict, arrays: dict) -> None:
        name = name_of(manifest)
        flat = arrays[name].reshape(-1)
        flat[index] = value(flat, manifest) if callable(value) else value

    return edit


def _last_call(m: dict) -> dict:
    return _steps(m, "compute")[-1]["calls"][0]


def _exchange(m: dict) -> dict:
    return _steps(m, "exchange")[0]


def _end(m: dict) -> int:
    return int(m["memory"]["memory_end"])


def _manifest(fn: Callable[[dict], Any]) -> Callable[[dict, dict], None]:
    return lambda manifest, arrays: fn(manifest)


def _retype(name_of: Callable[[dict], str], dtype: Any = None,
            shape: tuple[int, ...] | None = None) -> Callable[[dict, dict], None]:
    def edit(manifest: dict, arrays: dict) -> None:
        name = name_of(manifest)
        value = arrays[name].astype(dtype) if dtype is not None else arrays[name]
        arrays[name] = value.reshape(shape) if shape is not None else value

    return edit


Edit = Callable[[dict, dict], None]

# Hand-crafted packages with a valid container whose content is hostile; every one must be
# refused by ``ipu-stack run`` with one ``error:`` line and exit code 2.
CONTENT_ATTACKS: list[tuple[str, Edit, dict[str, str]]] = [
    ("written for target ipu2", _manifest(lambda m: None), {"target": "ipu2"}),
    ("compute call on tile 5000", _set(lambda m: _last_call(m)["tiles"], 5000), {}),
    ("compute call on tile -1", _set(lambda m: _last_call(m)["tiles"], -1), {}),
    ("kernel operand at the end of tile memory",
     _set(lambda m: _last_call(m)["addresses"], lambda a, m: _end(m)), {}),
    ("kernel operand at address 0, below the memory base",
     _set(lambda m: _last_call(m)["addresses"], 0), {}),
    ("host write to tile 5000", _set(lambda m: _steps(m, "host_write")[0]["tiles"], 5000), {}),
    ("host write past tile memory",
     _set(lambda m: _steps(m, "host_write")[0]["addresses"], lambda a, m: _end(m)), {}),
    ("host read past tile memory",
     _set(lambda m: _steps(m, "host_read")[0]["addresses"], lambda a, m: _end(m) - 2), {}),
    ("exchange to tile 1472", _set(lambda m: _exchange(m)["dst_tile"], 1472), {}),
    ("exchange from past tile memory",
     _set(lambda m: _exchange(m)["src_addr"], lambda a, m: _end(m)), {}),
    ("exchange of 10^9 words", _set(lambda m: _exchange(m)["words"], 10**9), {}),
    ("exchange of -4 words", _set(lambda m: _exchange(m)["words"], -4), {}),
    ("exchange schedule drops a word",
     _set(lambda m: _exchange(m)["chunk_words"], lambda a, m: int(a[0]) - 1), {}),
    ("exchange schedule names transfer 10^6",
     _set(lambda m: _exchange(m)["chunk_transfer"], 10**6), {}),
    ("exchange fan-out offsets reversed",
     lambda m, a: a.__setitem__(_exchange(m)["dst_offsets"],
                                a[_exchange(m)["dst_offsets"]][::-1].copy()), {}),
    ("unknown kernel family", _manifest(lambda m: m["kernels"][0].update(family="fft")), {}),
    ("kernel index 999",
     _manifest(lambda m: _steps(m, "compute")[0]["calls"][0].update(kernel=999)), {}),
    ("kernel index -1",
     _manifest(lambda m: _steps(m, "compute")[0]["calls"][0].update(kernel=-1)), {}),
    ("kernel parameters removed", _manifest(lambda m: [k["params"].clear() for k in m["kernels"]]),
     {}),
    ("kernel parameters a string",
     _manifest(lambda m: [k.update(params="x") for k in m["kernels"]]), {}),
    ("gemm depth 10^9", _manifest(lambda m: [k["params"].update(depth=10**9)
                                             for k in m["kernels"] if k["family"] == "gemm"]), {}),
    ("unknown step kind", _manifest(lambda m: _steps(m, "compute")[0].update(kind="teleport")), {}),
    ("a step that is a list", _manifest(lambda m: m["programs"]["run"].__setitem__(0, [1])), {}),
    ("step names a missing array", lambda m, a: a.pop(_last_call(m)["addresses"]), {}),
    ("manifest without programs", _manifest(lambda m: m.pop("programs")), {}),
    ("manifest without kernels", _manifest(lambda m: m.pop("kernels")), {}),
    ("unknown workload", _manifest(lambda m: m["workload"].update(name="no-such-workload")), {}),
    ("workload parameter below its minimum",
     _manifest(lambda m: m["workload"]["params"].update(tokens=0)), {}),
    ("unknown workload parameter", _manifest(lambda m: m["workload"]["params"].update(bogus=1)),
     {}),
    ("host write of an unknown tensor",
     _manifest(lambda m: _steps(m, "host_write")[0].update(tensor="nope")), {}),
    ("host write layout with row blocks of 0 rows",
     _manifest(lambda m: _steps(m, "host_write")[0]["layout"].update(row_block=0)), {}),
    ("host write precision F99",
     _manifest(lambda m: _steps(m, "host_write")[0]["layout"]["precision"].update(kind="F99")), {}),
    ("host write FP8 scale exponent 99",
     _manifest(lambda m: _steps(m, "host_write")[0]["layout"]["precision"].update(
         scale_exponent=99)), {}),
    ("host write tile array flattened to 1-D",
     _retype(lambda m: _steps(m, "host_write")[0]["tiles"], shape=(-1,)), {}),
    ("compute address array flattened to 1-D",
     _retype(lambda m: _last_call(m)["addresses"], shape=(-1,)), {}),
    ("host read origin -1", _manifest(lambda m: _steps(m, "host_read")[0].update(origin=[-1, 0])),
     {}),
    # the run records the host reads outside the device program (package/records.py)
    ("options.diagnostics a string",
     _manifest(lambda m: m["options"].update(diagnostics="yes")), {}),
    ("gemm mode fp7", _manifest(lambda m: [v.update(mode="fp7") for v in m["gemm_modes"].values()]),
     {}),
    ("gemm depth block 0",
     _manifest(lambda m: [v.update(depth_block=0) for v in m["gemm_modes"].values()]), {}),
    ("gemm modes keyed by a name",
     _manifest(lambda m: m["gemm_modes"].update(fc1={"mode": "fp8", "depth_block": 32})), {}),
    ("gemm modes name operation 999",
     _manifest(lambda m: m["gemm_modes"].update({"999": {"mode": "fp8", "depth_block": 32}})),
     {}),
    ("layer loop of 2 layers without its figures",
     _manifest(lambda m: m.update(layer_loop={"layers": 2})), {}),
    ("layer loop of -1 layers", _manifest(lambda m: m.update(layer_loop={"layers": -1})), {}),
]

# Hand-crafted packages that ``ipu-stack run`` once failed to refuse cleanly (bugs found by
# this suite, since fixed by the load-time checks): name, edit, what used to happen.
# tests/reliability/test_package_attacks.py keeps each as a regression test.
KNOWN_BUGS: list[tuple[str, Edit, str]] = [
    ("manifest workload is a string", _manifest(lambda m: m.update(workload="siglip-mlp")),
     "cli.cmd_run: AttributeError 'str' object has no attribute 'get'"),
    ("workload parameter of the wrong type",
     _manifest(lambda m: m["workload"]["params"].update(tokens="abc")),
     "Workload.resolve: TypeError '<' not supported between 'str' and 'int'"),
    ("workload parameters that do not match the program (tokens 16 -> 32)",
     _manifest(lambda m: m["workload"]["params"].update(tokens=32)),
     "SimulatedIpu._host_write: ValueError cannot reshape (the host tensor is never checked "
     "against manifest['tensors'])"),
    ("workload precision that does not match the program (fp8 -> f16)",
     _manifest(lambda m: m["workload"]["params"].update(precision="f16")),
     "runs and reports numericalTest=FAIL (exit 1) instead of refusing a package/graph mismatch"),
    ("manifest tensors without the output", _manifest(lambda m: m["tensors"].clear()),
     "SimulatedIpu._collect: KeyError during the run call (not checked at load)"),
    ("host read of an unknown tensor",
     _manifest(lambda m: _steps(m, "host_read")[0].update(tensor="nope")),
     "SimulatedIpu._collect: KeyError 'nope' during the run call"),
    ("host read checkpoint 'x'",
     _manifest(lambda m: _steps(m, "host_read")[0].update(checkpoint="x")),
     "SimulatedIpu._collect: ValueError int('x') during the run call"),
    ("run program is an object, not a list",
     _manifest(lambda m: m["programs"].update(run={})),
     "load accepts it (iterates keys), the run produces no output: KeyError in run_package"),
    ("compute tile array of float64", _retype(lambda m: _last_call(m)["tiles"], np.float64),
     "SimulatedIpu._compute: IndexError arrays used as indices must be integer"),
    ("compute address array of float64",
     _retype(lambda m: _last_call(m)["addresses"], np.float64),
     "kernel run: TypeError slice indices must be integers"),
    ("compute tile array reshaped to 2-D", _retype(lambda m: _last_call(m)["tiles"], shape=(-1, 1)),
     "kernel run: ValueError shape mismatch (array ranks never checked)"),
    ("host write layout rows 17 for a 16-row tensor",
     _manifest(lambda m: _steps(m, "host_write")[0]["layout"].update(rows=17)),
     "SimulatedIpu._host_write: ValueError cannot reshape"),
    ("manifest without estimate", _manifest(lambda m: m.pop("estimate")),
     "runtime.session.benchmark_fields: KeyError 'estimate' after the run"),
    ("manifest without memory", _manifest(lambda m: m.pop("memory")),
     "runtime.session.benchmark_fields: KeyError 'memory' after the run"),
    ("exchange source address not word aligned (+2 bytes)",
     _set(lambda m: _exchange(m)["src_addr"], lambda a, m: int(a[0]) + 2),
     "accepted and run (exit 0): the simulator floors the address to a word, hardware would fault"),
    ("copy kernel row_bytes 1.5",
     _manifest(lambda m: [k["params"].update(row_bytes=1.5) for k in m["kernels"]
                          if k["family"] == "copy"]),
     "kernels/copy.py _run: IndexError (kernel parameter types never checked at load)"),
    ("gemm operand precision that is a number",
     _manifest(lambda m: [k["params"].update(b=5000) for k in m["kernels"] if k["family"] == "gemm"]),
     "ir/precision.py Precision.from_json: TypeError 'int' object is not subscriptable"),
    ("gemm out_pitch -1",
     _manifest(lambda m: [k["params"].update(out_pitch=-1) for k in m["kernels"]
                          if k["family"] == "gemm"]),
     "kernels/base.py write_rows: ValueError could not broadcast (negative pitch passes the "
     "range check)"),
    ("gemm with -5 rows",
     _manifest(lambda m: [k["params"].update(rows=-5) for k in m["kernels"] if k["family"] == "gemm"]),
     "accepted; the run ends in numpy RuntimeWarnings on stderr and numericalTest=FAIL (exit 1)"),
    # found by benchmarks/fuzz.py (seeds 778-780), refused since by package/records.py
    ("manifest options a string", _manifest(lambda m: m.update(options="x")),
     "runtime/session.py run_package: AttributeError 'str' object has no attribute 'get'"),
    ("manifest layer_loop -1", _manifest(lambda m: m.update(layer_loop=-1)),
     "runtime/session.py _loop_fields: AttributeError 'int' object has no attribute 'get'"),
    ("manifest gemm_modes 1", _manifest(lambda m: m.update(gemm_modes=1)),
     "ir/interpret.py _run_steps: AttributeError 'int' object has no attribute 'get'"),
    ("manifest gemm_modes a list", _manifest(lambda m: m.update(gemm_modes=[])),
     "runtime/session.py benchmark_fields: AttributeError 'list' object has no attribute "
     "'values'"),
]

# ``ipu-stack inspect`` reads the manifest without checking its structure: a traceback on these.
INSPECT_BUGS: list[tuple[str, Edit, str]] = [
    ("manifest without programs", _manifest(lambda m: m.pop("programs")),
     "cli.cmd_inspect: KeyError 'programs'"),
    ("manifest without kernels", _manifest(lambda m: m.pop("kernels")),
     "cli.cmd_inspect: KeyError 'kernels'"),
    ("manifest without estimate", _manifest(lambda m: m.pop("estimate")),
     "cli.cmd_inspect: KeyError 'estimate'"),
    ("manifest workload is a string", _manifest(lambda m: m.update(workload="siglip-mlp")),
     "cli.cmd_inspect: TypeError string indices must be integers"),
    ("a step that is a list", _manifest(lambda m: m["programs"]["run"].__setitem__(0, [1])),
     "cli.cmd_inspect: TypeError list indices must be integers"),
]


def craft(source: Any, edit: Edit, path: Path, target: str | None = None) -> bytes:
    """Apply ``edit`` to a copy of ``source`` (a read Package) and write a valid container."""
    manifest = copy.deepcopy(source.manifest)
    arrays = {k: v.copy() for k, v in source.arrays.items()}
    edit(manifest, arrays)
    write_package(path, target=target or source.target, compiler_version=source.compiler_version,
                  manifest=manifest, arrays=arrays)
    return path.read_bytes()


def content_attacks(original: bytes, scratch: Path,
                    table: list | None = None) -> list[tuple[str, bytes]]:
    """The packages of ``table`` (default :data:`CONTENT_ATTACKS`) built from ``original``."""
    scratch.mkdir(parents=True, exist_ok=True)
    src = scratch / "source.ipuexe"
    src.write_bytes(original)
    source = read_package(src)
    out = []
    for index, entry in enumerate(CONTENT_ATTACKS if table is None else table):
        name, edit, extra = entry
        target = extra.get("target") if isinstance(extra, dict) else None
        out.append((name, craft(source, edit, scratch / f"crafted-{index}.ipuexe", target)))
    return out


# ----------------------------------------------------------------------------- random mutations

HOSTILE_INTS = (-1, -(2**31), 1472, 5000, 2**31 - 1, 2**40, 0, 1)


def mutate_bytes(original: bytes, rng: np.random.Generator) -> tuple[str, bytes]:
    """One random byte-level mutation: flips, overwrites, truncation, insertion or deletion."""
    data = bytearray(original)
    kind = str(rng.choice(["flip", "overwrite", "truncate", "insert", "delete", "multi-flip"]))
    at = int(rng.integers(0, len(data)))
    if kind == "flip":
        data[at] ^= 1 << int(rng.integers(0, 8))
    elif kind == "multi-flip":
        for spot in rng.integers(0, len(data), size=int(rng.integers(2, 16))):
            data[int(spot)] ^= int(rng.integers(1, 256))
    elif kind == "overwrite":
        length = int(rng.integers(1, 64))
        data[at : at + length] = rng.integers(0, 256, size=len(data[at : at + length]),
                                              dtype=np.uint8).tobytes()
    elif kind == "truncate":
        del data[at:]
    elif kind == "insert":
        data[at:at] = rng.integers(0, 256, size=int(rng.integers(1, 64)), dtype=np.uint8).tobytes()
    else:
        del data[at : at + int(rng.integers(1, 64))]
    return f"{kind} at {at}", bytes(data)


def mutate_content(source: Any, rng: np.random.Generator) -> tuple[str, Edit]:
    """One random semantic mutation: an array element, a step field or a manifest entry."""
    kind = str(rng.choice(["array", "array", "step", "kernel", "manifest"]))
    if kind == "array":
        name = str(rng.choice(sorted(source.arrays)))
        size = source.arrays[name].size
        index = int(rng.integers(0, size)) if size else 0
        value = int(rng.choice(HOSTILE_INTS)) if rng.random() < 0.5 else int(rng.integers(-64, 1 << 20))

        def edit_array(m: dict, a: dict) -> None:
            if a[name].size:
                flat = a[name].reshape(-1)
                info = np.iinfo(flat.dtype) if flat.dtype.kind in "iu" else None
                flat[index] = value if info is None else int(np.clip(value, info.min, info.max))

        return f"array {name}[{index}] = {value}", edit_array
    if kind == "step":
        program = str(rng.choice(["initialize", "run"]))
        steps = source.manifest["programs"][program]
        index = int(rng.integers(0, len(steps)))
        key = str(rng.choice(sorted(steps[index])))
        value = _hostile_json(rng)

        def edit_step(m: dict, a: dict) -> None:
            m["programs"][program][index][key] = value

        return f"{program}[{index}].{key} = {value!r}", edit_step
    if kind == "kernel":
        index = int(rng.integers(0, len(source.manifest["kernels"])))
        key = str(rng.choice(sorted(source.manifest["kernels"][index]["params"])))
        value = _hostile_json(rng)

        def edit_kernel(m: dict, a: dict) -> None:
            m["kernels"][index]["params"][key] = value

        return f"kernels[{index}].params.{key} = {value!r}", edit_kernel
    key = str(rng.choice(sorted(source.manifest)))
    value = _hostile_json(rng)

    def edit_manifest(m: dict, a: dict) -> None:
        m[key] = value

    return f"manifest.{key} = {value!r}", edit_manifest


def _hostile_json(rng: np.random.Generator) -> Any:
    choices: list[Any] = [None, -1, 0, 1, 5000, 2**40, 1.5, "x", [], {}, [1, 2], True]
    return choices[int(rng.integers(0, len(choices)))]


# ----------------------------------------------------------------------------- tree snapshots


def snapshot(folder: Path) -> dict[str, int]:
    """Relative path -> size of every file under ``folder`` (to prove nothing new appeared)."""
    return {str(p.relative_to(folder)): p.stat().st_size for p in folder.rglob("*") if p.is_file()}
