"""The public read API: what destinations and other tools use to read a store.

A store is a directory (docs/format.md). This module is the whole of what a reader outside
tracklake needs, and the built-in exporters use nothing else of the store:

- the store root rule: `resolve_root(root)` (explicit argument, else ``$TRACKLAKE_ROOT``,
  else the default directory); a pyarrow file system URL (``s3://bucket/store``,
  ``gs://…``) gives a read-only path in that file system, which every function here
  accepts as a root;
- runs: `list_runs(root, project)`, `find_run(root, run, project)` → `RunRecord`, and
  `effective_status(record, now=now)` / `TERMINAL_STATUSES` to tell a live run
  from an ended one;
- records: `read_run(root, cursor, kinds=..., ranks=..., problems=...)` yields
  ``(StreamId, RecordBatch)`` strictly after a `Cursor`, which the caller advances and
  keeps; damaged or torn files are collected in `ReadProblems`, never raised;
  `run_files(root, project, run)` lists a run's stream files with sizes and modification
  times, so that a follower can tell that nothing was written since it last read;
- the record schemas (`SCHEMAS`, one per kind in `KINDS`), the types of the Hive
  partition columns (`PARTITION_SCHEMA`: give it to any engine reading the Parquet parts,
  so that run ``0042`` stays a string), `StreamId`, and the format
  version with `check_version()` for files a tool keeps beside the store;
- artifacts: `blob_path(root, digest)`, `stored_blob(root, digest)` (the path only if the
  store holds the blob as a regular file) and `open_blob(root, digest)` for the bytes of
  an artifact record; `media_file(root, digest, size)` for the file of a media record;
- the ``wandb.define_metric`` events of `tracklake.wandb` (docs/format.md): `MetricRule`
  and `MetricAxes`, which tell the step metric a key is charted against as W&B matches
  names and globs.

Durable file writes for tools that keep their own files (cursors, event files) are in
`tracklake.files`.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import BinaryIO

from tracklake._errors import FormatError
from tracklake._format import (
    FORMAT_VERSION,
    KINDS,
    PARTITION_SCHEMA,
    SCHEMAS,
    StreamId,
    check_version,
)
from tracklake._format import blob_path as _blob_path
from tracklake._format.attempt import TERMINAL_STATUSES, effective_status
from tracklake._format.bounded import bounded, touch
from tracklake._format.checks import is_digest
from tracklake._format.cursor import MAX_STATE_BYTES, Cursor
from tracklake._format.cursor import read_state as read_exporter_state
from tracklake._format.files import NotRegularFileError, open_regular
from tracklake._integrations.wandb.history import Axes as MetricAxes
from tracklake._integrations.wandb.history import MetricRule
from tracklake._read.cutoffs import AttemptCutoffs
from tracklake._read.listing import stream_dirs as _stream_dirs
from tracklake._read.location import is_url as _is_url
from tracklake._read.location import read_root as resolve_root
from tracklake._read.location import regular_blob as _regular_blob
from tracklake._read.location import through_no_link as _through_no_link
from tracklake._read.reader import (
    ReadProblems,
    RunRecord,
    find_run,
    list_runs,
    positions_past_end,
    read_run,
    stream_last_seq,
)


def blob_path(root: str | os.PathLike[str], digest: str) -> Path:
    """Where the bytes of the artifact with SHA-256 `digest` (64 hex digits) are kept.

    Raises `FormatError` for a digest that is not 64 lowercase hex digits (an artifact
    record from a damaged or crafted file), so that no path outside the store is formed.
    """
    if not is_digest(digest):
        raise FormatError(f"not an artifact digest (64 hex digits): {digest!r}")
    return _blob_path(resolve_root(root), digest)


def stored_blob(root: str | os.PathLike[str], digest: str) -> Path | None:
    """`blob_path(root, digest)` if the store holds that blob as a regular file reached
    through no symbolic link; None if it is missing (a pack made without blobs) or is a
    link, FIFO or device planted in its place, which no reader follows out of the store."""
    blob_path(root, digest)  # the digest checked
    return _regular_blob(resolve_root(root), digest)


def media_file(root: str | os.PathLike[str], digest: str, size: int,
               limit: int | None = None) -> Path | None:
    """The blob of a media record if the store holds it as a regular file of the size the
    record declares (and of at most `limit` bytes); None if not, so that a destination
    never sends a file the record does not describe, nor reads past what it declared."""
    path = stored_blob(root, digest)
    if path is None or (limit is not None and size > limit):
        return None
    try:
        return path if path.stat().st_size == size else None
    except OSError:
        return None


def open_blob(root: str | os.PathLike[str], digest: str) -> BinaryIO:
    """The bytes of an artifact, opened for reading: `FileNotFoundError` if the store
    does not hold them (as after a pack made without blobs), `NotRegularFileError` (an
    OSError) naming the path if a link, FIFO or device stands in their place."""
    path = blob_path(root, digest)
    base = resolve_root(root)
    if _is_url(base):
        return path.open("rb")
    if not _through_no_link(base, path.relative_to(base).as_posix()):
        raise NotRegularFileError(errno.ELOOP, f"{path} is reached through a symbolic "
                                  "link; tracklake does not follow links in a store",
                                  str(path))
    return open_regular(path)


def run_files(root: str | os.PathLike[str], project: str, run: str,
              kinds: tuple[str, ...] = KINDS) -> tuple[tuple[str, int, int], ...] | None:
    """(path, size, mtime in ns) of every file in the stream directories of one run, sorted:
    two equal answers mean nothing of the run's records was written, compacted or pruned
    in between, so a follower can skip reading it. None for a store in an object store,
    where a listing with sizes costs as much as reading what is new."""
    base = resolve_root(root)
    if _is_url(base):
        return None
    return bounded(lambda: _run_files(base, project, run, kinds), base)


def _run_files(base: Path, project: str, run: str, kinds: tuple[str, ...]
               ) -> tuple[tuple[str, int, int], ...]:
    found: list[tuple[str, int, int]] = []
    for directory in _stream_dirs(base, project, run, kinds).values():
        path = os.path.join(base, directory)
        touch(path)
        try:
            with os.scandir(path) as entries:
                for entry in entries:
                    try:
                        info = entry.stat()
                    except FileNotFoundError:
                        continue  # compacted or pruned since it was listed
                    found.append((entry.path, info.st_size, info.st_mtime_ns))
        except (FileNotFoundError, NotADirectoryError):
            continue
    return tuple(sorted(found))


__all__ = [
    "FORMAT_VERSION",
    "KINDS",
    "MAX_STATE_BYTES",
    "PARTITION_SCHEMA",
    "SCHEMAS",
    "TERMINAL_STATUSES",
    "AttemptCutoffs",
    "Cursor",
    "MetricAxes",
    "MetricRule",
    "ReadProblems",
    "RunRecord",
    "StreamId",
    "blob_path",
    "check_version",
    "effective_status",
    "find_run",
    "list_runs",
    "media_file",
    "open_blob",
    "positions_past_end",
    "read_exporter_state",
    "read_run",
    "resolve_root",
    "run_files",
    "stored_blob",
    "stream_last_seq",
]
