"""Where a backup lives: a local directory (plain path or ``file://``) with fast copies and
one sync of its file system, or any pyarrow file system URL (``s3://``, ``gs://``, ...)
whose endpoint, region and credentials come from the standard environment and config
files (``AWS_*`` variables, ``~/.aws``), never from the store."""

from __future__ import annotations

import ctypes
import hashlib
import os
import stat
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit, urlunsplit

import pyarrow as pa
import pyarrow.fs as pafs

from tracklake._format import fsync_dir, write_atomic
from tracklake._format.files import (
    create_new,
    no_link_on_the_way,
    open_regular,
    open_state,
    read_state,
    scratch,
)
from tracklake._format.store_clock import directory_now_ns
from tracklake._format.temporaries import remove_left_over
from tracklake._ops.backup.blobcopy import check_source, copy_blob, file_sha256
from tracklake._ops.backup.errors import BackupError

#: Files up to this size are copied in one read; bigger ones in chunks of it.
CHUNK = 8 << 20


def _syncfs(directory: Path) -> None:
    """Make everything written to the file system of `directory` durable: syncfs(2) where
    the C library has it (one file system, not every disk of the machine), else sync(2)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        syncfs = getattr(libc, "syncfs", None)
        if syncfs is None or syncfs(fd) != 0:
            os.sync()
    finally:
        os.close(fd)


class Target(Protocol):
    """The operations backup and restore need from a destination; `rel` is a path
    relative to the backup's top, with ``/`` separators."""

    url: str  # where it is, for messages and the store's record (no credentials)

    def listing(self) -> Mapping[str, int]:
        """Size of every file the destination holds, by relative path."""

    def put(self, src: Path, rel: str) -> tuple[str, int]:
        """Copy a local file to `rel`, verified by reading the copy back; (sha256, size)
        of the bytes read from `src`. A reader never sees a half-written `rel`."""

    def put_blob(self, src: Path, rel: str, name: str) -> int:
        """Copy the store blob `src` to `rel`, verified by reading the copy back and
        hashing it to the blob's `name`; its size. A DamagedBlobError, and nothing at
        `rel`, if the source's bytes do not hash to `name`."""

    def fetch(self, rel: str, dst: Path) -> tuple[str, int]:
        """Copy `rel` to the local path `dst` (fsynced); (sha256, size) of the bytes."""

    def digest(self, rel: str) -> tuple[str, int]:
        """(sha256, size) of the bytes `rel` holds now."""

    def read(self, rel: str) -> bytes | None:
        """Bytes of a small file (the manifest), None if there is none."""

    def write(self, rel: str, data: bytes) -> None:
        """Replace a small file (the manifest) whole, atomically and durably."""

    def make_durable(self) -> None:
        """Return only once every `put` so far survives a crash of this machine."""


def _hash_copy(fin: object, fout: object) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    while True:
        chunk = fin.read(CHUNK)  # type: ignore[attr-defined]
        if not chunk:
            return digest.hexdigest(), size
        digest.update(chunk)
        fout.write(chunk)  # type: ignore[attr-defined]
        size += len(chunk)


def _copy_fd(src: Path, dst: Path) -> tuple[str, int]:
    """Copy with plain system calls (most store files fit one read), each chunk read back
    from the copy and compared with what was written; (sha256, size) of the bytes."""
    digest, size = hashlib.sha256(), 0
    with open_regular(src) as source, create_new(dst, readable=True) as copy:
        fin, fout = source.fileno(), copy.fileno()
        while chunk := os.read(fin, CHUNK):
            digest.update(chunk)
            view = memoryview(chunk)
            at = size
            while view:
                written = os.pwrite(fout, view, at)
                view, at = view[written:], at + written
            if os.pread(fout, len(chunk), size) != chunk:
                raise BackupError(f"{dst}: the copy does not read back as written (the "
                                  "backup's storage is failing)")
            size += len(chunk)
    return digest.hexdigest(), size


def local_digest(path: Path) -> tuple[str, int]:
    """(sha256, size) of a local file."""
    return file_sha256(path)


def _fetch_to(stream: object, dst: Path) -> tuple[str, int]:
    """Write a readable stream to `dst` through an fsynced temporary renamed into place."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = scratch(dst)
    try:
        with create_new(tmp) as fout:
            digest, size = _hash_copy(stream, fout)
            fout.flush()
            os.fsync(fout.fileno())
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)
    return digest, size


class _StatSizes(Mapping[str, int]):
    """Sizes of a directory's files, each looked up with one stat when asked: an
    incremental backup asks only about files whose manifest entry is unchanged, which
    costs less than walking every directory of the backup."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __getitem__(self, rel: str) -> int:
        try:
            st = os.lstat(self.path / rel)
        except (FileNotFoundError, NotADirectoryError):
            raise KeyError(rel) from None
        if not stat.S_ISREG(st.st_mode) or not no_link_on_the_way(self.path, rel):
            raise KeyError(rel)  # a link, FIFO or device in a backup is never read
        return st.st_size

    def __iter__(self) -> Iterator[str]:
        base = os.fspath(self.path)
        for dirpath, dirnames, names in os.walk(base):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            rel_dir = dirpath[len(base) + 1:]
            for name in names:
                if not name.startswith("."):
                    yield f"{rel_dir}/{name}" if rel_dir else name

    def __len__(self) -> int:
        return sum(1 for _ in self)


#: The most `LocalTarget.read` reads of one file (the manifest: a checksum, size and
#: runs per file of the store, a few million files).
MAX_READ_BYTES = 1 << 30


class LocalTarget:
    """A backup in a local directory: plain file copies, no per-file fsync; the owner
    calls `make_durable` (one syncfs) before it records what was copied."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.url = str(path)
        self._made: set[Path] = set()

    def listing(self) -> Mapping[str, int]:
        return _StatSizes(self.path)

    def _place(self, rel: str) -> Path:
        dst = self.path / rel
        if dst.parent not in self._made:  # one mkdir per directory, not per file
            dst.parent.mkdir(parents=True, exist_ok=True)
            # of an earlier backup that was killed, aged by the target's clock (another
            # host's copy on its way to a file server is as old as the server says)
            remove_left_over(dst.parent, directory_now_ns(self.path) / 1e9)
            self._made.add(dst.parent)
        return dst

    def put(self, src: Path, rel: str) -> tuple[str, int]:
        dst = self._place(rel)
        tmp = scratch(dst)
        try:
            digest, size = _copy_fd(src, tmp)
            os.rename(tmp, dst)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return digest, size

    def put_blob(self, src: Path, rel: str, name: str) -> int:
        return copy_blob(src, self._place(rel), rel, name)

    def fetch(self, rel: str, dst: Path) -> tuple[str, int]:
        with open_state(self.path, rel) as fin:
            return _fetch_to(fin, dst)

    def digest(self, rel: str) -> tuple[str, int]:
        return local_digest(self.path / rel)

    def read(self, rel: str) -> bytes | None:
        try:
            return read_state(self.path, rel, MAX_READ_BYTES)
        except FileNotFoundError:
            return None

    def write(self, rel: str, data: bytes) -> None:
        write_atomic(self.path / rel, data)

    def make_durable(self) -> None:
        if self.path.is_dir():
            _syncfs(self.path)
            fsync_dir(self.path)


class ArrowTarget:
    """A backup on a pyarrow file system (an object store): an upload appears whole or
    not at all, and is durable once the store answered; it is read back to verify."""

    def __init__(self, fs: pafs.FileSystem, base: str, url: str) -> None:
        self.fs, self.base, self.url = fs, base.rstrip("/"), url

    def _key(self, rel: str) -> str:
        return f"{self.base}/{rel}"

    def listing(self) -> dict[str, int]:
        selector = pafs.FileSelector(self.base, recursive=True, allow_not_found=True)
        out: dict[str, int] = {}
        for info in self.fs.get_file_info(selector):
            rel = info.path[len(self.base) + 1:]
            if info.type == pafs.FileType.File and not any(
                    p.startswith(".") for p in rel.split("/")):
                out[rel] = int(info.size or 0)
        return out

    def put(self, src: Path, rel: str) -> tuple[str, int]:
        digest, size, crc = hashlib.sha256(), 0, 0
        with open(src, "rb") as fin, self.fs.open_output_stream(self._key(rel)) as fout:
            while chunk := fin.read(CHUNK):
                digest.update(chunk)
                crc = zlib.crc32(chunk, crc)
                fout.write(chunk)
                size += len(chunk)
        back, back_size = 0, 0  # read back: a CRC-32 is enough to compare, and cheaper
        with self.fs.open_input_stream(self._key(rel)) as fin:
            while chunk := fin.read(CHUNK):
                back = zlib.crc32(chunk, back)
                back_size += len(chunk)
        if (back, back_size) != (crc, size):
            raise BackupError(f"{self.url}/{rel}: the upload does not read back as sent")
        return digest.hexdigest(), size

    def put_blob(self, src: Path, rel: str, name: str) -> int:
        """Upload without hashing the source; the read-back is hashed once, and an upload
        that does not hash to `name` is deleted."""
        with open(src, "rb") as fin, self.fs.open_output_stream(self._key(rel)) as fout:
            while chunk := fin.read(CHUNK):
                fout.write(chunk)
        back, size = self.digest(rel)
        if back == name:
            return size
        self.fs.delete_file(self._key(rel))
        check_source(src, rel, name)
        raise BackupError(f"{self.url}/{rel}: the upload does not read back as sent")

    def fetch(self, rel: str, dst: Path) -> tuple[str, int]:
        with self.fs.open_input_stream(self._key(rel)) as fin:
            return _fetch_to(fin, dst)

    def digest(self, rel: str) -> tuple[str, int]:
        digest, size = hashlib.sha256(), 0
        with self.fs.open_input_stream(self._key(rel)) as fin:
            while chunk := fin.read(CHUNK):
                digest.update(chunk)
                size += len(chunk)
        return digest.hexdigest(), size

    def read(self, rel: str) -> bytes | None:
        try:
            with self.fs.open_input_stream(self._key(rel)) as fin:
                return bytes(fin.read())
        except FileNotFoundError:
            return None

    def write(self, rel: str, data: bytes) -> None:
        with self.fs.open_output_stream(self._key(rel)) as fout:
            fout.write(data)

    def make_durable(self) -> None:
        """Nothing to do: an object store acknowledges an upload once it is stored."""


def _public_url(url: str) -> str:
    """`url` without a query string or user info, which may carry credentials."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.hostname or "", parts.path, "", ""))


def open_target(dest: str | os.PathLike[str]) -> Target:
    """The backup destination `dest` names: a path, ``file://``, ``s3://``, ``gs://``, or
    any URL pyarrow's ``FileSystem.from_uri`` understands."""
    text = os.fspath(dest)
    if "://" not in text:
        return LocalTarget(Path(text))
    try:
        fs, base = pafs.FileSystem.from_uri(text)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as exc:
        raise BackupError(f"cannot open backup location {_public_url(text)}: {exc}") from exc
    if isinstance(fs, pafs.LocalFileSystem):
        return LocalTarget(Path(base))
    if not base.strip("/"):
        raise BackupError(f"{_public_url(text)} names no bucket")
    return ArrowTarget(fs, base, _public_url(text))
