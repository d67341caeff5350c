"""The manifest of a pack: what it holds (one entry per member, with its sha256 and
size), what it and its predecessors cover, and its strict parsing (the archive layout is
described in `_pack_archive`)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracklake._errors import FormatError, NewerFormatError
from tracklake._format import (
    FORMAT_VERSION,
    KINDS,
    StreamId,
    attempt_file,
    blob_path,
    bounded_json,
    check_version,
    checks,
    part_name,
    stream_dir,
)
from tracklake._format.checks import MAX_INT32, MAX_INT64, is_digest

PACK_FORMAT_VERSION = "1.0"
PACK_FORMAT_MAJOR = 1
MANIFEST = "manifest.json"
MANIFEST_SUM = "manifest.json.sha256"
#: The last-segment number of every part inside a pack (unpack chooses its own).
PACKED_SEGMENT = 0
CHUNK = 1 << 20
_NAME = re.compile(r"[A-Za-z0-9._+@-]{1,128}")


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


def _count(value: object, what: str, high: int = MAX_INT64, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{what} must be an integer in {low}..{high}, not {value!r}")
    return value


def _rank(value: object) -> int:
    return _count(value, "rank", MAX_INT32)  # an int32 partition value in every query


def _attempt(value: object) -> int:
    return _count(value, "attempt", MAX_INT32, low=1)


_STREAM_KEY = re.compile(r"([a-z]+)/([^/]+)/([^/]+)/(\d+)/(\d+)")
_ATTEMPT_KEY = re.compile(r"([^/]+)/([^/]+)/(\d+)/(\d+)")


def _covered_key(key: str, form: re.Pattern[str]) -> str:
    """A key of `covered` (``kind/project/run/rank/attempt`` or ``project/run/rank/
    attempt``), its parts checked like the entries'."""
    m = form.fullmatch(key)
    if m is None:
        raise ValueError(f"covered key {key!r} is malformed")
    *names, rank, attempt = m.groups()
    if form is _STREAM_KEY and names[0] not in KINDS:
        raise ValueError(f"covered key {key!r} names an unknown record kind")
    for n in names[-2:]:
        _name(n, "covered")
    _rank(int(rank))
    _attempt(int(attempt))
    return key


def _digest(value: object) -> str:
    if not is_digest(value):
        raise ValueError(f"{value!r} is not a sha256 hex digest")
    return value


def parse_manifest(data: bytes, where: object) -> Manifest:
    """The manifest in `data`, every field checked; FormatError naming `where` if not."""
    try:
        doc = bounded_json.loads(data)
    except (ValueError, RecursionError) as exc:  # JSON, UTF-8, nesting too deep
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
                raise ValueError(
                    f"unknown record kind {kind!r} (the pack holds a store of format "
                    f"{doc.get('store_format')}, this tracklake writes {FORMAT_VERSION}: "
                    "upgrade tracklake to unpack it)")
            s = StreamId(_name(e["project"], "project"), _name(e["run"], "run"),
                         _rank(e["rank"]), _attempt(e["attempt"]), kind)
            entry = StreamEntry(s, _count(e["first_seq"], "first_seq"),
                                _count(e["last_seq"], "last_seq"), _count(e["rows"], "rows"),
                                _digest(e["sha256"]), _count(e["size"], "size"))
            if entry.first_seq > entry.last_seq or entry.member != e["member"]:
                raise ValueError(f"stream entry {e['member']!r} is inconsistent")
            streams.append(entry)
        attempts = []
        for e in doc["attempts"]:
            a = AttemptEntry(_name(e["project"], "project"), _name(e["run"], "run"),
                             _rank(e["rank"]), _attempt(e["attempt"]),
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
            {_covered_key(k, _STREAM_KEY): _count(v, "seq") for k, v in cov["streams"].items()},
            {_covered_key(k, _ATTEMPT_KEY): _digest(v) for k, v in cov["attempts"].items()},
            {_digest(d) for d in cov["blobs"]})
        source, since = doc["source"], doc["since"]
        created = checks.timestamp(doc["created_at"], "created_at")
        checks.mapping(source, "source")
        checks.optional(checks.text)(source.get("host"), "source.host")
        checks.optional(checks.text)(source.get("root"), "source.root")
        if since is not None:
            checks.mapping(since, "since")
            checks.optional(checks.timestamp)(since.get("created_at"), "since.created_at")
            checks.optional(checks.text)(since.get("path"), "since.path")
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise FormatError(f"{where}: {MANIFEST} is malformed: {exc}") from exc
    manifest = Manifest(version, created, source, since, streams, attempts, blobs, covered)
    entries: list[StreamEntry | AttemptEntry | BlobEntry] = [*streams, *attempts, *blobs]
    names = [e.member for e in entries]
    if len(set(names)) != len(names):
        raise FormatError(f"{where}: {MANIFEST} lists a member twice")
    return manifest


def stream_key(s: StreamId) -> str:
    return f"{s.kind}/{s.project}/{s.run}/{s.rank}/{s.attempt}"
