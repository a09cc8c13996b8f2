"""The content-addressed kernel cache: ``<cache>/kernels/<sha256>/kernel.json``.

A kernel instance's canonical JSON (family + parameters) names its entry.  An entry holds
the instance descriptor, its code size, the target and the cost the compiler assumed.  There
is no IPU object code in a simulated toolchain: the descriptor *is* the artifact the device
needs.  On every read the stored file is hashed again; an entry whose bytes do not match its
name is rebuilt, never trusted.  Writes are atomic, so parallel compiles sharing a cache both
succeed (the second simply finds or rewrites identical bytes).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

from ipu_stack.kernels.base import KernelInstance
from ipu_stack.target import Target
from ipu_stack.util.errors import CompileError
from ipu_stack.util.files import write_bytes_atomic
from ipu_stack.util.log import event

LOG = logging.getLogger("ipu_stack.kernels")


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/ipu-stack`` or ``~/.cache/ipu-stack``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ipu-stack"


def artifact_bytes(instance: KernelInstance, target: Target) -> bytes:
    """The deterministic bytes of a kernel artifact."""
    descriptor = {
        "name": instance.name,
        "family": instance.family,
        "params": instance.params,
        "target": target.name,
        "source": instance.impl.source,
        "code_bytes": instance.impl.code_bytes,
    }
    return json.dumps(descriptor, sort_keys=True, indent=1).encode() + b"\n"


def entry_key(instance: KernelInstance, target: Target) -> str:
    return hashlib.sha256(artifact_bytes(instance, target)).hexdigest()


def compile_kernels(
    instances: list[KernelInstance], target: Target, cache_dir: Path | None
) -> dict[str, int]:
    """Make sure every instance has a verified cache entry; count hits, builds and repairs."""
    counts = {"hits": 0, "built": 0, "rebuilt": 0}
    if cache_dir is None:
        return counts
    try:
        _compile_into(instances, target, Path(cache_dir), counts)
    except OSError as exc:
        raise CompileError(f"kernel cache {cache_dir} is not usable: {exc.strerror or exc}") from None
    return counts


def _compile_into(
    instances: list[KernelInstance], target: Target, cache_dir: Path, counts: dict[str, int]
) -> None:
    for instance in instances:
        data = artifact_bytes(instance, target)
        key = hashlib.sha256(data).hexdigest()
        path = cache_dir / "kernels" / key / "kernel.json"
        if path.is_file() and not path.is_symlink():
            if hashlib.sha256(path.read_bytes()).hexdigest() == key:
                counts["hits"] += 1
                continue
        if path.exists() or path.is_symlink():
            event(LOG, "kernel cache entry corrupt, rebuilding", level=logging.WARNING,
                  path=str(path))
            counts["rebuilt"] += 1
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
        else:
            counts["built"] += 1
        event(LOG, "compiling kernel", level=logging.DEBUG, name=instance.name,
              target=target.name)
        write_bytes_atomic(path, data)
        event(LOG, "kernel artifact created", level=logging.DEBUG, metadata=str(path))
