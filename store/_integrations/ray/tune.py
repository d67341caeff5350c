"""`TracklakeLoggerCallback`: each Ray Tune trial a run of its own, written by the Tune
driver from the results it receives (no actor, no network)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from ray.tune.logger import LoggerCallback

from tracklake._integrations.ray.results import split_result
from tracklake._write.coerce import jsonable
from tracklake._write.run import init
from tracklake._write.tracking import StoreBackend


class TracklakeLoggerCallback(LoggerCallback):
    """``tune.RunConfig(callbacks=[TracklakeLoggerCallback()])``.

    A trial is run ``EXPERIMENT-TRIAL_ID`` of `project` (default: the experiment's
    directory name), named as Tune names it, its config (without ``callbacks``) and Tune's
    info keys (under ``ray/``) as the run's config, its results logged at ``result[step_key]``
    (``training_iteration``; ``timesteps_total`` for RL). A trial that Tune restores
    (``Tuner.restore``) continues its run as a new attempt, whose re-reported iterations
    supersede the old ones. A config that changes in the results (PBT) is logged again.
    At most `max_open_runs` trials are written at once; one more is said once and left out.
    """

    def __init__(self, *, project: str | None = None, root: str | os.PathLike[str] | None = None,
                 step_key: str = "training_iteration", excludes: Sequence[str] = (),
                 export: Sequence[str] | Mapping[str, Any] | None = None,
                 max_open_runs: int = 64) -> None:
        super().__init__()
        self._project = project
        self._root = root
        self._step_key = step_key
        self._excludes = tuple(excludes)
        self._export = export
        self._max_open_runs = max_open_runs
        self._runs: dict[str, StoreBackend] = {}
        self._configs: dict[str, str] = {}
        self._left_out: set[str] = set()
        self._info_logged: set[str] = set()

    def log_trial_start(self, trial: Any) -> None:
        if trial.trial_id in self._runs:
            return
        if len(self._runs) >= self._max_open_runs:
            if not self._left_out:
                print(f"tracklake: {len(self._runs)} trials are already being written "
                      f"(max_open_runs={self._max_open_runs}); trial {trial} and any more "
                      "are left out of the store", file=sys.stderr, flush=True)
            self._left_out.add(trial.trial_id)
            return
        experiment = trial.experiment_dir_name
        run = init(project=self._project or experiment, name=str(trial),
                   run_id=f"{experiment}-{trial.trial_id}", rank=0, root=self._root,
                   export=self._export, tags=[f"experiment:{experiment}"])
        self._runs[trial.trial_id] = StoreBackend(run)
        self._log_config(trial.trial_id, trial.config)

    def log_trial_restore(self, trial: Any) -> None:
        self.log_trial_start(trial)

    def log_trial_result(self, iteration: int, trial: Any, result: dict[str, Any]) -> None:
        store = self._runs.get(trial.trial_id)
        if store is None:
            return
        metrics, info = split_result(result, self._excludes)
        if isinstance(result.get("config"), Mapping):
            self._log_config(trial.trial_id, result["config"])
        if info and trial.trial_id not in self._info_logged:  # where it ran: once
            self._info_logged.add(trial.trial_id)
            store.run.log_config({"ray": jsonable(info)})
        step = result.get(self._step_key, iteration)
        store.log(metrics, int(step))

    def log_trial_save(self, trial: Any) -> None:
        store = self._runs.get(trial.trial_id)
        checkpoint = getattr(trial, "checkpoint", None)
        if store is None or checkpoint is None:
            return
        manifest = {"path": str(checkpoint.path),
                    "iteration": trial.last_result.get("training_iteration")}
        store.run.log_artifact(json.dumps(manifest).encode(), "checkpoint.json",
                               media_type="application/json")

    def log_trial_end(self, trial: Any, failed: bool = False) -> None:
        store = self._runs.pop(trial.trial_id, None)
        if store is not None:
            store.finish("failed" if failed else "finished")

    def on_experiment_end(self, trials: list[Any], **info: Any) -> None:
        for trial_id in list(self._runs):
            self._runs.pop(trial_id).finish("finished")

    def _log_config(self, trial_id: str, config: Mapping[str, Any]) -> None:
        """The trial's config, again only when it changed (PBT mutates it)."""
        values = {k: v for k, v in config.items() if k != "callbacks"}
        text = json.dumps(jsonable(values), sort_keys=True)
        if self._configs.get(trial_id) != text:
            self._configs[trial_id] = text
            self._runs[trial_id].run.log_config(jsonable(values))
