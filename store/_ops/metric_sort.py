"""Sorting a metrics stream by (key, step, seq) in bounded memory, with its summary.

A metric part is ordered by key, then step, then seq; its sources come in seq order
(segments) or by key within one seq range (earlier parts). Sorting them whole costs the
whole stream in memory, so this is an external sort that uses what training logs look
like:

1. Runs. The records are cut into chunks of `RUN_ROWS`; each chunk is sorted (a stable
   sort by key rank when steps do not go down within it, which is the usual case, else
   a lexicographic sort of key, step, seq) and, unless it is the last one, spilled to an
   Arrow IPC file with one record batch per key.
2. Merge. Keys are taken in order. A key's slices, run after run, are already in
   (step, seq) order whenever each run's last step of the key is at most the next run's
   first (steps that never go back, again the usual case): they are handed on one by one,
   never gathered. Otherwise that key's slices are gathered and sorted, which costs that
   one key's records in memory.

So memory is one run plus one output chunk, whatever the stream's length (for a key
whose steps go back and forth, plus that key's records). The per-key summary the part
carries is built from the slices as they pass, with DuckDB's `min`/`max` ordering of NaN
(above every number), as `compact.SUMMARY_SQL` defines it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracklake._format import SCHEMAS
from tracklake._format.part_summary import SUMMARY_SCHEMA

#: Records per sorted run (one run is in memory at a time, about 40 bytes per record).
RUN_ROWS = 1 << 20
#: Records handed to the Parquet writer at a time.
CHUNK_ROWS = 1 << 20
_SCHEMA = SCHEMAS["metrics"]
#: The records as sorted and handed on: keys stay dictionary-encoded (a run's dictionary),
#: which the Parquet writer stores as they are; decoding a million keys to strings and
#: encoding them again cost as much as the sort.
SORTED_SCHEMA = _SCHEMA.set(3, pa.field("key", pa.dictionary(pa.int32(), pa.string())))
#: Spilled runs are not compressed: lz4 took a quarter of compaction's CPU (10 M values:
#: 3.0 s -> 2.2 s without it) to save 15 of a record's 36 bytes, and the spill is deleted
#: when the part is written. The price is temporary disk: 36 bytes a record (2.2 GB for a
#: 60 M-value stream, beside its 0.6 GB of segments) instead of about 21.
_SPILL_OPTIONS = pa.ipc.IpcWriteOptions(compression=None)


@dataclass
class _Slice:
    """Where one key's records of one run are: batches [first, first + count) of the
    run's spill file (or of its in-memory batches), and their first and last step."""

    first: int
    count: int
    first_step: int
    last_step: int


@dataclass
class _Run:
    keys: dict[str, _Slice]
    path: Path | None = None  # spilled; else `batches` holds it
    batches: list[pa.RecordBatch] = field(default_factory=list)
    _reader: Any = None

    def slice(self, s: _Slice) -> list[pa.RecordBatch]:
        if self.path is None:
            return self.batches[s.first : s.first + s.count]
        if self._reader is None:
            self._reader = pa.ipc.open_file(pa.OSFile(str(self.path)))
        return [self._reader.get_batch(i) for i in range(s.first, s.first + s.count)]

    def close(self) -> None:
        self._reader = None


@dataclass
class KeySpans:
    """Where each key's rows are in a table sorted by (key, step, seq): `names[i]` holds
    rows [starts[i], starts[i] + lengths[i])."""

    names: list[str]
    starts: np.ndarray
    lengths: np.ndarray

    def __len__(self) -> int:
        return len(self.names)

    def __iter__(self) -> Iterator[tuple[str, int, int]]:
        return zip(self.names, self.starts.tolist(), self.lengths.tolist(), strict=True)


def _sort_run(table: pa.Table) -> tuple[pa.Table, KeySpans]:
    """`table` sorted by (key, step, seq), its keys dictionary-encoded in key order, and
    where each key's rows are."""
    encoded = pc.dictionary_encode(table.column("key").combine_chunks())
    # Arrow orders strings by their bytes, as str.encode does
    order = pc.array_sort_indices(encoded.dictionary).to_numpy()
    # numpy's stable sort of 16-bit integers is a radix sort, several times faster
    rank_of = np.empty(len(order), np.int16 if len(order) <= 1 << 15 else np.int64)
    rank_of[order] = np.arange(len(order))
    ranks = rank_of[encoded.indices.to_numpy(zero_copy_only=False)]
    step = table.column("step").to_numpy()
    seq = table.column("seq").to_numpy()
    if len(step) < 2 or (np.all(step[1:] >= step[:-1]) and np.all(seq[1:] >= seq[:-1])):
        idx = np.argsort(ranks, kind="stable")  # already in (step, seq) order within a key
    else:
        idx = np.lexsort((seq, step, ranks))
    ranked = ranks[idx]
    starts = np.flatnonzero(np.r_[True, ranked[1:] != ranked[:-1]])
    dictionary = encoded.dictionary.take(pa.array(order))  # index = rank
    spans = KeySpans(dictionary.take(pa.array(ranked[starts])).to_pylist(), starts,
                     np.diff(np.r_[starts, len(ranked)]))
    # numpy gathers the fixed-width columns; the keys are their ranks in a dictionary
    # in key order (taking a string column directly costs several times more)
    columns = {name: pa.array(table.column(name).to_numpy()[idx], _SCHEMA.field(name).type)
               for name in ("seq", "step", "value")}
    columns["time"] = pa.array(table.column("time").cast(pa.int64()).to_numpy()[idx]
                               ).cast(_SCHEMA.field("time").type)
    columns["key"] = pa.DictionaryArray.from_arrays(pa.array(ranked, pa.int32()), dictionary)
    return pa.table([columns[f.name] for f in SORTED_SCHEMA], schema=SORTED_SCHEMA), spans


class MetricSorter:
    """Takes metric batches in any order (`add`), hands them back sorted (`sorted`)."""

    def __init__(self, spill: Path) -> None:
        self._spill = spill
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0
        self._runs: list[_Run] = []
        self.summary = SummaryBuilder()

    def add(self, batches: Iterable[pa.RecordBatch]) -> None:
        for batch in batches:
            self._pending.append(batch)
            self._pending_rows += batch.num_rows
            if self._pending_rows >= RUN_ROWS:
                self._cut(spill=True)

    def _cut(self, spill: bool) -> None:
        table = pa.Table.from_batches(self._pending, _SCHEMA)
        self._pending, self._pending_rows = [], 0
        if table.num_rows == 0:
            return
        table, keys = _sort_run(table)
        run = _Run({})
        writer = None
        if spill:
            self._spill.mkdir(exist_ok=True)
            run.path = self._spill / f"run-{len(self._runs):06d}.arrow"
            writer = pa.ipc.new_file(str(run.path), SORTED_SCHEMA, options=_SPILL_OPTIONS)
        try:
            for key, start, length in keys:
                part = table.slice(start, length).combine_chunks()
                steps = part.column("step")
                batches = part.to_batches()
                first = len(run.batches) if writer is None else writer.stats.num_record_batches
                for b in batches:
                    if writer is None:
                        run.batches.append(b)
                    else:
                        writer.write_batch(b)
                run.keys[key] = _Slice(first, len(batches), steps[0].as_py(),
                                       steps[-1].as_py())
        finally:
            if writer is not None:
                writer.close()
        self._runs.append(run)

    def sorted(self) -> Iterator[pa.Table]:
        """Every record added, in (key, step, seq) order, in chunks of about CHUNK_ROWS."""
        if self._pending and not self._runs:
            yield from self._sorted_in_memory()
            return
        if self._pending:
            self._cut(spill=False)
        out: list[pa.RecordBatch] = []
        rows = 0
        try:
            for key in sorted({k for r in self._runs for k in r.keys}, key=str.encode):
                for batch in self._key_batches(key):
                    self.summary.add(batch)
                    out.append(batch)
                    rows += batch.num_rows
                    if rows >= CHUNK_ROWS:
                        yield pa.Table.from_batches(out, SORTED_SCHEMA)
                        out, rows = [], 0
            if out:
                yield pa.Table.from_batches(out, SORTED_SCHEMA)
        finally:
            for run in self._runs:
                run.close()

    def _sorted_in_memory(self) -> Iterator[pa.Table]:
        """`sorted` of a stream that fits in one run (nothing spilled): the run sorted
        whole and handed on in chunks, its summary taken per key by NumPy, with no
        batch per key (100,000 keys of 10 values: 12 s of per-key work)."""
        table = pa.Table.from_batches(self._pending, _SCHEMA)
        self._pending, self._pending_rows = [], 0
        if table.num_rows == 0:
            return
        table, keys = _sort_run(table)
        self.summary.add_sorted(table, keys)
        for offset in range(0, table.num_rows, CHUNK_ROWS):
            yield table.slice(offset, CHUNK_ROWS)

    def _key_batches(self, key: str) -> Iterator[pa.RecordBatch]:
        having = [(r, r.keys[key]) for r in self._runs if key in r.keys]
        in_order = all(a.last_step <= b.first_step
                       for (_, a), (_, b) in itertools.pairwise(having))
        if in_order:
            for run, s in having:
                yield from run.slice(s)
            return
        # this key's steps go back between runs: gather its records and sort them
        table = pa.Table.from_batches([b for run, s in having for b in run.slice(s)],
                                      SORTED_SCHEMA)
        # one dictionary for the slices of every run (each run has its own)
        table = table.set_column(3, SORTED_SCHEMA.field("key"), pc.dictionary_encode(
            table.column("key").cast(pa.string()).combine_chunks()).cast(
                SORTED_SCHEMA.field("key").type))
        idx = np.lexsort((table.column("seq").to_numpy(), table.column("step").to_numpy()))
        yield from table.take(pa.array(idx)).combine_chunks().to_batches(CHUNK_ROWS)


def _nan_max(a: float, b: float) -> float:
    return math.nan if math.isnan(a) or math.isnan(b) else max(a, b)


def _nan_min(a: float, b: float) -> float:
    if math.isnan(a) or math.isnan(b):
        return b if math.isnan(a) else a  # NaN only if both are (no number to take)
    return min(a, b)


class SummaryBuilder:
    """The per-key summary of a metric part, from its batches in (key, step, seq) order."""

    def __init__(self) -> None:
        self._rows: dict[str, dict[str, Any]] = {}
        self._sorted: list[tuple[KeySpans, dict[str, np.ndarray]]] = []

    def add(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        self._objects()
        key = batch.column(3)[0].as_py()
        values = batch.column(4).to_numpy(zero_copy_only=False)
        nan = np.isnan(values)
        numbers = values[~nan]
        lo = float(numbers.min()) if len(numbers) else math.nan
        hi = math.nan if nan.any() else float(values.max())
        seqs, steps = batch.column(0), batch.column(2)
        new = {"key": key, "count": batch.num_rows, "min": lo, "max": hi,
               "first_step": steps[0].as_py(), "last_step": steps[-1].as_py(),
               "last_value": float(values[-1]), "last_seq": pc.max(seqs).as_py(),
               "last_time_us": batch.column(1).cast(pa.int64())[-1].as_py()}
        old = self._rows.get(key)
        if old is not None:
            new.update(count=old["count"] + new["count"], min=_nan_min(old["min"], lo),
                       max=_nan_max(old["max"], hi), first_step=old["first_step"],
                       last_seq=max(old["last_seq"], new["last_seq"]))
        self._rows[key] = new

    def add_sorted(self, table: pa.Table, keys: KeySpans) -> None:
        """`add` of every key's rows of `table` at once: `table` in (key, step, seq)
        order, `keys` where each key's rows are in it (as `_sort_run` gives them), none of
        them added before. The per-key objects are made only if `rows` is asked for (a
        part too wide to store its summary never does)."""
        starts, counts = keys.starts, keys.lengths
        ends = starts + counts - 1
        values = table.column("value").to_numpy()
        steps = table.column("step").to_numpy()
        self._sorted.append((keys, {
            "count": counts,
            "min": np.fmin.reduceat(values, starts),  # NaN only where the key has no number
            "max": np.maximum.reduceat(values, starts),  # NaN where the key has one
            "first_step": steps[starts], "last_step": steps[ends],
            "last_value": values[ends],
            "last_seq": np.maximum.reduceat(table.column("seq").to_numpy(), starts),
            "last_time_us": table.column("time").cast(pa.int64()).to_numpy()[ends]}))

    def _objects(self) -> dict[str, dict[str, Any]]:
        """Every key's object, those `add_sorted` took made now."""
        for keys, columns in self._sorted:
            names = list(columns)
            for key, *values in zip(keys.names, *(c.tolist() for c in columns.values()),
                                    strict=True):
                self._rows[key] = {"key": key, **dict(zip(names, values, strict=True))}
        self._sorted.clear()
        return self._rows

    def __len__(self) -> int:
        """How many keys it summarises."""
        return len(self._rows) + sum(len(keys) for keys, _ in self._sorted)

    def rows(self) -> list[dict[str, Any]]:
        """One object per key, in key order (as `compact.metric_summary` gives them)."""
        rows = self._objects()
        return [rows[k] for k in sorted(rows, key=str.encode)]

    def columns(self) -> dict[str, list[Any]]:
        """What `rows` gives, as columns (`part_summary.SUMMARY_SCHEMA`'s names), made
        without an object per key when every key came through `add_sorted` in key order
        (str orders by code point, as UTF-8 bytes do)."""
        names = [k for keys, _ in self._sorted for k in keys.names]
        if self._rows or any(a >= b for a, b in itertools.pairwise(names)):
            rows = self.rows()
            return {name: [r[name] for r in rows] for name in SUMMARY_SCHEMA.names}
        return {"key": names, **{
            name: (np.concatenate([c[name] for _, c in self._sorted]).tolist()
                   if self._sorted else []) for name in SUMMARY_SCHEMA.names[1:]}}
