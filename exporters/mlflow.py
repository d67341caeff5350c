"""MLflow destination: a tracklake run becomes an MLflow run, through `MlflowClient` only.

=============  ===========================================================================
tracklake      MLflow
=============  ===========================================================================
project        experiment of the same name (created if missing)
run            run tagged ``tracklake.run_id`` = ``project/run``, found again by that tag
               (never by name); created with run name = run name or id, start time =
               ``started_at``, tags ``tracklake.run_id``, ``tracklake.project``,
               ``tracklake.attempts``, ``tracklake.ranks`` (``0,1``), ``tracklake.tags``
               (JSON list) and one tag per run tag (value ""; ``mlflow.*``/``tracklake.*``
               names get a ``tag.`` prefix)
status         on `finish_run`: finished → FINISHED, failed → FAILED, killed and crashed →
               KILLED; a run that runs again (a new attempt) is set back to RUNNING
metrics        ``log_batch`` points (key, value, step, timestamp = record time in ms)
configs        params: flattened key → the string itself for a JSON string, else the JSON
               text; cut to 6,000 characters. A value that changes after it was logged
               (MLflow refuses to change a param) goes to the tag
               ``tracklake.param_changed.<key>`` (the latest value) and the param keeps
               the first one. The whole config, untruncated, is the artifact
               ``tracklake/config.json`` (key → JSON value, the latest of each key).
               Latest means of the highest attempt (tag ``tracklake.config_attempt``):
               ranks log the same config, and a rank's older attempt that arrives after
               a newer one (the loop sends stream by stream) changes nothing
texts          artifact ``texts/<key>/step_<step:08d>.txt`` (``no_step.txt`` without a
               step); the last text of a key and step wins
generations    table artifact ``generations/<key>/step_<step:08d>.json`` in the format of
               ``MlflowClient.log_table`` (pandas "split" JSON, registered in the tag
               ``mlflow.loggedArtifacts``), columns rank, attempt, seq, sample, input,
               output, score (null for NaN), extra; rows of all ranks of that step, the
               latest attempt of each rank only. Written as text, not with log_table,
               which appends to an existing file (a re-send would repeat the rows)
artifacts      artifact ``artifacts/<name>``, uploaded from the store's blob (the loop
               sets `store_root`; pass ``store_root=`` when using the class alone); the
               last version of a name wins; media type and metadata are not sent; a
               blob missing from the store is left out, tag
               ``tracklake.missing_artifact.artifacts/<name>`` = its sha256
events         tag ``tracklake.<kind>.<rank>.<attempt>.<seq>`` (kind ``alert`` or
               ``write_error``) = JSON ``{"level", "title", "text", "step", "time"}``
               (time in µs since the epoch; text cut to fit 8,000 characters)
traces         MLflow traces (``tr-<trace_id>``) with the store's span ids, parents and
               start/end times, in the run's experiment and linked to the run; span
               attributes: the logged ones plus ``tracklake.step``, ``tracklake.rank``,
               ``tracklake.attempt``, ``tracklake.token_ids``, ``tracklake.trace_id``,
               ``tracklake.span_id`` (logged attributes named ``mlflow.*`` get a
               ``tracklake.attribute.`` prefix); trace tags
               ``mlflow.traceName`` and ``tracklake.run_id``. Sent with the tracking
               store's ``log_spans`` (MLflow ≥ 3.4): MlflowClient.start_trace/start_span
               go through the process-wide tracer and make new ids, so a re-send would
               make a second trace
=============  ===========================================================================

Keys (metric, param and tag names; path parts of artifacts) are mapped to what MLflow
accepts, the same way everywhere: every character other than a letter, digit, ``_ - .
space / :`` becomes ``_``; empty path segments are dropped and ``.``/``..`` segments
become ``_``/``__`` (MLflow refuses names that change under path normalisation); a key
longer than 250 characters keeps its first 241 and gets ``-`` and 8 hex digits of the
SHA-256 of the original key. In artifact paths ``:`` also becomes ``_``. Two keys that
differ only in replaced characters land on the same MLflow name.

Limits respected (``mlflow.utils.validation``): at most 1,000 metrics and 100 params or
tags per ``log_batch`` request and about 900 kB of JSON per request (MLflow refuses
requests over 1 MB); params of 6,000 and tags of 8,000 characters (longer values are cut
here, not by MLflow). ``mlflow.loggedArtifacts`` stops listing tables when it would
exceed 8,000 characters (the files are still there).

Exactly once, without state: every write is idempotent, so the loop may re-send anything
after a crash or an outage. MLflow's SQL store keeps one metric row per (run, key,
timestamp, step, value, NaN flag) and skips exact duplicates in a batch
(``SqlAlchemyStore._log_metrics``); timestamps come from the record, so a re-sent point
is an exact duplicate. Params already logged with the same value are skipped, tags and
artifact files are overwritten with the same content, tables are merged by (rank,
attempt, seq, sample), and spans are upserted by (trace id, span id) — which also lets
the spans of one trace arrive in several batches. `commit()` returns only the MLflow
run and experiment ids, for information.

Values: NaN is stored and read back as NaN; MLflow's SQL store cannot hold infinities
and stores ±inf as ±1.7976931348623157e308 (``sys.float_info.max``), which is what
``get_metric_history`` then returns.

Network: unless ``telemetry=True`` (``--allow-telemetry``), ``MLFLOW_DISABLE_TELEMETRY``
is set to ``true`` before mlflow is imported (``import mlflow`` creates its telemetry
client when it is not set) and MLflow's telemetry client is reset, so no usage data
leaves the process. MLflow's client retries each HTTP request up to 7 times over about
4 minutes; the export loop already retries with backoff, so unless
``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` is set it is set to 0 here and an outage comes back
at once as ``ExportError(retryable=True)``; ``MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT``
likewise defaults to ``true`` here, so that MLflow does not print run links into the
exporter's output. Errors are translated by MLflow's error
code (HTTP status ≥ 500 except 501, 408 and 429, and connection failures are
retryable; other 4xx are not).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import click
import pyarrow as pa

from tracklake._errors import ExportError
from tracklake.exporters._mlflow_errors import boundary
from tracklake.exporters._mlflow_names import MAX_TAG_VAL_LENGTH, RUN_ID_TAG, mlflow_key
from tracklake.exporters._mlflow_records import (
    write_artifacts,
    write_configs,
    write_events,
    write_generations,
    write_metrics,
    write_texts,
)
from tracklake.exporters._mlflow_spans import write_traces
from tracklake.exporters._mlflow_target import Target
from tracklake.exporters._protocol import RunInfo

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


class MlflowDestination:
    """Exports tracklake runs to an MLflow tracking server or database."""

    name: ClassVar[str] = "mlflow"

    def __init__(self, *, tracking_uri: str | None = None, telemetry: bool = False,
                 store_root: str | os.PathLike[str] | None = None) -> None:
        uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            raise ExportError("no MLflow tracking URI: pass --tracking-uri or set "
                              "MLFLOW_TRACKING_URI", retryable=False)
        self.tracking_uri = uri
        self.telemetry = telemetry
        #: The tracklake store the records come from (artifact blobs are read there).
        self.store_root: Path | None = Path(store_root) if store_root is not None else None
        _configure_mlflow_environment(telemetry)
        self._clients: tuple[MlflowClient, TracingClient] | None = None
        self._experiments: dict[str, str] = {}
        self._targets: dict[str, Target] = {}

    def _make_clients(self) -> tuple[MlflowClient, TracingClient]:
        """The clients, made on first use, inside an error boundary (for a database URI,
        making one connects and migrates the schema)."""
        if self._clients is None:
            from mlflow.tracing.client import TracingClient
            from mlflow.tracking import MlflowClient

            self._clients = (MlflowClient(tracking_uri=self.tracking_uri),
                             TracingClient(self.tracking_uri))
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
    def cli_options(cls) -> list[click.Option]:
        return [
            click.Option(["--tracking-uri", "tracking_uri"], envvar="MLFLOW_TRACKING_URI",
                         show_envvar=True, default=None,
                         help="MLflow tracking URI (a server's http(s) URL or a database)."),
            click.Option(["--allow-telemetry", "telemetry"], is_flag=True, default=False,
                         help="Let MLflow send its usage telemetry (off by default)."),
        ]

    def describe(self) -> str:
        return f"mlflow:{redact_uri(self.tracking_uri)}"

    # -- the Destination protocol ------------------------------------------------------

    def open_run(self, run: RunInfo, state: Mapping[str, Any]) -> None:
        with boundary(self.describe(), run, "opening the run"):
            experiment_id = self._experiment(run.project)
            found = self._find_run(experiment_id, run.key)
            mlrun = found if found is not None else self._create_run(experiment_id, run)
            target = Target(self._client, self.tracking_uri, mlrun.info.run_id,
                            experiment_id, mlrun.info.artifact_uri,
                            dict(mlrun.data.params), dict(mlrun.data.tags),
                            mlrun.info.status)
            self._targets[run.key] = target
            target.log_tags(self._run_tags(run))  # those that changed
            if run.status == "running" and target.status != "RUNNING":
                self._client.update_run(target.run_id, status="RUNNING")
                target.status = "RUNNING"

    def write(self, run: RunInfo, kind: str, records: pa.Table) -> None:
        writers: dict[str, Callable[[RunInfo, Target, pa.Table], None]] = {
            "metrics": write_metrics, "configs": write_configs,
            "texts": write_texts, "generations": write_generations,
            "artifacts": self._write_artifacts, "events": write_events,
            "traces": self._write_traces,
        }
        writer = writers.get(kind)
        if writer is None:
            raise ExportError(f"the mlflow exporter does not know record kind {kind!r} of "
                              f"run {run.key}; upgrade tracklake", retryable=False)
        if records.num_rows == 0:
            return
        with boundary(self.describe(), run, f"writing {records.num_rows} {kind} records"):
            writer(run, self._target(run), records)

    def commit(self, run: RunInfo) -> Mapping[str, Any]:
        target = self._target(run)  # every write is synchronous: nothing is pending
        return {"run_id": target.run_id, "experiment_id": target.experiment_id}

    def finish_run(self, run: RunInfo) -> None:
        status = STATUSES.get(run.status)
        if status is None:
            return  # still running: it stays RUNNING
        with boundary(self.describe(), run, f"marking the run {status}"):
            target = self._target(run)
            if target.status != status:
                self._client.set_terminated(target.run_id, status=status)
                target.status = status

    def close(self) -> None:
        self._targets.clear()
        self._experiments.clear()

    # -- records (the other kinds need no more than the target) ------------------------

    def _write_artifacts(self, run: RunInfo, target: Target, table: pa.Table) -> None:
        write_artifacts(run, target, table, store_root=self.store_root,
                        destination=self.describe())

    def _write_traces(self, run: RunInfo, target: Target, table: pa.Table) -> None:
        write_traces(run, target, table, tracing=self._tracing, destination=self.describe())

    # -- runs and experiments ----------------------------------------------------------

    def _target(self, run: RunInfo) -> Target:
        target = self._targets.get(run.key)
        if target is None:
            raise RuntimeError(f"open_run() was not called for {run.key}")
        return target

    def _experiment(self, project: str) -> str:
        cached = self._experiments.get(project)
        if cached is not None:
            return cached
        from mlflow.exceptions import MlflowException
        from mlflow.protos.databricks_pb2 import RESOURCE_ALREADY_EXISTS, ErrorCode

        experiment = self._client.get_experiment_by_name(project)
        if experiment is None:
            try:
                experiment_id = self._client.create_experiment(project)
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

    def _create_run(self, experiment_id: str, run: RunInfo) -> MlflowRun:
        start = _iso_ms(run.started_at) if run.started_at else None
        created = self._client.create_run(experiment_id, start_time=start,
                                          tags=self._run_tags(run),
                                          run_name=run.name or run.run)
        chosen = self._find_run(experiment_id, run.key) or created
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
