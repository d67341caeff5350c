"""The compacting process a rank's writer starts by itself (store/_write/compactor.py):
``python -m tracklake._ops.auto ROOT PROJECT RUN RANK [PROJECT RUN RANK ...]``.

It lowers its own priority, compacts every attempt of that rank of the run (sealed
segments only while a writer lives; everything once it finished) and merges small parts.
Streams another compactor holds are tried again every few seconds, for at most
`WAIT_FOR_BUSY_SECONDS`: the one started at `finish()` must not give up because the one
started at the last seal is still at work. Killed at any moment, it leaves what
`compact` leaves (docs/format.md): the next compaction takes over.

Parts a merge replaced stay readable for a grace period (`replaced.py`); while the run
lives, a later seal's compaction deletes them. When every attempt of the rank is done,
no seal comes again: the compactor then starts one more compactor of the rank, in a
process that sleeps (a bare interpreter, nothing imported) until the last of them may go.
Once every writer of a run it compacted is done, it has the run catalog and bundles
brought up to date (`derive.start`).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from tracklake._format import KINDS, stream_dir
from tracklake._ops import derive
from tracklake._ops.compact import CompactionReport, compact_streams, writer_done
from tracklake._ops.replaced import grace_seconds
from tracklake._read.reader import list_streams

#: How long streams held by another compactor are waited for.
WAIT_FOR_BUSY_SECONDS = 600.0
_RETRY_SECONDS = 2.0
#: The process that waits for replaced parts' grace period: sleeps, then becomes the
#: compactor (argv: seconds, then the compactor's argv).
_SLEEP_THEN_EXEC = "import os, sys, time; time.sleep(float(sys.argv[1])); " \
                   "os.execv(sys.argv[2], sys.argv[2:])"
#: Slack past the last deadline, so that the later compactor finds every part past it.
_LATER_SLACK_SECONDS = 1.0


def compact_rank(root: Path, project: str, run: str, rank: int) -> CompactionReport:
    """Compact the streams of one rank of a run (every attempt), waiting for busy ones."""
    streams = [s for s in list_streams(root, project, run, KINDS) if s.rank == rank]
    deadline = time.monotonic() + WAIT_FOR_BUSY_SECONDS
    total = CompactionReport()
    while streams:
        report = compact_streams(root, streams)
        for name in ("parts_written", "segments_removed", "parts_merged", "parts_removed",
                     "parts_kept", "torn", "skipped"):
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


def _later(root: Path, project: str, run: str, rank: int, report: CompactionReport
           ) -> float | None:
    """Seconds until the rank's replaced parts may all go, if no seal will compact it
    again (every attempt's writer is done) and they may go within one grace period;
    None if no later compaction is owed."""
    if not report.parts_kept:
        return None
    now = time.time()
    streams = [s for s in list_streams(root, project, run, KINDS) if s.rank == rank]
    if not all(writer_done(root, s, now) for s in streams):
        return None  # a live writer's next seal compacts again
    wait = max(until for _, until in report.parts_kept) - now + _LATER_SLACK_SECONDS
    if wait > grace_seconds() + _LATER_SLACK_SECONDS:
        return None  # a holder dated in the future (another clock): `compact` deletes them
    return max(wait, 0.0)


def _start_later(argv: list[str], seconds: float) -> None:
    """Start the compactor `argv` after `seconds`, in a process of its own session that
    outlives this one; nobody waits for it."""
    devnull = [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_RDWR, 0) for fd in (0, 1)]
    os.posix_spawn(sys.executable, [sys.executable, "-S", "-c", _SLEEP_THEN_EXEC,
                                    f"{seconds:.3f}", sys.executable, *argv],
                   os.environ, file_actions=devnull, setsid=True)


def _run_done(root: Path, project: str, run: str) -> bool:
    """Whether every writer of every rank and attempt of the run is done."""
    now = time.time()
    streams = list_streams(root, project, run, KINDS)
    return bool(streams) and all(writer_done(root, s, now) for s in streams)


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
    finished = False
    for at in range(0, len(rest), 3):
        project, run, rank = rest[at], rest[at + 1], int(rest[at + 2])
        try:
            wait = _later(root, project, run, rank, compact_rank(root, project, run, rank))
            if wait is not None:
                _start_later(["-m", "tracklake._ops.auto", str(root), project, run,
                              str(rank)], wait)
            finished = finished or _run_done(root, project, run)
        except Exception as exc:  # reported, never raised into anyone: the segments stay
            print(f"tracklake: automatic compaction of run {run!r} rank {rank} under {root} "
                  f"failed: {exc.__class__.__name__}: {exc}; its data stays in segments, "
                  "readable; `tracklake compact` retries", file=sys.stderr, flush=True)
            status = 1
    if finished:
        try:
            derive.start(root)
        except Exception as exc:  # the catalog and bundles only save readers time
            print(f"tracklake: cannot start bringing the run catalog and bundles under "
                  f"{root} up to date: {exc.__class__.__name__}: {exc}; readers derive them",
                  file=sys.stderr, flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
