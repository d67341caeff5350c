"""The compacting process a rank's writer starts by itself (store/_write/compactor.py):
``python -m tracklake._ops.auto ROOT PROJECT RUN RANK [PROJECT RUN RANK ...]``.

It lowers its own priority, compacts every attempt of that rank of the run (sealed
segments only while a writer lives; everything once it finished) and merges small parts.
Streams another compactor holds are tried again every few seconds, for at most
`WAIT_FOR_BUSY_SECONDS`: the one started at `finish()` must not give up because the one
started at the last seal is still at work. Killed at any moment, it leaves what
`compact` leaves (docs/format.md): the next compaction takes over.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from tracklake._format import KINDS, stream_dir
from tracklake._ops.compact import CompactionReport, compact_streams
from tracklake._read.reader import list_streams

#: How long streams held by another compactor are waited for.
WAIT_FOR_BUSY_SECONDS = 600.0
_RETRY_SECONDS = 2.0


def compact_rank(root: Path, project: str, run: str, rank: int) -> CompactionReport:
    """Compact the streams of one rank of a run (every attempt), waiting for busy ones."""
    streams = [s for s in list_streams(root, project, run, KINDS) if s.rank == rank]
    deadline = time.monotonic() + WAIT_FOR_BUSY_SECONDS
    total = CompactionReport()
    while streams:
        report = compact_streams(root, streams)
        for name in ("parts_written", "segments_removed", "parts_merged", "torn", "skipped"):
            getattr(total, name).extend(getattr(report, name))
        total.records += report.records
        total.bytes_before += report.bytes_before
        total.bytes_after += report.bytes_after
        busy = set(report.busy)
        streams = [s for s in streams if stream_dir(root, s) in busy]
        if streams and time.monotonic() < deadline:
            time.sleep(_RETRY_SECONDS)
        else:
            total.busy.extend(report.busy)
            break
    return total


def main(argv: list[str]) -> int:
    """Entry point: ROOT, then one (PROJECT, RUN, RANK) triple per rank to compact, in
    turn. The exit status is 0 unless a compaction failed (each reported on stderr)."""
    root, rest = Path(argv[0]), argv[1:]
    if not rest or len(rest) % 3:
        print("usage: python -m tracklake._ops.auto ROOT PROJECT RUN RANK "
              "[PROJECT RUN RANK ...]", file=sys.stderr)
        return 2
    os.nice(19)  # CPU (and, with the default I/O scheduler classes, disk) after training's
    status = 0
    for at in range(0, len(rest), 3):
        project, run, rank = rest[at], rest[at + 1], int(rest[at + 2])
        try:
            compact_rank(root, project, run, rank)
        except Exception as exc:  # reported, never raised into anyone: the segments stay
            print(f"tracklake: automatic compaction of run {run!r} rank {rank} under {root} "
                  f"failed: {exc.__class__.__name__}: {exc}; its data stays in segments, "
                  "readable; `tracklake compact` retries", file=sys.stderr, flush=True)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
