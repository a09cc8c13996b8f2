"""Damaged and hostile packages made from a real one (the package fuzz of
``benchmarks/fuzz.py`` and ``tests/reliability/test_package_attacks.py``).

* :func:`container_attacks`: damage to the file itself (truncation, bit flips, hostile ZIP
  members, a zip bomb, missing members, another format version or target);
* :func:`content_attacks` with :data:`CONTENT_ATTACKS`: a valid container whose manifest or
  arrays are hostile, written with ``write_package``; :data:`KNOWN_BUGS` and
  :data:`INSPECT_BUGS` are the same kind of case, kept as regression cases for ``run`` and
  ``inspect``;
* :func:`mutate_bytes` / :func:`mutate_content`: one random mutation of either kind.
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

from ipu_stack.package import read_package, write_package


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

# Hand-crafted packages that ``ipu-stack run`` must refuse like the others, each a regression
# case: name, edit, and the failure a load without the check that refuses it runs into.
# tests/reliability/test_package_attacks.py keeps each as a regression test.
def _shared_checkpoint(manifest: dict) -> None:
    """A host read of another tensor (an output's) takes the first probe's checkpoint."""
    reads = _steps(manifest, "host_read")
    probe = next(s for s in reads if s.get("checkpoint") is not None)
    other = next(s for s in reads if s["tensor"] != probe["tensor"])
    other["checkpoint"] = probe["checkpoint"]


KNOWN_BUGS: list[tuple[str, Edit, str]] = [
    ("a checkpoint read from two tensors of different shapes", _manifest(_shared_checkpoint),
     "SimulatedIpu._collect: ValueError could not broadcast (fuzz seed 202)"),
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
    # cases of benchmarks/fuzz.py (seeds 778-780), refused by package/records.py
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


def _leaves(node: Any, path: tuple = ()) -> list[tuple]:
    """The paths of every leaf (and every non-empty container) below ``node``."""
    found = [path] if path else []
    if isinstance(node, dict):
        for key, child in node.items():
            found += _leaves(child, path + (key,))
    elif isinstance(node, list):
        for index, child in enumerate(node):
            found += _leaves(child, path + (index,))
    return found


def mutate_system(source: Any, rng: np.random.Generator) -> tuple[str, Edit]:
    """One random mutation of a system package's own records: a field of its ``pipeline``
    or ``system`` record (a group, a hand-off, the steps) set to a hostile value or deleted,
    or an element of a hand-off's arrays."""
    handoff_arrays = sorted(k for k in source.arrays if k.startswith("handoff."))
    if rng.random() < 0.3 and handoff_arrays:
        name = str(rng.choice(handoff_arrays))
        size = source.arrays[name].size
        index = int(rng.integers(0, size)) if size else 0
        value = int(rng.choice(HOSTILE_INTS))

        def edit_array(m: dict, a: dict) -> None:
            if a[name].size:
                info = np.iinfo(a[name].dtype)
                a[name].reshape(-1)[index] = int(np.clip(value, info.min, info.max))

        return f"array {name}[{index}] = {value}", edit_array
    records = {k: source.manifest[k] for k in ("pipeline", "system") if k in source.manifest}
    paths = _leaves(records)
    path = paths[int(rng.integers(0, len(paths)))]
    delete = rng.random() < 0.2 and isinstance(path[-1], str)
    value = int(rng.choice(HOSTILE_INTS)) if rng.random() < 0.5 else _hostile_json(rng)

    def edit_record(m: dict, a: dict) -> None:
        node = m
        for key in path[:-1]:
            node = node[key]
        if delete:
            del node[path[-1]]
        else:
            node[path[-1]] = value

    where = ".".join(str(k) for k in path)
    return (f"delete {where}" if delete else f"{where} = {value!r}"), edit_record
