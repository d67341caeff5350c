"""Artifacts: files, directories or bytes stored as content-addressed blobs
(``ROOT/blobs/sha256/XX/<digest>``), written to a temporary name, fsynced and renamed."""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

from tracklake._format import blob_path, fsync_dir
from tracklake._format.files import create_new, is_regular_file, scratch, store_dir
from tracklake._format.naming import safe_name


def artifact_items(artifact: str | os.PathLike[str] | bytes | bytearray | memoryview,
                   name: str | None) -> list[tuple[str, bytes | Path]]:
    """(artifact name, bytes or file) for each blob one `log_artifact()` call stores."""
    if isinstance(artifact, (bytes, bytearray, memoryview)):
        if name is None:
            raise TypeError("log_artifact(bytes) needs a name")
        return [(safe_name(name, "artifact"), bytes(artifact))]
    if isinstance(artifact, (str, os.PathLike)):
        path = Path(artifact)
        if not path.exists():
            raise FileNotFoundError(f"artifact {str(path)!r} does not exist")
        base = safe_name(name or path.name, "artifact")
        if path.is_dir():
            return [(_member_name(base, relative), f)
                    for relative, f in _directory_files(path)]
        if not path.is_file():
            raise ValueError(f"artifact {str(path)!r} is not a regular file or a directory")
        return [(base, path.resolve())]  # a link named by the caller is followed
    raise TypeError(f"artifact must be a path or bytes, not {type(artifact).__name__}")


def _directory_files(directory: Path) -> list[tuple[Path, Path]]:
    """(path relative to `directory`, file to read) for each file below `directory`.

    A symbolic link inside the tree is stored as the file it points to only if that file
    is itself inside the tree; a link out of it (``-> /etc/hostname``), a link to a
    directory, or anything that is not a regular file is refused, naming it, before
    anything is stored.
    """
    top = directory.resolve()
    found: list[tuple[Path, Path]] = []
    for dirpath, dirnames, filenames in os.walk(directory, followlinks=False):
        here = Path(dirpath)
        entries = filenames + [d for d in dirnames if (here / d).is_symlink()]
        for entry in sorted(entries):
            path = here / entry
            relative = path.relative_to(directory)
            if path.is_symlink():
                target = path.resolve()
                if not target.is_relative_to(top):
                    raise ValueError(
                        f"artifact directory {str(directory)!r}: {relative} links to "
                        f"{target}, outside the directory; refused (copy the file in, or "
                        "log it as an artifact of its own)")
                if not target.is_file():
                    raise ValueError(
                        f"artifact directory {str(directory)!r}: {relative} links to "
                        f"{target}, which is not a regular file; refused")
                found.append((relative, target))
            elif path.is_file():
                found.append((relative, path))
            else:
                raise ValueError(f"artifact directory {str(directory)!r}: {relative} is not "
                                 "a regular file (a device, socket or pipe); refused")
    return sorted(found)


def store_blob(root: Path, source: bytes | Path) -> tuple[str, int]:
    """Store `source` as a blob under `root`; (sha256 hex digest, size)."""
    tmp = scratch(store_dir(root, root / "blobs" / "tmp") / "blob")
    try:
        return _copy_blob(root, source, tmp)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()  # left only when the copy failed (e.g. a full disk)


def _copy_blob(root: Path, source: bytes | Path, tmp: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    with create_new(tmp) as out:
        if isinstance(source, bytes):
            h.update(source)
            out.write(source)
            size = len(source)
        else:
            # O_NOFOLLOW: a file swapped for a link after it was listed is not followed
            fd = os.open(source, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            with open(fd, "rb") as src:
                while chunk := src.read(1 << 20):
                    h.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
        out.flush()
        os.fsync(out.fileno())
    digest = h.hexdigest()
    final = blob_path(root, digest)
    store_dir(root, final.parent)
    if not is_regular_file(final):  # a link or FIFO planted in its place is replaced
        os.replace(tmp, final)
        fsync_dir(final.parent)
    return digest, size


def _member_name(base: str, relative: Path) -> str:
    """Artifact name of a file inside a logged directory: ``base/sub/file``."""
    return "/".join([base, *(safe_name(p, "artifact") for p in relative.parts)])
