"""The runs a snapshot read from their files rather than from the catalog: what it found of
each, so that the settled ones can be catalogued for the next reader."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracklake._format import StreamId
from tracklake._format.columns import combined, numpy_of
from tracklake._read.attempt_rows import attempt_row
from tracklake._read.catalog import RunEntry, watched_paths
from tracklake._read.reader import StreamFiles


class FreshRuns:
    """Per run read from its files: its metric parts and summaries, its attempt records,
    and whether all of it was settled (no live segment, nothing damaged or half written)."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], RunEntry] = {}
        self._unsettled: set[tuple[str, str]] = set()

    def _entry(self, project: str, run: str) -> RunEntry:
        key = (project, run)
        if key not in self._entries:
            self._entries[key] = RunEntry(project, run, [], [], [], [])
        return self._entries[key]

    def add(self, stream: StreamId, files: StreamFiles, rows: list[pa.Table],
            settled: bool) -> None:
        """Metric stream `stream` as listed (`files`), with its parts' summaries (tables
        with the fields of `catalog.SUMMARY_FIELDS` among their columns)."""
        entry = self._entry(stream.project, stream.run)
        if not settled:
            self._unsettled.add((stream.project, stream.run))
        prefix = f"metrics/project={stream.project}/run={stream.run}/rank={stream.rank}/" \
                 f"attempt={stream.attempt}/"
        entry.parts.extend((prefix + p.path.name, p.first_seq, p.last_seq, p.last_segment)
                           for p in files.parts)
        entry.summaries.extend(rows)

    def attempt(self, path: Path, record: dict[str, Any] | None) -> dict[str, Any] | None:
        """`record`, read from attempt file `path` (None: claimed but not yet written, or
        damaged), noted for its run's entry."""
        *_, project, run, _rank, _name = str(path).rsplit("/", 4)
        key = (project.removeprefix("project="), run.removeprefix("run="))
        if record is None:
            self._unsettled.add(key)
        else:
            self._entry(*key).attempts.append(attempt_row(record))
        return record

    def entries(self, root: Path, complete: bool) -> list[RunEntry]:
        """The settled runs' entries, the mtimes of their paths taken now; none unless
        both the metrics and the attempt files were read (`complete`)."""
        if not complete:
            return []
        out = []
        for key, entry in self._entries.items():
            if key not in self._unsettled:
                entry.watched = watched_paths(root, *key)
                out.append(entry)
        return out


def resumed_in(summaries: pa.Table) -> list[tuple[str, str]]:
    """(project, run) of the runs whose metric summaries come from more than one attempt."""
    if not summaries.num_rows:
        return []
    bounds = pc.min_max(summaries.column("attempt"))
    if bounds["min"].as_py() == bounds["max"].as_py():
        return []  # one attempt number in all: no run has two (no grouping to pay for)
    # (project, run) as one code per row, from their dictionaries (`group_by` would load
    # pandas: see `columns`)
    codes = []
    names = []
    for column in ("project", "run"):
        encoded = combined(summaries.column(column)).dictionary_encode()
        codes.append(numpy_of(encoded.indices).astype(np.int64))
        names.append(encoded.dictionary.to_pylist())
    run = codes[0] * len(names[1]) + codes[1]
    pairs = np.unique(np.stack([run, numpy_of(summaries.column("attempt"))]), axis=1)
    runs, attempts = np.unique(pairs[0], return_counts=True)
    return [(names[0][int(c) // len(names[1])], names[1][int(c) % len(names[1])])
            for c in runs[attempts > 1]]
