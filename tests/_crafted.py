"""Files crafted past every writer's checks: a pack holding one part of records as given
(for the tests of records that break their kind's rules), where one flipped bit
turns a segment's header big-endian, and a run catalog signed as a reader signs it (and
its files read and planted)."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import time
import zlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tracklake._format import FORMAT_VERSION, StreamId
from tracklake._ops.pack.archive import write_archive
from tracklake._ops.pack.manifest import PACK_FORMAT_VERSION, Covered, Manifest, StreamEntry
from tracklake._read import catalog_shards
from tracklake._read.catalog_shards import (
    CATALOG_DIR,
    CATALOG_VERSION,
    catalog_file,
    shard_file,
    shard_of,
)


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


def endianness_slot(data: bytes) -> int:
    """Where the schema table's vtable stores the offset of `endianness` (absent: 0)."""
    fb = 8
    root = fb + int.from_bytes(data[fb : fb + 4], "little")
    vtable = root - int.from_bytes(data[root : root + 4], "little", signed=True)
    header_slot = int.from_bytes(data[vtable + 8 : vtable + 10], "little")  # Message.header
    at = root + header_slot
    table = at + int.from_bytes(data[at : at + 4], "little")
    schema_vtable = table - int.from_bytes(data[table : table + 4], "little", signed=True)
    assert data[schema_vtable + 4 : schema_vtable + 6] == b"\0\0"  # pyarrow leaves it out
    return schema_vtable + 4


def message_spans(data: bytes) -> list[tuple[int, int, int]]:
    """(start, body_start, end) of each IPC message in `data` (the schema message first)."""
    source = pa.BufferReader(data)
    reader = pa.ipc.MessageReader.open_stream(source)
    spans = []
    while True:
        start = source.tell()
        try:
            message = reader.read_next_message()
        except StopIteration:
            return spans
        end = source.tell()
        spans.append((start, end - message.body.size, end))


def signed_catalog(table: pa.Table) -> bytes:
    """`table` as a run catalog file: its header (version, CRC-32 of the rest), then the
    table as an Arrow IPC stream: what a forger who knows the format writes."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    body = sink.getvalue().to_pybytes()
    return json.dumps({"version": CATALOG_VERSION, "crc32": zlib.crc32(body)}).encode() \
        + b"\n" + body


def catalog_path(root: Path, run: str) -> Path:
    """The run catalog's file that holds `run`."""
    return root / catalog_file(run)


def catalogued_table(root: Path) -> pa.Table:
    """Every row the run catalog's files hold (each file's header checked), shard by
    shard."""
    tables = []
    for path in sorted((root / CATALOG_DIR).glob("*.catalog")):
        if not path.is_file():
            continue  # planted where a file goes
        header, _, body = path.read_bytes().partition(b"\n")
        assert json.loads(header) == {"version": CATALOG_VERSION, "crc32": zlib.crc32(body)}
        tables.append(pa.ipc.open_stream(body).read_all())
    return pa.concat_tables(tables) if tables else pa.table({"run": pa.array([], pa.string())})


def plant_catalog(root: Path, table: pa.Table, null_run: str = "r0") -> None:
    """Replace the run catalog's files by `table`, signed, each row in the file of its
    run's shard (a row with no run in `null_run`'s): what a forger who knows the format
    writes."""
    for path in (root / CATALOG_DIR).glob("*.catalog"):
        path.unlink()
    shards = [shard_of(run if isinstance(run, str) else null_run)
              for run in table.column("run").to_pylist()]
    for shard in sorted(set(shards)):
        rows = table.filter(pa.array([s == shard for s in shards]))
        (root / shard_file(shard)).parent.mkdir(parents=True, exist_ok=True)
        (root / shard_file(shard)).write_bytes(signed_catalog(rows))


def age_catalog(root: Path) -> None:
    """Make the run catalog's files older than a coarse mtime's tick, so that a reading
    process keeps what it read of them."""
    old = time.time() - 30
    for path in (root / CATALOG_DIR).glob("*.catalog"):
        os.utime(path, (old, old))


def kept_catalog(root: Path) -> pa.Table:
    """The whole run catalog of `root` this process keeps (AssertionError if none)."""
    whole = catalog_shards._read_before[str(root)].whole
    assert whole is not None, "no whole catalog kept"
    return whole.table
