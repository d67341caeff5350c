"""The MLflow destination: one MLflow run per tracklake run, written through `MlflowClient`
(spans through MLflow's tracing client).

The mapping, key rules, limits, exactly-once writes, network settings and troubleshooting
are documented in docs/exporters.md (MLflow). In short: there is no export state to keep,
because every write is idempotent — a metric's timestamp is its record's time, so a
re-sent point is an exact duplicate MLflow's SQL store skips; params go once, files and
tags are rewritten, generation tables are merged by row and spans are upserted by id
(`log_spans`: `start_trace` would make new ids). The MLflow run is found again by its tag
``tracklake.run_id``, never by name. The writers per kind are in `records` and
`spans`, names and limits in `names`, and `errors` translates
errors by MLflow's error code. Unless asked for, MLflow's telemetry and its own request
retries are switched off before mlflow is imported: no usage data leaves the process, and
the loop's backoff decides.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import click
import pyarrow as pa
import pyarrow.compute as pc

from tracklake import ExportError
from tracklake.exporters._protocol import Destination, ExportContext, RunInfo
from tracklake.exporters._shared.attempt_routes import Routes, Target, attempt_label, by_attempt
from tracklake.exporters.mlflow.errors import boundary
from tracklake.exporters.mlflow.histograms import write_histograms
from tracklake.exporters.mlflow.media import write_media
from tracklake.exporters.mlflow.names import MAX_TAG_VAL_LENGTH, RUN_ID_TAG, mlflow_key
from tracklake.exporters.mlflow.records import (
    write_artifacts,
    write_configs,
    write_events,
    write_generations,
    write_metrics,
    write_texts,
)
from tracklake.exporters.mlflow.spans import write_traces
from tracklake.exporters.mlflow.target import MlflowTarget

# mlflow itself is imported on first use, after its environment is set; without it, this
# destination cannot be loaded at all (the command line then shows it as unavailable)
if importlib.util.find_spec("mlflow") is None:
    raise ModuleNotFoundError("No module named 'mlflow'", name="mlflow")

if TYPE_CHECKING:
    from mlflow.entities import Run as MlflowRun
    from mlflow.tracing.client import TracingClient
    from mlflow.tracking import MlflowClient

STATUSES = {"finished": "FINISHED", "failed": "FAILED", "killed": "KILLED",
            "crashed": "KILLED"}

_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/@]*@")


def redact_uri(uri: str) -> str:
    """`uri` without user, password, query and fragment (where credentials may sit)."""
    uri = uri.split("#", 1)[0].split("?", 1)[0]
    return _USERINFO.sub(r"\1", uri)


def _configure_mlflow_environment(telemetry: bool) -> None:
    """Switch off MLflow's telemetry (before mlflow is imported), its own retries and its
    printing to stdout."""
    if not telemetry:
        # read by `import mlflow` (set_telemetry_client) and by every tracked call
        os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    # set_terminated() would print "View run ... at: URL" to stdout (and fetch the run)
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    if not telemetry:
        from mlflow.telemetry import set_telemetry_client

        # drops a client created by an earlier `import mlflow` (unannotated in mlflow 3.17)
        set_telemetry_client()  # type: ignore[no-untyped-call]


class MlflowRoutes(Routes):
    """Which MLflow run each attempt of a run goes to (`_shared.attempt_routes`): an
    attempt that logs again steps already delivered gets a run of its own."""

    destination = "MLflow"

    def __init__(self, run: RunInfo, state: Mapping[str, Any]) -> None:
        super().__init__(run, run.key, state)


def attempt_run_tag(run: RunInfo, attempt: int) -> str:
    """The ``tracklake.run_id`` tag of a resumed attempt's MLflow run (a run id never holds
    a space, so no run's own tag is one of these)."""
    return f"{run.key} (attempt {attempt})"


class MlflowDestination(Destination):
    """Exports tracklake runs to an MLflow tracking server or database."""

    name: ClassVar[str] = "mlflow"

    def __init__(self, *, tracking_uri: str | None = None, telemetry: bool = False,
                 artifact_root: str | None = None) -> None:
        uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            raise ExportError("no MLflow tracking URI: pass --tracking-uri or set "
                              "MLFLOW_TRACKING_URI", retryable=False)
        self.tracking_uri = uri
        self.telemetry = telemetry
        #: Where experiments this exporter creates keep their artifacts (None: MLflow's
        #: default, the server's artifact root, or ./mlruns for a database URI).
        self.artifact_root = artifact_root
        self._context: ExportContext | None = None  # from `start()`
        _configure_mlflow_environment(telemetry)
        self._clients: tuple[MlflowClient, TracingClient] | None = None
        self._experiments: dict[str, str] = {}
        self._targets: dict[str, dict[str, MlflowTarget]] = {}  # run key -> route id -> run
        self._routes: dict[str, MlflowRoutes] = {}

    def _make_clients(self) -> tuple[MlflowClient, TracingClient]:
        """The clients, made on first use, inside an error boundary (for a database URI,
        making one connects and migrates the schema)."""
        if self._clients is None:
            from mlflow.tracing.client import TracingClient
            from mlflow.tracking import MlflowClient

            with _schema_lock(self.tracking_uri):
                client = MlflowClient(tracking_uri=self.tracking_uri)
                client.search_experiments(max_results=1)  # connects, migrates the schema
                self._clients = (client, TracingClient(self.tracking_uri))
        return self._clients

    @property
    def _client(self) -> MlflowClient:
        return self._make_clients()[0]

    @property
    def _tracing(self) -> TracingClient:
        """For `log_spans`, which MlflowClient does not offer (its start_trace/start_span
        go through the process-wide tracer and make new ids and times)."""
        return self._make_clients()[1]

    @classmethod
    def cli_options(cls) -> list[click.Parameter]:
        return [
            click.Option(["--tracking-uri", "tracking_uri"], envvar="MLFLOW_TRACKING_URI",
                         show_envvar=True, default=None,
                         help="MLflow tracking URI (a server's http(s) URL or a database)."),
            click.Option(["--allow-telemetry", "telemetry"], is_flag=True, default=False,
                         help="Let MLflow send its usage telemetry (off by default)."),
            click.Option(["--artifact-root"], default=None,
                         help="Directory or URI under which experiments this exporter "
                              "creates keep their artifacts, one folder per project "
                              "(default: MLflow's: the server's, or ./mlruns for a "
                              "database URI)."),
        ]

    def describe(self) -> str:
        return f"mlflow:{redact_uri(self.tracking_uri)}"

    def start(self, context: ExportContext) -> None:
        self._context = context

    # -- the Destination protocol ------------------------------------------------------

    def open_run(self, run: RunInfo, state: Mapping[str, Any]) -> None:
        with boundary(self.describe(), run, "opening the run"):
            experiment_id = self._experiment(run.project)
            # a state written before attempts were routed holds only the base run's id
            self._routes[run.key] = MlflowRoutes(run, state if "id" in state else {})
            self._targets[run.key] = {}
            base = self._open_target(run, experiment_id, self._routes[run.key].targets[0])
            self._count_what_is_held(run)
            if run.status == "running" and base.status != "RUNNING":
                self._client.update_run(base.run_id, status="RUNNING")
                base.status = "RUNNING"

    def _count_what_is_held(self, run: RunInfo) -> None:
        """A commit lost after its write (the exporter killed before it saved) left
        metrics in the current MLflow run that the committed routes do not count: its
        attempts are bound to it and its last step counted, so that a resumed attempt
        logging those steps again goes to a run of its own, not beside them."""
        routes = self._routes[run.key]
        current = routes.current()
        held, attempts = self._target(run, current).held()
        if held is not None and (current.last_step is None or held > current.last_step):
            current.last_step = held
        index = routes.targets.index(current)
        for attempt in attempts:
            routes.attempts.setdefault(attempt, index)

    def write(self, run: RunInfo, kind: str, records: pa.Table) -> None:
        writers: dict[str, Callable[[RunInfo, MlflowTarget, pa.Table], None]] = {
            "metrics": write_metrics, "configs": write_configs,
            "texts": write_texts, "generations": write_generations,
            "artifacts": self._write_artifacts, "events": write_events,
            "traces": self._write_traces, "histograms": write_histograms,
            "media": self._write_media,
        }
        writer = writers.get(kind)
        if writer is None:
            raise ExportError(f"the mlflow exporter does not know record kind {kind!r} of "
                              f"run {run.key}; upgrade tracklake", retryable=False)
        if records.num_rows == 0:
            return
        routes = self._open_routes(run)
        with boundary(self.describe(), run, f"writing {records.num_rows} {kind} records"):
            for attempt, part in by_attempt(records):
                steps = part.column("step") if kind == "metrics" else None
                first = None if steps is None else pc.min(steps).as_py()
                route = routes.route(attempt, first, routes.current().last_step)
                target = self._target(run, route)
                last = None if steps is None else pc.max(steps).as_py()
                if last is not None:
                    target.may_hold(attempt, last)
                writer(run, target, part)
                if last is not None:
                    route.last_step = last if route.last_step is None else max(
                        route.last_step, last)

    def commit(self, run: RunInfo) -> Mapping[str, Any]:
        routes = self._open_routes(run)  # every write is synchronous: nothing is pending
        base = self._target(run, routes.targets[0])
        return {**routes.dump(), "run_id": base.run_id, "experiment_id": base.experiment_id}

    def finish_run(self, run: RunInfo) -> None:
        status = STATUSES.get(run.status)
        if status is None:
            return  # still running: it stays RUNNING
        with boundary(self.describe(), run, f"marking the run {status}"):
            for route in self._open_routes(run).targets:
                target = self._target(run, route)
                if target.status != status:
                    self._client.set_terminated(target.run_id, status=status)
                    target.status = status

    def close(self) -> None:
        self._targets.clear()
        self._routes.clear()
        self._experiments.clear()

    # -- records (the other kinds need no more than the target) ------------------------

    def _write_artifacts(self, run: RunInfo, target: MlflowTarget, table: pa.Table) -> None:
        write_artifacts(run, target, table, context=self._context,
                        destination=self.describe())

    def _write_media(self, run: RunInfo, target: MlflowTarget, table: pa.Table) -> None:
        write_media(run, target, table, context=self._context, destination=self.describe())

    def _write_traces(self, run: RunInfo, target: MlflowTarget, table: pa.Table) -> None:
        write_traces(run, target, table, tracing=self._tracing, destination=self.describe())

    # -- runs and experiments ----------------------------------------------------------

    def _open_routes(self, run: RunInfo) -> MlflowRoutes:
        routes = self._routes.get(run.key)
        if routes is None:
            raise RuntimeError(f"open_run() was not called for {run.key}")
        return routes

    def _target(self, run: RunInfo, route: Target) -> MlflowTarget:
        """The MLflow run of `route`: the base one, or a resumed attempt's (found or made
        on first use)."""
        target = self._targets[run.key].get(route.id)
        if target is None:
            target = self._open_target(run, self._experiment(run.project), route)
        return target

    def _open_target(self, run: RunInfo, experiment_id: str, route: Target) -> MlflowTarget:
        tags = self._run_tags(run)
        parent = None
        if route.attempt is not None:
            parent = self._target(run, self._open_routes(run).targets[0]).run_id
            tags[RUN_ID_TAG] = attempt_run_tag(run, route.attempt)
            tags.update({"tracklake.attempt": str(route.attempt),
                         "mlflow.parentRunId": parent})
        name, label_tags = attempt_label(run, route)
        for tag in label_tags:
            tags[mlflow_key(tag)] = ""
        found = self._find_run(experiment_id, tags[RUN_ID_TAG])
        mlrun = found if found is not None else self._create_run(
            experiment_id, run, tags, name)
        target = MlflowTarget(self._client, self.tracking_uri, mlrun.info.run_id,
                              experiment_id, mlrun.info.artifact_uri,
                              dict(mlrun.data.params), dict(mlrun.data.tags),
                              mlrun.info.status)
        self._targets[run.key][route.id] = target
        target.log_tags(tags)  # those that changed
        return target

    def _artifact_location(self, project: str) -> str | None:
        if self.artifact_root is None:
            return None
        if "://" in self.artifact_root:
            return f"{self.artifact_root.rstrip('/')}/{project}"
        return (Path(self.artifact_root).expanduser().resolve() / project).as_uri()

    def _experiment(self, project: str) -> str:
        cached = self._experiments.get(project)
        if cached is not None:
            return cached
        from mlflow.exceptions import MlflowException
        from mlflow.protos.databricks_pb2 import RESOURCE_ALREADY_EXISTS, ErrorCode

        experiment = self._client.get_experiment_by_name(project)
        if experiment is None:
            try:
                experiment_id = self._client.create_experiment(
                    project, artifact_location=self._artifact_location(project))
            except MlflowException as exc:
                if exc.error_code != ErrorCode.Name(RESOURCE_ALREADY_EXISTS):
                    raise
                experiment = self._client.get_experiment_by_name(project)  # created meanwhile
                if experiment is None:
                    raise
                experiment_id = experiment.experiment_id
        else:
            experiment_id = experiment.experiment_id
        if experiment is not None and experiment.lifecycle_stage != "active":
            raise ExportError(f"{self.describe()}: experiment {project!r} is deleted; restore "
                              "it (`mlflow experiments restore`) or delete it for good",
                              retryable=False)
        self._experiments[project] = experiment_id
        return experiment_id

    def _find_run(self, experiment_id: str, key: str) -> MlflowRun | None:
        """The oldest active run tagged with this tracklake run (several exist only if two
        exporters created it at once)."""
        if "'" in key or "\\" in key:
            raise ValueError(f"run key {key!r} cannot be quoted in an MLflow filter")
        runs = self._client.search_runs([experiment_id],
                                        filter_string=f"tags.`{RUN_ID_TAG}` = '{key}'",
                                        max_results=100)
        return min(runs, key=lambda r: (r.info.start_time or 0, r.info.run_id), default=None)

    def _create_run(self, experiment_id: str, run: RunInfo, tags: dict[str, str],
                    name: str) -> MlflowRun:
        start = _iso_ms(run.started_at) if run.started_at else None
        created = self._client.create_run(experiment_id, start_time=start, tags=tags,
                                          run_name=name)
        chosen = self._find_run(experiment_id, tags[RUN_ID_TAG]) or created
        if chosen.info.run_id != created.info.run_id:
            self._client.delete_run(created.info.run_id)  # another exporter won the race
        return chosen

    def _run_tags(self, run: RunInfo) -> dict[str, str]:
        tags = {RUN_ID_TAG: run.key, "tracklake.project": run.project,
                "tracklake.attempts": str(run.attempts),
                "tracklake.ranks": ",".join(str(r) for r in run.ranks),
                "tracklake.tags": json.dumps(list(run.tags), ensure_ascii=False)}
        for tag in run.tags:
            key = mlflow_key(tag)
            if key.startswith(("mlflow.", "tracklake.")):
                key = mlflow_key(f"tag.{key}")
            tags[key] = ""
        return {k: v[:MAX_TAG_VAL_LENGTH] for k, v in tags.items()}


def _iso_ms(text: str) -> int:
    import datetime as dt

    return int(dt.datetime.fromisoformat(text).timestamp() * 1000)


@contextlib.contextmanager
def _schema_lock(uri: str | None) -> Iterator[None]:
    """For a SQLite database, one process at a time creates and migrates it: two exporters
    starting on a new database otherwise race in MLflow's schema migration, and one fails.
    A lock file beside the database, held with flock; other URIs need none."""
    prefix = "sqlite:///"
    if not uri or not uri.startswith(prefix) or ":memory:" in uri:
        yield
        return
    import fcntl

    database = Path(uri[len(prefix):].split("?", 1)[0])
    database.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{database}.tracklake-lock", "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
