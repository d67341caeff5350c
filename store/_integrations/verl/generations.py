"""verl's generation loggers, also writing to the store under verl's own keys."""

from __future__ import annotations

import os
import sys
from typing import Any

from verl.utils import tracking as _verl

from tracklake._integrations.verl.tracking import BACKEND, active_run, exported_backends
from tracklake._write.tracking import ALIASES

#: verl's keys, as its W&B/SwanLab/TensorBoard backends name them.
VAL_GENERATIONS_KEY = "val/generations"
DAPO_REWARD_COUNTS_KEY = "training/filter_groups/filtered_reward_counts"

_warned: set[tuple[str, str]] = set()


def _run_or_warn(project_name: Any, experiment_name: Any, what: str) -> Any:
    run = active_run(str(project_name), str(experiment_name))
    if run is None and (str(project_name), what) not in _warned:
        _warned.add((str(project_name), what))
        print(f"tracklake: {what} for project {project_name!r} experiment "
              f"{experiment_name!r} not recorded: no verl Tracking with 'tracklake' is open "
              f"in this process (pid {os.getpid()})", file=sys.stderr, flush=True)
    return run


def _in_process(loggers: Any) -> Any:
    """The backends verl serves itself: with ``tracklake`` listed, the exported ones
    (wandb, ...) are sidecar exporters reading the store, not objects in this process."""
    if BACKEND not in loggers:
        return loggers
    exported = exported_backends([str(b) for b in loggers])
    return [b for b in loggers if ALIASES.get(str(b), str(b)) not in exported]


class ValidationGenerationsLogger(_verl.ValidationGenerationsLogger):
    """verl's logger; with ``"tracklake"`` in `loggers` the samples (verl's (input, output,
    score) tuples) are also stored as generations under ``val/generations``."""

    def log(self, loggers: Any, samples: Any, step: int) -> None:
        super().log(_in_process(loggers), samples,  # type: ignore[no-untyped-call, unused-ignore]
                    step)
        if BACKEND in loggers:
            run = _run_or_warn(self.project_name, self.experiment_name, "validation generations")
            if run is not None:
                run.log_generations(list(samples), step=step, key=VAL_GENERATIONS_KEY)


class DapoFilteredRewardTableLogger(_verl.DapoFilteredRewardTableLogger):
    """verl's DAPO reward-count table; with ``"tracklake"`` in `loggers` each step's row
    (verl's ``reward:count, ...`` text) is also stored as a text under verl's key."""

    def log(self, loggers: Any, reward_counts: dict[Any, Any], step: int) -> None:
        super().log(_in_process(loggers), reward_counts, step)
        if BACKEND in loggers:
            run = _run_or_warn(self.project_name, self.experiment_name, "DAPO reward counts")
            if run is not None:
                row = {float(v): int(c) for v, c in reward_counts.items()}
                text = ", ".join(f"{v:g}:{row[v]}" for v in sorted(row))
                run.log_text(DAPO_REWARD_COUNTS_KEY, text, step=step)
