"""The W&B run object of `tracklake.wandb`: W&B's attributes and methods over one
tracklake `Run` (none in ``mode="disabled"``, which writes nothing)."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from tracklake._errors import WandbError, WandbUsageError
from tracklake._integrations.wandb.artifacts import (
    Artifact,
    matched_files,
    store_path,
)
from tracklake._integrations.wandb.config import Config, Summary
from tracklake._integrations.wandb.history import Axes, History, MetricRule
from tracklake._integrations.wandb.missing import missing_attribute
from tracklake._integrations.wandb.settings import Settings
from tracklake._integrations.wandb.values import RowWriter, flat_row, frozen, summary_text
from tracklake._write.coerce import jsonable
from tracklake._write.run import Run
from tracklake._write.tracking import status_for_exit_code

#: Event kinds this module records (the W&B exporter reads the first two).
DEFINE_METRIC_EVENT = "wandb.define_metric"
SUMMARY_EVENT = "wandb.summary"
INIT_EVENT = "wandb.init"
PREEMPTING_EVENT = "wandb.mark_preempting"

#: Summary values set within this many seconds go into one event.
SUMMARY_SECONDS = 10.0

_ALERT_LEVELS = {"INFO": "info", "WARN": "warning", "WARNING": "warning", "ERROR": "error"}


class WandbRun:
    """What ``wandb.init()`` returns: ``log``, ``define_metric``, ``config``, ``summary``,
    ``finish`` and the rest of W&B's run API, written to the store."""

    def __init__(self, store: Run | None, *, project: str, name: str | None, run_id: str,
                 settings: Settings, identity: Mapping[str, Any],
                 allow_val_change: bool = False) -> None:
        self._store = store
        self._writer = RowWriter(store) if store is not None else None
        self._history = History()
        self._axes = Axes()
        self._said: set[str] = set()
        self._saved: dict[str, tuple[float, int]] = {}  # live save() files: mtime, size
        self._live_globs: list[tuple[str, str | None]] = []
        self._finished = False
        self._lock = threading.RLock()  # the open row, from the loop and from other threads
        self._summary_pending: dict[str, Any] = {}  # set, not yet in an event
        self._summary_written = -SUMMARY_SECONDS  # when the last summary event was written
        self.id = run_id
        self.name = name if name is not None else run_id
        self.project = project
        self.entity = identity.get("entity")
        self.group = identity.get("group")
        self.job_type = identity.get("job_type")
        self.notes = identity.get("notes")
        self.tags: tuple[str, ...] = tuple(identity.get("tags") or ())
        self.settings = settings
        self._dir: str | None = None  # made when first asked for
        self.url = None  # nothing is online
        self.start_time = time.time()
        self.resumed = store is not None and store.attempt > 1  # attempts count from 1
        self.offline = True
        self.disabled = store is None
        self.sweep_id = None
        self.config = Config(self._config_changed, allow_val_change=allow_val_change)
        self.summary = Summary(self._summary_set)

    # -- W&B's attributes --------------------------------------------------------------

    @property
    def step(self) -> int:
        """W&B's current step (the row the next call logs to)."""
        return self._history.step

    @property
    def dir(self) -> str:
        """W&B's run directory: files written here are stored as artifacts at `finish()`
        (as W&B uploads them). A temporary directory of this run, never the store."""
        if self._dir is None:
            self._dir = tempfile.mkdtemp(prefix=f"tracklake-wandb-{self.id}-")
        return self._dir

    @property
    def path(self) -> str:
        return "/".join(str(p) for p in (self.entity, self.project, self.id) if p)

    @property
    def store_run(self) -> Run | None:
        """The tracklake `Run` written to (None in disabled mode)."""
        return self._store

    def __getattr__(self, name: str) -> Any:
        raise missing_attribute(f"Run.{name}", "wandb run")

    # -- logging -----------------------------------------------------------------------

    def log(self, data: Mapping[str, Any], step: int | None = None,
            commit: bool | None = None, sync: bool | None = None) -> None:
        """``wandb.log``: W&B's steps and rows (history.py); the values as values.py says."""
        self._check_open("log")
        if not isinstance(data, Mapping):
            raise TypeError("wandb.log must be passed a dictionary")
        if any(not isinstance(key, str) for key in data):
            raise TypeError("Key values passed to `wandb.log` must be strings.")
        with self._lock:
            current = self._history.step
            rows = self._history.log(frozen(data), step, commit)
            if rows is not None:
                self._commit(rows)
        if rows is None:
            self._say_once("lower-step", f"tried to log to step {step} that is less than the "
                           f"current step {current}; W&B ignores such data, and so does "
                           "tracklake.wandb (said once; `finish()` reports how many calls)")

    def _commit(self, rows: list[tuple[int, dict[str, Any]]]) -> None:
        if self._writer is None:
            return
        for wandb_step, row in rows:
            flat = row if self._writer.plain(row) else flat_row(row, self._writer.skip)
            by_step, notes = self._axes.split(flat, wandb_step)
            for note in notes:
                self._say(note)
            for step, values in sorted(by_step.items()):
                self.summary._logged(self._writer.write(step, values))
            if by_step.keys() - {wandb_step}:
                # keys on an axis of their own sit at its values; what is recorded outside
                # rows (system metrics, texts, events) stays at W&B's step
                self._writer.run.log({}, step=wandb_step)
        self._flush_summary(force=False)

    def define_metric(self, name: str, step_metric: str | Any = None,
                      step_sync: bool | None = None, hidden: bool | None = None,
                      summary: str | None = None, goal: str | None = None,
                      overwrite: bool | None = None) -> MetricRule:
        """``wandb.define_metric``: keys matching `name` (a glob with a trailing ``*``) are
        stored at the value of `step_metric`; the rule is recorded for the exporters."""
        self._check_open("define_metric")
        if not isinstance(name, str) or not name:
            raise WandbError("define_metric() requires non-empty name argument")
        if step_metric is not None and not isinstance(step_metric, str):
            step_metric = getattr(step_metric, "name", step_metric)
        if summary is not None:
            from tracklake._integrations.wandb.history import SUMMARY_OPS

            unknown = [s for s in summary.lower().split(",") if s not in SUMMARY_OPS]
            if unknown:
                raise WandbError(f"Unhandled define_metric() arg: summary op: {unknown[0]}")
        if goal is not None and goal not in ("minimize", "maximize"):
            raise WandbError(f"Unhandled define_metric() arg: goal: {goal!r}")
        try:
            with self._lock:
                rule = self._axes.define(MetricRule(name, step_metric, step_sync, hidden,
                                                    summary, goal), overwrite=overwrite)
        except ValueError as exc:
            raise WandbError(str(exc)) from None
        self._event(DEFINE_METRIC_EVENT, name, json.dumps(rule.options(), sort_keys=True))
        return rule

    def _config_changed(self, values: dict[str, Any]) -> None:
        if self._store is None or self._finished:
            return
        try:
            self._store.log_config(jsonable(values))  # jsonable: int keys (id2label) as str
        except (TypeError, ValueError) as exc:
            self._say_once(f"config:{exc}", f"config not stored: {exc}")

    def _summary_set(self, values: dict[str, Any]) -> None:
        """Values the code set: one event for what was set within `SUMMARY_SECONDS` (code
        that sets a best value at every step makes a few events, not one a step)."""
        with self._lock:
            self._summary_pending.update(values)
        self._flush_summary(force=False)

    def _flush_summary(self, *, force: bool) -> None:
        with self._lock:
            now = time.monotonic()
            if not self._summary_pending or (
                    not force and now - self._summary_written < SUMMARY_SECONDS):
                return
            pending, self._summary_pending = self._summary_pending, {}
            self._summary_written = now
        self._event(SUMMARY_EVENT, "summary", summary_text(pending))

    def _event(self, kind: str, title: str, text: str, level: str = "info") -> None:
        if self._store is not None and not self._finished:
            self._store._add("events", [{"time": time.time_ns() // 1000, "step": None,
                                         "level": level, "kind": kind, "title": title,
                                         "text": text}])

    def alert(self, title: str, text: str, level: Any = None,
              wait_duration: Any = None) -> None:
        """``wandb.alert``: an alert event (exporters forward it where they can)."""
        self._check_open("alert")
        name = str(getattr(level, "value", level) or "INFO").upper()
        if self._store is not None:
            self._store.alert(str(title), str(text), level=_ALERT_LEVELS.get(name, "warning"))

    def log_artifact(self, artifact_or_path: Artifact | str | os.PathLike[str],
                     name: str | None = None, type: str | None = None,
                     aliases: Sequence[str] | None = None,
                     tags: Sequence[str] | None = None) -> Artifact | None:
        """``wandb.log_artifact``: the files stored as blobs at the current step."""
        self._check_open("log_artifact")
        if self._store is None:
            return artifact_or_path if isinstance(artifact_or_path, Artifact) else None
        step = self._last_step()
        if isinstance(artifact_or_path, Artifact):
            artifact_or_path.store(self._store, aliases=aliases, tags=tags, step=step)
            return artifact_or_path
        store_path(self._store, artifact_or_path, name=name, type=type, aliases=aliases,
                   step=step)
        return None

    def save(self, glob_str: str | os.PathLike[str] | None = None,
             base_path: str | os.PathLike[str] | None = None, policy: str = "live",
             glob: bool = True) -> bool | list[str]:
        """``wandb.save``: the matching files stored as artifacts now; with
        ``policy="live"`` (W&B's default) changed files are stored again at `finish()`."""
        self._check_open("save")
        if glob_str is None or self._store is None:
            return True
        files = matched_files(glob_str, base_path, glob)
        for name, path in files:
            self._store_saved(name, path)
        if policy == "live":
            self._live_globs.append((os.fspath(glob_str),
                                     None if base_path is None else os.fspath(base_path)))
        return [str(p) for _, p in files]

    def _store_saved(self, name: str, path: Path) -> None:
        assert self._store is not None
        stat = path.stat()
        if self._saved.get(name) == (stat.st_mtime, stat.st_size):
            return
        self._saved[name] = (stat.st_mtime, stat.st_size)
        self._store.log_artifact(path, name=name.replace("/", "_"), step=self._last_step(),
                                 metadata={"wandb_save": name})

    def watch(self, *args: Any, **kwargs: Any) -> None:
        """No gradients or parameters are logged (said once)."""
        self._say_once("watch", "watch() logs nothing here: gradients and parameters are not "
                       "recorded (log their norms as metrics instead)")

    def unwatch(self, *args: Any, **kwargs: Any) -> None:
        self._say_once("watch", "unwatch() does nothing: watch() logs nothing here")

    def mark_preempting(self) -> None:
        """Record that the run expects to be preempted (an event)."""
        self._event(PREEMPTING_EVENT, "preempting", "the run marked itself as preempting")

    def _label(self, *args: Any, **kwargs: Any) -> None:
        """W&B's telemetry label (transformers calls it); nothing to record."""

    def log_code(self, *args: Any, **kwargs: Any) -> None:
        """The code is captured with the run's identity (git commit and dirty state)."""

    # -- the end -----------------------------------------------------------------------

    def finish(self, exit_code: int | None = None, quiet: bool | None = None) -> None:
        """``wandb.finish``: commits the open row; 0 or None is ``finished``, any other
        exit code ``failed``. A second call does nothing, as in W&B."""
        if self._finished:
            return
        self.flush_row()
        if self._store is not None:
            for glob_str, base in self._live_globs:
                for name, path in matched_files(glob_str, base, True):
                    self._store_saved(name, path)
            if self._dir is not None:
                for name, path in matched_files(os.path.join(self._dir, "**", "*"),
                                                self._dir, True):
                    self._store_saved(name, path)
        self._finished = True
        from tracklake._integrations.wandb import current

        current.finished(self)
        if self._store is None:
            return
        assert self._writer is not None
        report = self._writer.report()
        if report is not None:
            print(report, file=sys.stderr, flush=True)
        if self._history.ignored:
            self._say(f"{self._history.ignored} log() calls were ignored: their step was "
                      "below the current step")
        try:
            status = status_for_exit_code(exit_code)
        except TypeError:
            status = "failed"
        self._store.finish(status)

    def flush_row(self) -> None:
        """Commit the open row and the summary values set (at exit and `finish()`)."""
        with self._lock:
            if not self._finished:
                self._commit(self._history.flush())
                self._flush_summary(force=True)

    def __enter__(self) -> WandbRun:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.finish(exit_code=0 if exc_type is None else 1)

    # -- helpers -----------------------------------------------------------------------

    def _check_open(self, what: str) -> None:
        if self._finished:
            raise WandbUsageError(f"Run ({self.id}) is finished. The call to `{what}` will "
                                  "be ignored. Please make sure that you are using an active "
                                  "run.")

    def _last_step(self) -> int | None:
        """The step of the last committed row, for records logged outside rows."""
        return self._history.step - 1 if self._history.step > 0 else None

    def _say(self, text: str) -> None:
        print(f"tracklake.wandb: run {self.id!r}: {text}", file=sys.stderr, flush=True)

    def _say_once(self, topic: str, text: str) -> None:
        if topic not in self._said:
            self._said.add(topic)
            self._say(text)

    def __repr__(self) -> str:
        mode = "disabled" if self._store is None else str(self._store.root)
        return f"<tracklake.wandb run {self.project}/{self.id} ({mode})>"
