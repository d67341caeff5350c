"""Durable file writes (atomic replacement, fsync of files and directories) and reads of
files that must be regular files of the store (no link, FIFO or device followed)."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

from tracklake._format.bounded import touch


def fsync_file(path: Path) -> None:
    """Make the contents of the file at `path` durable."""
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    """Make a rename or file creation in `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that no reader ever sees a partial file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise OSError(exc.errno, f"cannot write {path}: {exc.strerror}", str(path)) from exc
    fsync_dir(path.parent)


class NotRegularFileError(OSError):
    """A path in the store that is a link, directory, device, FIFO or socket, where a
    regular file was expected (planted, or left by another tool)."""


def _what(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    return "a device or socket"


def is_regular_file(path: Path) -> bool:
    """True if `path` itself (not what a link there points to) is a regular file."""
    touch(path)
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False


def open_regular(path: Path) -> BinaryIO:
    """Open `path` for reading only if it is a regular file, never following a link and
    never blocking (a FIFO or device is refused, not opened for a read that hangs).

    Raises `NotRegularFileError` (an OSError naming the path and what it is) otherwise.
    """
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    touch(path)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise NotRegularFileError(errno.ELOOP, f"{path} is a symbolic link, not a regular "
                                  "file; tracklake does not follow links in a store",
                                  str(path)) from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFileError(errno.EINVAL, f"{path} is {_what(st.st_mode)}, not a "
                                      "regular file", str(path))
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: Path, limit: int) -> bytes:
    """The bytes of the regular file `path` (see `open_regular`), refused with an OSError
    naming it if it holds more than `limit` bytes."""
    with open_regular(path) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"{path} holds more than {limit} bytes, the most "
                      "tracklake reads of such a file", str(path))
    return data

