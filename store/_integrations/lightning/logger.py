"""`TracklakeLogger`: what a Lightning Trainer (or Fabric) logs, written to the store by
global rank zero (by every rank with ``all_ranks``)."""

from __future__ import annotations

import json
import os
from argparse import Namespace
from collections.abc import Mapping, Sequence
from typing import Any

from tracklake._integrations.lightning.base import Logger, rank_zero_experiment, rank_zero_only
from tracklake._write.coerce import jsonable
from tracklake._write.run import Run, init
from tracklake._write.tracking import StoreBackend

CHECKPOINTS = ("manifest", "none")


class TracklakeLogger(Logger):
    """``Trainer(logger=TracklakeLogger(project=...))``.

    `project`, `name`, `run_id`, `root`, `tags` and `export` are `tracklake.init`'s; the
    rank is Lightning's global rank (its DDP launcher sets no ``RANK``). `save_dir` is
    where Lightning puts checkpoints (None: the Trainer's ``default_root_dir``), never the
    store. `prefix` is put before every metric key with ``/``. `all_ranks` makes every rank
    a rank of the run; Lightning itself hands metrics to rank zero only, so other ranks log
    through ``logger.experiment.log(...)``. `log_checkpoints="manifest"` records a small
    JSON per saved checkpoint, never its file.

    ``finalize("success")`` (after every fit, validate, test) only flushes, so a ``test()``
    after ``fit()`` logs into the same run; the run finishes at exit, ``failed`` at once on
    a failure, ``killed`` when SLURM's requeue handler ends it (its next job is the next
    attempt).
    """

    def __init__(self, project: str = "lightning_logs", *, name: str | None = None,
                 run_id: str | None = None, root: str | os.PathLike[str] | None = None,
                 save_dir: str | None = None, prefix: str = "",
                 export: Sequence[str] | Mapping[str, Any] | None = None,
                 tags: Sequence[str] | None = None, all_ranks: bool = False,
                 log_checkpoints: str = "manifest") -> None:
        super().__init__()
        if log_checkpoints not in CHECKPOINTS:
            raise ValueError(f"log_checkpoints must be one of {CHECKPOINTS}, not "
                             f"{log_checkpoints!r}")
        self._project = project
        self._options: dict[str, Any] = {"project": project, "name": name, "run_id": run_id,
                                         "root": root, "tags": tags, "export": export}
        self._save_dir = save_dir
        self._prefix = prefix
        self._all_ranks = all_ranks
        self._log_checkpoints = log_checkpoints
        self._store: StoreBackend | None = None

    # -- what Lightning asks of a logger --------------------------------------------------

    @property
    def name(self) -> str:
        return self._project

    @property
    def version(self) -> str | None:
        """The run id: the open run's on a rank that writes, else the one asked for."""
        if self._writes():
            return self._open().run.id
        return self._options["run_id"] or os.environ.get("TRACKLAKE_RUN_ID")

    @property
    def save_dir(self) -> str | None:
        return self._save_dir

    @property
    def experiment(self) -> Any:
        """The tracklake `Run` (a do-nothing stand-in on ranks that do not write)."""
        if self._all_ranks:
            return self._open().run
        return self._rank_zero_run()

    @rank_zero_experiment
    def _rank_zero_run(self) -> Run:
        return self._open().run

    def log_hyperparams(self, params: Mapping[str, Any] | Namespace, *args: Any,
                        **kwargs: Any) -> None:
        if not self._writes():
            return
        values = vars(params) if isinstance(params, Namespace) else dict(params)
        self._open().run.log_config(jsonable(values))

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        if not self._writes():
            return
        if self._prefix:
            metrics = {f"{self._prefix}/{k}": v for k, v in metrics.items()}
        self._open().log(metrics, step)

    def log_text(self, key: str, text: str, step: int | None = None) -> None:
        """A text record (W&B's logger has `log_text` for tables; this is one string)."""
        if self._writes():
            self._open().run.log_text(key, text, step=step)

    def log_generations(self, key: str, samples: Sequence[Any], step: int | None = None
                        ) -> None:
        """Generated samples (mappings with input/output/score), as `Run.log_generations`."""
        if self._writes():
            self._open().run.log_generations(samples, step=step, key=key)

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        """A small JSON naming the checkpoint Lightning saved (called on global rank zero)."""
        if not self._writes() or self._log_checkpoints == "none":
            return
        score = checkpoint_callback.best_model_score
        current = checkpoint_callback.current_score
        manifest = {"last_model_path": checkpoint_callback.last_model_path,
                    "best_model_path": checkpoint_callback.best_model_path,
                    "best_model_score": None if score is None else float(score),
                    "current_score": None if current is None else float(current),
                    "monitor": checkpoint_callback.monitor}
        self._open().run.log_artifact(json.dumps(manifest).encode(), "checkpoint.json",
                                      media_type="application/json")

    def save(self) -> None:
        """Nothing: Lightning calls this after every `log_metrics`, and the run's own
        writer already flushes on its interval."""

    def finalize(self, status: str) -> None:
        store = self._store
        if store is None or store.run.finished:
            return
        if status == "success":
            store.run.flush()
        else:  # "failed", or "finished" from SLURM's requeue handler, which ends the job
            self._store = None
            store.finish("failed" if status == "failed" else "killed")

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (``ddp_spawn``) without the open run: the child opens its own."""
        state = dict(self.__dict__)
        state["_store"] = None
        return state

    # -- the run --------------------------------------------------------------------------

    def _writes(self) -> bool:
        return self._all_ranks or rank_zero_only.rank == 0

    def _open(self) -> StoreBackend:
        if self._store is None:
            self._store = StoreBackend(init(rank=rank_zero_only.rank, **self._options))
        return self._store
