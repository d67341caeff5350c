"""The retention audit log: one record per applied action, kept in the store outside the
runs it describes, as an `events` stream of the reserved project ``_tracklake`` (no user
project can be named so: names never start with ``_``). SQL reads it from the `events`
view::

    SELECT time, title, json_extract_string(text, '$.rule') AS rule
    FROM events WHERE project = '_tracklake' AND run = 'retention'
"""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from tracklake._format import SCHEMAS, StreamId, fsync_dir, segment_name, stream_dir
from tracklake._format.segment import SegmentWriter, stream_schema
from tracklake._read.reader import list_stream, read_table, stream_last_seq

AUDIT_STREAM = StreamId("_tracklake", "retention", 0, 0, "events")


def audit_records(root: Path) -> list[dict[str, Any]]:
    """Every audit record, oldest first (the JSON of each event's text)."""
    table = read_table(root, AUDIT_STREAM)
    return [json.loads(t) for t in table.column("text").to_pylist()]


class AuditLog:
    """Appends records to the audit stream, one sealed, fsynced segment each.

    Made by the holder of the retention claim, so no other process appends meanwhile:
    the next segment number and seq are found once, then counted.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        files = list_stream(root, AUDIT_STREAM)
        self.number = max([p.last_segment for p in files.parts]
                          + [g.number for g in files.segments], default=-1) + 1
        self.seq = stream_last_seq(root, AUDIT_STREAM) + 1

    def append(self, record: dict[str, Any]) -> None:
        s = AUDIT_STREAM
        when = _dt.datetime.fromisoformat(record["at"])
        schema = SCHEMAS["events"]
        batch = pa.record_batch([
            pa.array([self.seq], pa.int64()), pa.array([when], schema.field("time").type),
            pa.array([None], pa.int64()), pa.array(["info"]), pa.array(["retention"]),
            pa.array([f"{record['action']} {record['project']}/{record['run']}"]),
            pa.array([json.dumps(record, sort_keys=True)]),
        ], schema=schema)
        directory = stream_dir(self.root, s)
        writer = SegmentWriter(directory / segment_name(self.number, self.seq),
                               stream_schema(schema, s))
        try:
            writer.append(batch)
            writer.seal()
        finally:
            writer.close()
        fsync_dir(directory)
        self.number += 1
        self.seq += 1
