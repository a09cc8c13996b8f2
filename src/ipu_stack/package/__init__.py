"""The application package ``model.ipuexe``: a versioned, checksummed, pickle-free container.

The compiler writes it with :func:`write_package`; the simulated device loads only what
:func:`read_package` accepts.  The layout is specified in ``docs/package-format.md``.
"""

from __future__ import annotations

from .format import ALLOWED_DTYPES, FORMAT_NAME, FORMAT_VERSION, Package
from .reader import read_package, read_package_bytes
from .writer import package_bytes, write_package

__all__ = [
    "ALLOWED_DTYPES",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "Package",
    "package_bytes",
    "read_package",
    "read_package_bytes",
    "write_package",
]
