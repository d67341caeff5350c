"""Carrying runs across an air gap: `pack()` selected runs into one tar file and
`unpack()` it into another store, verified first and merged idempotently
(docs/air-gapped.md).

Archive layout (plain, uncompressed tar; relative member names only, in this order)::

    manifest.json                  what the pack holds: a sha256 and size per member
    manifest.json.sha256           sha256 hex of manifest.json, so no byte goes unchecked
    <kind>/project=P/run=R/rank=N/attempt=A/part-FFFFFFFFFFFF-LLLLLLLLLLLL-000000.parquet
    runs/project=P/run=R/rank=N/attempt=A.json
    blobs/sha256/XX/<sha256 hex>

The records are Parquet already compressed with zstd, so the tar itself is not.
Packing only reads the source store (it never compacts it): each stream's complete
records, parts and live segments alike, are written as one fresh part.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import io
import json
import os
import platform
import re
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tracklake._compact import write_part
from tracklake._errors import (
    FormatError,
    NewerFormatError,
    PackConflictError,
    RunNotFoundError,
)
from tracklake._format import (
    FORMAT_VERSION,
    KINDS,
    SCHEMAS,
    StreamId,
    attempt_file,
    blob_path,
    check_version,
    fsync_dir,
    part_name,
    stream_dir,
    write_atomic,
)
from tracklake._naming import resolve_root
from tracklake._reader import ReadProblems, list_runs, list_stream, list_streams, read_stream

#: Major.minor of the pack format (manifest and layout). unpack refuses a newer major.
PACK_FORMAT_VERSION = "1.0"
PACK_FORMAT_MAJOR = 1
MANIFEST = "manifest.json"
MANIFEST_SUM = "manifest.json.sha256"
#: The last-segment number of every part inside a pack (unpack chooses its own).
PACKED_SEGMENT = 0
_MAX_SMALL_MEMBER = 64 << 20  # manifest and attempt files are read into memory
_CHUNK = 1 << 20
_NAME = re.compile(r"[A-Za-z0-9._+@-]{1,128}")
_HEX = re.compile(r"[0-9a-f]{64}")


# -- manifest ---------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamEntry:
    """One stream's records in a pack: seq first..last as one Parquet member."""

    stream: StreamId
    first_seq: int
    last_seq: int
    rows: int
    sha256: str
    size: int

    @property
    def member(self) -> str:
        return (stream_dir(Path(), self.stream)
                / part_name(self.first_seq, self.last_seq, PACKED_SEGMENT)).as_posix()


@dataclass(frozen=True)
class AttemptEntry:
    project: str
    run: str
    rank: int
    attempt: int
    sha256: str
    size: int

    @property
    def key(self) -> str:
        return f"{self.project}/{self.run}/{self.rank}/{self.attempt}"

    @property
    def member(self) -> str:
        return attempt_file(Path(), self.project, self.run, self.rank, self.attempt).as_posix()


@dataclass(frozen=True)
class BlobEntry:
    sha256: str
    size: int

    @property
    def member(self) -> str:
        return blob_path(Path(), self.sha256).as_posix()


@dataclass
class Covered:
    """What a pack and the packs it was made `since` hold together: the last seq per
    stream, the sha256 of each attempt file, and the blob digests."""

    streams: dict[str, int] = field(default_factory=dict)
    attempts: dict[str, str] = field(default_factory=dict)
    blobs: set[str] = field(default_factory=set)


@dataclass
class Manifest:
    format: str
    created_at: str
    source: dict[str, Any]
    since: dict[str, Any] | None
    streams: list[StreamEntry]
    attempts: list[AttemptEntry]
    blobs: list[BlobEntry]
    covered: Covered

    def members(self) -> dict[str, tuple[str, int]]:
        """Member name -> (sha256, size) for every member after the manifest."""
        entries: list[StreamEntry | AttemptEntry | BlobEntry] = [
            *self.streams, *self.attempts, *self.blobs]
        return {e.member: (e.sha256, e.size) for e in entries}

    def to_json(self) -> bytes:
        doc = {
            "format": self.format, "kind": "tracklake-pack", "store_format": FORMAT_VERSION,
            "created_at": self.created_at, "source": self.source, "since": self.since,
            "streams": [{"project": e.stream.project, "run": e.stream.run,
                         "rank": e.stream.rank, "attempt": e.stream.attempt,
                         "kind": e.stream.kind, "first_seq": e.first_seq,
                         "last_seq": e.last_seq, "rows": e.rows, "member": e.member,
                         "sha256": e.sha256, "size": e.size} for e in self.streams],
            "attempts": [{"project": e.project, "run": e.run, "rank": e.rank,
                          "attempt": e.attempt, "member": e.member, "sha256": e.sha256,
                          "size": e.size} for e in self.attempts],
            "blobs": [{"sha256": e.sha256, "member": e.member, "size": e.size}
                      for e in self.blobs],
            "covered": {"streams": self.covered.streams, "attempts": self.covered.attempts,
                        "blobs": sorted(self.covered.blobs)},
        }
        return json.dumps(doc, indent=1, sort_keys=True).encode()


def _check_pack_version(version: object, where: object) -> str:
    if not isinstance(version, str) or not re.fullmatch(r"\d+\.\d+", version):
        raise FormatError(f"{where}: missing or malformed pack format version {version!r}")
    if int(version.split(".")[0]) > PACK_FORMAT_MAJOR:
        raise NewerFormatError(
            f"{where}: a pack in format {version}, this tracklake reads "
            f"{PACK_FORMAT_MAJOR}.x; upgrade tracklake to unpack it")
    return version


def _name(value: object, what: str) -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value) or set(value) == {"."}:
        raise ValueError(f"unsafe {what} name {value!r}")
    return value


def _count(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 10**12:
        raise ValueError(f"{what} must be a non-negative integer, not {value!r}")
    return value


def _digest(value: object) -> str:
    if not isinstance(value, str) or not _HEX.fullmatch(value):
        raise ValueError(f"{value!r} is not a sha256 hex digest")
    return value


def parse_manifest(data: bytes, where: object) -> Manifest:
    """The manifest in `data`, every field checked; FormatError naming `where` if not."""
    try:
        doc = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FormatError(f"{where}: {MANIFEST} is not valid JSON ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("kind") != "tracklake-pack":
        raise FormatError(f"{where}: {MANIFEST} is not a tracklake pack manifest")
    version = _check_pack_version(doc.get("format"), where)
    check_version(doc.get("store_format"), where)
    try:
        streams = []
        for e in doc["streams"]:
            kind = e["kind"]
            if kind not in KINDS:
                raise ValueError(f"unknown record kind {kind!r}")
            s = StreamId(_name(e["project"], "project"), _name(e["run"], "run"),
                         _count(e["rank"], "rank"), _count(e["attempt"], "attempt"), kind)
            entry = StreamEntry(s, _count(e["first_seq"], "first_seq"),
                                _count(e["last_seq"], "last_seq"), _count(e["rows"], "rows"),
                                _digest(e["sha256"]), _count(e["size"], "size"))
            if entry.first_seq > entry.last_seq or entry.member != e["member"]:
                raise ValueError(f"stream entry {e['member']!r} is inconsistent")
            streams.append(entry)
        attempts = []
        for e in doc["attempts"]:
            a = AttemptEntry(_name(e["project"], "project"), _name(e["run"], "run"),
                             _count(e["rank"], "rank"), _count(e["attempt"], "attempt"),
                             _digest(e["sha256"]), _count(e["size"], "size"))
            if a.member != e["member"]:
                raise ValueError(f"attempt entry {e['member']!r} is inconsistent")
            attempts.append(a)
        blobs = []
        for e in doc["blobs"]:
            b = BlobEntry(_digest(e["sha256"]), _count(e["size"], "size"))
            if b.member != e["member"]:
                raise ValueError(f"blob entry {e['member']!r} is inconsistent")
            blobs.append(b)
        cov = doc["covered"]
        covered = Covered(
            {str(k): _count(v, "seq") for k, v in cov["streams"].items()},
            {str(k): _digest(v) for k, v in cov["attempts"].items()},
            {_digest(d) for d in cov["blobs"]})
        source, since, created = doc["source"], doc["since"], str(doc["created_at"])
        if not isinstance(source, dict) or not (since is None or isinstance(since, dict)):
            raise ValueError("source/since are malformed")
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise FormatError(f"{where}: {MANIFEST} is malformed: {exc}") from exc
    manifest = Manifest(version, created, source, since, streams, attempts, blobs, covered)
    entries: list[StreamEntry | AttemptEntry | BlobEntry] = [*streams, *attempts, *blobs]
    names = [e.member for e in entries]
    if len(set(names)) != len(names):
        raise FormatError(f"{where}: {MANIFEST} lists a member twice")
    return manifest


def _stream_key(s: StreamId) -> str:
    return f"{s.kind}/{s.project}/{s.run}/{s.rank}/{s.attempt}"


# -- reading an archive -----------------------------------------------------------------


def _read_member(tar: tarfile.TarFile, info: tarfile.TarInfo) -> IO[bytes]:
    f = tar.extractfile(info)
    if f is None:
        raise FormatError(f"pack member {info.name!r} is not a regular file")
    return f


def _check_info(path: Path, info: tarfile.TarInfo | None, expected: str) -> tarfile.TarInfo:
    if info is None:
        raise FormatError(f"{path}: ends before its {expected} (truncated?)")
    if info.name != expected:
        raise FormatError(f"{path}: member {info.name!r} where {expected!r} was expected")
    if not info.isreg():
        raise FormatError(f"{path}: member {info.name!r} is not a regular file "
                          "(links and devices are refused)")
    return info


def _hash_member(tar: tarfile.TarFile, info: tarfile.TarInfo) -> str:
    h = hashlib.sha256()
    with _read_member(tar, info) as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def _open_pack(path: Path) -> Iterator[tarfile.TarFile]:
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
    data = _read_member(tar, info).read()
    sum_info = _check_info(path, tar.next(), MANIFEST_SUM)
    stated = _read_member(tar, sum_info).read(128).decode("ascii", "replace").strip()
    if hashlib.sha256(data).hexdigest() != stated:
        raise FormatError(f"{path}: {MANIFEST} does not match its checksum (damaged)")
    return parse_manifest(data, path)


def read_manifest(path: str | os.PathLike[str]) -> Manifest:
    """The manifest of the pack at `path` (only the manifest is checked)."""
    pack_path = Path(path)
    with _open_pack(pack_path) as tar:
        return _verified_manifest(pack_path, tar)


def verify(path: str | os.PathLike[str]) -> Manifest:
    """Check a whole pack: format version, member names and types, every sha256 and
    size, nothing missing and nothing extra. Raises FormatError naming what is wrong."""
    pack_path = Path(path)
    with _open_pack(pack_path) as tar:
        return _verify_open(pack_path, tar)


def _verify_open(path: Path, tar: tarfile.TarFile) -> Manifest:
    manifest = _verified_manifest(path, tar)
    expected = manifest.members()
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


# -- pack -------------------------------------------------------------------------------


@dataclass
class PackReport:
    """What `pack()` wrote."""

    output: Path
    runs: int = 0
    streams: int = 0
    records: int = 0
    attempts: int = 0
    blobs: int = 0
    size_bytes: int = 0
    missing_blobs: list[str] = field(default_factory=list)  # referenced, not in the store
    problems: ReadProblems = field(default_factory=ReadProblems)

    def __str__(self) -> str:
        text = (f"packed {self.runs} run(s) into {self.output}: {self.records} records in "
                f"{self.streams} stream(s), {self.attempts} attempt file(s), "
                f"{self.blobs} blob(s), {self.size_bytes} bytes")
        if self.missing_blobs:
            text += f"; {len(self.missing_blobs)} referenced blob(s) missing or damaged"
        if self.problems.torn or self.problems.damaged:
            text += (f"; {len(self.problems.torn)} torn and {len(self.problems.damaged)} "
                     "damaged segment(s) read up to their last good batch")
        return text


def _sha256_file(path: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


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


def pack(*, root: str | os.PathLike[str] | None = None, project: str | None = None,
         runs: Sequence[str] = (), all_runs: bool = False, output: str | os.PathLike[str],
         since: str | os.PathLike[str] | None = None) -> PackReport:
    """Write the selected runs (a project, run ids, or all) to one tar file at `output`.

    With `since` (an earlier pack), only what that pack and its own predecessors did not
    hold goes in: records after their last seq per stream, changed attempt files, new
    blobs. The source store is only read.
    """
    if not (project or runs or all_runs):
        raise ValueError("choose runs to pack: project=..., runs=[...] or all_runs=True")
    root_path = resolve_root(root)
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
    report = PackReport(out, runs=len(selected))
    created = _dt.datetime.now(_dt.timezone.utc)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".tracklake-pack-") as stage:
        streams: list[tuple[StreamEntry, Path]] = []
        attempts: list[tuple[AttemptEntry, bytes]] = []
        digests: set[str] = set()
        for record in selected:
            for a in record.attempts:
                path = attempt_file(root_path, record.project, record.run, a["rank"],
                                    a["attempt"])
                data = path.read_bytes()
                entry = AttemptEntry(record.project, record.run, a["rank"], a["attempt"],
                                     hashlib.sha256(data).hexdigest(), len(data))
                if covered.attempts.get(entry.key) != entry.sha256 and data:
                    attempts.append((entry, data))
                    covered.attempts[entry.key] = entry.sha256
            for s in list_streams(root_path, record.project, record.run):
                key = _stream_key(s)
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
                if s.kind == "artifacts":
                    digests.update(d for d in table.column("digest").to_pylist() if d)
        blobs: list[BlobEntry] = []
        for digest in sorted(digests - covered.blobs):
            path = blob_path(root_path, digest)
            if not path.is_file() or _sha256_file(path)[0] != digest:
                report.missing_blobs.append(digest)
                continue
            blobs.append(BlobEntry(digest, path.stat().st_size))
            covered.blobs.add(digest)
        since_doc = None
        if base is not None and since is not None:
            since_doc = {"created_at": base.created_at, "path": Path(since).name}
        manifest = Manifest(
            PACK_FORMAT_VERSION, created.isoformat(timespec="microseconds"),
            {"root": str(root_path), "host": platform.node(),
             "selection": {"project": project, "runs": list(runs), "all": all_runs}},
            since_doc, [e for e, _ in streams], [e for e, _ in attempts], blobs, covered)
        _write_archive(out, manifest, streams, attempts, root_path, created.timestamp())
    report.streams, report.attempts, report.blobs = len(streams), len(attempts), len(blobs)
    report.size_bytes = out.stat().st_size
    return report


def _write_archive(out: Path, manifest: Manifest, streams: list[tuple[StreamEntry, Path]],
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
                    with open(blob_path(root, b.sha256), "rb") as src:
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


# -- unpack -----------------------------------------------------------------------------


@dataclass
class UnpackReport:
    """What `unpack()` added to the store; `new` is 0 when it held everything already."""

    parts_written: list[Path] = field(default_factory=list)
    records: int = 0
    streams_skipped: int = 0
    attempts_written: int = 0
    attempts_skipped: int = 0
    blobs_written: int = 0
    blobs_skipped: int = 0

    @property
    def new(self) -> int:
        return len(self.parts_written) + self.attempts_written + self.blobs_written

    def __str__(self) -> str:
        return (f"unpacked {self.records} new records in {len(self.parts_written)} part(s) "
                f"({self.streams_skipped} stream(s) already present), "
                f"{self.attempts_written} attempt file(s) ({self.attempts_skipped} kept), "
                f"{self.blobs_written} blob(s) ({self.blobs_skipped} already present)")


@dataclass
class _StreamPlan:
    entry: StreamEntry
    ranges: list[tuple[int, int]]  # seq ranges of the new records, one part each
    last_segment: int


def _load_part(path: Path, tar: tarfile.TarFile, entry: StreamEntry) -> pa.Table:
    """The records of a packed part, checked against the manifest."""
    where = f"{path}: member {entry.member!r}"
    try:
        with _read_member(tar, tar.getmember(entry.member)) as f:
            table = pq.read_table(f)
    except (pa.ArrowException, OSError) as exc:
        raise FormatError(f"{where} is not a readable Parquet part ({exc})") from exc
    meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
    check_version(meta.get("tracklake.format"), where)
    s = entry.stream
    if (meta.get("tracklake.kind"), meta.get("tracklake.project"), meta.get("tracklake.run"),
            meta.get("tracklake.rank"), meta.get("tracklake.attempt")) != (
            s.kind, s.project, s.run, str(s.rank), str(s.attempt)):
        raise FormatError(f"{where}: its metadata names another stream")
    table = table.replace_schema_metadata(None)
    if not table.schema.equals(SCHEMAS[s.kind]):
        raise FormatError(f"{where}: its columns are not those of {s.kind} records")
    seqs = table.column("seq")
    if (table.num_rows != entry.rows or seqs.null_count
            or (pc.min(seqs).as_py(), pc.max(seqs).as_py()) != (entry.first_seq,
                                                                entry.last_seq)):
        raise FormatError(f"{where}: its rows or seq range differ from the manifest")
    return table


def _canonical(table: pa.Table) -> pa.Table:
    keys = [(n, "ascending") for n, t in zip(table.column_names, table.schema.types,
                                             strict=True)
            if not pa.types.is_list(t)]
    return table.take(pc.sort_indices(table, sort_keys=keys))


def _same_rows(a: pa.Table, b: pa.Table) -> bool:
    """Equal record sets (row order inside a seq group aside; NaN equals NaN)."""
    if a.num_rows != b.num_rows:
        return False
    a, b = _canonical(a), _canonical(b)
    for name in a.column_names:
        x, y = a.column(name).combine_chunks(), b.column(name).combine_chunks()
        if x.equals(y):
            continue
        if not pa.types.is_floating(x.type):
            return False
        same = pc.fill_null(pc.or_kleene(pc.equal(x, y),
                                          pc.and_kleene(pc.is_nan(x), pc.is_nan(y))), False)
        same = pc.or_(same, pc.and_(pc.is_null(x), pc.is_null(y)))
        if not pc.all(same).as_py():
            return False
    return True


def _existing(root: Path, s: StreamId, first: int, last: int) -> pa.Table:
    """The target's records of stream `s` with seq in first..last."""
    batches = []
    for batch in read_stream(root, s, first - 1):
        if batch.column(0)[0].as_py() > last:
            break
        batches.append(batch.filter(pc.less_equal(batch.column(0), last)))
    return pa.Table.from_batches(batches, schema=SCHEMAS[s.kind])


def _plan_stream(root: Path, path: Path, tar: tarfile.TarFile,
                 entry: StreamEntry) -> _StreamPlan:
    s = entry.stream
    incoming = _load_part(path, tar, entry)
    have = _existing(root, s, entry.first_seq, entry.last_seq)
    have_seqs = pc.unique(have.column("seq"))
    common_in = pc.is_in(incoming.column("seq"), value_set=have_seqs)
    common_have = pc.is_in(have.column("seq"), value_set=pc.unique(incoming.column("seq")))
    if not _same_rows(incoming.filter(common_in), have.filter(common_have)):
        raise PackConflictError(
            f"{path}: stream {_stream_key(s)} holds records with seq in "
            f"{entry.first_seq}..{entry.last_seq} that differ from those in {root}; "
            "refusing to overwrite them (were the same run id and attempt used on both "
            "machines?)")
    new = np.unique(incoming.filter(pc.invert(common_in)).column("seq").to_numpy())
    files = list_stream(root, s)
    covered_segment = max((p.last_segment for p in files.parts), default=PACKED_SEGMENT)
    if len(new) == 0:
        return _StreamPlan(entry, [], covered_segment)
    if files.segments:
        raise PackConflictError(
            f"{path}: stream {_stream_key(s)} is also being written in {root} (it has live "
            "segments); refusing to merge records into a stream another writer owns")
    firsts = np.array([p.first_seq for p in files.parts], dtype=np.int64)
    lasts = np.array([p.last_seq for p in files.parts], dtype=np.int64)
    slot = np.searchsorted(firsts, new, side="right")
    inside = (slot > 0) & (new <= lasts[np.maximum(slot - 1, 0)]) if len(firsts) else \
        np.zeros(len(new), dtype=bool)
    if inside.any():
        raise PackConflictError(
            f"{path}: stream {_stream_key(s)} has seq {int(new[inside][0])}, which falls "
            f"inside a part of {root} that does not hold it; refusing to merge")
    ranges = [(int(new[slot == g].min()), int(new[slot == g].max())) for g in np.unique(slot)]
    return _StreamPlan(entry, ranges, covered_segment)


def _plan_attempt(root: Path, path: Path, tar: tarfile.TarFile,
                  entry: AttemptEntry) -> bytes | None:
    """The attempt file's bytes if they should be written, None to keep the target's."""
    where = f"{path}: member {entry.member!r}"
    data = _read_member(tar, tar.getmember(entry.member)).read()
    incoming = _attempt_record(data, where)
    if (incoming.get("project"), incoming.get("run"), incoming.get("rank"),
            incoming.get("attempt")) != (entry.project, entry.run, entry.rank, entry.attempt):
        raise FormatError(f"{where}: its record names another attempt")
    target = attempt_file(root, entry.project, entry.run, entry.rank, entry.attempt)
    try:
        present = target.read_bytes()
    except FileNotFoundError:
        return data
    if present == data:
        return None
    mine = _attempt_record(present, target) if present else {}
    if mine.get("started_at") != incoming.get("started_at"):
        raise PackConflictError(
            f"{path}: run {entry.project}/{entry.run} rank {entry.rank} attempt "
            f"{entry.attempt} exists in {root} as a different attempt (started "
            f"{mine.get('started_at')}, the pack's {incoming.get('started_at')}); the same "
            "run id was used on both machines")
    newer = str(incoming.get("heartbeat_at") or "") > str(mine.get("heartbeat_at") or "")
    return data if newer else None


def _attempt_record(data: bytes, where: object) -> dict[str, Any]:
    try:
        record = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FormatError(f"{where}: not a valid attempt record ({exc})") from exc
    if not isinstance(record, dict):
        raise FormatError(f"{where}: not a valid attempt record")
    check_version(record.get("format"), where)
    return record


def _inside(root: Path, target: Path) -> Path:
    """`target`, after checking it lies below `root` (names were validated already)."""
    if not target.absolute().is_relative_to(root) or ".." in target.parts:
        raise FormatError(f"refusing to write {target}: outside the store {root}")
    return target


def _copy_blob(root: Path, path: Path, tar: tarfile.TarFile, entry: BlobEntry) -> None:
    final = _inside(root, blob_path(root, entry.sha256))
    tmp_dir = root / "blobs" / "tmp"
    tmp_dir.mkdir(parents=True, exist_ok=True)
    tmp = tmp_dir / f"unpack-{os.getpid()}-{entry.sha256}"
    h = hashlib.sha256()
    try:
        with _read_member(tar, tar.getmember(entry.member)) as src, open(tmp, "wb") as out:
            while chunk := src.read(_CHUNK):
                h.update(chunk)
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        if h.hexdigest() != entry.sha256:
            raise FormatError(f"{path}: blob {entry.sha256} changed while unpacking")
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, final)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    fsync_dir(final.parent)


def unpack(path: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None
           ) -> UnpackReport:
    """Verify the pack at `path`, then merge it into the store at `root`.

    Nothing is written unless the whole pack checks out and merges without conflict:
    records already present (same seqs, same content) are skipped, records that differ
    raise PackConflictError naming the stream. Unpacking the same pack twice adds nothing.
    """
    pack_path = Path(path)
    root_path = resolve_root(root)
    report = UnpackReport()
    with _open_pack(pack_path) as tar:
        manifest = _verify_open(pack_path, tar)
        plans = [_plan_stream(root_path, pack_path, tar, e) for e in manifest.streams]
        attempts = [(e, _plan_attempt(root_path, pack_path, tar, e))
                    for e in manifest.attempts]
        blobs = [e for e in manifest.blobs if not blob_path(root_path, e.sha256).exists()]
        report.blobs_skipped = len(manifest.blobs) - len(blobs)
        # write: blobs first, so no artifact record points at a missing blob; the attempt
        # files last, so a run shows up once its records are in place
        for b in blobs:
            _copy_blob(root_path, pack_path, tar, b)
            report.blobs_written += 1
        for plan in plans:
            if not plan.ranges:
                report.streams_skipped += 1
                continue
            table = _load_part(pack_path, tar, plan.entry)
            seqs = table.column("seq")
            directory = _inside(root_path, stream_dir(root_path, plan.entry.stream))
            directory.mkdir(parents=True, exist_ok=True)
            for lo, hi in plan.ranges:
                chunk = table.filter(pc.and_(pc.greater_equal(seqs, lo),
                                             pc.less_equal(seqs, hi)))
                chunk = chunk.take(pc.sort_indices(chunk, sort_keys=[("seq", "ascending")]))
                report.parts_written.append(write_part(directory, plan.entry.stream, chunk,
                                                       plan.last_segment))
                report.records += chunk.num_rows
        for a, data in attempts:
            if data is None:
                report.attempts_skipped += 1
                continue
            write_atomic(_inside(root_path, attempt_file(root_path, a.project, a.run, a.rank,
                                                         a.attempt)), data)
            report.attempts_written += 1
    return report
