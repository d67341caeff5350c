"""The on-disk format (docs/format.md): schemas and version, the layout of a store,
durable file writes, segment framing, attempt files, cursors and names.

The names most layers need are re-exported here; segments, attempts, cursors and naming
are imported from their own modules.
"""

from tracklake._format.files import fsync_dir, fsync_file, write_atomic
from tracklake._format.layout import (
    PART_SUFFIX,
    SEGMENT_SUFFIX,
    attempt_file,
    blob_path,
    parse_part_name,
    parse_segment_name,
    part_name,
    segment_name,
    stream_dir,
)
from tracklake._format.schema import (
    FORMAT_MAJOR,
    FORMAT_VERSION,
    KINDS,
    PARTITION_SCHEMA,
    PARTITIONS,
    SCHEMAS,
    StreamId,
    check_version,
)

__all__ = [
    "FORMAT_MAJOR",
    "FORMAT_VERSION",
    "KINDS",
    "PARTITIONS",
    "PARTITION_SCHEMA",
    "PART_SUFFIX",
    "SCHEMAS",
    "SEGMENT_SUFFIX",
    "StreamId",
    "attempt_file",
    "blob_path",
    "check_version",
    "fsync_dir",
    "fsync_file",
    "parse_part_name",
    "parse_segment_name",
    "part_name",
    "segment_name",
    "stream_dir",
    "write_atomic",
]
