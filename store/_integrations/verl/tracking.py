"""verl's `Tracking` with a ``tracklake`` backend writing the run to the store."""

from __future__ import annotations

import hashlib
import os
import re
import sys
from collections.abc import Mapping
from typing import Any

from verl.utils import tracking as _verl

from tracklake._write.run import Run, init
from tracklake._write.tracking import (
    ALIASES,
    EXPORTED_BACKENDS,
    StoreBackend,
    status_for_exit_code,
)

#: The name to put in verl's ``trainer.logger``.
BACKEND = "tracklake"

#: The tag of every run verl's `Tracking` opens: exporters give such a run verl's names
#: where verl's own backends name things differently (MLflow params, docs/verl.md).
RUN_TAG = "tracklake.integration=verl"

#: This process's live tracklake runs, by (project_name, experiment_name): verl's generation
#: loggers are separate objects that know only those two names.
_active: dict[tuple[str, str], Run] = {}


def run_id_for(project_name: str, experiment_name: str,
               env: Mapping[str, str] = os.environ) -> str:
    """The run id of a verl job: $TRACKLAKE_RUN_ID, else one derived from the project and
    experiment names only, so that a restarted job (verl's resume) is a new attempt of the
    same run: ``verl-<experiment, made safe>-<12 hex digits of sha256(project NUL experiment)>``.
    """
    if env.get("TRACKLAKE_RUN_ID"):
        return env["TRACKLAKE_RUN_ID"]
    digest = hashlib.sha256(f"{project_name}\x00{experiment_name}".encode()).hexdigest()[:12]
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", experiment_name).strip("_.")[:60]
    return f"verl-{slug}-{digest}" if slug else f"verl-{digest}"


def exported_backends(backends: list[str]) -> list[str]:
    """The backends that sidecar exporters serve instead of verl (``tracking`` is verl's
    alias of ``wandb``), once each, in the order given."""
    return list(dict.fromkeys(
        ALIASES.get(b, b) for b in backends if ALIASES.get(b, b) in EXPORTED_BACKENDS))


def active_run(project_name: str, experiment_name: str) -> Run | None:
    """The unfinished run this process's `Tracking` opened for these names, if any."""
    run = _active.get((project_name, experiment_name))
    return run if run is not None and not run.finished else None


class Tracking(_verl.Tracking):
    """verl's `Tracking`; with ``"tracklake"`` among the backends it also writes to the store.

    wandb, mlflow, swanlab and tensorboard are then served by sidecar exporters that
    global rank 0 starts (they follow the run in the store), not in this process; every
    other backend is verl's, untouched. `finish(exit_code=...)` finishes the run as
    ``finished`` (0) or ``failed``; skipped non-metric values are counted in `skipped`.
    """

    # verl declares it without ClassVar; it is read on the class (a name check in __init__)
    supported_backend = [*_verl.Tracking.supported_backend, BACKEND]  # noqa: RUF012

    def __init__(self, project_name: Any, experiment_name: Any,
                 default_backend: Any = "console", config: Any = None) -> None:
        self.tracklake: StoreBackend | None = None
        backends = [default_backend] if isinstance(default_backend, str) else [
            str(b) for b in default_backend]
        if BACKEND not in backends:
            super().__init__(project_name, experiment_name, default_backend, config)
            return
        exported = exported_backends(backends)
        super().__init__(project_name, experiment_name,
                         [b for b in backends
                          if b != BACKEND and ALIASES.get(b, b) not in exported], config)
        project, experiment = str(project_name), str(experiment_name)
        run = init(project=project, name=experiment, config=config,
                   run_id=run_id_for(project, experiment), tags=[RUN_TAG],
                   export=exported or None)
        print(f"tracklake: verl run {run.id!r} attempt {run.attempt} (rank {run.rank}) is "
              f"written to {str(run.root)!r}", file=sys.stderr, flush=True)
        self.tracklake = StoreBackend(run)
        # verl types its backends as modules; any object with log() and finish() serves
        self.logger[BACKEND] = self.tracklake  # type: ignore[assignment, unused-ignore]
        _active[(project, experiment)] = run

    @property
    def skipped(self) -> dict[str, int]:
        return dict(self.tracklake.skipped) if self.tracklake is not None else {}

    def finish(self, exit_code: int = 0) -> None:
        """verl's backends, then the store: ``finished`` for exit code 0, else ``failed``."""
        try:
            super().finish(exit_code=exit_code)
        finally:
            store = getattr(self, "tracklake", None)
            if store is not None and not store.run.finished:
                store.finish(status_for_exit_code(exit_code))
