"""What a run catalog file must be before a reader uses it: like every file in the store,
it may have been planted (a restored backup, another user), and its checksum proves
nothing a forger cannot recompute.

- What it decodes to, read from each record batch's header before anything is
  decompressed (`ipc_size.decoded_size`): a few megabytes of lz4 may stand for gigabytes.
- Every path lies inside the store, under the directories of its kind: its parts under
  ``metrics/project=``, ending in ``.parquet``; its watched paths under
  ``metrics/project=`` or ``runs/project=``; none with a component that starts with a
  dot (so no ``..``). An absolute path, or one through ``..``, had a question read a
  file outside the store as one of a run's parts. (An entry naming another run's files,
  inside the store, makes answers as wrong as editing those files would; it is not
  checked: comparing 237,000 paths with their runs' names took 0.15 to 0.3 s a process at
  34,000 runs, these checks about 30 ms.)
- No null where a reader never writes one: a run's name, project, lists, watched paths
  and mtimes, and parts. The reader counts on each (a null mtime or list stopped every
  question with an error; a null run answered its rows twice).
- Each of a run's attempts names that run: an attempt of another run would be that run's
  twice, and counted twice where the runs are counted file by file (`run_index`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracklake._format.columns import combined, numpy_of
from tracklake._format.ipc_size import decoded_size, message_size

_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"
#: (column, the prefixes one of which each path must start with, and its ending)
_SHAPES = (("parts", ("metrics/project=",), ".parquet"),
           ("watched", ("metrics/project=", "runs/project="), ""))


def decodes_within(body: bytes, limit: int) -> bool:
    """Whether the Arrow IPC stream `body` says its record batches decode to at most
    `limit` bytes in all; False if a message's header cannot be read."""
    view = memoryview(body)
    pos = total = 0
    while pos < len(view):
        if view[pos:pos + 8] == _EOS:
            return True
        size = message_size(view[pos:])
        if size is None:
            return False
        batch = decoded_size(view[pos:pos + size])
        total += batch or 0  # None: the schema message
        if total > limit:
            return False
        pos += size
    return True


def untrusted_rows(table: pa.Table) -> np.ndarray:
    """Per row of the catalog `table`: whether a part or watched path of it lies outside
    the store or where its kind does not, or it holds a null where a reader never writes
    one (see the module's docstring). One pass over the rows of every file at once; a
    table of some of the catalog's columns (read for the runs view alone) is checked in
    those."""
    bad = np.zeros(table.num_rows, dtype=bool)
    for name, fields in _NEVER_NULL:
        if name not in table.column_names:
            continue
        chunks = table.column(name)
        if chunks.null_count:
            bad |= numpy_of(chunks.is_null())
        if fields:  # joined only where its items are looked at (the lists of paths)
            column = combined(chunks)
            items, parents = pc.list_flatten(column), pc.list_parent_indices(column)
            for f in fields:
                if items.field(f).null_count:
                    bad[numpy_of(parents)[numpy_of(items.field(f).is_null())]] = True
    for name, prefixes, ending in _SHAPES:
        if name not in table.column_names:
            continue
        column = combined(table.column(name))
        paths = pc.list_flatten(column).field("path")
        if not len(paths):
            continue
        inside = pc.starts_with(paths, prefixes[0])
        for prefix in prefixes[1:]:
            inside = pc.or_(inside, pc.starts_with(paths, prefix))
        if ending:
            inside = pc.and_(inside, pc.ends_with(paths, ending))
        inside = pc.and_(inside, pc.invert(pc.match_substring(paths, "/.")))
        outside = ~numpy_of(inside, null=False)  # a null path: a null, counted above
        bad[numpy_of(pc.list_parent_indices(column))[outside]] = True
    if {"project", "run", "attempts"} <= set(table.column_names):
        bad |= _attempts_of_other_runs(table)
    return bad


def _attempts_of_other_runs(table: pa.Table) -> np.ndarray:
    """Per row: whether one of its attempts names another project or run than the row."""
    bad = np.zeros(table.num_rows, dtype=bool)
    column = combined(table.column("attempts"))
    items = pc.list_flatten(column)
    if not len(items):
        return bad
    parents = pc.list_parent_indices(column)
    for name in ("project", "run"):
        same = pc.equal(items.field(name), combined(table.column(name)).take(parents))
        bad[numpy_of(parents)[~numpy_of(same, null=False)]] = True
    return bad


#: Columns (and the fields of their items) a reader never writes a null in.
_NEVER_NULL = (("project", ()), ("run", ()), ("watched", ("path", "mtime_ns")),
               ("parts", ("path", "first_seq", "last_seq", "last_segment")),
               ("attempts", ()), ("summaries", ()))
