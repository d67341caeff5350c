"""How many bytes of media a run holds, for its limit (`TRACKLAKE_MEDIA_RUN_LIMIT`): what
this handle stored, plus what the run's other ranks and attempts stored, read from the
store's media records (only the new ones, at most once every `REFRESH` seconds, and only
when a media item is logged: a run that logs no media never reads anything)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pyarrow.compute as pc

from tracklake._errors import TracklakeError
from tracklake._format.cursor import Cursor

logger = logging.getLogger(__name__)

#: Seconds between two reads of what the run's other ranks and attempts stored.
REFRESH = 10.0


class RunMedia:
    """The media bytes of one run, as seen by one rank's attempt."""

    def __init__(self, root: Path, project: str, run: str, rank: int, attempt: int) -> None:
        self._root = root
        self._own_stream = (rank, attempt)
        self._cursor = Cursor(project, run)
        self._others = 0  # bytes the other ranks and attempts stored, as last read
        self._read_at: float | None = None
        self.own = 0  # bytes this handle stored

    def total(self) -> int:
        """The run's media bytes (the others' as read at most `REFRESH` seconds ago)."""
        now = time.monotonic()
        if self._read_at is None or now - self._read_at >= REFRESH:
            self._read_at = now
            self._read_others()
        return self._others + self.own

    def _read_others(self) -> None:
        from tracklake._read.reader import ReadProblems, read_run

        try:
            for stream, batch in read_run(self._root, self._cursor, kinds=("media",),
                                          problems=ReadProblems()):
                if (stream.rank, stream.attempt) != self._own_stream:
                    self._others += pc.sum(batch.column("size")).as_py() or 0
        except (OSError, TracklakeError) as exc:
            # what was not read is read at the next call (the cursor kept its place)
            self._read_at = None
            logger.debug("run %s: media of other ranks not read: %s", self._cursor.run, exc)
