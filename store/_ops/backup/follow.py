"""``backup --follow``: back up a live run's sealed data as it is written, until every
selected run has ended or the caller asks to stop."""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Callable
from pathlib import Path

from tracklake._ops.backup.backup import BackupReport, backup
from tracklake._ops.backup.errors import BackupError
from tracklake._ops.backup.select import EVERYTHING, Selection
from tracklake._ops.retention.inventory import live_reason
from tracklake._read.reader import list_runs

#: How often the wait between passes looks at the stop flag.
_TICK = 0.2


def live_runs(root: Path, selection: Selection) -> tuple[int, list[str]]:
    """(how many selected runs exist, those still live) -- by the rule retention uses."""
    now = _dt.datetime.now(_dt.timezone.utc).timestamp()
    found, live = 0, []
    for record in list_runs(root):
        key = f"{record.project}/{record.run}"
        if not selection.takes_run(key):
            continue
        found += 1
        if live_reason(root, record.project, record.run, record.attempts, now) is not None:
            live.append(key)
    return found, live


def follow(root: Path, dest: str | Path, *, selection: Selection = EVERYTHING,
           interval: float = 10.0, should_stop: Callable[[], bool] = lambda: False,
           on_pass: Callable[[BackupReport], None] | None = None,
           on_error: Callable[[BackupError], None] | None = None) -> BackupReport:
    """Back up the sealed files of the selected runs every `interval` seconds; once a run
    exists and none is live, one last pass takes everything (the torn tails of killed
    writers too) and returns. `should_stop()` true ends after the pass under way; the
    manifest then names every file copied so far. A pass that fails (the destination is
    down) is reported to `on_error` and tried again after `interval`; a failing last pass
    raises."""
    total = BackupReport()
    while True:
        found, live = live_runs(root, selection)
        final = found > 0 and not live
        try:
            report = backup(root, dest, selection=selection, sealed_only=not final)
        except BackupError as exc:
            if final or on_error is None:
                raise
            on_error(exc)
            report = BackupReport()
        total.copied += report.copied
        total.bytes_copied += report.bytes_copied
        total.unchanged, total.bytes_total = report.unchanged, report.bytes_total
        total.skipped_live, total.unrecorded = report.skipped_live, report.unrecorded
        if on_pass is not None:
            on_pass(report)
        if final or should_stop():
            return total
        deadline = time.monotonic() + interval
        while time.monotonic() < deadline:
            if should_stop():
                return total
            time.sleep(_TICK)
