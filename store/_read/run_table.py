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
from pathlib import Path

import pyarrow as pa

from tracklake._errors import FormatError, NewerFormatError
from tracklake._format import PARTITION_SCHEMA, SCHEMAS
from tracklake._format.part import read_small_part
from tracklake._format.schema import with_partition_columns
from tracklake._read.reader import Part, ReadProblems, add_once

#: A run's parts of one kind are read whole while they take at most this many bytes on
#: disk in all ...
SMALL_RUN_BYTES = 1 << 20
#: ... and decode to at most this many (a file that compresses better is a crafted one,
#: or a run to read through the dataset).
SMALL_RUN_DECODED = 64 << 20


def _partition(path: Path) -> tuple[str, str, int, int] | None:
    """(project, run, rank, attempt) from a part's directories (``project=P/run=R/rank=N/
    attempt=N/part-….parquet``), None for a path of another shape."""
    values = []
    for directory, name in zip(reversed(path.parents[:4]), PARTITION_SCHEMA.names,
                               strict=True):
        prefix = f"{name}="
        if not directory.name.startswith(prefix):
            return None
        values.append(directory.name.removeprefix(prefix))
    try:
        rank, attempt = int(values[2]), int(values[3])
    except ValueError:
        return None
    if not (0 <= rank < 1 << 31 and 0 <= attempt < 1 << 31):
        return None
    return values[0], values[1], rank, attempt


def run_table(kind: str, parts: list[Part], problems: ReadProblems) -> pa.Table | None:
    """The rows of `parts` (one run's, of `kind`) with their partition columns, as the
    kind's view has them; None if they are too large to read whole or not local files.
    A damaged part is left out and noted in `problems`, as the dataset's reader would
    have it; a part gone since it was listed raises FileNotFoundError (list again)."""
    if not parts or any(hasattr(p.path, "fs_path") for p in parts):
        return None  # nothing, or an object store's files: the dataset reads those
    partitions = [_partition(p.path) for p in parts]
    if any(value is None for value in partitions) or \
            sum(os.stat(p.path).st_size for p in parts) > SMALL_RUN_BYTES:
        return None
    schema = with_partition_columns(SCHEMAS[kind])
    tables = []
    left = SMALL_RUN_DECODED
    for part, partition in zip(parts, partitions, strict=True):
        try:
            table = read_small_part(part.path, left)
        except NewerFormatError:
            raise
        except FormatError as exc:
            from tracklake._read.snapshot import part_lost

            add_once(problems.damaged, (part.path, part_lost(exc, part)))
            continue
        if table is None or not table.schema.equals(SCHEMAS[kind]):
            return None  # too large, or of an earlier format: the dataset adapts it
        left -= table.nbytes
        rows = table.num_rows
        columns = [table.column(name) for name in SCHEMAS[kind].names] + [
            pa.repeat(pa.scalar(value, field.type), rows)
            for value, field in zip(partition or (), PARTITION_SCHEMA, strict=True)]
        tables.append(pa.Table.from_arrays(columns, schema=schema))
    return pa.concat_tables(tables) if tables else schema.empty_table()
