"""Following a live run: read new metric records and hand them out step by step."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from tracklake._format.attempt import TERMINAL_STATUSES, effective_status
from tracklake._format.cursor import Cursor
from tracklake._read.reader import find_run, read_run


def follow(root: Path, run_id: str, project: str | None, *, rank: int,
           emit: Callable[[int, dict[str, float]], None], interval: float = 1.0,
           once: bool = False) -> None:
    """Call `emit(step, {key: value})` for each step of `rank` as it is written, until the
    run's ranks have all finished (or at once with `once`)."""
    record = find_run(root, run_id, project)
    cursor = Cursor(record.project, record.run)
    pending: dict[int, dict[str, float]] = {}
    while True:
        for _, batch in read_run(root, cursor, kinds=("metrics",), ranks=(rank,)):
            for step, key, value in zip(batch.column("step").to_pylist(),
                                        batch.column("key").to_pylist(),
                                        batch.column("value").to_pylist(), strict=True):
                pending.setdefault(step, {})[key] = value
        record = find_run(root, run_id, project)
        latest = max(record.attempt_numbers)
        now = time.time()
        done = once or all(effective_status(a, latest, now) in TERMINAL_STATUSES
                           for a in record.attempts if a["attempt"] == latest)
        # a step is complete once a later one has started (or the run is over)
        ready = sorted(pending) if done else sorted(pending)[:-1]
        for step in ready:
            emit(step, pending.pop(step))
        if done:
            return
        time.sleep(interval)
