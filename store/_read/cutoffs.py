"""Where a later attempt supersedes an earlier one, as the default views define it, for
readers that go through the streams rather than SQL (the exporters).

A rank's attempt A is superseded from step S on, where S is the lowest metric step any
later attempt of that rank logged: rows of A at or after S (metrics, texts, generations)
are hidden by the default views, and an exporter leaves them out too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from tracklake._format import StreamId
from tracklake._format.bounded import bounded
from tracklake._read.listing import list_streams
from tracklake._read.location import read_root
from tracklake._read.reader import ReadProblems, read_stream
from tracklake._read.snapshot import STEP_KINDS

__all__ = ["AttemptCutoffs"]


@dataclass
class AttemptCutoffs:
    """The cutoffs of one run, kept up to date across calls of `update`: each attempt's
    lowest metric step is read once, then only from where the last call stopped."""

    project: str
    run: str
    #: per stream key: (last seq read, lowest step seen, None before any step)
    _lowest: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    #: (rank, attempt) -> the step from which that attempt is superseded
    cutoffs: dict[tuple[int, int], int] = field(default_factory=dict)

    def update(self, root: str | os.PathLike[str], problems: ReadProblems | None = None
               ) -> dict[tuple[int, int], int]:
        """The cutoffs as the store holds them now (`NoAnswerError` if its file system
        gives no answer within the read timeout)."""
        path = read_root(root)
        return bounded(lambda: self._update(path, problems), path)

    def _update(self, root: Path, problems: ReadProblems | None) -> dict[tuple[int, int], int]:
        lowest: dict[int, dict[int, int | None]] = {}  # rank -> attempt -> lowest step
        for stream in list_streams(root, self.project, self.run, ("metrics",)):
            # attempt 1's steps cut nothing off: only whether it has metrics matters
            lowest.setdefault(stream.rank, {})[stream.attempt] = (
                None if stream.attempt < 2 else self._lowest_step(root, stream, problems))
        cutoffs: dict[tuple[int, int], int] = {}
        for rank, attempts in lowest.items():
            for attempt in attempts:
                later = [s for b, s in attempts.items() if b > attempt and s is not None]
                if later:
                    cutoffs[(rank, attempt)] = min(later)
        self.cutoffs = cutoffs
        return cutoffs

    def _lowest_step(self, root: Path, stream: StreamId,
                     problems: ReadProblems | None) -> int | None:
        last, lowest = self._lowest.get(stream.key(), (-1, None))
        for batch in read_stream(root, stream, last, problems):
            low = pc.min(batch.column("step")).as_py()
            if low is not None:
                lowest = low if lowest is None else min(lowest, low)
            last = batch.column("seq")[-1].as_py()
        self._lowest[stream.key()] = (last, lowest)
        return lowest

    def cutoff(self, rank: int, attempt: int) -> int | None:
        """The step from which `attempt` of `rank` is superseded, or None."""
        return self.cutoffs.get((rank, attempt))

    def visible(self, stream: StreamId, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The rows of `batch` (of `stream`) the default views show: without those at or
        after its attempt's cutoff (a row without a step is at none)."""
        cut = self.cutoffs.get((stream.rank, stream.attempt))
        if cut is None or stream.kind not in STEP_KINDS:
            return batch
        steps = batch.column("step")
        keep = pc.or_kleene(pc.is_null(steps), pc.less(steps, cut))
        return batch if pc.all(keep).as_py() else batch.filter(keep)
