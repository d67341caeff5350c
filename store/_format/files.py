"""Durable file writes (atomic replacement, fsync of files and directories) and reads of
files that must be regular files of the store (no link, FIFO or device followed)."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
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


def scratch(path: Path, prefix: str = ".") -> Path:
    """A new name beside `path` to write it under before it is renamed into place:
    ``.NAME.RANDOM.PID.tmp`` (`temporaries.left_over` knows the pattern). No other user
    can guess it, so none can plant a link or FIFO there beforehand, and two threads of
    one process never share one."""
    return path.with_name(f"{prefix}{path.name}.{secrets.token_hex(6)}.{os.getpid()}.tmp")


def create_new(path: Path, *, readable: bool = False) -> BinaryIO:
    """A file created at `path` for writing (and reading back, if `readable`), which must
    not exist yet (O_EXCL): never opened through a link or a FIFO standing under that name
    (a `scratch` name has none)."""
    access = os.O_RDWR if readable else os.O_WRONLY
    fd = os.open(path, access | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    return open(fd, "w+b" if readable else "wb")


def write_new(path: Path, data: bytes, *, fsync: bool = False) -> None:
    """Write `data` to a file created by `create_new`. An error names `path` (a full disk
    fails in the write, whose error names no file)."""
    try:
        with create_new(path) as f:
            f.write(data)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
    except OSError as exc:
        if exc.filename is not None:
            raise
        raise OSError(exc.errno, exc.strerror, str(path)) from exc


def write_atomic(path: Path, data: bytes, *, root: Path | None = None) -> None:
    """Write `data` to `path` so that no reader ever sees a partial file. Given the store's
    `root`, the directories between are made by `store_dir` (never through a link)."""
    if root is None:
        path.parent.mkdir(parents=True, exist_ok=True)
    else:
        store_dir(root, path.parent)
    tmp = scratch(path)
    try:
        write_new(tmp, data, fsync=True)
        os.replace(tmp, path)
    except BaseException as exc:  # Ctrl-C during the write (fsync takes a while) too
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(exc, OSError):
            raise OSError(exc.errno, f"cannot write {path}: {exc.strerror}",
                          str(path)) from exc
        raise
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


def store_dir(root: Path, directory: Path) -> Path:
    """`directory`, a directory under `root`, created with those between if missing; an
    OSError naming the path if one of them is a symbolic link or not a directory (planted
    in a shared store or restored from a backup, a link would take what is written there
    out of the store, where no reader looks). `root` itself may be a link."""
    path = root
    for part in directory.relative_to(root).parts:
        path = path / part
        try:
            os.mkdir(path)
            continue
        except FileExistsError:
            pass
        mode = os.lstat(path).st_mode
        if not stat.S_ISDIR(mode):
            raise NotRegularFileError(
                errno.ELOOP if stat.S_ISLNK(mode) else errno.ENOTDIR,
                f"{path} is {'a regular file' if stat.S_ISREG(mode) else _what(mode)}, "
                "where the store keeps a directory; nothing is "
                "written through it: remove it (`tracklake fsck` lists such files)", str(path))
    return directory


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
        # as many bytes as it holds: a read of the most it may hold allocates that much
        # (64 MiB an attempt file, 20 µs; an address-space limit refuses it)
        data = f.read(min(os.fstat(f.fileno()).st_size, limit) + 1)
        while len(data) <= limit:  # it grew since: on, in pieces, to the limit
            more = f.read(min(1 << 20, limit + 1 - len(data)))
            if not more:
                break
            data += more
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"{path} holds more than {limit} bytes, the most "
                      "tracklake reads of such a file", str(path))
    return data


def no_link_on_the_way(root: Path, rel: str) -> bool:
    """True if no component of `rel` (a relative POSIX path) under `root` is a symbolic
    link (which would lead a read, write, move or delete out of the store), nor `..`;
    components that do not exist are no link."""
    path = os.fspath(root)
    touch(path)
    for part in rel.split("/"):
        if part in ("", ".", ".."):
            return False
        path = os.path.join(path, part)
        try:
            if stat.S_ISLNK(os.lstat(path).st_mode):
                return False
        except FileNotFoundError:
            return True
    return True


def open_state(root: Path, rel: str) -> BinaryIO:
    """Open a file the store keeps for itself (a cache, a marker) at `rel` under `root`,
    as `open_regular` does, refusing it also when a directory on the way is a link."""
    return open_regular(_state_path(root, rel))


def read_state(root: Path, rel: str, limit: int) -> bytes:
    """The bytes of `open_state(root, rel)`; an OSError naming it if it holds more than
    `limit` bytes."""
    return read_regular(_state_path(root, rel), limit)


def _state_path(root: Path, rel: str) -> Path:
    """`root / rel`, or NotRegularFileError if a directory on the way is a link."""
    if not no_link_on_the_way(root, rel):
        raise NotRegularFileError(errno.ELOOP, f"{root / rel} is reached through a symbolic "
                                  "link in the store; tracklake does not follow links in a "
                                  "store", str(root / rel))
    return root / rel


def write_state(root: Path, rel: str, data: bytes, *, tidy: bool = False) -> None:
    """`write_atomic` of a file the store keeps for itself at `rel` under `root`, its
    directories made by `store_dir` (never written through a link). `tidy`: then delete
    the temporaries that killed processes left beside it (`temporaries.left_over`): a
    reader killed while it saved the run catalog left a copy of it, 20 MB at 10,000 runs,
    that nothing else removes."""
    write_atomic(root / rel, data, root=root)
    if tidy:
        from tracklake._format.store_clock import store_now_ns
        from tracklake._format.temporaries import remove_left_over

        with contextlib.suppress(OSError):  # another user's, in a shared store: stays
            # by the store's clock: a host ahead of the file server by more than the
            # temporaries' age took another host's file being written for a left-over
            remove_left_over((root / rel).parent, store_now_ns(root) / 1e9)
