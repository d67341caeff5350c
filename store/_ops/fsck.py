"""`fsck`: find damage in a store, say what it costs, and repair what can be repaired.

Checks every segment (batch checksums, a torn tail behind a writer that is gone, a header
that does not match its stream), every Parquet part (read in full with page checksum
verification, schema and metadata against the stream, row groups' statistics and the
metric summary against the values), every blob's digest, every attempt file and every
exporter state. Repair never deletes: a damaged file is moved to ``ROOT/quarantine/``
under its relative path, and the readable batches of a damaged or torn segment are
written back as a sealed segment of the same name.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tracklake._errors import FormatError
from tracklake._format import SCHEMAS, StreamId, check_version, fsync_dir, fsync_file
from tracklake._format.attempt import CRASHED_AFTER_SECONDS, STATUSES, read_attempt
from tracklake._format.part import open_part
from tracklake._format.segment import SegmentWriter, read_segment, stream_schema
from tracklake._ops.compact import STALE_AFTER_SECONDS, SUMMARY_SQL
from tracklake._read.reader import list_stream, list_streams

_ATTEMPT_KEYS = {"project": str, "run": str, "rank": int, "attempt": int, "status": str}


@dataclass
class Problem:
    path: Path
    what: str  # what is wrong
    lost: str  # what a reader does not get because of it
    todo: str  # what to do
    repairable: bool = True
    repaired: str | None = None  # what --repair did

    def line(self, root: Path) -> str:
        rel = self.path.relative_to(root) if self.path.is_relative_to(root) else self.path
        done = f" -> repaired: {self.repaired}" if self.repaired else ""
        return f"{rel}: {self.what}; lost: {self.lost}; {self.todo}{done}"


@dataclass
class FsckReport:
    problems: list[Problem] = field(default_factory=list)
    checked: dict[str, int] = field(default_factory=dict)  # kind of file -> count
    bytes: int = 0

    @property
    def clean(self) -> bool:
        return not self.problems

    def count(self, what: str, path: Path) -> None:
        self.checked[what] = self.checked.get(what, 0) + 1
        self.bytes += path.stat().st_size


def _writer_gone(root: Path, s: StreamId, now: float) -> bool:
    """True if no writer will append to this stream again (as compaction judges)."""
    rank_dir = root / "runs" / f"project={s.project}" / f"run={s.run}" / f"rank={s.rank}"
    if any(int(p.stem.split("=")[1]) > s.attempt for p in rank_dir.glob("attempt=*.json")
           if p.stem.split("=")[1].isdigit()):
        return True
    try:
        record = read_attempt(rank_dir / f"attempt={s.attempt}.json")
    except (FileNotFoundError, FormatError):
        return True  # no writer can be heard from
    if record is None:
        return False
    if record.get("status") != "running":
        return True
    beat = record.get("heartbeat_at")
    return not isinstance(beat, str) or (
        now - _dt.datetime.fromisoformat(beat).timestamp() > STALE_AFTER_SECONDS)


def _expected_meta(s: StreamId) -> dict[str, str]:
    return {"tracklake.kind": s.kind, "tracklake.project": s.project,
            "tracklake.run": s.run, "tracklake.rank": str(s.rank),
            "tracklake.attempt": str(s.attempt)}


def _meta_mismatch(meta: dict[str, str], s: StreamId) -> str | None:
    for key, value in _expected_meta(s).items():
        if meta.get(key) != value:
            return f"metadata {key} is {meta.get(key)!r}, the path says {value!r}"
    return None


def _check_segment(root: Path, s: StreamId, path: Path, last: bool, now: float,
                   report: FsckReport) -> None:
    report.count("segments", path)
    try:
        contents = read_segment(path)
    except FormatError as exc:
        report.problems.append(Problem(path, f"unreadable segment ({exc})",
                                       "every record of the file", "quarantine it (--repair)"))
        return
    batches = contents.batches
    rows = sum(b.num_rows for b in batches)
    if not contents.schema_metadata:
        if not last or _writer_gone(root, s, now):
            report.problems.append(Problem(
                path, "no complete header (the file was cut short or emptied)",
                "every record of the file", "quarantine it (--repair)"))
        return
    header = None
    if contents.schema_metadata or batches:
        header = _meta_mismatch(contents.schema_metadata, s)
        if header is None and batches and not batches[0].schema.remove_metadata().equals(
                SCHEMAS[s.kind]):
            header = f"schema is not the {s.kind} schema"
    if header is not None:
        report.problems.append(Problem(path, f"damaged header: {header}",
                                       f"every record of the file ({rows} rows)",
                                       "quarantine it (--repair)"))
        return
    if contents.damaged:
        report.problems.append(Problem(
            path, contents.damaged, f"{contents.torn_bytes} bytes after batch "
            f"{len(batches)} (seq > {_last_seq(batches)})",
            "salvage the readable batches (--repair)"))
    elif contents.torn_bytes and (not last or _writer_gone(root, s, now)):
        report.problems.append(Problem(
            path, f"torn tail of {contents.torn_bytes} bytes (its writer died mid-batch)",
            "the batch being written when it died",
            "seal the readable batches (--repair)"))


def _last_seq(batches: list[pa.RecordBatch]) -> int:
    return int(batches[-1].column(0)[-1].as_py()) if batches else -1


def _check_part(s: StreamId, path: Path, first: int, last: int, report: FsckReport,
                summaries: _Summaries) -> None:
    report.count("parts", path)
    lost = f"records seq {first}..{last}"
    try:
        f = open_part(path)  # the footer's checksum, and pages verified as read
        table = f.read()
        meta = {k.decode(): v.decode() for k, v in (f.schema_arrow.metadata or {}).items()}
        check_version(meta.get("tracklake.format"), path)
        why = _meta_mismatch(meta, s) or _part_contents(s, f, table, meta, first, last,
                                                        summaries)
    except (OSError, pa.ArrowException, ValueError, KeyError, TypeError, FormatError,
            UnicodeDecodeError) as exc:
        why = f"unreadable Parquet ({type(exc).__name__}: {exc})"
    if why is not None:
        report.problems.append(Problem(path, f"damaged part: {why}", lost,
                                       "quarantine it (--repair); restore it from a backup"))


def _part_contents(s: StreamId, f: pq.ParquetFile, table: pa.Table, meta: dict[str, str],
                   first: int, last: int, summaries: _Summaries) -> str | None:
    """Why the values read do not agree with the part's own name, statistics or summary."""
    if not table.schema.remove_metadata().equals(SCHEMAS[s.kind]):
        return f"schema is not the {s.kind} schema"
    if table.num_rows != f.metadata.num_rows:
        return f"{table.num_rows} rows read, the footer says {f.metadata.num_rows}"
    if table.num_rows:
        seq = table.column("seq")
        low, high = pc.min(seq).as_py(), pc.max(seq).as_py()
        if low < first or high > last:
            return f"seq {low}..{high} outside the name's range {first}..{last}"
    for i in range(f.metadata.num_row_groups):
        rg = f.metadata.row_group(i)
        group = f.read_row_group(i)
        if group.num_rows != rg.num_rows:
            return f"row group {i} has {group.num_rows} rows, its header says {rg.num_rows}"
        for j in range(rg.num_columns):
            col = rg.column(j)
            stats = col.statistics
            name = col.path_in_schema
            if stats is None or not stats.has_min_max or name not in group.column_names:
                continue
            values = group.column(name)
            if pa.types.is_floating(values.type):
                values = pc.filter(values, pc.invert(pc.is_nan(values)))
            mm = pc.min_max(values)
            if _differs(mm["min"].as_py(), stats.min) or _differs(mm["max"].as_py(), stats.max):
                return f"row group {i} column {name}: statistics do not match the values"
    if s.kind == "metrics" and "tracklake.summary" in meta:
        return _summary_mismatch(table, json.loads(meta["tracklake.summary"]), summaries)
    return None


def _differs(actual: Any, recorded: Any) -> bool:
    if actual is None:
        return False
    if isinstance(actual, _dt.datetime) and isinstance(recorded, _dt.datetime):
        return actual.replace(tzinfo=None) != recorded.replace(tzinfo=None)
    if isinstance(actual, float) and isinstance(recorded, float):
        return not (actual == recorded or (math.isnan(actual) and math.isnan(recorded)))
    return bool(actual != recorded)


class _Summaries:
    """Metric summaries computed as compaction computes them, on one DuckDB connection for
    the whole check (a connection per part cost most of fsck's time)."""

    def __init__(self) -> None:
        self._con: Any = None

    def __call__(self, table: pa.Table) -> list[dict[str, Any]]:
        if self._con is None:
            import duckdb

            self._con = duckdb.connect()
        self._con.register("batch", table)
        try:
            rows = self._con.execute(SUMMARY_SQL).fetchall()
            names = [d[0] for d in self._con.description]
        finally:
            self._con.unregister("batch")
        return [dict(zip(names, r, strict=True)) for r in rows]

    def close(self) -> None:
        if self._con is not None:
            self._con.close()


def _summary_mismatch(table: pa.Table, summary: list[dict[str, Any]],
                      summaries: _Summaries) -> str | None:
    actual = {r["key"]: r for r in summaries(table)}
    recorded = {r["key"]: r for r in summary}
    if set(actual) != set(recorded):
        return "the metric summary names other keys than the values"
    for key, row in recorded.items():
        for field_ in ("count", "min", "max", "first_step", "last_step", "last_seq"):
            if _differs(actual[key][field_], row[field_]):
                return f"the metric summary's {field_} of {key!r} does not match the values"
    return None


def _check_blobs(root: Path, report: FsckReport) -> None:
    base = root / "blobs" / "sha256"
    if not base.is_dir():
        return
    for path in sorted(base.glob("*/*")):
        report.count("blobs", path)
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        if digest.hexdigest() != path.name or path.parent.name != path.name[:2]:
            report.problems.append(Problem(path, "blob content does not match its digest",
                                           "the artifact's bytes",
                                           "quarantine it (--repair); log the artifact again"))


def _check_attempts(root: Path, report: FsckReport) -> None:
    for path in sorted((root / "runs").glob("project=*/run=*/rank=*/attempt=*.json")):
        report.count("attempt files", path)
        parts = dict(p.split("=", 1) for p in path.relative_to(root / "runs").with_suffix(
            "").parts)
        try:
            record = read_attempt(path)
        except FormatError as exc:
            why: str | None = str(exc)
        else:
            why = _empty_attempt(root, path, parts) if record is None else _attempt_mismatch(
                record, parts)
        if why is not None:
            report.problems.append(Problem(
                path, f"damaged attempt file: {why}", "the run's identity, status and "
                "config for this rank and attempt (its records stay)",
                "quarantine it (--repair); the run then lists without this attempt"))


def _empty_attempt(root: Path, path: Path, parts: dict[str, str]) -> str | None:
    """Why an empty attempt file is damage rather than one being created right now: a
    later attempt of its rank exists, it has records, or it stayed empty for minutes."""
    if any(int(p.stem.split("=")[1]) > int(parts["attempt"])
           for p in path.parent.glob("attempt=*.json") if p.stem.split("=")[1].isdigit()):
        return "empty, and a later attempt of its rank exists"
    s = StreamId(parts["project"], parts["run"], int(parts["rank"]), int(parts["attempt"]),
                 "metrics")
    if any(list_stream(root, StreamId(s.project, s.run, s.rank, s.attempt, k)).parts
           or list_stream(root, StreamId(s.project, s.run, s.rank, s.attempt, k)).segments
           for k in SCHEMAS):
        return "empty, yet its attempt has records"
    age = _dt.datetime.now(_dt.timezone.utc).timestamp() - path.stat().st_mtime
    if age > CRASHED_AFTER_SECONDS:
        return f"empty for {age:.0f} s"
    return None


def _attempt_mismatch(record: dict[str, Any], parts: dict[str, str]) -> str | None:
    for key, kind in _ATTEMPT_KEYS.items():
        if not isinstance(record.get(key), kind):
            return f"{key} is missing or not {kind.__name__}"
    for key in ("project", "run", "rank", "attempt"):
        if str(record[key]) != parts[key]:
            return f"{key} is {record[key]!r}, the path says {parts[key]!r}"
    if record["status"] not in STATUSES:
        return f"status {record['status']!r} is unknown"
    for key in ("started_at", "heartbeat_at", "finished_at"):
        value = record.get(key)
        if value is not None:
            try:
                _dt.datetime.fromisoformat(value)
            except (TypeError, ValueError):
                return f"{key} {value!r} is not a time"
    return None


def _check_exports(root: Path, report: FsckReport) -> None:
    for path in sorted((root / "exports").glob("*/project=*/run=*.json")):
        report.count("exporter states", path)
        try:
            data = json.loads(path.read_bytes())
            check_version(data.get("format"), path)
            positions = data["positions"]
            if not isinstance(positions, dict) or not all(
                    isinstance(v, int) for v in positions.values()):
                raise ValueError("positions must map streams to ints")
        except (ValueError, KeyError, TypeError, AttributeError, FormatError) as exc:
            report.problems.append(Problem(
                path, f"damaged exporter state ({exc})", "where this exporter stands in the "
                "run", "restore the file from a backup, or move it away to export the run "
                "again from the start (the destination may then get records twice)",
                repairable=False))


def _check_stream(root: Path, s: StreamId, now: float, report: FsckReport,
                  summaries: _Summaries) -> None:
    files = list_stream(root, s)
    for part in files.parts:
        _check_part(s, part.path, part.first_seq, part.last_seq, report, summaries)
    for i, seg in enumerate(files.segments):
        _check_segment(root, s, seg.path, i + 1 == len(files.segments), now, report)
    for path in files.foreign:
        report.problems.append(Problem(path, "a file that is not a segment or part",
                                       "nothing (readers ignore it)",
                                       "move it out of the store (--repair)"))


def fsck(root: Path, *, repair: bool = False) -> FsckReport:
    """Check the store at `root`; with `repair`, quarantine and salvage what is damaged."""
    report = FsckReport()
    now = _dt.datetime.now(_dt.timezone.utc).timestamp()
    summaries = _Summaries()
    try:
        for s in list_streams(root):
            _check_stream(root, s, now, report, summaries)
    finally:
        summaries.close()
    _check_blobs(root, report)
    _check_attempts(root, report)
    _check_exports(root, report)
    if repair:
        for problem in report.problems:
            if problem.repairable:
                problem.repaired = _repair(root, problem)
    return report


def _quarantine_path(root: Path, path: Path) -> Path:
    target = root / "quarantine" / path.relative_to(root)
    n = 1
    while target.exists():
        target = target.with_name(f"{path.name}.{n}")
        n += 1
    target.parent.mkdir(parents=True, exist_ok=True)
    return target


def _repair(root: Path, problem: Problem) -> str:
    path = problem.path
    salvage = path.suffix == ".arrows" and ("salvage" in problem.todo or "seal" in problem.todo)
    target = _quarantine_path(root, path)
    if not salvage:
        os.rename(path, target)
        fsync_dir(path.parent)
        return f"moved to {target.relative_to(root)}"
    contents = read_segment(path)
    shutil.copy2(path, target)  # the original stays readable until the salvage replaces it
    fsync_file(target)
    fsync_dir(target.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    if tmp.exists():
        tmp.unlink()  # left by a repair killed midway: its own temporary
    meta = contents.schema_metadata
    s = StreamId(meta["tracklake.project"], meta["tracklake.run"], int(meta["tracklake.rank"]),
                 int(meta["tracklake.attempt"]), meta["tracklake.kind"])
    writer = SegmentWriter(tmp, stream_schema(SCHEMAS[s.kind], s))
    try:
        for batch in contents.batches:
            writer.append(batch)
        writer.seal()
    finally:
        writer.close()
    os.replace(tmp, path)
    fsync_dir(path.parent)
    rows = sum(b.num_rows for b in contents.batches)
    return (f"kept {len(contents.batches)} readable batches ({rows} rows) in a sealed segment; "
            f"the original is in {target.relative_to(root)}")
