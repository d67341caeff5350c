"""fsck of compacted parts: read as readers read them, then checked against their name,
metadata, row groups' statistics and metric summary."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tracklake._errors import FormatError
from tracklake._format import SCHEMAS, StreamId, check_version
from tracklake._format.part import open_part, summary_rows
from tracklake._format.part_bounds import bounded_table
from tracklake._format.records import invalid_records
from tracklake._ops.compact import SUMMARY_SQL
from tracklake._ops.fsck.footer_stats import differs, stats_mismatch_isolated
from tracklake._ops.fsck.rebuild import lost_detail, salvageable
from tracklake._ops.fsck.report import FsckReport, Problem

#: What fsck says to do with a part whose records all read: only derived data is lost.
REBUILD = "rebuild its footer, statistics and summary from its records (--repair)"


def _expected_meta(s: StreamId) -> dict[str, str]:
    return {"tracklake.kind": s.kind, "tracklake.project": s.project,
            "tracklake.run": s.run, "tracklake.rank": str(s.rank),
            "tracklake.attempt": str(s.attempt)}


def meta_mismatch(meta: dict[str, str], s: StreamId) -> str | None:
    for key, value in _expected_meta(s).items():
        if meta.get(key) != value:
            return f"metadata {key} is {meta.get(key)!r}, the path says {value!r}"
    return None


def check_part(s: StreamId, path: Path, first: int, last: int, report: FsckReport,
                summaries: Summaries) -> None:
    if not report.count("parts", path):
        return  # merged or removed since it was listed
    try:
        f = open_part(path, encoded=True)  # the footer's checksum; pages verified as read
        table = bounded_table(f, path)
        meta = {k.decode(): v.decode() for k, v in (f.schema_arrow.metadata or {}).items()}
        check_version(meta.get("tracklake.format"), path)
        why = meta_mismatch(meta, s) or _part_contents(s, path, f, table, meta, first, last,
                                                        summaries)
    except FileNotFoundError:
        return  # merged or removed while it was read
    except (OSError, pa.ArrowException, ValueError, KeyError, TypeError, FormatError,
            UnicodeDecodeError) as exc:
        why = f"unreadable Parquet ({type(exc).__name__}: {exc})"
    if why is None:
        report_invalid(s, path, table, report)
        return
    if salvageable(s, path, first, last) is not None:
        report.problems.append(Problem(
            path, f"damaged part: {why}", f"nothing yet: every record of seq {first}..{last} "
            "reads with verified page checksums", REBUILD, stream=s))
    else:
        report.problems.append(Problem(path, f"damaged part: {why}",
                                       lost_detail(path, first, last),
                                       "quarantine it (--repair); restore it from a backup"))


def _part_contents(s: StreamId, path: Path, f: pq.ParquetFile, table: pa.Table,
                   meta: dict[str, str], first: int, last: int,
                   summaries: Summaries) -> str | None:
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
    why = stats_mismatch_isolated(path)
    if why is not None:
        return why
    if s.kind == "metrics" and "tracklake.summary" in meta:
        try:  # as readers take it: a list of objects of the summary's fields and types
            stored = summary_rows(f, path)
        except FormatError as exc:
            return str(exc).removeprefix(f"{path}: ")
        return _summary_mismatch(table, stored, summaries)
    return None


def report_invalid(s: StreamId, path: Path, records: pa.Table, report: FsckReport) -> None:
    """Report the records of a file that break their kind's rules (readers skip them)."""
    invalid = invalid_records(s.kind, records)
    if invalid is not None:
        bad, why = invalid
        report.problems.append(Problem(
            path, f"invalid records: {why}", f"{int(bad.sum())} record(s), which readers "
            "skip", "nothing to repair: they were never valid (written by other software "
            "or planted); remove the file if it holds nothing else", repairable=False))


class Summaries:
    """Metric summaries computed as compaction computes them, on one DuckDB connection for
    the whole check (a connection per part cost most of fsck's time)."""

    def __init__(self) -> None:
        self._con: Any = None
        self._lock = threading.Lock()  # a check given up on may still be using it

    def __call__(self, table: pa.Table) -> list[dict[str, Any]]:
        with self._lock:
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
        if self._con is not None and self._lock.acquire(timeout=1.0):
            try:
                self._con.close()
            finally:
                self._lock.release()


def _summary_mismatch(table: pa.Table, summary: list[dict[str, Any]],
                      summaries: Summaries) -> str | None:
    actual = {r["key"]: r for r in summaries(table)}
    recorded = {r["key"]: r for r in summary}
    if set(actual) != set(recorded):
        return "the metric summary names other keys than the values"
    for key, row in recorded.items():
        for field_ in ("count", "min", "max", "first_step", "last_step", "last_seq"):
            if differs(actual[key][field_], row[field_]):
                return f"the metric summary's {field_} of {key!r} does not match the values"
    return None
