"""The process's current W&B run (``wandb.run``) and the runs not finished yet, whose
open rows are committed at exit before tracklake finishes their store runs."""

from __future__ import annotations

import atexit
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tracklake._integrations.wandb.run import WandbRun

run: WandbRun | None = None
_active: list[WandbRun] = []
_exit_hook = False


def started(new: WandbRun) -> None:
    """`new` is the current run (``wandb.run``) from now on."""
    global run, _exit_hook
    run = new
    _active.append(new)
    if not _exit_hook and new.store_run is not None:
        # registered after tracklake's own exit hook (installed by the first store run's
        # init), so it runs first: the open rows are stored before the runs are finished
        _exit_hook = True
        atexit.register(_commit_open_rows)


def finished(done: WandbRun) -> None:
    global run
    if done in _active:
        _active.remove(done)
    if run is done:
        run = _active[-1] if _active else None


def active() -> list[WandbRun]:
    return list(_active)


def _commit_open_rows() -> None:
    from tracklake._errors import RunStateError

    for open_run in list(_active):
        try:
            open_run.flush_row()
        except RunStateError:  # its store run was finished first (SIGTERM): nothing to do
            continue
