"""The Weights & Biases destination: one W&B run per tracklake run, written by the wandb
SDK (offline by default: ``wandb sync`` uploads the files later), one short wandb session
per commit.

| tracklake | W&B |
|---|---|
| run ``project/run`` | run id ``tl`` + 16 hex of SHA-256(``project/run``), resume="allow" |
| a resumed attempt | run ``<id>-a<attempt>`` in the same group (see Resumed attempts) |
| project | project (or ``--wandb-project``); entity ``--entity``/``WANDB_ENTITY`` |
| run id, name, tags | group, name (the run id without one), tags |
| configs, `RunInfo.config` | config, ``/`` keys nested back into dicts (`nest`) |
| metrics | `run.log(row, step=step)`: one row per step, keys as exported |
| texts | table ``texts/<key>``: step, text, rank, attempt |
| generations | table ``generations/<key>``: step, sample, input, output, score, extra, |
|  | rank, attempt |
| events (alert) | table ``alerts``: step, level, title, text, time; online also `run.alert` |
| traces | table ``traces``: one row per span (ids, name, status, error, duration) |
| artifacts | W&B artifact per name and step, files referenced from the store's blobs |
|  | (`_wandb_artifacts`); also table ``artifacts``: name, digest, size, media type |
| `finish_run()` | summary ``tracklake/status``/``attempts``/``ranks``; exit code 0 if |
|  | finished, else 1 |

Tables are `wandb.Table`s logged in the row of their step, several records of a key and
step in one table. A missing step counts as 0. NaN and ±inf are logged as they are (W&B's JSON has
``NaN``/``Infinity``; -0.0 arrives as 0); table cells that are NaN/inf become strings
and JSON columns stay text. Events of other kinds (``write_error``) and unknown kinds are skipped.

Steps. A W&B run holds one history row per step and takes only increasing steps.
`write()` only collects records; `commit()` merges everything collected (all kinds) per
step and logs the rows in increasing step order, so out-of-order records within a commit
arrive in order, and a step's tables sit in the same row as its metrics.

Resumed attempts. A job resumed from a checkpoint is a later attempt that logs steps
again that W&B already holds. Its records go to a W&B run of their own,
``<id>-a<attempt>``, in the same group, named ``<name> (attempt N)`` and tagged
``attempt-N``: the base run keeps what the earlier attempt logged, the new run everything
the resumed attempt logs, so no value is lost (tracklake's own views show the merged
history, the later attempt winning: ``metrics``; every record: ``metrics_all``). An
attempt is bound to a W&B run by its first metrics (`_attempt_routes`); an attempt that
starts after the last step continues the same run. W&B's rewind (``resume_from``) and
fork (``fork_from``) are not used: offline they are only recorded for the server to apply
at sync, rewind is not available on every server, a fork synced before its parent fails,
and ``wandb sync`` with ``WANDB_RESUME`` (needed to append sessions, below) ignores both.
Records that still arrive at or below their W&B run's last step (an export state that was
lost, or one attempt logging a step twice) are dropped and counted in the state
(``dropped_steps``, ``dropped_records``) and the summary (``tracklake/dropped_steps``).
Table records at or below it are not dropped: they go into the row of the last logged
step, and their ``step`` column keeps their own step (the loop sends a run kind by kind,
so a long run's tables come after all its metrics).

Exactly once. wandb-core buffers the transaction log (``run-<id>.wandb``) and writes it
only when the run finishes: a process killed before `run.finish()` leaves none of its
records in the file. So `commit()` is a whole wandb session: `wandb.init(id, resume="allow")`
→ log → `run.finish()` (which waits until wandb-core wrote and closed the file; online,
until it was uploaded), then the file and its directory are fsynced, and the state
``{"id", "targets": [{"id", "sessions", "last_step", ...}], "attempts", ...}`` is
returned. Session N of a W&B run writes the directory
``<mode>-run-<time>-<wandb id>-tracklake<N:06d><nonce>`` (setting `x_sync_dir_suffix`);
the state counts each W&B run's committed sessions. An exporter killed inside `commit()` (or
`finish_run()`) may leave a session directory whose number is not below the committed
count; `open_run()` renames its ``.wandb`` file to ``.wandb.uncommitted`` (kept for
inspection, never synced), and the loop sends those records again in a new session. The
crash window is therefore only between `run.finish()` returning and the loop saving its
cursor file: the next `open_run()` sets that session aside as well, so nothing is
duplicated in the files. With an empty state every earlier session of the run is set
aside (a warning names them) and the run is exported again from its start. Online, a
session killed mid-way may have streamed some rows to the server, whose re-sent steps W&B
then refuses as not increasing — those rows stay as first sent. `run.alert` (online)
sends e-mail or Slack messages that cannot be taken back either: an alert may be sent
again after a crash.

Uploading offline runs: ``WANDB_RESUME=allow wandb sync DIR/wandb``. Every committed
session is a ``.wandb`` file (set-aside ones are not); `wandb sync` replays the files of
one W&B run one after the other in start-time order, which is session order, and
``WANDB_RESUME=allow`` makes each file after the first resume the run on the server (its
history continues) instead of replacing it — without it, each file overwrites the last.
`wandb sync` marks what it uploaded (``.wandb.synced``) and skips it the next time, so
syncing again after a later export uploads only the new sessions. (That a synced file
resumes rather than replaces follows from wandb-core 0.31's sync, which applies the
``wandb sync`` process's resume setting to every run it replays; it cannot be checked
without a W&B server.)

Cost: a session takes about 30 ms offline after the first (the wandb-core service is
reused); each commit adds a directory (in ``--follow`` mode about one per poll with new
records). Nothing touches the network offline: wandb's own error reporting (which
connects to W&B's servers in offline mode too) is off unless ``error_reporting=True``
(``--allow-error-reporting``); system metrics, metadata, git, code, requirements and
console capture are off in every mode.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import click
import pyarrow as pa
import wandb

from tracklake._attempt import TERMINAL_STATUSES
from tracklake._errors import ExportError
from tracklake._format import fsync_dir
from tracklake.exporters import _wandb_rows as rows
from tracklake.exporters._attempt_routes import Target, by_attempt
from tracklake.exporters._nest import nest
from tracklake.exporters._protocol import RunInfo
from tracklake.exporters._wandb_artifacts import build as build_artifacts
from tracklake.exporters._wandb_state import RunState, wandb_run_id

__all__ = ["WandbDestination", "wandb_run_id"]

logger = logging.getLogger(__name__)

SUFFIX = "tracklake"
_EXIT_CODES = {"finished": 0}
_ADD: dict[str, Callable[[rows.Pending, pa.Table], None]] = {
    "metrics": rows.add_metrics, "texts": rows.add_texts, "configs": rows.add_configs,
    "generations": rows.add_generations, "traces": rows.add_traces,
    "artifacts": rows.add_artifacts, "events": rows.add_alerts}


class WandbDestination:
    """Writes each run as a W&B run (offline files by default) through the wandb SDK."""

    name: ClassVar[str] = "wandb"

    def __init__(self, *, mode: str = "offline", dir: str | None = None,
                 entity: str | None = None, wandb_project: str | None = None,
                 proxy: str | None = None, error_reporting: bool = False) -> None:
        if mode not in ("online", "offline"):
            raise ValueError(f"mode must be 'online' or 'offline', not {mode!r}")
        if not error_reporting:
            # read when wandb-core starts: otherwise it reports errors and traces to W&B's
            # servers, in offline mode too (a connection an air-gapped node cannot make)
            os.environ["WANDB_ERROR_REPORTING"] = "false"
        self.mode = mode
        base = dir or os.environ.get("WANDB_DIR") or os.getcwd()
        self.dir = Path(os.path.abspath(os.path.expanduser(base)))
        self.entity = entity
        self.wandb_project = wandb_project
        self.proxy = proxy
        self.store_root: Path | None = None  # set by the loop; artifacts are not uploaded
        self.rank_mode = "0"  # set by the loop: "all" holds steps back (`_hold`)
        self._states: dict[str, RunState] = {}
        self._pending: dict[str, dict[int | None, rows.Pending]] = {}  # per attempt

    @classmethod
    def cli_options(cls) -> list[click.Option]:
        return [
            click.Option(["--mode"], type=click.Choice(["online", "offline"]),
                         default="offline", envvar="WANDB_MODE", show_default=True,
                         help="offline: write run files for `wandb sync`; online: upload."),
            click.Option(["--dir"], type=click.Path(file_okay=False), default=None,
                         help="Directory holding the wandb/ folder (default $WANDB_DIR, "
                              "else the current directory)."),
            click.Option(["--entity"], default=None,
                         help="W&B entity (default $WANDB_ENTITY or your default)."),
            click.Option(["--wandb-project"], default=None, envvar="WANDB_PROJECT",
                         help="W&B project for every run (default $WANDB_PROJECT, else the "
                              "tracklake project)."),
            click.Option(["--proxy"], default=None,
                         help="HTTP(S) proxy for W&B (online mode)."),
            click.Option(["--allow-error-reporting", "error_reporting"], is_flag=True,
                         default=False,
                         help="Let wandb send its error reports to W&B (off by default)."),
        ]

    def describe(self) -> str:
        parts = [f"wandb:{self.mode}:{self.dir}"]
        if self.entity or self.wandb_project:
            parts.append(f"{self.entity or ''}/{self.wandb_project or ''}")
        return ":".join(parts)

    # -- the protocol ------------------------------------------------------------------

    def open_run(self, run: RunInfo, state: Mapping[str, Any]) -> None:
        current = RunState(run, state)
        self._set_aside(run, current)
        self._states[run.key] = current
        self._pending[run.key] = {}  # uncommitted records: the loop re-sends them

    def write(self, run: RunInfo, kind: str, records: pa.Table) -> None:
        pending = self._open(run)
        add = _ADD.get(kind)
        if add is None or not records.num_rows:
            return
        for attempt, part in by_attempt(records):
            add(pending.setdefault(attempt, rows.Pending()), part)
        if kind == "metrics" and "rank" in records.column_names:
            reach = self._states[run.key].reach
            for rank, step in zip(records.column("rank").to_pylist(),
                                  records.column("step").to_pylist(), strict=True):
                if rank is not None and step is not None:
                    reach[str(rank)] = max(reach.get(str(rank), step), step)

    def commit(self, run: RunInfo) -> Mapping[str, Any]:
        pending = self._open(run)
        current = self._states[run.key]
        self._hold(run, current, pending)
        for target, collected in current.split(pending, rows.Pending):
            if not collected.empty():
                self._commit_target(run, current, target, collected)
        self._pending[run.key] = {}
        return current.dump()

    def finish_run(self, run: RunInfo) -> None:
        """Record the final status in a session of each W&B run (not part of a commit: a
        later `open_run()` sets it aside, and the next `finish_run()` writes it again)."""
        self._open(run)
        current = self._states[run.key]

        def send(wb: Any) -> None:
            wb.summary.update({"tracklake/status": run.status,
                               "tracklake/attempts": run.attempts,
                               "tracklake/ranks": ",".join(str(r) for r in run.ranks)})

        for target in current.targets:
            self._session(run, target, send, exit_code=_EXIT_CODES.get(run.status, 1))
        self._pending.pop(run.key, None)

    def close(self) -> None:
        """Forget open runs; what they collected since their last commit is dropped."""
        self._pending.clear()
        self._states.clear()

    # -- commits -----------------------------------------------------------------------

    def _hold(self, run: RunInfo, current: RunState,
              pending: dict[int | None, rows.Pending]) -> None:
        """With ``--ranks all`` on a live run, a rank that lags would log steps W&B already
        passed: metric steps above the watermark (the lowest latest step of the run's
        ranks) wait in the state; earlier held steps join this commit. All go once the
        run is over."""
        for name, steps in current.held.items():
            attempt = None if name == "-" else int(name)
            held = rows.Pending(metrics={int(s): dict(v) for s, v in steps.items()})
            held.merge(pending.get(attempt, rows.Pending()))
            pending[attempt] = held
        current.held = {}
        if (self.rank_mode != "all" or run.status in TERMINAL_STATUSES
                or len(run.ranks) < 2):
            return
        mark = min(current.reach.get(str(r), -1) for r in run.ranks)
        for attempt, collected in pending.items():
            above = {s: collected.metrics.pop(s) for s in list(collected.metrics) if s > mark}
            if above:
                current.held["-" if attempt is None else str(attempt)] = {
                    str(s): values for s, values in sorted(above.items())}

    def _commit_target(self, run: RunInfo, current: RunState, target: Target,
                       pending: rows.Pending) -> None:
        history, dropped_steps, dropped_records = rows.rows_by_step(pending, target.last_step)
        if dropped_steps:
            logger.warning("run %s: %d steps (%d metric values) at or before step %s, the "
                           "last one W&B run %s holds, were dropped (W&B takes only "
                           "increasing steps)", run.key, dropped_steps, dropped_records,
                           target.last_step, target.id)
        total = current.dropped_steps + dropped_steps
        artifacts, missing = self._artifacts(run, pending)

        def send(wb: Any) -> None:
            if pending.config:
                wb.config.update(nest(pending.config), allow_val_change=True)
            for step, row in history:
                wb.log(row, step=step)
            for artifact, aliases in artifacts:
                wb.log_artifact(artifact, aliases=aliases)
            if missing:
                wb.summary["tracklake/missing_artifact_files"] = len(missing)
            if self.mode == "online":
                for alert in pending.alerts:
                    wb.alert(title=str(alert.get("title") or "alert"),
                             text=str(alert.get("text") or ""),
                             level=str(alert.get("level") or "warning").upper())
            if dropped_steps:
                wb.summary["tracklake/dropped_steps"] = total

        self._session(run, target, send, exit_code=0)
        target.sessions += 1
        if history:
            last = history[-1][0]
            target.last_step = last if target.last_step is None else max(target.last_step, last)
        current.dropped_steps = total
        current.dropped_records += dropped_records

    def _artifacts(self, run: RunInfo, pending: rows.Pending
                   ) -> tuple[list[tuple[Any, list[str]]], list[str]]:
        if not pending.artifacts:
            return [], []
        if self.store_root is None:
            raise ExportError(f"run {run.key}: cannot send artifacts: store_root is not set "
                              "(the export loop sets it)", retryable=False)
        built, missing = build_artifacts(pending.artifacts, self.store_root)
        if missing:
            logger.warning("run %s: %d artifact files are missing from the store's blobs and "
                           "were left out: %s", run.key, len(missing), ", ".join(missing[:5]))
        return built, missing

    # -- sessions ----------------------------------------------------------------------

    def _open(self, run: RunInfo) -> dict[int | None, rows.Pending]:
        pending = self._pending.get(run.key)
        if pending is None:
            raise RuntimeError(f"run {run.key} is not open: call open_run() first")
        return pending

    def _settings(self, target: Target) -> Any:
        nonce = uuid.uuid4().hex[:8]
        options: dict[str, Any] = {
            "mode": self.mode, "silent": True, "console": "off",
            "x_disable_stats": True, "x_disable_meta": True, "x_disable_machine_info": True,
            "disable_git": True, "disable_code": True, "save_code": False,
            "x_save_requirements": False, "disable_job_creation": True,
            "x_sync_dir_suffix": f"{SUFFIX}{target.sessions:06d}{nonce}",
        }
        if self.proxy:
            options.update(http_proxy=self.proxy, https_proxy=self.proxy)
        return wandb.Settings(**options)

    def _session(self, run: RunInfo, target: Target, send: Callable[[Any], None],
                 exit_code: int) -> None:
        """init → send → finish; the transaction log fsynced. A session that fails is
        finished and set aside, and the error is retryable (the loop sends again)."""
        config = nest({**run.config})
        name, tags = run.name or run.run, list(run.tags)
        if target.attempt is not None:
            name, tags = f"{name} (attempt {target.attempt})", [*tags, f"attempt-{target.attempt}"]
        try:
            wb = wandb.init(
                entity=self.entity, project=self.wandb_project or run.project,
                dir=str(self.dir), id=target.id, resume="allow", name=name,
                group=run.run, tags=tags, config=config or None,
                reinit="create_new", settings=self._settings(target))
        except Exception as exc:  # the SDK raises many types (CommError, OSError, ...)
            _forget_failed_init()
            raise _init_error(run, exc) from exc
        sync_file = Path(wb.settings.sync_file)
        try:
            send(wb)
        except Exception as exc:
            with contextlib.suppress(Exception):
                wb.finish(exit_code=1)
            _rename_uncommitted(sync_file)
            raise ExportError(f"run {run.key}: logging to W&B failed: {exc}",
                              retryable=True) from exc
        try:
            wb.finish(exit_code=exit_code)
            _fsync(sync_file)
        except Exception as exc:
            _rename_uncommitted(sync_file)
            raise ExportError(f"run {run.key}: finishing the W&B session {sync_file.parent} "
                              f"failed: {exc}", retryable=True) from exc

    def _set_aside(self, run: RunInfo, current: RunState) -> None:
        """Rename the transaction logs of sessions after the last commit, of the run's
        base W&B run and of its attempts' (also ones no commit knows)."""
        wandb_dir = Path(wandb.Settings(root_dir=str(self.dir)).wandb_dir)
        pattern = re.compile(rf"(?:offline-)?run-\d{{8}}_\d{{6}}-({current.base}(?:-a\d+)?)"
                             rf"-{SUFFIX}(\d{{6}})[0-9a-f]{{8}}\Z")
        try:
            names = sorted(os.listdir(wandb_dir))
        except FileNotFoundError:
            return
        except OSError as exc:
            raise ExportError(f"cannot list {wandb_dir}: {exc.strerror or exc}",
                              retryable=True) from exc
        for name in names:
            m = pattern.match(name)
            if not m:
                continue
            committed = current.committed_sessions(m.group(1))
            log = wandb_dir / name / f"run-{m.group(1)}.wandb"
            if int(m.group(2)) >= committed and log.exists():
                if committed:
                    logger.info("run %s: setting aside %s, written after the last commit",
                                run.key, log)
                else:
                    logger.warning("run %s: %s was written by an earlier export but the export "
                                   "state does not count it: it is renamed to "
                                   ".wandb.uncommitted and its records are exported again",
                                   run.key, log)
                _rename_uncommitted(log)


def _init_error(run: RunInfo, exc: Exception) -> ExportError:
    if isinstance(exc, (wandb.errors.UsageError, wandb.errors.AuthenticationError)):
        return ExportError(f"run {run.key}: wandb.init refused: {exc} (online mode needs "
                           "WANDB_API_KEY or `wandb login`; offline needs neither)",
                           retryable=False)
    return ExportError(f"run {run.key}: wandb.init failed: {exc}", retryable=True)


def _forget_failed_init() -> None:
    """A `wandb.init` that failed leaves its run registered in the wandb-core service, and
    every later init of that id fails with "run ID is in use": stop the service (the next
    init starts a fresh one)."""
    with contextlib.suppress(Exception):
        wandb.teardown()


def _rename_uncommitted(path: Path) -> None:
    target = path.with_name(path.name + ".uncommitted")
    try:
        if path.exists():
            os.replace(path, target)
            fsync_dir(path.parent)
    except OSError as exc:
        raise ExportError(f"cannot set aside the uncommitted W&B file {path}: "
                          f"{exc.strerror or exc}", retryable=True) from exc


def _fsync(path: Path) -> None:
    fsync_dir(path)  # opens read-only and fsyncs: works for a file as for a directory
    fsync_dir(path.parent)
    fsync_dir(path.parent.parent)
