"""A pack holding one part of records as given (for the tests of records that break their
kind's rules): what a crafted or damaged pack carries past every writer's checks."""

from __future__ import annotations

import datetime as _dt
import hashlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tracklake._format import FORMAT_VERSION, StreamId
from tracklake._ops.pack.archive import write_archive
from tracklake._ops.pack.manifest import PACK_FORMAT_VERSION, Covered, Manifest, StreamEntry


def crafted_pack(out: Path, work: Path, s: StreamId, table: pa.Table) -> None:
    """Write to `out` a pack of stream `s` holding `table` (seq 0..n-1) as its one part."""
    part = work / "crafted-part.parquet"
    with pq.ParquetWriter(part, table.schema, compression="zstd", store_schema=False) as w:
        w.write_table(table)
        w.add_key_value_metadata({
            "tracklake.format": FORMAT_VERSION, "tracklake.kind": s.kind,
            "tracklake.project": s.project, "tracklake.run": s.run,
            "tracklake.rank": str(s.rank), "tracklake.attempt": str(s.attempt)})
    data = part.read_bytes()
    entry = StreamEntry(s, 0, table.num_rows - 1, table.num_rows,
                        hashlib.sha256(data).hexdigest(), len(data))
    now = _dt.datetime.now(_dt.timezone.utc)
    manifest = Manifest(PACK_FORMAT_VERSION, now.isoformat(), {"root": "x"}, None, [entry],
                        [], [], Covered({}, {}, set()))
    write_archive(out, manifest, [(entry, part)], [], work, now.timestamp())
