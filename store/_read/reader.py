"""Reading the store: runs, streams, and record batches strictly after a cursor.

A stream directory holds compacted parts (``part-FIRST-LAST.parquet``) and live segments
(``_seg-NUMBER-FIRSTSEQ.arrows``; ``seg-…`` in format 1.0). Compaction consumes segments
in number order and names each part after the last segment number it consumed; a segment
numbered at or below that is skipped, so a reader that lists the directory while
compaction runs sees every record once (records are also de-duplicated by seq).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracklake._errors import FormatError, NewerFormatError, RunNotFoundError
from tracklake._format import (
    KINDS,
    StreamId,
    parse_part_name,
    parse_segment_name,
    stream_dir,
)
from tracklake._format.attempt import read_attempt
from tracklake._format.bounded import bounded, bounded_iter
from tracklake._format.columns import booleans, numpy_of
from tracklake._format.cursor import Cursor
from tracklake._format.part import read_part_table
from tracklake._format.records import invalid_records
from tracklake._format.segment import SegmentContents
from tracklake._read.listing import list_streams as list_streams  # re-exported for _ops
from tracklake._read.listing import names_in, rank_dirs
from tracklake._read.location import read_root, regular_files_in
from tracklake._read.tails import read_live_segment

#: Rows per batch handed out from a compacted part (cut at record-group boundaries).
PART_BATCH_ROWS = 65536


@dataclass(frozen=True)
class Part:
    first_seq: int
    last_seq: int
    last_segment: int
    path: Path


@dataclass(frozen=True)
class Segment:
    number: int
    first_seq: int
    path: Path


@dataclass
class StreamFiles:
    """One listing of a stream directory: its parts and the segments not yet compacted."""

    stream: StreamId
    parts: list[Part] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    foreign: list[Path] = field(default_factory=list)  # files that are neither
    consumed: list[Segment] = field(default_factory=list)  # segments a part already holds
    merged: list[Part] = field(default_factory=list)  # parts a larger part already holds


def list_stream(root: Path, stream: StreamId, directory: Path | None = None) -> StreamFiles:
    """The parts and segments in the directory of `stream` (`directory`, if the caller
    has it already)."""
    directory = stream_dir(root, stream) if directory is None else directory
    out = StreamFiles(stream)
    try:
        names, others = regular_files_in(directory)
    except (FileNotFoundError, NotADirectoryError):
        return out
    out.foreign = [directory / name for name in others if not name.startswith(".")]
    segments: list[Segment] = []
    for name in names:
        if name.startswith("."):
            continue  # temporary files of a writer or of compaction
        if (part := parse_part_name(name)) is not None:
            out.parts.append(Part(part[0], part[1], part[2], directory / name))
        elif (seg := parse_segment_name(name)) is not None:
            segments.append(Segment(seg[0], seg[1], directory / name))
        else:
            out.foreign.append(directory / name)
    out.parts, out.merged = _without_merged(out.parts)
    covered = max((p.last_segment for p in out.parts), default=-1)
    out.segments = sorted((s for s in segments if s.number > covered), key=lambda s: s.number)
    out.consumed = sorted((s for s in segments if s.number <= covered), key=lambda s: s.number)
    return out


def stream_last_seq(root: Path, s: StreamId) -> int:
    """The last `seq` the store holds for stream `s` (-1 if it holds none)."""
    from tracklake._format.segment import read_segment

    files = list_stream(root, s)
    last = max((p.last_seq for p in files.parts), default=-1)
    for seg in files.segments:
        for batch in read_segment(seg.path).batches:
            last = max(last, int(batch.column(0)[len(batch) - 1].as_py()))
    return last


def positions_past_end(root: Path, cursor: Cursor, skip: frozenset[str] = frozenset()
                       ) -> tuple[list[tuple[str, int, int]], set[str]]:
    """The positions of `cursor` that are past what the store holds: (stream key,
    position, the stream's last seq) for each, and the keys looked at (streams with files,
    not in `skip`). A cursor only moves past records it delivered, so such a position
    was planted or restored from elsewhere, and would skip records never delivered.
    Streams without files are not looked at: not written yet, or dropped by retention.
    `NoAnswerError` if the file system gives no answer within the read timeout."""
    return bounded(lambda: _positions_past_end(root, cursor, skip), root)


def _positions_past_end(root: Path, cursor: Cursor, skip: frozenset[str]
                        ) -> tuple[list[tuple[str, int, int]], set[str]]:
    past: list[tuple[str, int, int]] = []
    looked: set[str] = set()
    for s in list_streams(root, cursor.project, cursor.run):
        key = s.key()
        if key in skip or key not in cursor.positions:
            continue
        looked.add(key)
        last = stream_last_seq(root, s)
        if cursor.positions[key] > last:
            past.append((key, cursor.positions[key], last))
    return past, looked


def _without_merged(parts: list[Part]) -> tuple[list[Part], list[Part]]:
    """(parts to read in seq order, parts whose seq range lies within another part's).

    Merging parts writes one part over their whole range before deleting them: until they
    are gone (or if the merger was killed first) each is skipped, so nothing is read twice.
    """
    parts.sort(key=lambda p: (p.first_seq, -p.last_seq, -p.last_segment))
    kept: list[Part] = []
    merged: list[Part] = []
    for p in parts:
        if kept and p.last_seq <= kept[-1].last_seq:
            merged.append(p)
        else:
            kept.append(p)
    return kept, merged


@dataclass(frozen=True)
class RunRecord:
    """A run as recorded by its ranks' attempt files."""

    project: str
    run: str
    attempts: tuple[dict[str, Any], ...]  # one per rank and attempt, oldest first

    @property
    def ranks(self) -> list[int]:
        return sorted({a["rank"] for a in self.attempts})

    @property
    def attempt_numbers(self) -> list[int]:
        return sorted({a["attempt"] for a in self.attempts})


def list_runs(root: str | os.PathLike[str] | None = None, project: str | None = None,
              run: str | None = None) -> list[RunRecord]:
    """Runs in the store (default root: $TRACKLAKE_ROOT, else ./tracklake-store; a
    directory or a pyarrow file system URL), from their attempt files; only the files of
    `project` / `run` are read when they are given. `NoAnswerError` naming the file or
    directory if the file system gives no answer for `read_timeout()` seconds."""
    path = read_root(root)
    return bounded(lambda: runs_from(path, project, run, read_attempt), path)


def runs_from(root: Path, project: str | None, run: str | None,
              read: Callable[[Path], dict[str, Any] | None],
              skip_runs: frozenset[tuple[str, str]] = frozenset(),
              runs: frozenset[tuple[str, str]] | None = None) -> list[RunRecord]:
    """`list_runs`, reading each attempt file with `read` (`read_attempt`, or a cache),
    but no file of the runs in `skip_runs` (and, given `runs`, of those runs alone)."""
    by_run: dict[tuple[str, str], list[dict[str, Any]]] = {}
    files = [f"{rankdir}/{name}"
             for _, _, _, rankdir in rank_dirs(root, "runs", project, run, skip_runs, runs)
             for name in names_in(root, rankdir)
             if name.startswith("attempt=") and name.endswith(".json")]
    for rel in sorted(files):
        path = root / rel
        try:
            record = read(path)
        except FileNotFoundError:
            continue  # removed by retention since it was listed
        if record is None:
            continue
        by_run.setdefault((record["project"], record["run"]), []).append(record)
    return [RunRecord(p, r, tuple(sorted(a, key=lambda x: (x["attempt"], x["rank"]))))
            for (p, r), a in sorted(by_run.items())]


def find_run(root: str | os.PathLike[str] | None, run: str, project: str | None = None
             ) -> RunRecord:
    """The run with id `run` (in `project` if given), or with the id and project `init()`
    stores for those names (``my run`` → ``my_run``); RunNotFoundError otherwise."""
    root = read_root(root)
    matches = [r for r in list_runs(root, project, run) if r.run == run]
    stored = _stored_names(run, project)
    if not matches and stored is not None and stored != (run, project):
        matches = [r for r in list_runs(root, stored[1], stored[0]) if r.run == stored[0]]
    if not matches:
        raise RunNotFoundError(f"no run {run!r} in {root}" + (f" project {project!r}"
                                                               if project else "")
                               + "; `tracklake runs` lists the runs there")
    if len(matches) > 1:
        raise RunNotFoundError(f"run id {run!r} exists in projects "
                               f"{', '.join(m.project for m in matches)}; pass --project")
    return matches[0]


def _stored_names(run: str, project: str | None) -> tuple[str, str | None] | None:
    """`run` and `project` as `init()` stores them, or None if it would refuse them."""
    from tracklake._errors import InvalidNameError
    from tracklake._format.naming import safe_name

    try:
        return safe_name(run, "run"), None if project is None else safe_name(project,
                                                                              "project")
    except InvalidNameError:
        return None


def read_part(part: Part) -> pa.Table:
    """A compacted part, in record (seq) order, its version, footer and page checksums
    checked (`FormatError` naming the file if it is damaged)."""
    table = read_part_table(part.path)
    order = pc.sort_indices(table, sort_keys=[("seq", "ascending")])
    return table.take(order).replace_schema_metadata(None)


def _split_at_groups(table: pa.Table, rows: int) -> Iterator[pa.RecordBatch]:
    seq = numpy_of(table.column("seq"))
    start = 0
    while start < len(seq):
        end = min(start + rows, len(seq))
        if end < len(seq):
            # extend to the end of the record group of the last row
            end = int(np.searchsorted(seq, seq[end - 1], side="right"))
        yield from table.slice(start, end - start).combine_chunks().to_batches()
        start = end


@dataclass
class ReadProblems:
    """Damage met while reading, reported instead of raised (the good records still come)."""

    torn: list[tuple[Path, int]] = field(default_factory=list)  # (segment, bytes)
    damaged: list[tuple[Path, str]] = field(default_factory=list)
    foreign: list[Path] = field(default_factory=list)


def read_stream(root: Path, stream: StreamId, after: int = -1,
                problems: ReadProblems | None = None) -> Iterator[pa.RecordBatch]:
    """Record batches of `stream` with seq > `after`, in seq order, each holding whole
    record groups. Live segments are read up to their last complete batch.

    A damaged part or segment is skipped and noted in `problems` (with what it loses);
    without `problems` it raises `FormatError` naming the file.
    """
    files = list_stream(root, stream)
    if problems is not None:
        for path in files.foreign:
            add_once(problems.foreign, path)
    last = after
    for part in files.parts:
        if part.last_seq <= last:
            continue
        try:
            table = read_part(part)
        except FileNotFoundError:
            # merged into a larger part since the listing: read the stream again from here
            yield from read_stream(root, stream, last, problems)
            return
        except NewerFormatError:
            raise
        except FormatError as exc:
            if problems is None:
                raise
            lost = f"records seq {part.first_seq}..{part.last_seq} of this stream are not read"
            add_once(problems.damaged, (part.path, f"{_why(exc, part.path)}; {lost}"))
            continue
        table = table.filter(pc.greater(table.column("seq"), last))
        for batch in _split_at_groups(table, PART_BATCH_ROWS):
            checked = _checked(stream.kind, batch, part.path, problems)
            if checked is not None:
                yield checked
            last = batch.column(0)[-1].as_py()
    live = files.segments
    for i, seg in enumerate(live):
        if i + 1 < len(live) and live[i + 1].first_seq - 1 <= last:
            continue  # the next segment starts at or before the first seq still wanted
        more = True
        while more:  # a live segment is read a bounded slice at a time
            try:
                contents = read_live_segment(seg.path, last)
            except FileNotFoundError:
                # compacted away between listing and opening: read the stream again from here
                yield from read_stream(root, stream, last, problems)
                return
            except NewerFormatError:
                raise
            except FormatError as exc:
                if problems is None:
                    raise
                lost = "every record of this segment is not read"
                add_once(problems.damaged, (seg.path, f"{_why(exc, seg.path)}; {lost}"))
                break
            more = contents.more
            _note_problems(contents, problems, i + 1 < len(live))
            for batch in contents.batches:
                newer = after_seq(batch, last)
                if newer is not None:
                    checked = _checked(stream.kind, newer, seg.path, problems)
                    if checked is not None:
                        yield checked
                    last = newer.column(0)[-1].as_py()


def _checked(kind: str, batch: pa.RecordBatch, path: Path, problems: ReadProblems | None
             ) -> pa.RecordBatch | None:
    """`batch` less the records that break their kind's rules (noted in `problems`; without
    it, FormatError naming the file); None if none is left."""
    invalid = invalid_records(kind, batch)
    if invalid is None:
        return batch
    bad, why = invalid
    if problems is None:
        raise FormatError(f"{path}: {why}")
    add_once(problems.damaged, (path, f"{why}; {int(bad.sum())} such record(s) are not read"))
    kept = batch.filter(booleans(~bad))
    return kept if kept.num_rows else None


def _why(exc: Exception, path: Path) -> str:
    """The message of `exc` without the path it starts with (reports name it already)."""
    return str(exc).removeprefix(f"{path}: ")


def after_seq(batch: pa.RecordBatch, last: int) -> pa.RecordBatch | None:
    """The rows of `batch` with seq > `last` (None if none): a batch written again after
    a failed fsync, or already held by a part, is not read twice."""
    seqs = batch.column(0)
    if seqs[len(seqs) - 1].as_py() <= last:
        return None
    return batch.filter(pc.greater(seqs, last)) if seqs[0].as_py() <= last else batch


def _note_problems(contents: SegmentContents, problems: ReadProblems | None,
                   superseded: bool) -> None:
    if problems is None:
        return
    if contents.damaged:
        add_once(problems.damaged, (contents.path, contents.damaged))
    elif contents.torn_bytes and superseded:
        add_once(problems.torn, (contents.path, contents.torn_bytes))


def add_once(found: list[Any], item: Any) -> None:
    """Record a problem once, however often a follower reads past it."""
    if item not in found:
        found.append(item)


def read_run(root: str | os.PathLike[str] | None, cursor: Cursor, *,
             kinds: tuple[str, ...] = KINDS, ranks: tuple[int, ...] | None = None,
             problems: ReadProblems | None = None
             ) -> Iterator[tuple[StreamId, pa.RecordBatch]]:
    """Batches of every stream of the cursor's run after the cursor. The cursor moves past
    each batch as it is handed out, so a consumer that stops after any batch resumes right
    after it; persist `cursor.to_json()` only once the destination holds every batch
    handed out so far. Each batch is read within `read_timeout()` seconds without an
    answer of the file system, else `NoAnswerError` names the file or directory."""
    path = read_root(root)
    return bounded_iter(_read_run(path, cursor, kinds, ranks, problems), path)


def _read_run(root: Path, cursor: Cursor, kinds: tuple[str, ...],
              ranks: tuple[int, ...] | None, problems: ReadProblems | None
              ) -> Iterator[tuple[StreamId, pa.RecordBatch]]:
    for stream in list_streams(root, cursor.project, cursor.run, kinds):
        if ranks is not None and stream.rank not in ranks:
            continue
        for batch in read_stream(root, stream, cursor.after(stream), problems):
            cursor.advance(stream, batch.column(0)[-1].as_py())
            yield stream, batch


def read_table(root: Path, stream: StreamId) -> pa.Table:
    """All records of a stream as one table (for tests and small streams)."""
    batches = list(read_stream(root, stream))
    schema = None if batches else _empty_schema(stream)
    return pa.Table.from_batches(batches, schema=schema)


def _empty_schema(stream: StreamId) -> pa.Schema:
    from tracklake._format import SCHEMAS

    if stream.kind not in SCHEMAS:
        raise FormatError(f"unknown record kind {stream.kind!r}")
    return SCHEMAS[stream.kind]
