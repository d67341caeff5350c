"""The Weights & Biases destination: one W&B run per tracklake run, written by the wandb
SDK (offline by default: ``wandb sync`` uploads the files later), one short wandb session
per commit.

| tracklake | W&B |
|---|---|
| run ``project/run`` | run id ``tl`` + 16 hex of SHA-256(``project/run``), resume="allow" |
| project | project (or ``--wandb-project``); entity ``--entity``/``WANDB_ENTITY`` |
| run id, name, tags | group, name (the run id without one), tags |
| configs, `RunInfo.config` | config, ``/`` keys nested back into dicts (`nest`) |
| metrics | `run.log(row, step=step)`: one row per step, keys as exported |
| texts | table ``texts/<key>``: step, text, rank, attempt |
| generations | table ``generations/<key>``: step, sample, input, output, score, extra, |
|  | rank, attempt |
| events (alert) | table ``alerts``: step, level, title, text, time; online also `run.alert` |
| traces | table ``traces``: one row per span (ids, name, status, error, duration) |
| artifacts | table ``artifacts``: name, digest, size, media type (contents not sent) |
| `finish_run()` | summary ``tracklake/status``/``attempts``/``ranks``; exit code 0 if |
|  | finished, else 1 |

Tables are `wandb.Table`s logged in the row of their step, several records of a key and
step in one table. A missing step counts as 0. NaN and ±inf are logged as they are (W&B's JSON has
``NaN``/``Infinity``; -0.0 arrives as 0); table cells that are NaN/inf become strings
and JSON columns stay text. Events of other kinds (``write_error``) and unknown kinds are skipped.

Steps. A W&B run holds one history row per step and takes only increasing steps.
`write()` only collects records; `commit()` merges everything collected (all kinds) per
step and logs the rows in increasing step order, so out-of-order records within a commit
arrive in order, and a step's tables sit in the same row as its metrics. The last step
logged is kept in the commit state: metric records at or below it (a later attempt that
restarted at an earlier step, supersession in tracklake terms) are dropped and counted
in the state (``dropped_steps``, ``dropped_records``) and the summary
(``tracklake/dropped_steps``) — tracklake keeps them (the ``metrics_all`` view). Table
records at or below it (the loop sends a run kind by kind, so a long run's tables come
after all its metrics) are not dropped: they go into the row of the last logged step, and
their ``step`` column keeps their own step. W&B's rewind (``resume_from``) is not used:
offline it is only recorded for the server to apply at sync, which tracklake cannot check.

Exactly once. wandb-core buffers the transaction log (``run-<id>.wandb``) and writes it
only when the run finishes: a process killed before `run.finish()` leaves none of its
records in the file. So `commit()` is a whole wandb session: `wandb.init(id, resume="allow")`
→ log → `run.finish()` (which waits until wandb-core wrote and closed the file; online,
until it was uploaded), then the file and its directory are fsynced, and the state
``{"id", "sessions", "last_step", ...}`` is returned. Session N writes the directory
``<mode>-run-<time>-<id>-tracklake<N:06d><nonce>`` (setting `x_sync_dir_suffix`); its
state counts committed sessions. An exporter killed inside `commit()` (or
`finish_run()`) may leave a session directory whose number is not below the committed
count; `open_run()` renames its ``.wandb`` file to ``.wandb.uncommitted`` (kept for
inspection, never synced), and the loop sends those records again in a new session. The
crash window is therefore only between `run.finish()` returning and the loop saving its
cursor file: the next `open_run()` sets that session aside as well, so nothing is
duplicated in the files. With an empty state every earlier session of the run is set
aside (a warning names them) and the run is exported again from its start. What
``wandb sync`` already uploaded cannot be taken back: sync only files of committed
sessions (``wandb sync DIR/wandb/*-tracklake*``; set-aside files are not ``.wandb``
files), and online a session killed mid-way may have streamed some rows to the server,
whose re-sent steps W&B then refuses as not increasing — those rows stay as first sent.
`run.alert` (online) sends e-mail or Slack messages that cannot be taken back either: an
alert may be sent again after a crash.

Cost: a session takes about 30 ms offline after the first (the wandb-core service is
reused); each commit adds a directory (in ``--follow`` mode about one per poll with new
records). Nothing touches the network offline; system metrics, metadata, git, code,
requirements and console capture are off in every mode.
"""

from __future__ import annotations

import contextlib
import hashlib
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

from tracklake._errors import ExportError
from tracklake._format import fsync_dir
from tracklake.exporters import _wandb_rows as rows
from tracklake.exporters._protocol import RunInfo

logger = logging.getLogger(__name__)

SUFFIX = "tracklake"
_EXIT_CODES = {"finished": 0}
_ADD: dict[str, Callable[[rows.Pending, pa.Table], None]] = {
    "metrics": rows.add_metrics, "texts": rows.add_texts, "configs": rows.add_configs,
    "generations": rows.add_generations, "traces": rows.add_traces,
    "artifacts": rows.add_artifacts, "events": rows.add_alerts}


def wandb_run_id(run: RunInfo) -> str:
    """The W&B run id of a tracklake run: deterministic, lowercase letters and digits."""
    return "tl" + hashlib.sha256(run.key.encode()).hexdigest()[:16]


class _State:
    """The commit state of one run (JSON in the loop's cursor file)."""

    def __init__(self, run: RunInfo, state: Mapping[str, Any]) -> None:
        self.id = wandb_run_id(run)
        sessions, last = state.get("sessions", 0), state.get("last_step")
        dropped, dropped_records = state.get("dropped_steps", 0), state.get(
            "dropped_records", 0)
        ints = (sessions, dropped, dropped_records)
        if (state and state.get("id") != self.id) or any(
                isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in ints) or (
                last is not None and (isinstance(last, bool) or not isinstance(last, int))):
            raise ExportError(f"run {run.key}: the W&B export state {dict(state)!r} is not one "
                              "this exporter wrote; delete the run's export state to export it "
                              "again from its start", retryable=False)
        self.sessions: int = sessions
        self.last_step: int | None = last
        self.dropped_steps: int = dropped
        self.dropped_records: int = dropped_records

    def dump(self) -> dict[str, Any]:
        return {"id": self.id, "sessions": self.sessions, "last_step": self.last_step,
                "dropped_steps": self.dropped_steps, "dropped_records": self.dropped_records}


class WandbDestination:
    """Writes each run as a W&B run (offline files by default) through the wandb SDK."""

    name: ClassVar[str] = "wandb"

    def __init__(self, *, mode: str = "offline", dir: str | None = None,
                 entity: str | None = None, wandb_project: str | None = None,
                 proxy: str | None = None) -> None:
        if mode not in ("online", "offline"):
            raise ValueError(f"mode must be 'online' or 'offline', not {mode!r}")
        self.mode = mode
        base = dir or os.environ.get("WANDB_DIR") or os.getcwd()
        self.dir = Path(os.path.abspath(os.path.expanduser(base)))
        self.entity = entity
        self.wandb_project = wandb_project
        self.proxy = proxy
        self.store_root: Path | None = None  # set by the loop; artifacts are not uploaded
        self._states: dict[str, _State] = {}
        self._pending: dict[str, rows.Pending] = {}

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
            click.Option(["--wandb-project"], default=None,
                         help="W&B project for every run (default: the tracklake project)."),
            click.Option(["--proxy"], default=None,
                         help="HTTP(S) proxy for W&B (online mode)."),
        ]

    def describe(self) -> str:
        parts = [f"wandb:{self.mode}:{self.dir}"]
        if self.entity or self.wandb_project:
            parts.append(f"{self.entity or ''}/{self.wandb_project or ''}")
        return ":".join(parts)

    # -- the protocol ------------------------------------------------------------------

    def open_run(self, run: RunInfo, state: Mapping[str, Any]) -> None:
        current = _State(run, state)
        self._set_aside(run, current)
        self._states[run.key] = current
        self._pending[run.key] = rows.Pending()  # uncommitted records: the loop re-sends

    def write(self, run: RunInfo, kind: str, records: pa.Table) -> None:
        pending = self._open(run)
        add = _ADD.get(kind)
        if add is not None and records.num_rows:
            add(pending, records)

    def commit(self, run: RunInfo) -> Mapping[str, Any]:
        pending = self._open(run)
        current = self._states[run.key]
        if pending.empty():
            return current.dump()
        history, dropped_steps, dropped_records = rows.rows_by_step(pending, current.last_step)
        if dropped_steps:
            logger.warning("run %s: %d steps (%d metric values) at or before step %s, the "
                           "last one W&B holds, were dropped (W&B takes only increasing "
                           "steps)", run.key, dropped_steps, dropped_records, current.last_step)
        total = current.dropped_steps + dropped_steps

        def send(wb: Any) -> None:
            if pending.config:
                wb.config.update(rows.nest(pending.config), allow_val_change=True)
            for step, row in history:
                wb.log(row, step=step)
            if self.mode == "online":
                for alert in pending.alerts:
                    wb.alert(title=str(alert.get("title") or "alert"),
                             text=str(alert.get("text") or ""),
                             level=str(alert.get("level") or "warning").upper())
            if dropped_steps:
                wb.summary["tracklake/dropped_steps"] = total

        self._session(run, current, send, exit_code=0)
        current.sessions += 1
        if history:
            current.last_step = max(current.last_step or history[-1][0], history[-1][0])
        current.dropped_steps = total
        current.dropped_records += dropped_records
        self._pending[run.key] = rows.Pending()
        return current.dump()

    def finish_run(self, run: RunInfo) -> None:
        """Record the final status in a session of its own (not part of a commit: a
        later `open_run()` sets it aside, and the next `finish_run()` writes it again)."""
        self._open(run)
        current = self._states[run.key]

        def send(wb: Any) -> None:
            wb.summary.update({"tracklake/status": run.status,
                               "tracklake/attempts": run.attempts,
                               "tracklake/ranks": ",".join(str(r) for r in run.ranks)})

        self._session(run, current, send, exit_code=_EXIT_CODES.get(run.status, 1))
        self._pending.pop(run.key, None)

    def close(self) -> None:
        """Forget open runs; what they collected since their last commit is dropped."""
        self._pending.clear()
        self._states.clear()

    # -- sessions ----------------------------------------------------------------------

    def _open(self, run: RunInfo) -> rows.Pending:
        pending = self._pending.get(run.key)
        if pending is None:
            raise RuntimeError(f"run {run.key} is not open: call open_run() first")
        return pending

    def _settings(self, current: _State) -> Any:
        nonce = uuid.uuid4().hex[:8]
        options: dict[str, Any] = {
            "mode": self.mode, "silent": True, "console": "off",
            "x_disable_stats": True, "x_disable_meta": True, "x_disable_machine_info": True,
            "disable_git": True, "disable_code": True, "save_code": False,
            "x_save_requirements": False, "disable_job_creation": True,
            "x_sync_dir_suffix": f"{SUFFIX}{current.sessions:06d}{nonce}",
        }
        if self.proxy:
            options.update(http_proxy=self.proxy, https_proxy=self.proxy)
        return wandb.Settings(**options)

    def _session(self, run: RunInfo, current: _State, send: Callable[[Any], None],
                 exit_code: int) -> None:
        """init → send → finish; the transaction log fsynced. A session that fails is
        finished and set aside, and the error is retryable (the loop sends again)."""
        config = rows.nest({**run.config})
        try:
            wb = wandb.init(
                entity=self.entity, project=self.wandb_project or run.project,
                dir=str(self.dir), id=current.id, resume="allow", name=run.name or run.run,
                group=run.run, tags=list(run.tags), config=config or None,
                reinit="create_new", settings=self._settings(current))
        except Exception as exc:  # the SDK raises many types (wandb.Error, OSError, ...)
            raise ExportError(f"run {run.key}: wandb.init failed: {exc}",
                              retryable=True) from exc
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

    def _set_aside(self, run: RunInfo, current: _State) -> None:
        """Rename the transaction logs of sessions after the last commit."""
        wandb_dir = Path(wandb.Settings(root_dir=str(self.dir)).wandb_dir)
        pattern = re.compile(rf"(?:offline-)?run-\d{{8}}_\d{{6}}-{current.id}-{SUFFIX}"
                             r"(\d{6})[0-9a-f]{8}\Z")
        try:
            names = sorted(os.listdir(wandb_dir))
        except FileNotFoundError:
            return
        except OSError as exc:
            raise ExportError(f"cannot list {wandb_dir}: {exc.strerror or exc}",
                              retryable=True) from exc
        for name in names:
            m = pattern.match(name)
            log = wandb_dir / name / f"run-{current.id}.wandb"
            if m and int(m.group(1)) >= current.sessions and log.exists():
                if current.sessions:
                    logger.info("run %s: setting aside %s, written after the last commit",
                                run.key, log)
                else:
                    logger.warning("run %s: %s was written by an earlier export but the export "
                                   "state is empty: it is renamed to .wandb.uncommitted and "
                                   "the run is exported again from its start", run.key, log)
                _rename_uncommitted(log)


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
