"""`TracklakeCallback`: a transformers Trainer's logs, config, checkpoints and TRL's
completions written to the store, by world rank zero (every rank with ``all_ranks``).

The values the Trainer hands to ``on_log`` are already reduced across processes, so one
rank logs them, at ``state.global_step``, under the names W&B and TensorBoard show
(``train/loss``, ``eval/loss``, ``test/…``). The run id travels in every checkpoint (the
callback is an `ExportableState`), so ``trainer.train(resume_from_checkpoint=…)`` continues
the run as a new attempt whose steps supersede the old attempt's from the checkpoint on.
"""

from __future__ import annotations

import json
import os
from typing import Any

from transformers import TrainerCallback
from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK, rewrite_logs
from transformers.trainer_callback import ExportableState

from tracklake._integrations.transformers.completions import completion_file, read_completions
from tracklake._integrations.transformers.config import trainer_config
from tracklake._write.run import Run, init
from tracklake._write.tracking import StoreBackend

#: The name ``report_to`` takes once `register()` ran (importing
#: ``tracklake.integrations.transformers`` runs it).
REPORT_TO = "tracklake"
CHECKPOINTS = ("manifest", "none")


class TracklakeCallback(TrainerCallback, ExportableState):
    """Writes the Trainer's run to the store: ``Trainer(..., callbacks=[TracklakeCallback()])``.

    `project` defaults to ``args.project`` (else $TRACKLAKE_PROJECT, else "huggingface"),
    `name` to ``args.run_name``; `run_id`, `root`, `tags` and `export` are `tracklake.init`'s.
    `all_ranks` makes every process a rank of the run (each logs what it is handed);
    `checkpoints="manifest"` records a small JSON per saved checkpoint, never its files;
    `completions` turns TRL's completions files into generations; `finish_on_train_end`
    finishes the run when ``train()`` ends (otherwise at exit, so a later ``evaluate()``
    still logs into it).
    """

    def __init__(self, *, project: str | None = None, name: str | None = None,
                 run_id: str | None = None, root: str | None = None,
                 tags: list[str] | None = None, export: list[str] | None = None,
                 all_ranks: bool = False, checkpoints: str = "manifest",
                 completions: bool = True, finish_on_train_end: bool = False) -> None:
        if checkpoints not in CHECKPOINTS:
            raise ValueError(f"checkpoints must be one of {CHECKPOINTS}, not {checkpoints!r}")
        self.options: dict[str, Any] = {
            "project": project, "name": name, "run_id": run_id, "root": root, "tags": tags,
            "export": export, "all_ranks": all_ranks, "checkpoints": checkpoints,
            "completions": completions, "finish_on_train_end": finish_on_train_end}
        self.run_id: str | None = run_id  # restored from a checkpoint by `from_state`
        self._run: Run | None = None
        self._store: StoreBackend | None = None
        self._trial: str | None = None
        #: (step, generations key) of the completions file TRL writes after the last on_log
        self._completions_due: tuple[int, str] | None = None
        #: (step, key, samples as JSON) last logged: TRL rewrites a file with the same
        #: samples (as JSON, where a NaN equals a NaN)
        self._completions_last: tuple[int, str, str] | None = None

    # -- ExportableState: the run id goes into every checkpoint ---------------------------

    def state(self) -> dict[str, Any]:
        return {"args": dict(self.options), "attributes": {"run_id": self.run_id}}

    # -- the run ------------------------------------------------------------------------

    def _writes(self, args: Any, state: Any) -> bool:
        return bool(self.options["all_ranks"] or state.is_world_process_zero)

    def _start(self, args: Any, state: Any, model: Any) -> None:
        """Open the run (once, or once per trial of a hyperparameter search)."""
        trial = state.trial_name if state.is_hyper_param_search else None
        if self._run is not None and trial == self._trial:
            return
        if self._run is not None:  # the next trial of a search: a run of its own
            self._read_completions(args)
            self._finish("finished")
        self._trial = trial
        saved = (state.stateful_callbacks.get(type(self).__name__) or {})
        saved_id = (saved.get("attributes") or {}).get("run_id") if isinstance(
            saved, dict) else None
        run_id = (self.options["run_id"] or os.environ.get("TRACKLAKE_RUN_ID")
                  or (saved_id if state.global_step > 0 and trial is None else None))
        project = (self.options["project"] or getattr(args, "project", None)
                   or os.environ.get("TRACKLAKE_PROJECT") or "huggingface")
        name = trial or self.options["name"] or getattr(args, "run_name", None)
        tags = list(self.options["tags"] or [])
        if trial is not None and getattr(args, "run_name", None):
            tags.append(f"search:{args.run_name}")
        self._run = init(project=project, name=name, run_id=run_id, root=self.options["root"],
                         rank=args.process_index, tags=tags, export=self.options["export"])
        self._store = StoreBackend(self._run)
        self.run_id = self._run.id
        config = trainer_config(args, model)
        if trial is not None and state.trial_params:
            config["trial"] = dict(state.trial_params)
        self._run.log_config(config)

    def _finish(self, status: str) -> None:
        store, self._store, self._run = self._store, None, None
        if store is not None and not store.run.finished:
            store.finish(status)

    # -- the Trainer's events -------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       **kwargs: Any) -> None:
        # a checkpoint written without this callback has no entry, and the Trainer's next
        # save would fail looking it up (every rank: any of them may save)
        state.stateful_callbacks.setdefault(type(self).__name__, self.state())
        if self._writes(args, state):
            self._start(args, state, model)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               model: Any = None, **kwargs: Any) -> None:
        if not self._writes(args, state) or not logs:
            return
        self._start(args, state, model)  # evaluate() or predict() without train()
        assert self._store is not None
        self._store.log(rewrite_logs(logs), state.global_step)
        self._read_completions(args)
        if self._completions_on(args, state):
            # TRL's own test of the mode it logs in: the model's training flag
            evaluating = model is not None and not getattr(model, "training", True)
            self._completions_due = (state.global_step,
                                     "eval/completions" if evaluating else "completions")

    def on_predict(self, args: Any, state: Any, control: Any, metrics: dict[str, Any],
                   model: Any = None, **kwargs: Any) -> None:
        if not self._writes(args, state) or not metrics:
            return
        self._start(args, state, model)
        assert self._store is not None
        self._store.log(rewrite_logs(metrics), state.global_step)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self._writes(args, state) or self._run is None:
            return
        self._read_completions(args)
        if self.options["checkpoints"] == "manifest":
            step = state.global_step
            manifest = {"path": os.path.join(args.output_dir, f"checkpoint-{step}"),
                        "step": step, "best_metric": state.best_metric,
                        "best_model_checkpoint": state.best_model_checkpoint}
            self._run.log_artifact(json.dumps(manifest).encode(), f"checkpoint-{step}.json",
                                   media_type="application/json", step=step)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._run is not None:
            self._read_completions(args)

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._run is not None:
            self._read_completions(args)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._run is None:
            return
        self._read_completions(args)
        if state.best_metric is not None and state.best_global_step:
            self._run.log({"train/best_metric": state.best_metric,
                           "train/best_global_step": state.best_global_step},
                          step=state.global_step)
        if self.options["finish_on_train_end"]:
            self._finish("finished")
        else:
            self._run.flush()

    def _completions_on(self, args: Any, state: Any) -> bool:
        """Whether TRL writes completions files here: on the main process only."""
        return bool(self.options["completions"] and getattr(args, "log_completions", False)
                    and state.is_world_process_zero)

    def _read_completions(self, args: Any) -> None:
        """The completions file TRL wrote after the last on_log, once, as generations: a
        training log's under ``completions``, an evaluation's under ``eval/completions``."""
        due, self._completions_due = self._completions_due, None
        if due is None or self._run is None:
            return
        step, key = due
        samples = read_completions(completion_file(args.output_dir, step))
        if not samples:
            return
        seen = (step, key, json.dumps(samples, sort_keys=True, default=str))
        if seen != self._completions_last:
            self._run.log_generations(samples, step=step, key=key)
            self._completions_last = seen


def register() -> None:
    """Make ``report_to="tracklake"`` name this callback, in this process."""
    INTEGRATION_TO_CALLBACK[REPORT_TO] = TracklakeCallback
