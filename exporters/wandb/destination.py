"""The Weights & Biases destination: one W&B run per tracklake run, written by the wandb
SDK (offline by default: ``wandb sync`` uploads the files later).

The mapping, steps, resumed attempts, artifacts, exactly-once sessions, the offline
upload and troubleshooting are documented in docs/exporters.md (Weights & Biases). In
short: `write()` collects records per attempt; `commit()` routes each attempt to its W&B
run (`_shared.attempt_routes`: a resumed attempt that logs steps again gets ``<id>-a<N>``),
merges per step and logs rows in increasing step order in one whole wandb session per
W&B run — init, log, finish, fsync — because wandb-core writes its ``.wandb`` file only
when a run finishes. Session N of a W&B run is the directory ``…-<id>-tracklake<N>…``;
the state counts committed sessions, and `open_run()` renames the ``.wandb`` file of
every later one to ``.wandb.uncommitted``, so a crash duplicates nothing in the files.
With ``--ranks all``, steps above the lowest latest step of the run's ranks wait in the
state (`_hold`). Keys on a `define_metric` axis of their own get W&B steps of their own
(`axes`). wandb's error reporting, which connects to W&B's servers even offline,
is off unless ``error_reporting=True``.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import click
import pyarrow as pa

from tracklake import ExportError
from tracklake.exporters._protocol import Destination, ExportContext, RunInfo
from tracklake.exporters._shared.attempt_routes import Collecting, Target
from tracklake.exporters._shared.nest import nest
from tracklake.exporters.wandb import axes, rows
from tracklake.exporters.wandb.artifacts import build as build_artifacts
from tracklake.exporters.wandb.media import MediaFiles
from tracklake.exporters.wandb.session import Sessions
from tracklake.exporters.wandb.state import WandbState, wandb_run_id

__all__ = ["WandbDestination", "wandb_run_id"]

logger = logging.getLogger(__name__)

_EXIT_CODES = {"finished": 0}
_ADD: dict[str, Callable[[rows.WandbPending, pa.Table], None]] = {
    "metrics": rows.add_metrics, "texts": rows.add_texts, "configs": rows.add_configs,
    "generations": rows.add_generations, "traces": rows.add_traces,
    "artifacts": rows.add_artifacts, "events": rows.add_events,
    "histograms": rows.add_histograms, "media": rows.add_media}


class WandbDestination(Destination):
    """Writes each run as a W&B run (offline files by default) through the wandb SDK."""

    name: ClassVar[str] = "wandb"
    #: while following, seconds between commits to a live run: each commit is a session
    #: directory that `sync` uploads one by one (``--commit-interval`` overrides it)
    commit_interval: ClassVar[float] = 30.0

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
        self._sessions = Sessions(mode, self.dir, entity, wandb_project, proxy)
        self._context: ExportContext | None = None  # from `start()`
        self._states: dict[str, WandbState] = {}
        self._collecting = Collecting(rows.WandbPending)
        self._ending: set[str] = set()  # runs whose next commit is their last

    @classmethod
    def cli_options(cls) -> list[click.Parameter]:
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
    def start(self, context: ExportContext) -> None:
        self._context = context

    @property
    def _ranks(self) -> str:
        """The rank mode ("all" holds steps back, `_hold`)."""
        return self._context.ranks if self._context is not None else "0"


    def open_run(self, run: RunInfo, state: Mapping[str, Any]) -> None:
        self._ending.discard(run.key)
        current = WandbState(run, state)
        self._sessions.set_aside(run, current)
        self._states[run.key] = current
        self._collecting.open(run.key)

    def write(self, run: RunInfo, kind: str, records: pa.Table) -> None:
        self._collecting.pending(run.key)  # raises unless the run is open
        add = _ADD.get(kind)
        if add is None or not records.num_rows:
            return
        self._collecting.add(run.key, records, add)

    def commit(self, run: RunInfo) -> Mapping[str, Any]:
        pending = self._collecting.pending(run.key)
        current = self._states[run.key]
        new_rules = [rule for collected in pending.values() for rule in collected.metric_rules]
        if not axes.merge_rules(current.rules, new_rules):
            logger.warning("run %s: more than %d define_metric names; the later ones are "
                           "left out of the W&B run", run.key, axes.MAX_RULES)
        rules = axes.AxisRules(current.rules, prefixed=self._ranks == "all")
        for collected in pending.values():
            rows.extract_axes(collected, rules)
        self._hold(run, current, pending)
        for collected in pending.values():
            if collected.identity and not current.identity:
                current.identity = dict(collected.identity)
        committed = set()
        for target, collected in current.split(pending, rows.WandbPending):
            committed.add(target.id)
            self._commit_target(run, current, target, collected)
        if run.key in self._ending:  # what waits in targets this commit did not reach
            for target in current.targets:
                if target.id not in committed and current.waiting.get(target.id):
                    self._commit_target(run, current, target, rows.WandbPending())
        self._collecting.committed(run.key)
        return current.dump()

    def ending(self, run: RunInfo) -> None:
        """Everything of the (ended) run was written: its next commit holds nothing back."""
        self._ending.add(run.key)

    def finish_run(self, run: RunInfo) -> None:
        """Record the final status in a session of each W&B run (not part of a commit: a
        later `open_run()` sets it aside, and the next `finish_run()` writes it again)."""
        self._collecting.pending(run.key)  # raises unless the run is open
        current = self._states[run.key]

        def send(wb: Any) -> None:
            wb.summary.update({"tracklake/status": run.status,
                               "tracklake/attempts": run.attempts,
                               "tracklake/ranks": ",".join(str(r) for r in run.ranks)})

        for target in current.targets:
            self._sessions.run(run, target, send, exit_code=_EXIT_CODES.get(run.status, 1),
                               identity=current.identity)
        self._collecting.close(run.key)

    def close(self) -> None:
        """Forget open runs; what they collected since their last commit is dropped."""
        self._collecting.close()
        self._states.clear()

    # -- commits -----------------------------------------------------------------------

    def _hold(self, run: RunInfo, current: WandbState,
              pending: dict[int | None, rows.WandbPending]) -> None:
        """With ``--ranks all``, a rank that lags (or is read after another, in a run
        exported in several commits) would log steps W&B already passed: metric steps above
        the watermark (the lowest latest step of W&B's own axis of the run's ranks) wait in
        the state; earlier held steps join this commit. All go in the last commit of an
        ended run (`ending`)."""
        if self._ranks == "all":  # keys are rank{r}/...
            for collected in pending.values():
                for step, values in collected.metrics.items():
                    for rank in {_rank_of(key) for key in values}:
                        current.reach[rank] = max(current.reach.get(rank, step), step)
                current.seen.update(_rank_of(axis) for axis, _ in collected.axis_rows)
        for name, steps in current.held.items():
            attempt = None if name == "-" else int(name)
            held = rows.WandbPending(metrics={int(s): dict(v) for s, v in steps.items()})
            held.merge(pending.get(attempt, rows.WandbPending()))
            pending[attempt] = held
        current.held = {}
        if self._ranks != "all" or run.key in self._ending or len(run.ranks) < 2:
            return
        # a rank seen only on axes of its own (slime's secondary process) holds nothing back
        mark = min((current.reach.get(str(r), -1) for r in run.ranks
                    if str(r) in current.reach or str(r) not in current.seen), default=-1)
        for attempt, collected in pending.items():
            above = {s: collected.metrics.pop(s) for s in list(collected.metrics) if s > mark}
            if above:
                current.held["-" if attempt is None else str(attempt)] = {
                    str(s): values for s, values in sorted(above.items())}

    def _commit_target(self, run: RunInfo, current: WandbState, target: Target,
                       pending: rows.WandbPending) -> None:
        waiting = current.waiting.pop(target.id, {})
        if waiting:  # earlier rows first: what this commit brings at the same place wins
            earlier = rows.WandbPending(axis_rows=waiting)
            earlier.merge(pending)
            pending = earlier
        if pending.empty():
            return
        with tempfile.TemporaryDirectory(prefix="tracklake-wandb-media-") as tmp:
            media = None if self._context is None else MediaFiles(
                self._context.root, Path(tmp), f"run {run.key}")
            self._commit_rows(run, current, target, pending, media)

    def _commit_rows(self, run: RunInfo, current: WandbState, target: Target,
                     pending: rows.WandbPending, media: MediaFiles | None) -> None:
        own = rows.own_steps(pending, target.last_step)
        tops = [t for t in (current.tops.get(target.id), max(own, default=None)) if t is not None]
        placed, waiting = axes.place(pending.axis_rows, own, target.last_step,
                                     max(tops) if tops else None, final=run.key in self._ending)
        if waiting:
            current.waiting[target.id] = waiting
        history, dropped_steps, dropped_records = rows.rows_by_step(pending, target.last_step,
                                                                    media, placed)
        if tops:
            current.tops[target.id] = max(tops)
        if not history and not (pending.config or pending.metric_rules or pending.summary
                                or pending.artifacts or dropped_steps):
            return  # all of it waits: no session
        if dropped_steps:
            logger.warning("run %s: %d steps (%d metric values) at or before step %s, the "
                           "last one W&B run %s holds, were dropped (W&B takes only "
                           "increasing steps)", run.key, dropped_steps, dropped_records,
                           target.last_step, target.id)
        total = current.dropped_steps + dropped_steps
        artifacts, missing = self._artifacts(run, pending)
        rules = axes.sent_rules(current.rules, run.ranks if self._ranks == "all" else None)

        def send(wb: Any) -> None:
            if pending.config:
                wb.config.update(nest(pending.config), allow_val_change=True)
            for rule in rules:  # before the rows, so that they use the axes
                wb.define_metric(**rule)
            for step, row in history:
                wb.log(row, step=step)
            if pending.summary:
                wb.summary.update(pending.summary)
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

        self._sessions.run(run, target, send, exit_code=0, identity=current.identity)
        target.sessions += 1
        if history:
            last = history[-1][0]
            target.last_step = last if target.last_step is None else max(target.last_step, last)
        current.dropped_steps = total
        current.dropped_records += dropped_records

    def _artifacts(self, run: RunInfo, pending: rows.WandbPending
                   ) -> tuple[list[tuple[Any, list[str]]], list[str]]:
        if not pending.artifacts:
            return [], []
        if self._context is None:
            raise ExportError(f"run {run.key}: cannot send artifacts: the destination was "
                              "not started (`start()` tells it the store)", retryable=False)
        built, missing = build_artifacts(pending.artifacts, self._context.root)
        if missing:
            logger.warning("run %s: %d artifact files are missing from the store's blobs and "
                           "were left out: %s", run.key, len(missing), ", ".join(missing[:5]))
        return built, missing

    # -- sessions ----------------------------------------------------------------------


def _rank_of(key: str) -> str:
    """The rank of a key of ``--ranks all`` (``rank{r}/...``)."""
    return key.split("/", 1)[0][len("rank"):]
