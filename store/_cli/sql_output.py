"""`tracklake sql --format csv|json|parquet`: the answer written batch by batch as the
query makes it, so memory holds one batch whatever the answer's size. A file is written
under a temporary name beside it and renamed into place once the answer is complete: an
interrupted or failed query leaves no partial file. An output that exists and is not a
regular file (a device such as /dev/stdout, a FIFO) is written straight into, never
replaced; a link to a file replaces the file it points to."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import click
import pyarrow as pa

from tracklake._cli.cells import interval_text, plain
from tracklake._format.columns import nullable, strings


class AnswerWriter:
    """Writes record batches in `fmt` to `output` (stdout when None)."""

    def __init__(self, fmt: str, output: Path | None) -> None:
        self.fmt = fmt
        self.output = output
        self.rows = 0
        self._direct = output  # written straight into (stdout when None)
        self._tmp: Path | None = None
        if output is not None:
            target = output.resolve()
            try:
                mode = target.stat().st_mode
            except FileNotFoundError:
                mode = stat.S_IFREG
            if stat.S_ISDIR(mode):
                raise IsADirectoryError(errno.EISDIR, "it is a directory", str(output))
            if stat.S_ISREG(mode):
                self._direct = None
                self._target = target
                self._tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        self._file: IO[bytes] | None = None
        self._writer: Any = None
        self._wrote_stdout = False

    def _sink(self) -> IO[bytes]:
        if self._file is None:
            if self._tmp is not None:
                self._file = open(self._tmp, "wb")  # noqa: SIM115
            elif self._direct is not None:
                self._file = open(self._direct, "wb")  # noqa: SIM115
            else:
                self._file = sys.stdout.buffer
        return self._file

    def write(self, batch: pa.RecordBatch) -> None:
        sink = self._sink()
        if self.fmt == "json":
            rows = batch.to_pylist()
            walked = [f.name for f in batch.schema if _holds_interval(f.type)]
            for row in rows:  # (an interval is a tuple, written as a list of numbers)
                row.update((name, plain(row[name])) for name in walked)
            text = "".join(json.dumps(row, default=str) + "\n" for row in rows)
            sink.write(text.encode())
        else:
            if self.fmt == "csv":
                # (cells CSV has none for, which pyarrow's CSV writer refuses)
                batch = _as_text(batch, lambda t: pa.types.is_nested(t) or
                                 pa.types.is_interval(t))
            else:  # (Parquet has no type for an interval of months, days and nanoseconds)
                batch = _intervals_as_durations(batch)
            if self._writer is None:
                self._writer = self._open_writer(sink, batch.schema)
            self._writer.write_batch(batch)
        self.rows += batch.num_rows
        self._wrote_stdout = self._tmp is None
        if self._tmp is None:
            sink.flush()  # whoever reads it sees the rows as they come

    def _open_writer(self, sink: IO[bytes], schema: pa.Schema) -> Any:
        if self.fmt == "csv":
            import pyarrow.csv as pacsv

            return pacsv.CSVWriter(sink, schema)
        import pyarrow.parquet as pq

        try:
            return pq.ParquetWriter(sink, schema, compression="zstd")
        except pa.ArrowNotImplementedError as exc:  # a union, an interval in a list
            names = ", ".join(repr(f.name) for f in schema if not _parquet_can_hold(f))
            raise click.ClickException(
                f"column {names or '?'} cannot be written as Parquet ({exc}): select it "
                "as CAST(... AS VARCHAR), or write --format csv or json") from exc

    def restart(self) -> bool:
        """Start the output over (the query is asked again); False for stdout once
        something was written to it."""
        if self._wrote_stdout:
            return False
        self._close()
        if self._tmp is not None:
            self._tmp.unlink(missing_ok=True)
        self.rows = 0
        return True

    def finish(self) -> None:
        """Complete the output; a file is renamed into place."""
        self._close()
        if self._tmp is not None:
            if not self._tmp.exists():
                self._tmp.write_bytes(b"")
            os.replace(self._tmp, self._target)

    def abort(self) -> None:
        """Leave no partial file behind."""
        with contextlib.suppress(OSError):
            self._close()
            if self._tmp is not None:
                self._tmp.unlink(missing_ok=True)

    def _close(self) -> None:
        writer, self._writer = self._writer, None
        f, self._file = self._file, None
        try:
            if writer is not None:
                writer.close()
            if f is not None:
                f.flush()
                if self._tmp is not None:
                    os.fsync(f.fileno())
        finally:
            if f is not None and f is not sys.stdout.buffer:
                f.close()


def _as_text(batch: pa.RecordBatch, which: Callable[[pa.DataType], bool]
             ) -> pa.RecordBatch:
    """`batch` with the columns of the types `which` picks as text: a list, struct or map
    (a run's tags) as the JSON of its values, an interval (a run's duration) as DuckDB
    writes it."""
    for i, field in enumerate(batch.schema):
        if which(field.type):
            texts = [None if v is None else interval_text(v) if isinstance(v, pa.MonthDayNano)
                     else json.dumps(plain(v), default=str)
                     for v in batch.column(i).to_pylist()]
            batch = batch.set_column(i, field.name, strings(texts))
    return batch


def _intervals_as_durations(batch: pa.RecordBatch) -> pa.RecordBatch:
    """`batch` with each interval column (a run's duration) as a duration in
    microseconds, which Parquet stores (as int64, read back as a duration by pyarrow);
    a value of months, which has no fixed length, is a clear error naming its column."""
    for i, field in enumerate(batch.schema):
        if not pa.types.is_interval(field.type):
            continue
        micros: list[int | None] = []
        for v in batch.column(i).to_pylist():
            if v is not None and v.months:
                raise click.ClickException(
                    f"column {field.name!r} holds an interval of months ({interval_text(v)}),"
                    " which Parquet cannot store: select it as epoch(...) or "
                    "CAST(... AS VARCHAR), or write --format csv or json")
            micros.append(None if v is None else v.days * 86_400_000_000 +
                          v.nanoseconds // 1000)
        batch = batch.set_column(i, field.name, nullable(micros, pa.duration("us")))
    return batch


def _parquet_can_hold(field: pa.Field) -> bool:
    import pyarrow.parquet as pq

    try:
        pq.ParquetWriter(pa.BufferOutputStream(), pa.schema([field])).close()
    except pa.ArrowNotImplementedError:
        return False
    return True


def _holds_interval(type_: pa.DataType) -> bool:
    """Whether values of `type_` are or hold intervals."""
    if pa.types.is_interval(type_):
        return True
    if pa.types.is_struct(type_):
        return any(_holds_interval(f.type) for f in type_)
    if pa.types.is_map(type_):
        return _holds_interval(type_.key_type) or _holds_interval(type_.item_type)
    if pa.types.is_list(type_) or pa.types.is_large_list(type_) or \
            pa.types.is_fixed_size_list(type_):
        return _holds_interval(type_.value_type)
    return False
