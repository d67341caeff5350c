"""The store's files at one moment, for the SQL views: compacted parts per kind (their
footers checked), the live tail as tables, metric summaries and the runs' attempts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from tracklake._errors import FormatError, NewerFormatError
from tracklake._format import KINDS, PARTITION_SCHEMA, SCHEMAS, StreamId
from tracklake._format.attempt import effective_status
from tracklake._format.part import open_part, summary_rows
from tracklake._read.reader import (
    Part,
    ReadProblems,
    RunRecord,
    StreamFiles,
    add_once,
    list_runs,
    list_stream,
    list_streams,
    read_stream,
)

_SUMMARY_SCHEMA = pa.schema(
    [("project", pa.string()), ("run", pa.string()), ("rank", pa.int32()),
     ("attempt", pa.int32()), ("key", pa.string()), ("count", pa.int64()),
     ("min", pa.float64()), ("max", pa.float64()), ("first_step", pa.int64()),
     ("last_step", pa.int64()), ("last_value", pa.float64()), ("last_seq", pa.int64()),
     ("last_time_us", pa.int64())]
)


def _with_partitions(table: pa.Table, s: StreamId) -> pa.Table:
    n = table.num_rows
    for name, value in zip(("project", "run", "rank", "attempt"),
                           (s.project, s.run, s.rank, s.attempt), strict=True):
        table = table.append_column(
            PARTITION_SCHEMA.field(name), pa.array([value] * n, PARTITION_SCHEMA.field(name).type))
    return table


class Snapshot:
    """The files of the store at one moment: parts per kind (their footers checked), live
    tail tables, summaries. Damaged files are left out and noted in `problems`."""

    def __init__(self, root: Path, problems: ReadProblems | None = None,
                 skip: frozenset[Path] = frozenset()) -> None:
        problems = ReadProblems() if problems is None else problems
        self.parts: dict[str, list[Part]] = {k: [] for k in KINDS}
        live: dict[str, list[pa.Table]] = {k: [] for k in KINDS}
        summaries: list[dict[str, Any]] = []
        for s in list_streams(root):
            files, opened = _open_parts(root, s, skip, problems)
            self.parts[s.kind].extend(p for p, _ in opened)
            summaries.extend(r for _, rows in opened for r in rows)
            after = max((p.last_seq for p in files.parts), default=-1)
            if files.segments:
                batches = list(read_stream(root, s, after, problems))
                if batches:
                    live[s.kind].append(_with_partitions(
                        pa.Table.from_batches(batches, SCHEMAS[s.kind]), s))
        self.live = {k: pa.concat_tables(v) if v else _empty(k) for k, v in live.items()}
        self.summaries = pa.Table.from_pylist(summaries, _SUMMARY_SCHEMA)
        self.runs = list_runs(root)


def _open_parts(root: Path, s: StreamId, skip: frozenset[Path], problems: ReadProblems
                ) -> tuple[StreamFiles, list[tuple[Part, list[dict[str, Any]]]]]:
    """The stream's listing and its parts with their metric summaries (footers checked;
    damaged ones noted in `problems` and left out). A part merged away between the listing
    and its opening makes the stream listed again: the merged part holds its records."""
    while True:
        files = list_stream(root, s)
        opened: list[tuple[Part, list[dict[str, Any]]]] = []
        try:
            for p in files.parts:
                if p.path in skip:
                    continue
                try:
                    parquet = open_part(p.path)
                    rows = _part_summary(parquet, p.path, s) if s.kind == "metrics" else []
                    opened.append((p, rows))
                except NewerFormatError:
                    raise
                except FormatError as exc:
                    add_once(problems.damaged, (p.path, part_lost(exc, p)))
        except FileNotFoundError:
            continue
        return files, opened


def part_lost(exc: Exception, part: Part) -> str:
    """Why a part is left out, and what that loses."""
    return (f"{str(exc).removeprefix(f'{part.path}: ')}; its records (seq "
            f"{part.first_seq}..{part.last_seq} of this stream) are left out")


def _empty(kind: str) -> pa.Table:
    schema = SCHEMAS[kind]
    for f in PARTITION_SCHEMA:
        schema = schema.append(f)
    return schema.empty_table()


def _part_summary(parquet: Any, path: Path, s: StreamId) -> list[dict[str, Any]]:
    return [{"project": s.project, "run": s.run, "rank": s.rank, "attempt": s.attempt, **r}
            for r in summary_rows(parquet, path)]


def parts_dataset(root: Path, kind: str, parts: list[Part]) -> Any:
    """The parts of one kind as a pyarrow dataset that verifies page checksums: DuckDB
    reads the files only through it, so the connection needs no file access at all."""
    import pyarrow.dataset as ds

    schema = SCHEMAS[kind]
    # `key` (few distinct values, dictionary-encoded in parts) is read as a dictionary, so
    # that its strings are not materialised per row (DuckDB still sees VARCHAR); the
    # partition columns stay plain strings: as dictionaries DuckDB no longer pushes filters
    # on them down to the dataset, and every file would be read.
    keyed = "key" in schema.names
    if keyed:
        at = schema.get_field_index("key")
        schema = schema.set(at, schema.field(at).with_type(pa.dictionary(pa.int32(),
                                                                         pa.string())))
    fmt = ds.ParquetFileFormat(
        read_options=ds.ParquetReadOptions(dictionary_columns={"key"} if keyed else set()),
        default_fragment_scan_options=ds.ParquetFragmentScanOptions(
            page_checksum_verification=True))
    for f in PARTITION_SCHEMA:
        schema = schema.append(f)
    return ds.dataset([str(p.path) for p in parts], schema=schema, format=fmt,
                      partitioning=ds.partitioning(PARTITION_SCHEMA, flavor="hive"),
                      partition_base_dir=str(root / kind))


def attempt_rows(runs: list[RunRecord], now: float) -> list[dict[str, Any]]:
    rows = []
    for run in runs:
        latest = {a["rank"]: a["attempt"] for a in run.attempts}  # attempts are sorted
        for a in run.attempts:
            status = effective_status(a, latest[a["rank"]], now)
            beat = a.get("heartbeat_at")
            ident = a.get("identity") or {}
            git = ident.get("git") or {}
            rows.append({
                "project": a["project"], "run": a["run"], "name": a.get("name"),
                "rank": a["rank"], "attempt": a["attempt"], "status": status,
                "world_size": a.get("world_size"), "tags": a.get("tags") or [],
                "started_at": a.get("started_at"), "heartbeat_at": beat,
                "finished_at": a.get("finished_at"), "host": ident.get("host"),
                "git_commit": git.get("commit"), "git_dirty": git.get("dirty"),
                "command": " ".join(ident.get("command") or []) or None,
                "config": json.dumps(a.get("config") or {}),
                "identity": json.dumps(ident),
            })
    return rows


ATTEMPTS_SCHEMA = pa.schema(
    [("project", pa.string()), ("run", pa.string()), ("name", pa.string()),
     ("rank", pa.int32()), ("attempt", pa.int32()), ("status", pa.string()),
     ("world_size", pa.int32()), ("tags", pa.list_(pa.string())),
     ("started_at", pa.string()), ("heartbeat_at", pa.string()), ("finished_at", pa.string()),
     ("host", pa.string()), ("git_commit", pa.string()), ("git_dirty", pa.bool_()),
     ("command", pa.string()), ("config", pa.string()), ("identity", pa.string())]
)
