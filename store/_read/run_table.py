"""A run's parts of one kind read whole into one table, for a question about that run.

DuckDB registers an Arrow table for less than a pyarrow dataset and scans it faster than
the dataset's verifying scan: one run's history of one key, 1,000 runs of 200 steps x 16
keys, took 2.8 ms to scan through the dataset and 1.8 ms read and scanned as a table
(`benchmarks/read_profile.py`). Verification is the same: the footer's checksum and every
page's, as any reader of a part (`read_small_part`). Only a run whose parts of the kind are
small is read so: a large one (a long or wide run) is left to the dataset, which reads only
the row groups and columns the question needs.
"""

from __future__ import annotations

import os

import pyarrow as pa

from tracklake._errors import FormatError, NewerFormatError
from tracklake._format import SCHEMAS, StreamId
from tracklake._format.layout import stream_of_file
from tracklake._format.part import read_small_part
from tracklake._read.kept import Kept
from tracklake._read.reader import Part, ReadProblems, add_once
from tracklake._read.snapshot import part_lost, partitioned_schema, with_partitions

#: A run's parts of one kind are read whole while they take at most this many bytes on
#: disk in all ...
SMALL_RUN_BYTES = 1 << 20
#: ... and decode to at most this many (a file that compresses better is a crafted one,
#: or a run to read through the dataset).
SMALL_RUN_DECODED = 64 << 20
#: Parts this process read whole and verified, kept while the file is the one read (its
#: device, inode, size and mtime) and older than the racy window (`Kept`): compaction
#: writes a part under a temporary name and renames it into place, never changes one.
#: A question about a run asked again (a notebook, a dashboard) reads nothing again.
_read_before: Kept[pa.Table] = Kept(1024, most_bytes=SMALL_RUN_DECODED)
#: `run_table`'s answers, by the kind and the parts they were made of (each path's device,
#: inode, size and mtime), kept as `_read_before` keeps the parts: a question asked again
#: does not make the partition columns again.
_made_before: Kept[pa.Table] = Kept(64, most_bytes=SMALL_RUN_DECODED)


def run_table(kind: str, parts: list[Part], problems: ReadProblems) -> pa.Table | None:
    """The rows of `parts` (one run's, of `kind`) with their partition columns, as the
    kind's view has them; None if they are too large to read whole or not local files.
    A damaged part is left out and noted in `problems`, as the dataset's reader would
    have it; a part gone since it was listed raises FileNotFoundError (list again)."""
    if not parts or any(hasattr(p.path, "fs_path") for p in parts):
        return None  # nothing, or an object store's files: the dataset reads those
    streams = [stream_of_file(p.path, kind) for p in parts]
    if any(s is None for s in streams):
        return None
    stats = [os.stat(p.path) for p in parts]
    if sum(st.st_size for st in stats) > SMALL_RUN_BYTES:
        return None
    identities = [(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) for st in stats]
    made_of = "\0".join([kind, *(str(p.path) for p in parts)])
    made_identity = tuple(n for i in identities for n in i)
    made = _made_before.get(made_of, made_identity)
    if made is not None:
        return made
    whole = True
    tables: list[tuple[pa.Table, StreamId]] = []
    left = SMALL_RUN_DECODED
    for part, stream, st, identity in zip(parts, streams, stats, identities, strict=True):
        table = _read_before.get(str(part.path), identity)
        if table is None:
            try:
                table = read_small_part(part.path, left)
            except NewerFormatError:
                raise
            except FormatError as exc:
                add_once(problems.damaged, (part.path, part_lost(exc, part)))
                whole = False
                continue
            if table is None or not table.schema.equals(SCHEMAS[kind]):
                return None  # too large, or of an earlier format: the dataset adapts it
            _read_before.keep(part.path.parents[5], str(part.path), st, identity, table,
                              table.nbytes)
        if table.nbytes > left or stream is None:
            return None
        left -= table.nbytes
        tables.append((table, stream))
    # partition columns as the live tables get them, then plain, as the dataset gives them
    made = with_partitions(tables, kind).cast(partitioned_schema(kind))
    if whole:  # kept as the newest of its parts would be (not while it may still change)
        newest = max(stats, key=lambda st: st.st_mtime_ns)
        _made_before.keep(parts[0].path.parents[5], made_of, newest, made_identity, made,
                          made.nbytes)
    return made
