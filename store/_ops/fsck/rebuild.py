"""What a damaged part still holds: its records when every data page verifies and they
cover the part's whole seq range (then only derived data -- footer, statistics, metric
summary -- is damaged, and repair rebuilds the part from them), else what its footer
says was lost, in records, steps and keys."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tracklake._errors import FormatError
from tracklake._format import FORMAT_VERSION, SCHEMAS, StreamId, bounded_json, fsync_dir
from tracklake._format.part import SUMMARY_KEY, summary_json, write_part_file
from tracklake._format.part_bounds import (
    bounded_table,
    check_pages,
    part_read_limit,
    string_columns,
)
from tracklake._ops.compact import metric_summary
from tracklake._ops.fsck.footer_stats import KILLS_READER, stats_mismatch_isolated

#: Metadata kept from a damaged footer when it still parses (retention's mark).
_KEPT_KEYS = (b"tracklake.downsampled",)
_READ_ERRORS = (OSError, pa.ArrowException, ValueError, KeyError, TypeError, EOFError,
                FormatError)


def salvageable(s: StreamId, path: Path, first: int, last: int) -> pa.Table | None:
    """The part's records if they all read with verified page checksums, have the
    stream's schema and hold every seq of first..last; None otherwise."""
    try:
        strings = string_columns(pq.read_schema(path))
        parquet = pq.ParquetFile(path, page_checksum_verification=True,
                                 read_dictionary=strings)
        with open(path, "rb") as f:  # before a page is read, as `open_part` does
            check_pages(f, path, part_read_limit())
        table = bounded_table(parquet, path)
    except _READ_ERRORS:
        return None
    if not table.schema.remove_metadata().equals(SCHEMAS[s.kind]) or not table.num_rows:
        return None
    seq = table.column("seq")
    if (pc.min(seq).as_py(), pc.max(seq).as_py()) != (first, last) or pc.count_distinct(
            seq).as_py() != last - first + 1:
        return None
    why = stats_mismatch_isolated(path)
    if why is not None and not why.startswith(KILLS_READER):
        return None  # the values disagree with the footer: which one is damaged?
    return table  # (a footer that kills the reader is rewritten from verified records)


def _kept_metadata(path: Path) -> dict[bytes, bytes]:
    try:
        meta = pq.read_schema(path).metadata or {}
    except _READ_ERRORS:
        return {}
    out = {}
    for key in _KEPT_KEYS:
        raw = meta.get(key)
        if raw is not None:
            try:
                bounded_json.loads(raw)
            except ValueError:
                continue
            out[key] = raw
    return out


def rebuild_part(s: StreamId, path: Path, table: pa.Table) -> None:
    """Write `table` back over `path` as compaction writes a part (fresh footer,
    statistics, summary and checksums), through an fsynced temporary and a rename."""
    order = [("key", "ascending"), ("step", "ascending"), ("seq", "ascending")] \
        if s.kind == "metrics" else [("seq", "ascending")]
    table = table.sort_by(order)
    meta: dict[bytes, bytes] = {
        k.encode(): v.encode() for k, v in {
            "tracklake.format": FORMAT_VERSION, "tracklake.kind": s.kind,
            "tracklake.project": s.project, "tracklake.run": s.run,
            "tracklake.rank": str(s.rank), "tracklake.attempt": str(s.attempt)}.items()}
    if s.kind == "metrics":
        meta[SUMMARY_KEY.encode()] = summary_json(metric_summary(table)).encode()
    meta.update(_kept_metadata(path))
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write_part_file(tmp, table.replace_schema_metadata(meta), s.kind)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def lost_detail(path: Path, first: int, last: int) -> str:
    """What a part that cannot be salvaged held: records by seq, and the keys and steps
    of its metric summary when its footer still gives one (unverified)."""
    records = f"records seq {first}..{last}"
    try:
        raw = (pq.read_schema(path).metadata or {}).get(b"tracklake.summary")
        summary: Any = bounded_json.loads(raw) if raw is not None else None
    except (*_READ_ERRORS, UnicodeDecodeError):
        return records
    if not isinstance(summary, list) or not all(isinstance(r, dict) for r in summary):
        return records
    try:
        keys = sorted(str(r["key"]) for r in summary)
        values = sum(int(r["count"]) for r in summary)
        steps = (min(int(r["first_step"]) for r in summary),
                 max(int(r["last_step"]) for r in summary))
    except (KeyError, TypeError, ValueError):
        return records
    shown = ", ".join(keys[:8]) + (f" and {len(keys) - 8} more" if len(keys) > 8 else "")
    return (f"{records}: {values} values of {len(keys)} key(s) ({shown}), steps "
            f"{steps[0]}..{steps[1]} (as its footer, unverified, says)")
