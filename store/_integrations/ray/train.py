"""`TracklakeTrainCallback`: every Ray Train worker's reports, as the ranks of one run,
written by the Train controller (which receives them all)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from ray.train.v2._internal.execution.callback import ControllerCallback
from ray.train.v2.api.callback import UserCallback

from tracklake._integrations.ray.results import split_result
from tracklake._write.run import init
from tracklake._write.tracking import StoreBackend


class TracklakeTrainCallback(UserCallback):
    """``RunConfig(name="job", callbacks=TracklakeTrainCallback().callbacks())``.

    The run id is the run's name (``RunConfig.name``, stable across restarts, unlike the
    context's per-attempt id); worker `i`'s report is rank `i`, logged at
    ``report[step_key]`` when given, else at the count of that worker's reports in this
    attempt. A worker group that Ray restarts after a failure starts each rank's next
    attempt (the ranks that raised end ``failed``, the others ``killed``); give `step_key`
    so that a group resumed from a checkpoint logs at the steps it resumed from. The ranks
    finish when the controller finishes the training (``finished``, or ``failed`` with an
    error): that is the second callback `callbacks()` returns, as Ray gives user callbacks
    no end of training.
    """

    def __init__(self, *, project: str = "ray-train", root: str | os.PathLike[str] | None = None,
                 step_key: str | None = None,
                 export: Sequence[str] | Mapping[str, Any] | None = None) -> None:
        self._project = project
        self._root = root
        self._step_key = step_key
        self._export = export
        self._ranks: dict[int, StoreBackend] = {}
        self._reports: dict[int, int] = {}

    def callbacks(self) -> list[Any]:
        """This callback and the one that ends the run, for ``RunConfig(callbacks=...)``."""
        return [self, _EndOfTraining(self)]

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]],
                     checkpoint: Any) -> None:
        name = run_context.get_run_config().name
        for rank, report in enumerate(metrics):
            store = self._ranks.get(rank)
            if store is None:
                store = self._ranks[rank] = StoreBackend(init(
                    project=self._project, name=name, run_id=name, rank=rank, root=self._root,
                    export=self._export if rank == 0 else None))
                self._reports[rank] = 0
            values, _ = split_result(report)
            step = report.get(self._step_key) if self._step_key else None
            store.log(values, int(step) if step is not None else self._reports[rank])
            self._reports[rank] += 1

    def after_exception(self, run_context: Any, worker_exceptions: dict[int, Exception]
                        ) -> None:
        """The ranks that raised end ``failed``, the others ``killed`` (Ray stops the whole
        worker group): a restarted group's reports are each rank's next attempt."""
        for rank in list(self._ranks):
            self._ranks.pop(rank).finish("failed" if rank in worker_exceptions else "killed")

    def finish(self, status: str) -> None:
        """End every rank still open with `status`."""
        for rank in list(self._ranks):
            self._ranks.pop(rank).finish(status)


class _EndOfTraining(ControllerCallback):
    """Ray's controller hook at the end of training (an internal interface: the tested
    range of Ray is pinned in pyproject.toml's ``ray`` extra)."""

    def __init__(self, callback: TracklakeTrainCallback) -> None:
        self._callback = callback

    def after_controller_finish(self, result: Any) -> None:
        self._callback.finish("failed" if getattr(result, "error", None) else "finished")
