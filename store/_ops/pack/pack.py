"""Carrying runs across an air gap: `pack()` selected runs into one tar file and
`unpack()` it into another store, verified first and merged idempotently
(docs/air-gapped.md).

The pack format is split by concern: `_pack_manifest` (what a pack holds),
`_pack_archive` (the tar layout: writing, reading, verifying), this module (selecting
and packing runs) and `_unpack` (planning and merging a pack into a store).
Packing only reads the source store (it never compacts it): each stream's complete
records, parts and live segments alike, are written as one fresh part.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import os
import platform
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from tracklake._errors import FormatError, PackConflictError, RunNotFoundError, StoreError
from tracklake._format import SCHEMAS, attempt_file, stream_dir
from tracklake._format.attempt import MAX_ATTEMPT_BYTES, parse_attempt
from tracklake._format.files import read_regular
from tracklake._format.naming import resolve_root
from tracklake._format.schema import BLOB_KINDS
from tracklake._ops.compact import write_part
from tracklake._ops.pack.archive import read_manifest, verify, write_archive
from tracklake._ops.pack.manifest import (
    CHUNK,
    MANIFEST,
    MANIFEST_SUM,
    PACK_FORMAT_VERSION,
    PACKED_SEGMENT,
    AttemptEntry,
    BlobEntry,
    Covered,
    Manifest,
    StreamEntry,
    stream_key,
)
from tracklake._ops.pack.unpack import UnpackReport, unpack
from tracklake._read.listing import refuse_unknown_kinds
from tracklake._read.location import regular_blob
from tracklake._read.reader import ReadProblems, list_runs, list_streams, read_stream

__all__ = [
    "MANIFEST",
    "MANIFEST_SUM",
    "Manifest",
    "PackConflictError",
    "PackReport",
    "UnpackReport",
    "pack",
    "read_manifest",
    "unpack",
    "verify",
]

@dataclass
class PackReport:
    """What `pack()` wrote."""

    output: Path
    runs: int = 0  # runs of which the pack holds something (records, attempt files)
    #: selected runs left out because the `since` packs hold all of them already
    runs_unchanged: int = 0
    since: Path | None = None
    streams: int = 0
    records: int = 0
    attempts: int = 0
    blobs: int = 0
    size_bytes: int = 0
    missing_blobs: list[str] = field(default_factory=list)  # referenced, not in the store
    #: attempt files left out because they are damaged or invalid: (path, why)
    bad_attempts: list[tuple[Path, str]] = field(default_factory=list)
    problems: ReadProblems = field(default_factory=ReadProblems)

    def __str__(self) -> str:
        text = f"packed {self.runs} run(s) into {self.output}"
        if self.since is not None:
            text += (f" ({self.runs} with something new since {self.since.name}, "
                     f"{self.runs_unchanged} unchanged and left out)")
        text += (f": {self.records} records in {self.streams} stream(s), {self.attempts} "
                 f"attempt file(s), {self.blobs} blob(s), {self.size_bytes} bytes")
        if self.missing_blobs:
            text += f"; {len(self.missing_blobs)} referenced blob(s) missing or damaged"
        for _, why in self.bad_attempts:
            text += f"; left out {why}"
        if self.problems.torn or self.problems.damaged:
            text += (f"; {len(self.problems.torn)} torn and {len(self.problems.damaged)} "
                     "damaged segment(s) read up to their last good batch")
        return text


def _sha256_file(path: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size



def _check_output(out: Path) -> None:
    """Refuse an output path the pack cannot, or must not, be renamed onto."""
    try:
        mode = os.lstat(out).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:  # e.g. a parent that is a file
        raise StoreError(f"cannot write the pack to {out}: {exc.strerror}") from exc
    if mode is not None and not stat.S_ISREG(mode):
        what = ("a symbolic link" if stat.S_ISLNK(mode) else "a directory"
                if stat.S_ISDIR(mode) else "a device, pipe or socket")
        raise StoreError(f"refusing to write the pack to {out}: it is {what}, not a regular "
                         "file (a pack replaces its output whole); give a file path")
    if not out.parent.is_dir():
        why = "is not a directory" if out.parent.exists() else "does not exist"
        raise StoreError(f"cannot write the pack to {out}: {out.parent} {why} (create the "
                         "directory first)")


@contextlib.contextmanager
def _output_errors(out: Path) -> Iterator[None]:
    """OS errors while packing (an unwritable directory, a full disk) as one clear error
    naming the output and the file the error is about."""
    try:
        yield
    except OSError as exc:
        about = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(out) else ""
        raise StoreError(f"packing to {out} failed: {exc.strerror or exc}{about}; nothing "
                         "was written there") from exc


@contextlib.contextmanager
def _stage(out: Path) -> Iterator[Path]:
    """A directory beside `out` to write the pack's parts in, removed at the end. A
    Ctrl-C while it is removed (a `TemporaryDirectory`'s removal stopped there, leaving
    it half removed) lets the removal finish, then ends the command."""
    stage = Path(tempfile.mkdtemp(dir=out.parent, prefix=".tracklake-pack-"))
    try:
        yield stage
    finally:
        interrupted: KeyboardInterrupt | None = None
        while True:
            try:
                shutil.rmtree(stage, ignore_errors=True)
                break
            except KeyboardInterrupt as exc:  # again from where it stopped
                interrupted = exc
        if interrupted is not None:
            raise interrupted


def pack(*, root: str | os.PathLike[str] | None = None, project: str | None = None,
         runs: Sequence[str] = (), all_runs: bool = False, output: str | os.PathLike[str],
         since: str | os.PathLike[str] | None = None,
         progress: Callable[[int, int | None, str], None] | None = None) -> PackReport:
    """Write the selected runs (a project, run ids, or all) to one tar file at `output`;
    `progress(done, total, note)` is called after each run is gathered (runs).

    With `since` (an earlier pack), only what that pack and its own predecessors did not
    hold goes in: records after their last seq per stream, changed attempt files, new
    blobs. The source store is only read.
    """
    if not (project or runs or all_runs):
        raise ValueError("choose runs to pack: project=..., runs=[...] or all_runs=True")
    root_path = resolve_root(root)
    refuse_unknown_kinds(root_path, "a pack")
    out = Path(output).absolute()
    base = read_manifest(since) if since is not None else None
    covered = Covered(dict(base.covered.streams), dict(base.covered.attempts),
                      set(base.covered.blobs)) if base else Covered()
    selected = [r for r in list_runs(root_path, project) if not runs or r.run in runs]
    unknown = set(runs) - {r.run for r in selected}
    if unknown:
        raise RunNotFoundError(f"no run {sorted(unknown)[0]!r} in {root_path}"
                         + (f" project {project!r}" if project else "")
                         + "; `tracklake runs` lists the runs there")
    _check_output(out)
    report = PackReport(out, since=Path(since) if since is not None else None)
    created = _dt.datetime.now(_dt.timezone.utc)
    with _output_errors(out), _stage(out) as stage:
        streams: list[tuple[StreamEntry, Path]] = []
        attempts: list[tuple[AttemptEntry, bytes]] = []
        digests: set[str] = set()
        for done, record in enumerate(selected, 1):
            held = len(streams) + len(attempts)
            for a in record.attempts:
                path = attempt_file(root_path, record.project, record.run, a["rank"],
                                    a["attempt"])
                try:  # it may have changed since it was listed (even into a FIFO)
                    data = read_regular(path, MAX_ATTEMPT_BYTES)
                    parse_attempt(data, path)
                except (FormatError, OSError) as exc:
                    report.bad_attempts.append((path, str(exc)))
                    continue
                entry = AttemptEntry(record.project, record.run, a["rank"], a["attempt"],
                                     hashlib.sha256(data).hexdigest(), len(data))
                if covered.attempts.get(entry.key) != entry.sha256 and data:
                    attempts.append((entry, data))
                    covered.attempts[entry.key] = entry.sha256
            for s in list_streams(root_path, record.project, record.run):
                key = stream_key(s)
                batches = list(read_stream(root_path, s, covered.streams.get(key, -1),
                                           report.problems))
                if not batches:
                    continue
                table = pa.Table.from_batches(batches, schema=SCHEMAS[s.kind])
                directory = stream_dir(Path(stage), s)
                directory.mkdir(parents=True, exist_ok=True)
                part = write_part(directory, s, table, PACKED_SEGMENT)
                sha, size = _sha256_file(part)
                seqs = table.column("seq")
                first, last = pc.min(seqs).as_py(), pc.max(seqs).as_py()
                streams.append((StreamEntry(s, first, last, table.num_rows, sha, size), part))
                covered.streams[key] = last
                report.records += table.num_rows
                if s.kind in BLOB_KINDS:
                    digests.update(d for d in table.column("digest").to_pylist() if d)
            if len(streams) + len(attempts) > held:
                report.runs += 1
            else:
                report.runs_unchanged += 1
            if progress is not None:
                progress(done, len(selected), f"{record.project}/{record.run}")
        blobs: list[BlobEntry] = []
        for digest in sorted(digests - covered.blobs):
            blob = regular_blob(root_path, digest)
            if blob is None or _sha256_file(blob)[0] != digest:
                report.missing_blobs.append(digest)
                continue
            blobs.append(BlobEntry(digest, blob.stat().st_size))
            covered.blobs.add(digest)
        since_doc = None
        if base is not None and since is not None:
            since_doc = {"created_at": base.created_at, "path": Path(since).name}
        manifest = Manifest(
            PACK_FORMAT_VERSION, created.isoformat(timespec="microseconds"),
            {"root": str(root_path), "host": platform.node(),
             "selection": {"project": project, "runs": list(runs), "all": all_runs}},
            since_doc, [e for e, _ in streams], [e for e, _ in attempts], blobs, covered)
        write_archive(out, manifest, streams, attempts, root_path, created.timestamp())
    report.streams, report.attempts, report.blobs = len(streams), len(attempts), len(blobs)
    report.size_bytes = out.stat().st_size
    return report
