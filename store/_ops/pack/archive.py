"""The pack file itself: writing its members in order, and reading and verifying them.

Archive layout (plain, uncompressed tar; relative member names only, in this order)::

    manifest.json                  what the pack holds: a sha256 and size per member
    manifest.json.sha256           sha256 hex of manifest.json, so no byte goes unchecked
    <kind>/project=P/run=R/rank=N/attempt=A/part-FFFFFFFFFFFF-LLLLLLLLLLLL-000000.parquet
    runs/project=P/run=R/rank=N/attempt=A.json
    blobs/sha256/XX/<sha256 hex>

The records are Parquet already compressed with zstd, so the tar itself is not.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from tracklake._errors import FormatError
from tracklake._format import blob_path, fsync_dir
from tracklake._format.files import open_regular
from tracklake._ops.pack.manifest import (
    CHUNK,
    MANIFEST,
    MANIFEST_SUM,
    AttemptEntry,
    Manifest,
    StreamEntry,
    parse_manifest,
)

_MAX_SMALL_MEMBER = 64 << 20  # manifest and attempt files are read into memory
#: The pax header fields a pack member may carry (tarfile writes `path` for long names).
_PAX_KEYS = frozenset({"path", "size", "mtime", "atime", "ctime", "uid", "gid", "uname",
                       "gname", "comment", "charset", "hdrcharset"})


# -- writing ----------------------------------------------------------------------------


def _tar_info(name: str, size: int, mtime: float) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.type = size, int(mtime), 0o644, tarfile.REGTYPE
    return info


class _HashingReader(io.RawIOBase):
    """A file read through, hashing what passes (to check a blob while it is packed)."""

    def __init__(self, f: IO[bytes]) -> None:
        self._f = f
        self.hash = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self._f.read(size)
        self.hash.update(data)
        return data



def write_archive(out: Path, manifest: Manifest, streams: list[tuple[StreamEntry, Path]],
                   attempts: list[tuple[AttemptEntry, bytes]], root: Path,
                   mtime: float) -> None:
    """Write the tar under a temporary name, fsync it, and rename it into place."""
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            with tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT) as tar:
                data = manifest.to_json()
                tar.addfile(_tar_info(MANIFEST, len(data), mtime), io.BytesIO(data))
                checksum = hashlib.sha256(data).hexdigest().encode() + b"\n"
                tar.addfile(_tar_info(MANIFEST_SUM, len(checksum), mtime),
                            io.BytesIO(checksum))
                for entry, path in streams:
                    with open(path, "rb") as src:
                        tar.addfile(_tar_info(entry.member, entry.size, mtime), src)
                for a, blob in attempts:
                    tar.addfile(_tar_info(a.member, a.size, mtime), io.BytesIO(blob))
                for b in manifest.blobs:
                    with open_regular(blob_path(root, b.sha256)) as src:
                        reader = _HashingReader(src)
                        tar.addfile(_tar_info(b.member, b.size, mtime), reader)
                    if reader.hash.hexdigest() != b.sha256:
                        raise FormatError(f"{blob_path(root, b.sha256)}: blob changed while "
                                          "it was packed (damaged store?)")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    fsync_dir(out.parent)



# -- reading an archive -----------------------------------------------------------------


def read_member(tar: tarfile.TarFile, info: tarfile.TarInfo) -> IO[bytes]:
    f = tar.extractfile(info)
    if f is None:
        raise FormatError(f"pack member {info.name!r} is not a regular file")
    return f


def _check_info(path: Path, info: tarfile.TarInfo | None, expected: str) -> tarfile.TarInfo:
    if info is None:
        raise FormatError(f"{path}: ends before its {expected} (truncated?)")
    if info.name != expected:
        raise FormatError(f"{path}: member {info.name!r} where {expected!r} was expected")
    # isreg() is also true of GNU sparse and contiguous members: a sparse member of a few
    # bytes can stand for gigabytes of zeros, so only plain regular files pass
    if info.type not in (tarfile.REGTYPE, tarfile.AREGTYPE) or info.sparse is not None \
            or any(k.startswith("GNU.sparse.") for k in info.pax_headers):
        raise FormatError(f"{path}: member {info.name!r} is not a plain regular file "
                          f"(type {info.type!r}; links, devices, directories and sparse "
                          "members are refused)")
    unexpected = set(info.pax_headers) - _PAX_KEYS
    if unexpected:
        raise FormatError(f"{path}: member {info.name!r} has unexpected pax header fields "
                          f"{sorted(unexpected)} (refused)")
    return info


def _hash_member(tar: tarfile.TarFile, info: tarfile.TarInfo) -> str:
    h = hashlib.sha256()
    with read_member(tar, info) as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def open_pack(path: Path) -> Iterator[tarfile.TarFile]:
    """The pack as a TarFile; tar-level damage becomes FormatError naming the file."""
    with open(path, "rb") as raw:
        try:
            with tarfile.open(fileobj=raw, mode="r:") as tar:
                yield tar
        except (tarfile.TarError, EOFError) as exc:
            raise FormatError(f"{path}: damaged or truncated pack ({exc}); carry it "
                              "again or pack it again") from exc


def _verified_manifest(path: Path, tar: tarfile.TarFile) -> Manifest:
    """Read the manifest (the first two members) and check its own checksum."""
    info = _check_info(path, tar.next(), MANIFEST)
    if info.size > _MAX_SMALL_MEMBER:
        raise FormatError(f"{path}: {MANIFEST} is implausibly large ({info.size} bytes)")
    data = read_member(tar, info).read()
    sum_info = _check_info(path, tar.next(), MANIFEST_SUM)
    stated = read_member(tar, sum_info).read(128).decode("ascii", "replace").strip()
    if hashlib.sha256(data).hexdigest() != stated:
        raise FormatError(f"{path}: {MANIFEST} does not match its checksum (damaged)")
    return parse_manifest(data, path)


def read_manifest(path: str | os.PathLike[str]) -> Manifest:
    """The manifest of the pack at `path` (only the manifest is checked)."""
    pack_path = Path(path)
    with open_pack(pack_path) as tar:
        return _verified_manifest(pack_path, tar)


def verify(path: str | os.PathLike[str]) -> Manifest:
    """Check a whole pack: format version, member names and types, every sha256 and
    size, nothing missing and nothing extra. Raises FormatError naming what is wrong."""
    pack_path = Path(path)
    with open_pack(pack_path) as tar:
        return verify_open(pack_path, tar)


def verify_open(path: Path, tar: tarfile.TarFile) -> Manifest:
    manifest = _verified_manifest(path, tar)
    expected = manifest.members()
    stated = sum(size for _, size in expected.values())
    actual = os.stat(path).st_size
    if stated > actual:
        raise FormatError(f"{path}: the manifest lists {stated} bytes of members in a pack "
                          f"of {actual} bytes (members are stored whole; truncated or "
                          "crafted pack)")
    seen: set[str] = set()
    while (info := tar.next()) is not None:
        if info.name not in expected:
            raise FormatError(f"{path}: unexpected member {info.name!r}: not listed in the "
                              "manifest (refused; nothing was written)")
        if info.name in seen:
            raise FormatError(f"{path}: member {info.name!r} appears twice")
        _check_info(path, info, info.name)
        sha, size = expected[info.name]
        if info.size != size:
            raise FormatError(f"{path}: member {info.name!r} has {info.size} bytes, the "
                              f"manifest says {size}")
        if _hash_member(tar, info) != sha:
            raise FormatError(f"{path}: member {info.name!r} does not match its sha256 "
                              "(damaged)")
        seen.add(info.name)
    missing = sorted(set(expected) - seen)
    if missing:
        raise FormatError(f"{path}: {len(missing)} member(s) listed in the manifest are "
                          f"missing, e.g. {missing[0]!r} (truncated or damaged pack)")
    assert tar.fileobj is not None
    tar.fileobj.seek(tar.offset)
    marker = tar.fileobj.read(2 * tarfile.BLOCKSIZE)
    if len(marker) < 2 * tarfile.BLOCKSIZE or marker.strip(b"\0"):
        raise FormatError(f"{path}: does not end with the tar end-of-archive marker "
                          "(truncated, or something was appended)")
    return manifest
