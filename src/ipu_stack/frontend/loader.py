"""Loading torch and ``.pt2`` programs, with one clear line for every way it can go wrong.

torch is an optional extra (``pip install 'ipu-stack[torch]'``): nothing outside
``ipu_stack.frontend`` imports it, and this module imports it only when asked, so the core
compiler and its tests run without it.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import logging
import os
import re
import sys
import zipfile
from pathlib import Path
from typing import Any

from ipu_stack.frontend.convert import module_label, source_label, unsupported_message
from ipu_stack.util.errors import CompileError, UsageError, first_line
from ipu_stack.util.files import overlapping_member

LOG = logging.getLogger("ipu_stack.frontend")
SUPPORTED_TORCH = ("2.13",)  # the torch.export schema this importer was written against

# Bounds on a .pt2 archive, checked from its central directory before any member is read:
# the most that 8 linked chips' 7.2 GB could hold twice over, a member count far above any
# export's (a 30-layer model has a few hundred), and the deflate ratio real JSON members
# reach (torch stores tensors uncompressed)
MOST_ARCHIVE_BYTES = 16 << 30
MOST_MEMBERS = 100_000
MOST_RATIO = 200
MOST_JSON_BYTES = 512 << 20
PICKLE_FREE = ("weight_", "tensor_")  # payload names of raw tensor bytes (not pickles)


def require_torch() -> Any:
    """The ``torch`` module, or a UsageError saying how to install it."""
    try:
        import torch
    except ImportError:
        raise UsageError("importing a torch program needs torch: pip install 'ipu-stack[torch]'"
                         ) from None
    if not torch.__version__.startswith(SUPPORTED_TORCH):
        raise UsageError(f"torch {torch.__version__} is installed; the importer supports torch "
                         f"{', '.join(SUPPORTED_TORCH)}.x (pip install 'ipu-stack[torch]')")
    return torch


def refuse_unless_file(path: Path) -> None:
    """One line for a model path that is not a regular file: a folder (``m.onnx/``),
    something else that exists, or nothing."""
    if not path.is_file():
        raise UsageError(f"{path}: " + ("a folder, not a model file" if path.is_dir() else
                                        "not a regular file" if path.exists() else
                                        "no such file"))


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _recorded_versions(path: Path) -> tuple[str | None, str | None]:
    """(torch version, schema ``major.minor``) a ``.pt2`` archive says it was saved by, from
    its ``models/*.json`` member; ``None`` where it does not say."""
    with zipfile.ZipFile(path) as archive:
        for name in archive.namelist():
            if "/models/" in name and name.endswith(".json"):
                data = json.loads(archive.read(name))
                schema = data.get("schema_version") or {}
                version = f"{schema.get('major')}.{schema.get('minor')}" if schema else None
                return data.get("torch_version"), version
    return None, None


def load_program(path: str | Path) -> Any:
    """``torch.export.load(path)`` for a file the user names, as an ``ExportedProgram``.

    Raises UsageError (one line) for a missing file, a file that is not a ``.pt2`` zip
    archive (truncated, foreign), or an archive torch cannot read (another torch's schema).
    """
    path = Path(path)
    refuse_unless_file(path)
    if not zipfile.is_zipfile(path):
        raise UsageError(f"{path}: not a torch.export .pt2 archive (truncated or another format)")
    try:
        with zipfile.ZipFile(path) as archive:
            vet_archive(path, archive)
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise UsageError(f"{path}: damaged .pt2 archive ({exc})") from None
    if bad is not None:
        raise UsageError(f"{path}: damaged .pt2 archive (member {bad} fails its CRC)")
    torch = require_torch()
    _import_pytree_types(path)
    quiet = logging.getLogger("torch.export")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # torch logs a traceback per failure; we say it in one line
    forced = os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD")
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"  # every torch.load inside: tensors only
    try:
        program = torch.export.load(str(path))
    except Exception as exc:  # torch raises many types for one cause: an unreadable archive
        _raise_unknown_operator(path, torch)
        saved_by, schema = _safe_versions(path)
        detail = first_line(exc)
        if schema is not None and schema != _schema_version(torch):
            raise UsageError(f"{path}: exported by torch {saved_by} (schema {schema}); this is "
                             f"torch {torch.__version__} (schema {_schema_version(torch)}), "
                             f"re-export the model with it") from None
        raise UsageError(f"{path}: torch.export.load failed: {detail[:200]}") from None
    finally:
        quiet.setLevel(level)
        if forced is None:
            del os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"]
        else:
            os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = forced
    if not isinstance(program, torch.export.ExportedProgram):
        raise UsageError(f"{path}: holds a {type(program).__name__}, not an ExportedProgram")
    _restore_stack_traces(program, path)
    return program


def vet_archive(path: Path, archive: zipfile.ZipFile) -> None:
    """Refuse, in one line, an archive that could exhaust memory or run code before a byte
    of it is inflated: more members or bytes than any model (``MOST_*``), members that
    repeat or overlap (a bomb that inflates one payload many times), a member inflating
    more than ``MOST_RATIO`` times its stored size, and any payload torch would unpickle
    (a weight or constant with ``use_pickle``, a custom or opaque object, a legacy weights
    file, an AOTInductor package).  torch's own loads then read tensors only."""
    infos = archive.infolist()
    if len(infos) > MOST_MEMBERS:
        raise UsageError(f"{path}: {len(infos)} archive members, more than any model's "
                         f"({MOST_MEMBERS})")
    names: set[str] = set()
    for info in infos:
        if info.filename in names:
            raise UsageError(f"{path}: archive member {info.filename} repeats or overlaps "
                             "another (a zip bomb)")
        names.add(info.filename)
        if info.compress_type != zipfile.ZIP_STORED and \
                info.file_size > MOST_RATIO * max(info.compress_size, 1):
            raise UsageError(f"{path}: archive member {info.filename} inflates "
                             f"{info.file_size // max(info.compress_size, 1)} times (a zip bomb)")
        if info.filename.endswith(".json") and info.file_size > MOST_JSON_BYTES:
            raise UsageError(f"{path}: archive member {info.filename} is {info.file_size} "
                             f"bytes of JSON (at most {MOST_JSON_BYTES})")
    if (found := overlapping_member(archive)) is not None:  # no data shared either
        raise UsageError(f"{path}: archive member {found[0].filename} overlaps {found[1]} "
                         "(a zip bomb)")
    total = sum(info.file_size for info in infos)
    if total > MOST_ARCHIVE_BYTES:
        raise UsageError(f"{path}: {total} bytes inflated, more than any model's "
                         f"({MOST_ARCHIVE_BYTES})")
    _refuse_pickles(path, archive, sorted(names))


def _refuse_pickles(path: Path, archive: zipfile.ZipFile, names: list[str]) -> None:
    """The payload configs name only raw tensors (module ``vet_archive``)."""
    if not any("/models/" in n for n in names) and any(n.endswith("data.pkl") for n in names):
        raise UsageError(f"{path}: a torch.save file (a pickle), not a torch.export program; "
                         "export the model with torch.export.export and save it with "
                         "torch.export.save")
    for name in names:
        inner = name.split("/", 1)[-1]
        if inner.startswith("data/aotinductor/") or (
                inner.startswith("data/weights/") and inner.endswith(".pt")):
            raise UsageError(f"{path}: holds {inner}, which torch would unpickle; ipu-stack "
                             "reads no pickle (re-export with torch.export.save)")
        if not (inner.startswith(("data/weights/", "data/constants/"))
                and inner.endswith("config.json")):
            continue
        try:
            entries = json.loads(archive.read(name)).get("config", {})
            payloads = [(str(key), bool(meta.get("use_pickle")), str(meta.get("path_name")))
                        for key, meta in entries.items()]
        except (ValueError, RecursionError, AttributeError) as exc:
            raise UsageError(f"{path}: unreadable {inner} ({type(exc).__name__})") from None
        for key, pickled, payload in payloads:
            if pickled or not payload.startswith(PICKLE_FREE):
                raise UsageError(f"{path}: {key} is stored as a pickle ({payload}); ipu-stack "
                                 "reads no pickle (tensors only)")


def _restore_stack_traces(program: Any, path: Path) -> None:
    """Put back the source lines the archive recorded but the loaded nodes lack (torch drops
    them for custom operators): unsupported-operation errors quote them."""
    traces: dict[str, str] = {}
    for node in _archive_nodes(path):
        trace = (node.get("metadata") or {}).get("stack_trace")
        for output in node.get("outputs") or []:
            name = (output.get("as_tensor") or {}).get("name") if isinstance(output, dict) else None
            if trace and name:
                traces[name] = trace
    for node in program.graph.nodes:
        if not node.meta.get("stack_trace") and node.name in traces:
            node.meta["stack_trace"] = traces[node.name]


def _archive_nodes(path: Path) -> list[dict[str, Any]]:
    """The graph nodes of a ``.pt2``'s serialized model (empty when unreadable)."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = [n for n in archive.namelist() if "/models/" in n and n.endswith(".json")]
            model = json.loads(archive.read(names[0])) if names else {}
        return list(model["graph_module"]["graph"]["nodes"])
    except (zipfile.BadZipFile, OSError, ValueError, KeyError, TypeError, RecursionError):
        return []


PYTREE_TYPE = re.compile(r'\\"type\\": \\"([A-Za-z_][\w.]*)\.([A-Za-z_]\w*)\\"')


def _import_pytree_types(path: Path) -> None:
    """Import the installed modules that define the program's input/output containers (a
    Hugging Face ``BaseModelOutputWithPooling``): torch can only rebuild a pytree type that
    is registered, and such types register when their module is imported."""
    try:
        with zipfile.ZipFile(path) as archive:
            texts = [archive.read(n).decode("utf-8", "replace") for n in archive.namelist()
                     if "/models/" in n and n.endswith(".json")]
    except (zipfile.BadZipFile, OSError):
        return
    modules = {m.group(1) for text in texts for m in PYTREE_TYPE.finditer(text)}
    for module in sorted(modules):
        top = module.split(".")[0]
        if module in sys.modules or top in ("builtins", "collections", "torch"):
            continue
        if importlib.util.find_spec(top) is None:
            continue
        try:
            importlib.import_module(module)
        except Exception as exc:  # the load below reports what is still missing
            LOG.debug("could not import %s for the program's pytree types: %s", module, exc)


def _raise_unknown_operator(path: Path, torch: Any) -> None:
    """When the archive names an operator this process does not have (a custom op whose
    library is not imported), raise the importer's standard unsupported-operation line for
    its first node, from the node metadata the archive keeps."""
    for node in _archive_nodes(path):
        target = str(node.get("target", ""))
        parts = target.split(".")
        if len(parts) != 5 or parts[:2] != ["torch", "ops"] or _resolves(torch, parts[2:]):
            continue
        meta = node.get("metadata") or {}
        stack = [entry.split(",") for entry in str(meta.get("nn_module_stack", "")).split(";")
                 if entry]
        module = module_label(stack[-1][1], stack[-1][-1]) if stack and len(stack[-1]) >= 3 \
            else "<top>"
        raise CompileError(unsupported_message(
            ".".join(parts[2:]), module, source_label(meta.get("stack_trace")),
            "a custom operator that is not registered in this process"))


def _resolves(torch: Any, parts: list[str]) -> bool:
    try:
        getattr(getattr(getattr(torch.ops, parts[0]), parts[1]), parts[2])
    except (AttributeError, RuntimeError):
        return False
    return True


def _safe_versions(path: Path) -> tuple[str | None, str | None]:
    try:
        return _recorded_versions(path)
    except (zipfile.BadZipFile, OSError, UnicodeError, ValueError, AttributeError,
            RecursionError):
        return None, None


def _schema_version(torch: Any) -> str:
    """The serialization schema version this torch writes (``major.minor``)."""
    try:
        from torch._export.serde.schema import SCHEMA_VERSION

        return ".".join(str(v) for v in SCHEMA_VERSION)
    except ImportError:  # pragma: no cover - torch moved it
        return "unknown"
