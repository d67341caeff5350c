"""Where a store is read from: a local directory, or any pyarrow file system URL
(``s3://bucket/prefix``, ``gs://…``, ``file:///…``), read-only.

A store in an object store is addressed by an `ObjectPath`: a pure POSIX path inside its
file system that carries that file system, so that the reader joins, lists and opens its
files with the same code as local ones (`listdir`, `read_bytes`, `open`). The file system
comes from ``pyarrow.fs.FileSystem.from_uri``: credentials and endpoint from the standard
environment (``AWS_*``, ``GOOGLE_*``), nothing downloaded, nothing written.
"""

from __future__ import annotations

import itertools
import os
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, BinaryIO, ClassVar, cast

from tracklake._errors import StoreError
from tracklake._format.bounded import bounded, touch
from tracklake._format.checks import is_digest
from tracklake._format.files import is_regular_file, no_link_on_the_way
from tracklake._format.layout import blob_path
from tracklake._format.naming import env_root, resolve_root
from tracklake._read.kept import Kept

if TYPE_CHECKING:
    _PathBase = Path  # typed as a Path so the layers pass it on unchanged
else:
    _PathBase = PurePosixPath


class ObjectPath(_PathBase):
    """A file or directory in a pyarrow file system (`filesystem`, shared by every path
    derived from the root). `str()` is the URL, `fs_path` the path pyarrow takes.

    Only what reading needs is there (joining, `is_dir`, `exists`, `read_bytes`,
    `open("rb")`, `listdir`): anything else (writing, `os` calls through `__fspath__`)
    fails loudly rather than being tried on a local path of the same name."""

    filesystem: ClassVar[Any]
    scheme: ClassVar[str]

    @property
    def fs_path(self) -> str:
        return PurePosixPath.__str__(self)

    def __str__(self) -> str:
        return f"{self.scheme}://{self.fs_path}"

    def __repr__(self) -> str:
        return f"ObjectPath({str(self)!r})"

    def __fspath__(self) -> str:
        raise StoreError(f"{self}: a store in an object store is read-only: tracklake "
                         "reads it (runs, show, sql, query, export) and writes only to "
                         "a directory")

    def _info(self) -> Any:
        from pyarrow import fs

        info = self.filesystem.get_file_info(self.fs_path)
        return info.type, fs.FileType

    def is_dir(self) -> bool:
        kind, types = self._info()
        return bool(kind == types.Directory)

    def exists(self) -> bool:
        kind, types = self._info()
        return bool(kind != types.NotFound)

    def read_bytes(self) -> bytes:
        with self.open("rb") as f:
            return f.read()

    def open(self, mode: str = "rb") -> BinaryIO:  # type: ignore[override]  # read-only
        """The file, for reading only (a store in an object store is never written)."""
        if mode != "rb":
            raise StoreError(f"{self}: a store in an object store is read-only")
        return cast(BinaryIO, self.filesystem.open_input_file(self.fs_path))

    def listdir(self) -> list[str]:
        from pyarrow import fs

        selector = fs.FileSelector(self.fs_path, allow_not_found=False)
        return [info.base_name for info in self.filesystem.get_file_info(selector)]


def is_url(root: object) -> bool:
    """Whether `root` names a file system by URL (``scheme://…``) rather than a directory."""
    if isinstance(root, ObjectPath):
        return True
    return "://" in os.fspath(root) if isinstance(root, str | os.PathLike) else False


def read_root(root: str | os.PathLike[str] | None) -> Path:
    """The store root to read: `root`, else $TRACKLAKE_ROOT (empty counts as unset), else
    the default directory, by the writers' rule (`resolve_root`);
    a pyarrow file system URL gives an `ObjectPath` (`StoreError` naming the URL if no
    file system serves it)."""
    if isinstance(root, ObjectPath):
        return root
    chosen = root if root is not None else env_root()
    if chosen is None or not is_url(chosen):
        return resolve_root(chosen)
    url = os.fspath(chosen)
    from pyarrow import fs

    try:
        filesystem, path = fs.FileSystem.from_uri(url)
    except (OSError, ValueError, TypeError) as exc:  # pyarrow: unknown scheme, bad URL
        raise StoreError(f"{url}: cannot open this object store with pyarrow ({exc})") from exc
    if isinstance(filesystem, fs.LocalFileSystem):
        return Path(path)
    scheme = url.split("://", 1)[0].lower()
    cls = type("ObjectPath", (ObjectPath,), {"filesystem": filesystem, "scheme": scheme})
    return cast(ObjectPath, cls(path.rstrip("/")))


def listdir(directory: Path) -> list[str]:
    """Names in `directory` (FileNotFoundError if there is none)."""
    if isinstance(directory, ObjectPath):
        return directory.listdir()
    touch(directory)
    return os.listdir(directory)


def existing_root(root: str | os.PathLike[str] | None) -> Path:
    """The store root to read, checked to exist: an error naming it, never an empty
    answer, if it is not a directory (a typo, an unmounted file system, a bucket that is
    not there or cannot be read with the credentials of the environment)."""
    path = read_root(root)
    try:
        found = bounded(lambda: _is_store_dir(path), path)
    except OSError as exc:  # pyarrow: access denied, no such bucket, endpoint down
        raise StoreError(f"cannot read the store at {path}: {exc}") from exc
    if found is None:
        raise StoreError(f"no tracklake store at {path}: pass root= (or --root) the store's "
                         "directory or URL, or set TRACKLAKE_ROOT")
    if not found:
        raise StoreError(f"{path} is a directory but not a tracklake store (it holds none of "
                         f"{', '.join(STORE_MARKS)}; an empty or unmounted mount point?): "
                         "pass root= (or --root) the store's directory, or set "
                         "TRACKLAKE_ROOT; only `tracklake.init()`, restore and unpack make "
                         "a store")
    return path


def _is_store_dir(path: Path) -> bool | None:
    """None if `path` is no directory, else whether it is a store (any in an object
    store)."""
    touch(path)
    if not path.is_dir():
        return None
    return isinstance(path, ObjectPath) or is_store(path)


#: What a directory written by tracklake holds at least one of: `init()` makes ``runs/``
#: first; a store pruned of every run keeps its policy, exports or backups records.
STORE_MARKS = ("runs", "metrics", "blobs", "tracklake.toml", "exports", "backups", "trash")


def is_store(path: Path) -> bool:
    """True if the local directory `path` holds something only a tracklake store does."""
    return any(os.path.lexists(os.path.join(path, mark)) for mark in STORE_MARKS)


#: Listings kept while their directories stay the same (`subdirs_at`): a project of
#: 10,000 runs lists in 4 ms, and a store of 1,000 projects of a run or two listed them
#: all in 20 ms a question. Their names take at most 64 MiB (about a million).
_kept_listings: Kept[list[str]] = Kept(8192, most_bytes=64 << 20)


def subdirs_at(root: Path, rel: str) -> list[str]:
    """Names of the directories in directory `rel` of `root`, never a symbolic link to
    one (which would lead a read, a write or a delete out of the store); FileNotFoundError
    if there is none, and none at all if `rel` itself is a link. The names are kept
    while the directory's device, inode and mtime stay as they were (a name added,
    removed or renamed in it changes its mtime) and it is older than `RACY_SECONDS`."""
    if isinstance(root, ObjectPath):
        return (root / rel).listdir()  # an object store has no links
    path = os.path.join(root, rel)
    touch(path)
    st = os.lstat(path)  # a link is never followed: none of what it leads to is listed
    if stat.S_ISLNK(st.st_mode):
        return []
    identity = (st.st_dev, st.st_ino, st.st_mtime_ns)
    from tracklake._read.catalog import mtimes_trusted

    trusted = mtimes_trusted()  # else a change that kept the mtime is read too
    names = _kept_listings.get(path, identity) if trusted else None
    if names is None:
        with os.scandir(path) as entries:  # (a name that is no text is none of ours)
            names = _texts([e.name for e in entries if e.is_dir(follow_symlinks=False)])
        if trusted:
            _kept_listings.keep(root, path, st, identity, names,
                                sum(map(len, names)) + 64 * len(names))
    return list(names)


def through_no_link(root: Path, rel: str) -> bool:
    """True if no component of `rel` (a relative POSIX path) under `root` is a symbolic
    link (which would lead a read, write, move or delete out of the store), nor `..`;
    components that do not exist are no link."""
    if isinstance(root, ObjectPath):
        return ".." not in rel.split("/")
    return no_link_on_the_way(root, rel)


def regular_file_at(root: Path, rel: str) -> bool:
    """True if `rel` under the local `root` is a regular file reached through no link: no
    link, FIFO or device a planted state file names is read (or waited on)."""
    return through_no_link(root, rel) and is_regular_file(root / rel)


def regular_blob(root: Path, digest: str) -> Path | None:
    """The path of blob `digest` if the store holds it as a regular file reached through
    no link; None if it is missing, a link, FIFO or device stands in its place, or the
    digest is not 64 hex digits (a crafted record, which forms no path)."""
    if not is_digest(digest):
        return None
    path = blob_path(root, digest)
    if isinstance(root, ObjectPath):
        return path if path.is_file() else None
    rel = f"blobs/sha256/{digest[:2]}/{digest}"
    return path if regular_file_at(root, rel) else None


def regular_files_in(directory: Path) -> tuple[list[str], list[str]]:
    """(regular files, anything else) of `directory`: links, FIFOs, devices, sockets and
    directories are never opened by a reader (FileNotFoundError if there is none)."""
    if isinstance(directory, ObjectPath):
        return directory.listdir(), []
    regular: list[str] = []
    other: list[str] = []
    touch(directory)
    with os.scandir(directory) as entries:
        for e in entries:
            (regular if e.is_file(follow_symlinks=False) else other).append(e.name)
    return regular, other


def count_names_at(root: Path, rel: str, prefix: str) -> int:
    """How many names in directory `rel` of `root` (local) start with `prefix` and are
    text (`_texts`), a batch of them held at a time (a project of a million runs lists
    70 MB of names): FileNotFoundError if there is no such directory."""
    return sum(len(names) for names in names_at_by(root, rel, prefix, _COUNTED_AT))


#: Names held at once while they are counted.
_COUNTED_AT = 1 << 16


def names_at_by(root: Path, rel: str, prefix: str, size: int) -> Iterator[list[str]]:
    """The names in directory `rel` of `root` (local) that start with `prefix` and are
    text (`_texts`), in lists of at most `size` (a million runs' names held at once are
    70 MB): FileNotFoundError if there is no such directory. A name is listed, not
    looked up (a link or a file of a run's name is passed over where the run is read)."""
    path = os.path.join(root, rel)
    touch(path)
    with os.scandir(path) as entries:
        names = (entry.name for entry in entries)
        while batch := list(itertools.islice(names, size)):
            yield _texts([name for name in batch if name.startswith(prefix)])


def _texts(names: list[str]) -> list[str]:
    """`names` but those that are not text: a name that is not UTF-8 (read with its
    bytes escaped) is no name tracklake gives, and Arrow refuses it. All ASCII, as
    tracklake's names are, is one check of them all."""
    if "".join(names).isascii():
        return names
    return [name for name in names if name.isascii() or _encodes(name)]


def _encodes(name: str) -> bool:
    try:
        name.encode()
    except UnicodeEncodeError:
        return False
    return True


def listdir_at(root: Path, rel: str) -> list[str]:
    """Names in directory `rel` (a relative POSIX path string) of `root`, without making
    a path object per directory walked (FileNotFoundError if there is none)."""
    if isinstance(root, ObjectPath):
        return (root / rel).listdir()
    path = os.path.join(root, rel)
    touch(path)
    return _texts(os.listdir(path))
