"""Following a live run: read new metric and text records and hand them out step by step."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tracklake._format.attempt import TERMINAL_STATUSES, effective_status
from tracklake._format.cursor import Cursor
from tracklake._read.reader import ReadProblems, find_run, read_run


@dataclass
class Step:
    """What one step of the followed rank logged: metric values and texts."""

    step: int | None
    values: dict[str, float] = field(default_factory=dict)
    texts: list[tuple[str, str]] = field(default_factory=list)  # (key, text) in log order


@dataclass(frozen=True)
class Ended:
    """How a followed run ended: the status of each rank's latest attempt."""

    project: str
    run: str
    statuses: dict[int, str]  # rank -> status


def follow(root: Path, run_id: str, project: str | None, *, rank: int,
           emit: Callable[[Step], None], interval: float = 1.0, once: bool = False,
           problems: ReadProblems | None = None) -> Ended | None:
    """Call `emit(step)` for each step of `rank` as it is written (texts without a step
    at once), until every rank's latest attempt has ended; returns how it ended, or None
    if `once` stopped while it still runs."""
    record = find_run(root, run_id, project)
    cursor = Cursor(record.project, record.run)
    pending: dict[int, Step] = {}
    while True:
        for stream, batch in read_run(root, cursor, kinds=("metrics", "texts"), ranks=(rank,),
                                      problems=problems):
            steps = batch.column("step").to_pylist()
            keys = batch.column("key").to_pylist()
            if stream.kind == "metrics":
                for step, key, value in zip(steps, keys, batch.column("value").to_pylist(),
                                            strict=True):
                    pending.setdefault(step, Step(step)).values[key] = value
                continue
            for step, key, text in zip(steps, keys, batch.column("text").to_pylist(),
                                       strict=True):
                if step is None:
                    emit(Step(None, texts=[(key, text)]))
                else:
                    pending.setdefault(step, Step(step)).texts.append((key, text))
        record = find_run(root, run_id, project)
        latest = max(record.attempt_numbers)
        now = time.time()
        statuses = {a["rank"]: effective_status(a, latest, now)
                    for a in record.attempts if a["attempt"] == latest}
        ended = all(s in TERMINAL_STATUSES for s in statuses.values())
        done = once or ended
        # a step is complete once a later one has started (or the run is over)
        ready = sorted(pending) if done else sorted(pending)[:-1]
        for step in ready:
            emit(pending.pop(step))
        if done:
            return Ended(record.project, record.run, statuses) if ended else None
        time.sleep(interval)
