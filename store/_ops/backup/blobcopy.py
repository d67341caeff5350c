"""Copying blobs, the big files of a store, at close to the speed of ``cp``.

A blob's file name is the sha256 of its bytes (``blobs/sha256/XX/<digest>``), so a backup
need not hash the source to learn its digest: the kernel copies the bytes
(``copy_file_range``, no Python buffers), and the copy is read back once and hashed; the
copy is kept only if that digest is the blob's name. One hash over the bytes proves both
that the source was sound and that the copy holds it. A source whose bytes no longer hash
to its name is damaged: it is reported, never recorded as backed up."""

from __future__ import annotations

import errno
import hashlib
import os
import re
from pathlib import Path

from tracklake._format.files import create_new, open_regular, scratch
from tracklake._ops.backup.errors import BackupError

#: Read-back buffer: big enough that hashlib releases the GIL and threads hash in parallel.
HASH_CHUNK = 8 << 20
#: Errors with which copy_file_range says "not between these two files": copy in user space.
_NO_KERNEL_COPY = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.EPERM}
_BLOB = re.compile(r"blobs/sha256/([0-9a-f]{2})/(\1[0-9a-f]{62})")


class DamagedBlobError(BackupError):
    """A store blob whose bytes do not hash to its name: it was not backed up."""

    def __init__(self, rel: str, found: str) -> None:
        super().__init__(f"{rel}: the store's copy is damaged (its bytes hash to "
                         f"{found[:12]}..., not to its name); it was not backed up")
        self.rel = rel


def blob_digest(rel: str) -> str | None:
    """The sha256 a store path names if it is a blob (``blobs/sha256/XX/<digest>``)."""
    match = _BLOB.fullmatch(rel)
    return match.group(2) if match else None


def file_sha256(path: Path) -> tuple[str, int]:
    """(sha256, size) of a local file, read in big chunks into one buffer no bigger than
    the file (most store files are small: a fresh 8 MB buffer each would cost more)."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(min(HASH_CHUNK, os.fstat(f.fileno()).st_size + 1))
        view = memoryview(buf)
        while n := f.readinto(buf):
            digest.update(view[:n])
            size += n
    return digest.hexdigest(), size


def _user_copy(fin: int, fout: int, at: int) -> None:
    while chunk := os.pread(fin, HASH_CHUNK, at):
        view = memoryview(chunk)
        while view:
            written = os.pwrite(fout, view, at)
            view, at = view[written:], at + written


def kernel_copy(src: Path, dst: Path) -> None:
    """Copy `src` to a new `dst` inside the kernel where it can (copy_file_range), else
    through user space (another file system that refuses it, an older kernel)."""
    with open_regular(src) as source, create_new(dst) as copy:
        fin, fout = source.fileno(), copy.fileno()
        at = 0
        try:
            while True:
                n = os.copy_file_range(fin, fout, 1 << 30, at, at)
                if n == 0:
                    return
                at += n
        except OSError as exc:
            if exc.errno not in _NO_KERNEL_COPY:
                raise
        except AttributeError:  # a platform without copy_file_range
            pass
        _user_copy(fin, fout, at)


def copy_blob(src: Path, dst: Path, rel: str, name: str) -> int:
    """Copy the blob `src` to `dst` through a temporary, read the copy back and rename it
    into place only if it hashes to `name`; its size. On a mismatch nothing is left and
    the source is hashed to tell a damaged store blob (DamagedBlobError) from a backup
    disk that does not keep what it is given (BackupError)."""
    tmp = scratch(dst)
    try:
        kernel_copy(src, tmp)
        digest, size = file_sha256(tmp)
        if digest == name:
            os.rename(tmp, dst)
            return size
    finally:
        tmp.unlink(missing_ok=True)
    check_source(src, rel, name)
    raise BackupError(f"{dst}: the copy does not read back as the store holds it (the "
                      "backup's storage is failing)")


def check_source(src: Path, rel: str, name: str) -> None:
    """Raise DamagedBlobError if the store blob `src` does not hash to its `name`."""
    found, _ = file_sha256(src)
    if found != name:
        raise DamagedBlobError(rel, found)
