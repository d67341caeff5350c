"""The run catalog's files: the runs split into `SHARDS` files by a hash of their name,
so that a change to a few runs rewrites the files that hold them, not every run's, and a
question about one run reads the file that holds it.

``ROOT/.cache/runs-v3/XX.catalog`` (XX: the shard, two hex digits) holds the runs whose
name hashes to XX (`shard_of`); a shard with no run has no file. Each file is a header
line (version, CRC-32 of the rest), then an Arrow IPC stream of the catalog's schema.
A file of another version, with a wrong checksum or another schema, one that says it
decodes to more than the catalog may in all, that holds a path outside the store or a
run of another shard (planted: a question about that run reads its own shard's file, one
over every run would see the plant) is ignored, and its runs are read from their files
and written anew. A process keeps the tables of the files it
read while each stays the same file (device, inode, size, mtime) and is older than
`RACY_SECONDS`, and the catalog made of all of them, so that a warm question neither
reads nor joins them again. A pass over every run that needs a few columns of each
(`run_index`) reads the files a few at a time instead (`each_shard`), keeping none.

At 1,000,000 runs a shard holds about 16,000: a reader that finds a few runs changed
rewrites a few megabytes, where one file rewrote the whole catalog (6.7 MB at 10,000
runs of 16 keys, 670 MB at a million).
"""

from __future__ import annotations

import json
import os
import stat
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracklake._format import bounded_json
from tracklake._format.bounded import touch
from tracklake._format.columns import booleans, numpy_of, scalar_of
from tracklake._format.files import no_link_on_the_way, open_regular, write_state
from tracklake._format.ipc_size import declares_other_than_little_endian
from tracklake._format.part_bounds import part_read_limit
from tracklake._format.schema import empty_table
from tracklake._format.store_clock import store_now_ns
from tracklake._read.catalog_checks import decodes_within, untrusted_rows
from tracklake._read.decoded import RACY_SECONDS

#: Files the catalog is split into. A power of two, fixed: a run's file follows from its
#: name alone, whatever else the store holds.
SHARDS = 64
CATALOG_DIR = Path(".cache") / "runs-v3"
CATALOG_VERSION = 3
#: A catalog file larger than this (planted, or not ours) is ignored and written anew;
#: the files of one catalog decode to `part_read_limit()` bytes in all, at most.
MAX_CATALOG_BYTES = 4 << 30
#: Catalogs of earlier versions, removed when this one is written.
EARLIER = (Path(".cache") / "runs-v1.catalog", Path(".cache") / "runs-v2.catalog")
#: lz4: a third of the bytes (2.2 KB -> 0.7 KB a run of 16 keys), which every new process
#: reads from disk or NFS, for 0.4 ms more to decode 1,000 runs (zstd: 0.5 KB, 1.9 ms;
#: benchmarks/catalog_size.py).
_COMPRESSED = pa.ipc.IpcWriteOptions(compression="lz4")

#: Files at least this large are decoded by pyarrow's thread pool: a small file's few
#: buffers decoded by the pool cost more than they gain (64 files of 10,000 runs: 37 ms
#: against 11-16 ms on one thread).
_POOLED_BYTES = 1 << 20

Key = tuple[int, int, int, int]  # device, inode, size, mtime of a shard's file
_ABSENT: Key = (-1, -1, -1, -1)
_UNREADABLE: Key = (-2, -2, -2, -2)


def shard_of(run: str) -> int:
    """The shard that holds `run` (its name's CRC-32, modulo `SHARDS`)."""
    return zlib.crc32(run.encode("utf-8", "surrogatepass")) % SHARDS


def shard_file(shard: int) -> Path:
    """The file of `shard`, relative to the store root."""
    return CATALOG_DIR / f"{shard:02x}.catalog"


_SHARD_FILES = [str(shard_file(shard)) for shard in range(SHARDS)]


def catalog_file(run: str) -> Path:
    """The file that holds `run`'s entry, relative to the store root."""
    return shard_file(shard_of(run))


@dataclass
class Loaded:
    """The catalog rows read for a question: `table`, and the shard of each row."""

    table: pa.Table
    shards: np.ndarray
    #: the shards whose files were read (every shard, or the one a question needs)
    read: frozenset[int]


@dataclass
class _Kept:
    """What a process keeps of a store's catalog files (`_read_before`)."""

    keys: dict[int, Key] = field(default_factory=dict)
    tables: dict[int, pa.Table] = field(default_factory=dict)
    sizes: dict[int, int] = field(default_factory=dict)  # the tables' bytes
    whole: Loaded | None = None


#: The catalog files this process read whole and checked, by store root.
_read_before: dict[str, _Kept] = {}
_read_before_lock = threading.Lock()
#: Stores whose catalog is kept so (a 10,000-run catalog is ≈ 20 MB).
_READ_BEFORE_ROOTS = 2


def load(root: Path, schema: pa.Schema, run: str | None = None) -> Loaded:
    """The catalog rows of `root`: of every shard, or of `run`'s shard if given (every
    shard's still, if this process keeps them and that shard's file is the same); empty
    where there is no catalog, or one not to be trusted."""
    if not _reachable(root):
        return empty(schema)
    kept = _kept(root)
    shards = range(SHARDS) if run is None else [shard_of(run)]
    budget = [part_read_limit()]
    found = {shard: _read_shard(root, shard, schema, kept, budget) for shard in shards}
    if run is not None:
        (shard, (key, table)), = found.items()
        if kept.whole is not None and kept.keys.get(shard) == key:
            return kept.whole  # its rows of this shard are the file's
        if table is not None and kept.keys.get(shard) != key and \
                not _trusted_rows(table, np.full(table.num_rows, shard, np.int16)).all():
            table = None  # read now, checked now: not to be trusted
        rows = table if table is not None else empty_table(schema)
        if kept.keys.get(shard) != key:
            _keep(root, kept, {shard: (key, rows)}, None)
        return Loaded(rows, np.full(rows.num_rows, shard, dtype=np.int16), frozenset(found))
    if kept.whole is not None and all(kept.keys.get(s) == k for s, (k, _) in found.items()):
        return kept.whole
    tables = [t if t is not None else empty_table(schema) for _, t in found.values()]
    # not joined into one chunk: what uses a column joins it (the watched paths, the
    # attempts), the rest is never copied
    table = pa.concat_tables(tables)
    lengths = [t.num_rows for t in tables]
    shards_of_rows = np.repeat(np.arange(SHARDS, dtype=np.int16), lengths)
    trusted = _trusted_rows(table, shards_of_rows)
    if not trusted.all():  # a file not to be trusted: none of its rows are used
        table, shards_of_rows = table.filter(booleans(trusted)), shards_of_rows[trusted]
        lengths = np.bincount(shards_of_rows, minlength=SHARDS).tolist()
    whole = Loaded(table, shards_of_rows, frozenset(found))
    starts = np.cumsum([0, *lengths]).tolist()
    _keep(root, kept, {s: (k, table.slice(starts[s], lengths[s]))
                       for s, (k, _) in found.items()}, whole)
    return whole


def _trusted_rows(table: pa.Table, shards: np.ndarray) -> np.ndarray:
    """The rows of `table` (read from the files `shards` says) that are in a file none of
    whose rows is to be distrusted: one with a path out of the store or a null
    (`untrusted_rows`), a run of another shard (planted: a question about that run reads
    its own shard's file and would not see it, one over every run would), or a run the
    file holds twice (`_twice`)."""
    elsewhere = _elsewhere(table, shards)
    bad = untrusted_rows(table) | elsewhere | _twice(table, ~elsewhere)
    if not bad.any():
        return np.ones(table.num_rows, dtype=bool)
    return ~np.isin(shards, np.unique(shards[bad]))


def _elsewhere(table: pa.Table, shards: np.ndarray) -> np.ndarray:
    """The rows whose run is not of the shard whose file they were read from (a null
    run is distrusted by `untrusted_rows`). Every name hashed: 5 ms at 10,000 runs."""
    return np.array([run is not None and shard_of(run) != shard for run, shard in zip(
        table.column("run").to_pylist(), shards.tolist(), strict=True)], dtype=bool)


def _twice(table: pa.Table, among: np.ndarray) -> np.ndarray:
    """The rows, of those `among` says, of a run held more than once there."""
    if int(among.sum()) < 2:
        return np.zeros(table.num_rows, dtype=bool)
    names = _names(table)
    if not among.all():
        names = pc.if_else(booleans(among), names, scalar_of(None, pa.string()))
    counts = pc.value_counts(names)
    twice = counts.field("values").filter(pc.and_(
        pc.greater(counts.field("counts"), scalar_of(1, pa.int64())),
        pc.is_valid(counts.field("values"))))
    if not len(twice):
        return np.zeros(table.num_rows, dtype=bool)
    held: np.ndarray = numpy_of(pc.fill_null(pc.is_in(names, value_set=twice), False))
    held &= among
    return held


def each_shard(root: Path, schema: pa.Schema, fields: list[str], rows: int
               ) -> Iterator[pa.Table]:
    """The rows of the shards' files, a few files at a time (at least `rows` rows, the
    last group fewer), checked as `load` checks them, only the columns `fields` decoded,
    none kept: a pass over every run that holds a few files' rows at a time
    (`run_index`). A file not to be trusted gives no rows; no catalog, none."""
    if not _reachable(root):
        return
    indices = [schema.get_field_index(name) for name in fields]
    read: list[tuple[int, pa.Table]] = []
    held = 0
    for shard in range(SHARDS):
        _, table = _read_shard(root, shard, schema, _Kept(), [part_read_limit()], indices)
        if table is None or not table.num_rows:
            continue
        read.append((shard, table))
        held += table.num_rows
        if held >= rows:
            yield _trusted_files(read)
            read, held = [], 0
    if read:
        yield _trusted_files(read)


def _trusted_files(read: list[tuple[int, pa.Table]]) -> pa.Table:
    """The rows of the files `read` ((shard, table) each) that are to be trusted, as
    `load` checks them (a file with a row distrusted gives none) and with every run of
    its own shard, the files checked together: the checks' fixed cost, paid per file, was
    most of what 64 files of 1,000 runs cost (1.2 ms a file)."""
    table = pa.concat_tables([t for _, t in read])
    shards = np.repeat(np.array([s for s, _ in read], dtype=np.int16),
                       [t.num_rows for _, t in read])
    trusted = _trusted_rows(table, shards)
    return table if trusted.all() else table.filter(booleans(trusted))


def alone(root: Path, schema: pa.Schema, shard: int) -> Loaded:
    """The rows of `shard`'s file, checked as `each_shard` checks them and not kept by
    the process (a pass over every shard in turn holds one file's rows at a time); none
    where there is no such file, or one not to be trusted."""
    if not _reachable(root):
        return empty(schema)
    table = _shard_alone(root, shard, schema)
    rows = table if table is not None else empty_table(schema)
    return Loaded(rows, np.full(rows.num_rows, shard, dtype=np.int16), frozenset({shard}))


def _reachable(root: Path) -> bool:
    """Whether the catalog's directory may be read: no link on the way (one could lead
    out of the store), and `.cache` a directory that can be looked into."""
    try:
        return no_link_on_the_way(root, CATALOG_DIR.as_posix())
    except OSError:
        return False


def _shard_alone(root: Path, shard: int, schema: pa.Schema) -> pa.Table | None:
    """`shard`'s table read on its own, within the decode limit, None if not to be
    trusted (`_trusted_files`)."""
    _, table = _read_shard(root, shard, schema, _Kept(), [part_read_limit()])
    if table is None:
        return None
    trusted = _trusted_files([(shard, table)])
    return table if trusted.num_rows == table.num_rows else None


def _names(table: pa.Table) -> pa.ChunkedArray:
    """Each row's project and run as one string (a null one as empty: distrusted)."""
    # (a Python value given to a compute function is converted by pyarrow, which imports
    # pandas to see whether it is one of its objects: 0.3 s)
    names = pc.binary_join_element_wise(table.column("project"), table.column("run"),
                                        scalar_of("\0", pa.string()))
    return pc.fill_null(names, scalar_of("", pa.string()))


def empty(schema: pa.Schema) -> Loaded:
    """No catalog rows (none read, or none to be trusted)."""
    return Loaded(empty_table(schema), np.zeros(0, dtype=np.int16), frozenset())


def keeps_whole(root: Path) -> bool:
    """Whether this process keeps `root`'s whole catalog (as `load` last read it)."""
    return _kept(root).whole is not None


def _kept(root: Path) -> _Kept:
    with _read_before_lock:
        return _read_before.get(str(root)) or _Kept()


def _keep(root: Path, kept: _Kept, found: dict[int, tuple[Key, pa.Table]],
          whole: Loaded | None) -> None:
    """Keep what `kept` held with the shards `found` instead (those old enough that a
    change in place would show in their mtime), and `whole` (the catalog of every
    shard, or None: the whole one kept stays while its shards' files are the same).
    Replaced, never changed: questions in other threads read what they took."""
    old = store_now_ns(root) - int(RACY_SECONDS * 1e9)
    new = _Kept(dict(kept.keys), dict(kept.tables), dict(kept.sizes), kept.whole)
    for shard, (key, table) in found.items():
        if new.keys.get(shard) != key:
            new.whole = None
        if key == _ABSENT or (key != _UNREADABLE and key[3] < old):
            new.keys[shard], new.tables[shard] = key, table
            new.sizes[shard] = table.nbytes
        else:
            new.keys.pop(shard, None)
            new.tables.pop(shard, None)
            new.sizes.pop(shard, None)
    if whole is not None and len(new.keys) == SHARDS:
        new.whole = whole
    with _read_before_lock:
        _read_before.pop(str(root), None)
        while len(_read_before) >= _READ_BEFORE_ROOTS:
            _read_before.pop(next(iter(_read_before)))
        _read_before[str(root)] = new


def _read_shard(root: Path, shard: int, schema: pa.Schema, kept: _Kept, budget: list[int],
                fields: list[int] | None = None) -> tuple[Key, pa.Table | None]:
    """The key of `shard`'s file (`_ABSENT` if there is none) and its table: the one kept
    if the file is the same, else read and checked (None if it is not to be trusted).
    `budget`: the bytes the catalog's files may still decode to, lowered by this one's.
    `fields`: only the columns at these indices of `schema` are decoded."""
    path = os.path.join(root, _SHARD_FILES[shard])  # a str: 64 Path joins cost 1 ms
    if shard in kept.keys:
        # the file this process read, unchanged: known by `lstat` alone (no link is
        # followed, no FIFO opened), 64 opens fewer a question (3 ms at any size)
        touch(path)
        try:
            st = os.lstat(path)
        except OSError:
            pass  # gone or unreadable: told apart below
        else:
            key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            if stat.S_ISREG(st.st_mode) and kept.keys[shard] == key:
                budget[0] -= kept.sizes[shard]  # counted with the files read now
                return key, kept.tables[shard]
    try:
        with open_regular(Path(path)) as f:
            st = os.fstat(f.fileno())
            key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            if kept.keys.get(shard) == key:
                budget[0] -= kept.sizes[shard]  # counted with the files read now
                return key, kept.tables[shard]
            if st.st_size > MAX_CATALOG_BYTES:
                return key, None  # not ours, or past what a reader holds
            # as many bytes as it holds (a read of the most it may hold allocates that)
            header, _, body = f.read(st.st_size + 1).partition(b"\n")
    except FileNotFoundError:
        return _ABSENT, None
    except OSError:
        return _UNREADABLE, None  # unreadable, a link or not a file: rebuilt
    return key, _checked(body, header, schema, budget, fields)


def _checked(body: bytes, header: bytes, schema: pa.Schema, budget: list[int],
             fields: list[int] | None = None) -> pa.Table | None:
    """The table of a shard file's `body`, None if it is not one this version wrote
    (entries are used without checking the files again, so a damaged catalog must not
    pass for a whole one, nor a crafted one whose checksum is right too)."""
    try:
        meta = bounded_json.loads(header[:4096])
        if not isinstance(meta, dict) or meta.get("version") != CATALOG_VERSION or \
                meta.get("crc32") != zlib.crc32(body):
            return None
        if not decodes_within(body, budget[0]) or \
                declares_other_than_little_endian(memoryview(body)):
            # crafted to decompress past what a catalog may, or to be read byte-swapped
            return None
        options = pa.ipc.IpcReadOptions(use_threads=len(body) >= _POOLED_BYTES,
                                        included_fields=fields)
        table = pa.ipc.open_stream(body, options=options).read_all()
        table.validate(full=True)
    except (ValueError, pa.ArrowException):
        return None
    if fields is not None:
        schema = pa.schema([schema.field(i) for i in fields])
    if not table.schema.equals(schema):
        return None  # not ours (its rows are checked with the others': `_trusted_rows`)
    budget[0] -= table.nbytes
    return table


def save(root: Path, loaded: Loaded, keep: np.ndarray, fresh: pa.Table,
         remove: Callable[[], None]) -> tuple[pa.Table, pa.Table]:
    """Write the shards of `loaded` that change: those with a row not in `keep` (a mask of
    its rows) and those `fresh` (rows of the catalog's schema) adds to; a shard left with
    no row loses its file. `remove()` is called once a file is written (the catalogs of
    earlier versions go then). The runs (project, run) the files now hold, of the shards
    read, and the rows of `fresh` written (OSError if a file cannot be written: those
    before it are written)."""
    # (NumPy arrays given to pyarrow as `booleans`/`fixed`: `pa.array` asks pandas
    # whether it was given one of its objects, which imports it, 0.2 s)
    fresh_shards = np.array([shard_of(r) for r in fresh.column("run").to_pylist()],
                            dtype=np.int16)
    changed = set(np.unique(loaded.shards[~keep]).tolist()) | set(fresh_shards.tolist())
    failed: OSError | None = None
    for shard in sorted(changed & loaded.read):
        # a shard's rows are together, in shard order: filtered in its slice alone (the
        # whole table filtered took 120 ms at 38,778 runs, for one run changed)
        start, end = np.searchsorted(loaded.shards, [shard, shard + 1]).tolist()
        rows = pa.concat_tables([
            loaded.table.slice(start, end - start).filter(booleans(keep[start:end])),
            fresh.filter(booleans(fresh_shards == shard))])
        rel = shard_file(shard).as_posix()
        try:
            if rows.num_rows:
                write_state(root, rel, _encoded(rows), tidy=True)
            elif no_link_on_the_way(root, rel):
                (root / rel).unlink(missing_ok=True)
            remove()
        except OSError as exc:  # a directory planted at its name, say: the others still
            failed = failed or exc
    if failed is not None:
        raise failed
    # a run of a shard not read (never so: a question about one run reads its shard)
    # is not saved: writing its shard would drop the runs the file holds
    names = ["project", "run"]
    written = fresh.filter(booleans(np.isin(fresh_shards, list(loaded.read))))
    return pa.concat_tables([loaded.table.select(names).filter(booleans(keep)),
                             written.select(names)]), written


def _encoded(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=_COMPRESSED) as writer:
        writer.write_table(table)
    body: bytes = sink.getvalue().to_pybytes()
    header = json.dumps({"version": CATALOG_VERSION, "crc32": zlib.crc32(body)}).encode()
    return header + b"\n" + body
