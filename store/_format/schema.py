"""Record schemas, partition columns, the format version and stream identity
(specified in docs/format.md)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pyarrow as pa

from tracklake._errors import FormatError, NewerFormatError

#: Major.minor of the on-disk format. Readers refuse a newer major version; a newer minor
#: version only adds what older readers may ignore (docs/format.md, "Versioning").
FORMAT_VERSION = "1.2"
FORMAT_MAJOR = 1

_TIME = pa.timestamp("us", tz="UTC")


def empty_table(schema: pa.Schema) -> pa.Table:
    """A table of `schema` without rows. Not `schema.empty_table()`: pyarrow 25 imports
    pandas for that whenever it is installed (0.2-0.5 s of a reader's start)."""
    return pa.Table.from_batches([], schema=schema)

#: One Arrow schema per record kind. Every kind starts with `seq` (the record group
#: number within its stream) and `time`; cursors count `seq`.
SCHEMAS: dict[str, pa.Schema] = {
    "metrics": pa.schema(
        [("seq", pa.int64()), ("time", _TIME), ("step", pa.int64()),
         ("key", pa.string()), ("value", pa.float64())]
    ),
    "texts": pa.schema(
        [("seq", pa.int64()), ("time", _TIME), ("step", pa.int64()),
         ("key", pa.string()), ("text", pa.string())]
    ),
    "configs": pa.schema(
        [("seq", pa.int64()), ("time", _TIME), ("key", pa.string()), ("value", pa.string())]
    ),
    "generations": pa.schema(
        [("seq", pa.int64()), ("time", _TIME), ("step", pa.int64()), ("key", pa.string()),
         ("sample", pa.int32()), ("input", pa.string()), ("output", pa.string()),
         ("score", pa.float64()), ("extra", pa.string())]
    ),
    "traces": pa.schema(
        [("seq", pa.int64()), ("time", _TIME), ("end_time", _TIME), ("step", pa.int64()),
         ("trace_id", pa.string()), ("span_id", pa.string()), ("parent_id", pa.string()),
         ("name", pa.string()), ("status", pa.string()), ("error", pa.string()),
         ("attributes", pa.string()), ("inputs", pa.string()), ("outputs", pa.string()),
         ("token_ids", pa.list_(pa.int64()))]
    ),
    "artifacts": pa.schema(
        [("seq", pa.int64()), ("time", _TIME), ("step", pa.int64()), ("name", pa.string()),
         ("digest", pa.string()), ("size", pa.int64()), ("media_type", pa.string()),
         ("metadata", pa.string())]
    ),
    "histograms": pa.schema(
        [("seq", pa.int64()), ("time", _TIME), ("step", pa.int64()), ("key", pa.string()),
         ("count", pa.int64()), ("nonfinite", pa.int64()), ("min", pa.float64()),
         ("max", pa.float64()), ("mean", pa.float64()), ("std", pa.float64()),
         ("edges", pa.list_(pa.float64())), ("counts", pa.list_(pa.int64()))]
    ),
    "media": pa.schema(
        [("seq", pa.int64()), ("time", _TIME), ("step", pa.int64()), ("key", pa.string()),
         ("type", pa.string()), ("media_type", pa.string()), ("digest", pa.string()),
         ("size", pa.int64()), ("caption", pa.string()), ("shape", pa.list_(pa.int64())),
         ("sample_rate", pa.int32()), ("fps", pa.float64())]
    ),
    "events": pa.schema(
        [("seq", pa.int64()), ("time", _TIME), ("step", pa.int64()), ("level", pa.string()),
         ("kind", pa.string()), ("title", pa.string()), ("text", pa.string())]
    ),
}
KINDS: tuple[str, ...] = tuple(SCHEMAS)
#: Kinds whose records name blobs (``digest``): what keeps a blob, and what carries it.
BLOB_KINDS: tuple[str, ...] = ("artifacts", "media")

#: The order of the rows in a compacted part, per kind (ascending, nulls last), declared in
#: each part's Parquet `sorting_columns`: metrics by key then step then seq, so that one
#: key's values are contiguous and in logging order; every other kind by seq.
PART_ORDER: dict[str, tuple[str, ...]] = {
    kind: ("key", "step", "seq") if kind == "metrics" else ("seq",) for kind in KINDS}

#: Columns that the directory layout contributes (Hive partitions), in path order.
PARTITIONS: tuple[str, ...] = ("project", "run", "rank", "attempt")
#: Their types. Give this schema to Hive discovery (docs/format.md shows it for DuckDB,
#: Polars and pyarrow): guessed, run ``0042`` would become 42 and ``2025-01-01`` a date.
PARTITION_SCHEMA = pa.schema(
    [("project", pa.string()), ("run", pa.string()), ("rank", pa.int32()),
     ("attempt", pa.int32())]
)


def with_partition_columns(schema: pa.Schema) -> pa.Schema:
    """`schema` followed by the partition columns, as the views and bundles have them."""
    for f in PARTITION_SCHEMA:
        schema = schema.append(f)
    return schema


def check_version(version: object, where: object) -> None:
    """Refuse a file written by a newer major format version (or without a version)."""
    if not isinstance(version, str) or not re.fullmatch(r"\d+\.\d+", version):
        raise FormatError(f"{where}: missing or malformed tracklake format version {version!r}")
    major = int(version.split(".")[0])
    if major > FORMAT_MAJOR:
        raise NewerFormatError(
            f"{where}: written in tracklake format {version}, this tracklake reads "
            f"{FORMAT_MAJOR}.x; upgrade tracklake to read it"
        )


@dataclass(frozen=True)
class StreamId:
    """One append-only stream: a record kind of one attempt of one rank of a run."""

    project: str
    run: str
    rank: int
    attempt: int
    kind: str

    def key(self) -> str:
        """Stable text form used in cursors: ``rank/attempt/kind``."""
        return f"{self.rank}/{self.attempt}/{self.kind}"
