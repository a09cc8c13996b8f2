"""Files in and out: atomic writes that keep the user's umask, reads that refuse anything but a
regular file, and the up-front checks of the folders and files a command will write.

A reader never sees a half-written file under its final name (``write_atomic``).  The
temporary file is created with mode ``0o666`` so the kernel applies the umask (and any default
ACL) exactly as it would for ``open(path, "w")``: ``tempfile.mkstemp`` would create it 0600,
and a profile or report handed to a colleague or served by a web server would be unreadable.

A ZIP archive read from a user (a package, a ``.pt2``) is vetted from its central directory
first: ``overlapping_member`` finds entries whose data would run into the next entry's,
how a small file inflates one payload many times.

Input paths are opened without blocking and checked with ``fstat`` before a byte is read, so a
device (``/dev/zero``), a FIFO or a folder is refused at once instead of read until memory runs
out or blocked on forever.  Output paths are checked before any work starts, so a bad ``-o``
costs one line, not a compile and then a traceback.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from ipu_stack.util.errors import UsageError

_TEMP_ATTEMPTS = 100


class NotRegularFile(OSError):
    """An input path names a folder, a device, a FIFO or a socket, not a regular file."""


def _create_temp(folder: Path, name: str) -> tuple[int, str]:
    """A new, exclusive temporary file in ``folder`` created with mode 0o666 & ~umask."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(_TEMP_ATTEMPTS):
        tmp_name = str(folder / f".{name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp_name, flags, 0o666), tmp_name
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary file name", str(folder))


def write_atomic(path: str | os.PathLike[str], write: Callable[[BinaryIO], None]) -> None:
    """Call ``write(f)`` on a temporary file beside ``path``, fsync it, then rename it.

    The file ends with the mode a plain ``open(path, "w")`` would give it (0o666 minus the
    umask).  On any error (or KeyboardInterrupt) the temporary file is removed and ``path`` is
    left as it was.  A ``path`` that exists and is not a regular file (a folder, ``/dev/null``)
    is refused: renaming over a device node would replace it.
    """
    target = Path(path)
    if target.exists() and not target.is_file():
        raise NotRegularFile(errno.EEXIST, "exists and is not a regular file", str(target))
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = _create_temp(target.parent, target.name)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    write_atomic(path, lambda handle: handle.write(data))


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write UTF-8 ``text`` to ``path`` atomically."""
    write_bytes_atomic(path, text.encode("utf-8"))


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """Open ``path`` for reading only if it is a regular file (symlinks to one are fine).

    Opened with ``O_NONBLOCK`` so that a FIFO cannot hang the open, then judged by ``fstat`` on
    the open descriptor (no window for a swap between check and read).  Raises
    :class:`NotRegularFile` (an ``OSError`` whose ``strerror`` is "not a regular file") or the
    ``OSError`` of the open.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile(errno.EINVAL, "not a regular file", os.fspath(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike[str], limit: int | None = None) -> bytes:
    """The bytes of the regular file ``path`` (see :func:`open_regular`), at most ``limit + 1``
    of them when a limit is given, so the caller can tell "too large" without reading it all."""
    with open_regular(path) as handle:
        return handle.read() if limit is None else handle.read(limit + 1)


def _nearest_existing(path: Path) -> Path:
    """``path`` itself or its closest ancestor that exists (``.`` for a relative path)."""
    probe = path
    while not probe.exists() and not probe.is_symlink():
        parent = probe.parent
        if parent == probe:
            break
        probe = parent
    return probe


def _writable_folder(folder: Path) -> str | None:
    """Why ``folder`` cannot take a new file, or None.  Tried with a real file (created and
    removed at once): ``os.access`` says yes to root on a read-only or virtual filesystem."""
    try:
        fd, name = _create_temp(folder, "ipu-stack-probe")
    except OSError as exc:
        return exc.strerror or str(exc)
    os.close(fd)
    os.unlink(name)
    return None


def _folder_problem(path: Path) -> str | None:
    """Why no file could be written in the folder ``path`` (existing or to be created), or
    None: it exists and is not a folder, or its nearest existing ancestor is not a folder or
    takes no new files."""
    if path.exists() and not path.is_dir():
        return "exists and is not a folder"
    existing = _nearest_existing(path)
    if not existing.is_dir():
        return f"cannot create it, {existing} is not a folder"
    problem = _writable_folder(existing)
    if problem is None:
        return None
    return (f"cannot write there ({problem})" if existing == path
            else f"cannot create it in {existing} ({problem})")


def check_output_folder(option: str, value: str | os.PathLike[str]) -> Path:
    """Refuse, as one :class:`UsageError` line, a folder option the command could not write:
    one that exists and is not a folder (a file, ``/dev/null``), or whose nearest existing
    ancestor is not a folder or takes no new files.  Creates nothing; returns the path."""
    problem = _folder_problem(Path(value))
    if problem is not None:
        raise UsageError(f"{option} {os.fspath(value)}: {problem}")
    return Path(value)


def check_output_file(option: str, value: str | os.PathLike[str]) -> Path:
    """As :func:`check_output_folder`, for an option naming one file to write: it may not
    exist yet or be a regular file; its folder must take new files."""
    path = Path(value)
    if path.exists() and not path.is_file():
        raise UsageError(f"{option} {os.fspath(value)}: exists and is not a regular file")
    problem = _folder_problem(path.parent)
    if problem is not None:
        raise UsageError(f"{option} {os.fspath(value)}: its folder {path.parent}: {problem}")
    return path


ZIP_LOCAL_HEADER_BYTES = 30  # the fixed part of a ZIP local file header


def overlapping_member(archive: zipfile.ZipFile) -> tuple[zipfile.ZipInfo, str] | None:
    """The first entry (in file order) whose local header and data, at their least, run
    past the next entry's header or into the central directory, with what it runs into;
    None when no entry does."""
    ordered = sorted(archive.infolist(), key=lambda info: info.header_offset)
    end_of_data = getattr(archive, "start_dir", None)
    for index, info in enumerate(ordered):
        end = (info.header_offset + ZIP_LOCAL_HEADER_BYTES + len(info.filename.encode())
               + info.compress_size)
        after = ordered[index + 1] if index + 1 < len(ordered) else None
        limit = after.header_offset if after is not None else end_of_data
        if info.header_offset < 0 or (limit is not None and end > limit):
            return info, after.filename if after is not None else "the central directory"
    return None
