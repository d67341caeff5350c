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
               last version of a name wins; media type and metadata are not sent
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

import contextlib
import errno
import hashlib
import json
import math
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import click
import pyarrow as pa

from tracklake._errors import ExportError
from tracklake._format import blob_path
from tracklake.exporters._protocol import RunInfo

if TYPE_CHECKING:
    from mlflow.entities import Run as MlflowRun
    from mlflow.entities import Span as MlflowSpan
    from mlflow.tracing.client import TracingClient
    from mlflow.tracking import MlflowClient

#: Limits from mlflow.utils.validation (copied so that importing this module does not
#: import mlflow; test_mlflow.py checks they still match).
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_TAGS_PER_BATCH = 100
MAX_BATCH_LOG_REQUEST_SIZE = 1_000_000
MAX_PARAM_VAL_LENGTH = 6000
MAX_TAG_VAL_LENGTH = 8000
MAX_ENTITY_KEY_LENGTH = 250
MAX_TRACE_LINKS_PER_REQUEST = 100
#: Bytes of JSON sent per log_batch request: under MLflow's 1 MB with room for the envelope.
REQUEST_BUDGET = 900_000
#: Spans per log_spans request.
SPANS_PER_REQUEST = 500

RUN_ID_TAG = "tracklake.run_id"
LOGGED_ARTIFACTS_TAG = "mlflow.loggedArtifacts"
CONFIG_ARTIFACT = "tracklake/config.json"
#: The latest attempt whose config was applied (records of older attempts that arrive
#: later, e.g. from another rank, do not overwrite its values).
CONFIG_ATTEMPT_TAG = "tracklake.config_attempt"
TABLE_COLUMNS = ("rank", "attempt", "seq", "sample", "input", "output", "score", "extra")
STATUSES = {"finished": "FINISHED", "failed": "FAILED", "killed": "KILLED",
            "crashed": "KILLED"}
#: MLflow HTTP statuses worth retrying besides 5xx (501 Not Implemented is not).
_RETRY_STATUSES = frozenset({408, 429})
_PERMANENT_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENAMETOOLONG})

_BAD_KEY_CHARS = re.compile(r"[^\w/.\- :]")
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/@]*@")
_T = TypeVar("_T")


def mlflow_key(key: str) -> str:
    """The MLflow metric/param/tag name for a tracklake key (see the module docstring)."""
    name = _BAD_KEY_CHARS.sub("_", key)
    parts = [p for p in name.split("/") if p]
    name = "/".join("_" * len(p) if p in (".", "..") else p for p in parts) or "_"
    if name.startswith(".."):
        name = "_" + name[1:]
    if len(name) > MAX_ENTITY_KEY_LENGTH:
        digest = hashlib.sha256(key.encode()).hexdigest()[:8]
        name = f"{name[:MAX_ENTITY_KEY_LENGTH - 9]}-{digest}"
    return name


def artifact_part(key: str) -> str:
    """A key as a relative artifact path (no ``:``, no empty, ``.`` or ``..`` parts)."""
    return mlflow_key(key).replace(":", "_")


def param_value(json_text: str) -> str:
    """A config value (JSON text) as a param: strings as themselves, the rest as JSON."""
    value = json.loads(json_text)
    return (value if isinstance(value, str) else json_text)[:MAX_PARAM_VAL_LENGTH]


def redact_uri(uri: str) -> str:
    """`uri` without user, password, query and fragment (where credentials may sit)."""
    uri = uri.split("#", 1)[0].split("?", 1)[0]
    return _USERINFO.sub(r"\1", uri)


def _step_name(step: int | None) -> str:
    return "no_step" if step is None else f"step_{step:08d}"


def _hex_id(text: str, nbytes: int) -> str:
    """An OpenTelemetry id: the store's id when it is one already (tracklake writes
    random hex ids of that size), else the first bytes of its SHA-256."""
    if re.fullmatch(f"[0-9a-f]{{{2 * nbytes}}}", text) and int(text, 16):
        return text
    return hashlib.sha256(text.encode()).hexdigest()[:2 * nbytes]


def _chunks(items: Sequence[_T], limit: int, size: Callable[[_T], int]) -> Iterator[list[_T]]:
    """`items` in lists of at most `limit` items and about REQUEST_BUDGET bytes."""
    chunk: list[_T] = []
    used = 0
    for item in items:
        n = size(item)
        if chunk and (len(chunk) >= limit or used + n > REQUEST_BUDGET):
            yield chunk
            chunk, used = [], 0
        chunk.append(item)
        used += n
    if chunk:
        yield chunk


def _json_size(*texts: str) -> int:
    """An upper bound of one entity's share of a log_batch request (MLflow sends indented
    JSON with non-ASCII characters escaped: about 130 bytes besides the strings)."""
    return 200 + sum(len(json.dumps(t)) for t in texts)


def _retryable(exc: BaseException) -> bool:
    """Whether trying again later can help, from the error's code (never its message)."""
    from mlflow.exceptions import MlflowException

    status: int | None = None
    if isinstance(exc, MlflowException):
        # unannotated in mlflow 3.17 (returns the int HTTP status of exc.error_code)
        status = int(exc.get_http_status_code())  # type: ignore[no-untyped-call]
    else:
        import requests

        if isinstance(exc, requests.HTTPError) and exc.response is not None:
            status = exc.response.status_code
        elif isinstance(exc, (requests.ConnectionError, requests.Timeout,
                              requests.exceptions.ChunkedEncodingError,
                              requests.exceptions.RetryError)):
            return True
        elif isinstance(exc, requests.RequestException):
            return False  # a malformed URL, schema or header
        elif isinstance(exc, OSError):
            return exc.errno not in _PERMANENT_ERRNOS
    if status is None:
        return True
    return (status >= 500 and status != 501) or status in _RETRY_STATUSES


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


@dataclass
class _Target:
    """The MLflow run a tracklake run goes to, and what is known of it."""

    run_id: str
    experiment_id: str
    artifact_uri: str
    params: dict[str, str]
    tags: dict[str, str]
    status: str
    listed: dict[str, set[str]] = field(default_factory=dict)  # directory -> file paths
    config: dict[str, Any] | None = None  # tracklake/config.json, once read


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
        self._targets: dict[str, _Target] = {}

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
        with self._boundary(run, "opening the run"):
            experiment_id = self._experiment(run.project)
            found = self._find_run(experiment_id, run.key)
            mlrun = found if found is not None else self._create_run(experiment_id, run)
            target = _Target(mlrun.info.run_id, experiment_id, mlrun.info.artifact_uri,
                             dict(mlrun.data.params), dict(mlrun.data.tags),
                             mlrun.info.status)
            self._targets[run.key] = target
            self._log_tags(target, self._run_tags(run))  # those that changed
            if run.status == "running" and target.status != "RUNNING":
                self._client.update_run(target.run_id, status="RUNNING")
                target.status = "RUNNING"

    def write(self, run: RunInfo, kind: str, records: pa.Table) -> None:
        writers: dict[str, Callable[[RunInfo, _Target, pa.Table], None]] = {
            "metrics": self._write_metrics, "configs": self._write_configs,
            "texts": self._write_texts, "generations": self._write_generations,
            "artifacts": self._write_artifacts, "events": self._write_events,
            "traces": self._write_traces,
        }
        writer = writers.get(kind)
        if writer is None:
            raise ExportError(f"the mlflow exporter does not know record kind {kind!r} of "
                              f"run {run.key}; upgrade tracklake", retryable=False)
        if records.num_rows == 0:
            return
        with self._boundary(run, f"writing {records.num_rows} {kind} records"):
            writer(run, self._target(run), records)

    def commit(self, run: RunInfo) -> Mapping[str, Any]:
        target = self._target(run)  # every write is synchronous: nothing is pending
        return {"run_id": target.run_id, "experiment_id": target.experiment_id}

    def finish_run(self, run: RunInfo) -> None:
        status = STATUSES.get(run.status)
        if status is None:
            return  # still running: it stays RUNNING
        with self._boundary(run, f"marking the run {status}"):
            target = self._target(run)
            if target.status != status:
                self._client.set_terminated(target.run_id, status=status)
                target.status = status

    def close(self) -> None:
        self._targets.clear()
        self._experiments.clear()

    # -- runs and experiments ----------------------------------------------------------

    @contextlib.contextmanager
    def _boundary(self, run: RunInfo, what: str) -> Iterator[None]:
        """Translate MLflow's, requests' and the file system's errors to ExportError."""
        import requests
        from mlflow.exceptions import MlflowException

        try:
            yield
        except (MlflowException, requests.RequestException, OSError) as exc:
            message = exc.message if isinstance(exc, MlflowException) else str(exc)
            raise ExportError(f"{self.describe()}: {what} of {run.key} failed: {message}",
                              retryable=_retryable(exc)) from exc

    def _target(self, run: RunInfo) -> _Target:
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

    def _log_tags(self, target: _Target, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        entities = [RunTag(k, v[:MAX_TAG_VAL_LENGTH]) for k, v in tags.items()
                    if target.tags.get(k) != v[:MAX_TAG_VAL_LENGTH]]
        for chunk in _chunks(entities, MAX_PARAMS_TAGS_PER_BATCH,
                             lambda t: _json_size(t.key, t.value)):
            self._client.log_batch(target.run_id, tags=chunk, synchronous=True)
        target.tags.update((t.key, t.value) for t in entities)

    # -- records -------------------------------------------------------------------------

    def _write_metrics(self, run: RunInfo, target: _Target, table: pa.Table) -> None:
        from mlflow.entities import Metric

        times = table.column("time").cast(pa.int64()).to_pylist()
        metrics = [Metric(mlflow_key(k), float(v), t // 1000, s if s is not None else 0)
                   for k, v, t, s in zip(table.column("key").to_pylist(),
                                         table.column("value").to_pylist(), times,
                                         table.column("step").to_pylist(), strict=True)
                   if v is not None]
        for chunk in _chunks(metrics, MAX_METRICS_PER_BATCH, lambda m: _json_size(m.key)):
            self._client.log_batch(target.run_id, metrics=chunk, synchronous=True)

    def _write_configs(self, run: RunInfo, target: _Target, table: pa.Table) -> None:
        from mlflow.entities import Param

        # Oldest first: the loop sends stream by stream (rank 1's first attempt after rank
        # 0's second), but a later attempt's value must win.
        rows = sorted(table.select(["attempt", "time", "key", "value"]).to_pylist(),
                      key=lambda r: (r["attempt"], r["time"]))
        applied = int(target.tags.get(CONFIG_ATTEMPT_TAG, "0"))
        new: dict[str, str] = {}
        changed: dict[str, str] = {}
        latest: dict[str, Any] = {}
        for row in rows:
            name, value = mlflow_key(row["key"]), param_value(row["value"])
            first = target.params.get(name, new.get(name))
            if first is None:
                new[name] = value
            if row["attempt"] < applied:
                continue  # an older attempt than one already applied: not the latest value
            applied = row["attempt"]
            latest[row["key"]] = json.loads(row["value"])
            change_tag = mlflow_key(f"tracklake.param_changed.{name}")
            if first is not None and (value != first or change_tag in target.tags
                                      or change_tag in changed):
                changed[change_tag] = value
        params = [Param(k, v) for k, v in new.items()]
        for chunk in _chunks(params, MAX_PARAMS_TAGS_PER_BATCH,
                             lambda p: _json_size(p.key, p.value)):
            self._client.log_batch(target.run_id, params=chunk, synchronous=True)
        target.params.update(new)
        config = self._config(target)
        if (any(k not in config or config[k] != v for k, v in latest.items())
                or not self._has_file(target, CONFIG_ARTIFACT)):
            config.update(latest)
            self._put_text(target, CONFIG_ARTIFACT,
                           json.dumps(config, indent=1, sort_keys=True, ensure_ascii=False))
        self._log_tags(target, changed | {CONFIG_ATTEMPT_TAG: str(applied)})

    def _config(self, target: _Target) -> dict[str, Any]:
        if target.config is None:
            text = self._get_text(target, CONFIG_ARTIFACT)
            target.config = json.loads(text) if text is not None else {}
        return target.config

    def _write_texts(self, run: RunInfo, target: _Target, table: pa.Table) -> None:
        latest: dict[str, str] = {}  # the last text of each path wins
        for key, step, text in zip(table.column("key").to_pylist(),
                                   table.column("step").to_pylist(),
                                   table.column("text").to_pylist(), strict=True):
            latest[f"texts/{artifact_part(key)}/{_step_name(step)}.txt"] = text
        for path, text in latest.items():
            self._put_text(target, path, text)

    def _write_generations(self, run: RunInfo, target: _Target, table: pa.Table) -> None:
        groups: dict[str, list[list[Any]]] = {}
        for row in table.select(["key", "step", *TABLE_COLUMNS]).to_pylist():
            path = f"generations/{artifact_part(row['key'])}/{_step_name(row['step'])}.json"
            score = row["score"]
            row["score"] = None if score is None or not math.isfinite(score) else score
            groups.setdefault(path, []).append([row[c] for c in TABLE_COLUMNS])
        for path, rows in groups.items():
            old = self._get_text(target, path)
            if old is not None:
                rows = _merge_rows(json.loads(old)["data"], rows)
            else:
                rows = _merge_rows([], rows)
            self._put_text(target, path, json.dumps({"columns": list(TABLE_COLUMNS),
                                                     "data": rows}, ensure_ascii=False))
        self._register_tables(target, groups)

    def _register_tables(self, target: _Target, paths: Iterable[str]) -> None:
        """List new tables in ``mlflow.loggedArtifacts`` as log_table does (the UI reads
        it), as long as the tag stays within MLflow's tag length limit."""
        listed: list[dict[str, str]] = json.loads(target.tags.get(LOGGED_ARTIFACTS_TAG, "[]"))
        before = len(listed)
        for path in paths:
            entry = {"path": path, "type": "table"}
            if entry in listed:
                continue
            if len(json.dumps([*listed, entry])) > MAX_TAG_VAL_LENGTH:
                break
            listed.append(entry)
        if len(listed) > before:
            self._log_tags(target, {LOGGED_ARTIFACTS_TAG: json.dumps(listed)})

    def _write_artifacts(self, run: RunInfo, target: _Target, table: pa.Table) -> None:
        if self.store_root is None:
            raise ExportError(f"{self.describe()}: cannot upload the artifacts of {run.key}: "
                              "store_root is not set (the export loop sets it)",
                              retryable=False)
        latest: dict[str, str] = {}  # artifact path -> digest; the last one of a name wins
        for name, digest in zip(table.column("name").to_pylist(),
                                table.column("digest").to_pylist(), strict=True):
            latest[f"artifacts/{artifact_part(name)}"] = digest
        for path, digest in latest.items():
            blob = blob_path(self.store_root, digest)
            if not blob.is_file():
                raise ExportError(f"{self.describe()}: artifact {path!r} of {run.key}: its "
                                  f"blob {blob} is missing from the store", retryable=False)
            directory, _, filename = path.rpartition("/")
            with tempfile.TemporaryDirectory(prefix="tracklake-mlflow-") as tmp:
                local = Path(tmp) / filename
                try:
                    local.symlink_to(blob)
                except OSError:  # no symlinks here (some file systems): copy instead
                    local.write_bytes(blob.read_bytes())
                self._client.log_artifact(target.run_id, str(local), directory)
            self._note_file(target, path)

    def _write_events(self, run: RunInfo, target: _Target, table: pa.Table) -> None:
        tags: dict[str, str] = {}
        times = table.column("time").cast(pa.int64()).to_pylist()
        for row, t in zip(table.select(["seq", "step", "level", "kind", "title", "text",
                                        "rank", "attempt"]).to_pylist(), times, strict=True):
            key = mlflow_key(f"tracklake.{row['kind']}.{row['rank']}.{row['attempt']}."
                             f"{row['seq']}")
            tags[key] = _event_value(row | {"time": t})
        self._log_tags(target, tags)

    def _write_traces(self, run: RunInfo, target: _Target, table: pa.Table) -> None:
        from mlflow.entities import Span

        spans = [Span.from_dict(_span_dict(run, row))
                 for row in _with_int_times(table, "time", "end_time").to_pylist()]
        for some in _chunks(spans, SPANS_PER_REQUEST, lambda s: 0):
            self._log_spans(run, target, some)
        trace_ids = sorted({s.trace_id for s in spans})
        for ids in _chunks(trace_ids, MAX_TRACE_LINKS_PER_REQUEST, lambda t: 0):
            self._client.link_traces_to_run(ids, target.run_id)

    def _log_spans(self, run: RunInfo, target: _Target, spans: list[MlflowSpan]) -> None:
        try:
            self._tracing.log_spans(target.experiment_id, spans)
            return
        except NotImplementedError:
            # RestStore.log_spans says this both for a server older than 3.4 and for one
            # it could not reach when it first asked for the version — an answer it then
            # caches (functools.lru_cache) for the whole process. Tell the two apart:
            self._client.get_experiment(target.experiment_id)  # raises if unreachable
        from mlflow.store.tracking.rest_store import RestStore

        clear = getattr(RestStore._get_server_version, "cache_clear", None)
        if callable(clear):
            clear()
        try:
            self._tracing.log_spans(target.experiment_id, spans)
        except NotImplementedError as exc:
            raise ExportError(f"{self.describe()}: cannot store the traces of {run.key}: "
                              "this tracking store does not take spans (MLflow servers do "
                              "from version 3.4, the file store never); upgrade it, or "
                              "export the other kinds only", retryable=False) from exc

    # -- artifact files ------------------------------------------------------------------

    def _files(self, target: _Target, directory: str) -> set[str]:
        """Paths (relative to the run's root) of the files in an artifact directory,
        listed once per open run. Listed at the run's artifact location: listing through
        ``runs:/`` (MlflowClient.list_artifacts) also searches logged models each time."""
        files = target.listed.get(directory)
        if files is None:
            from mlflow.artifacts import list_artifacts

            found = list_artifacts(artifact_uri=f"{target.artifact_uri}/{directory}",
                                   tracking_uri=self.tracking_uri)
            files = {f"{directory}/{f.path.rpartition('/')[2]}" for f in found
                     if not f.is_dir}
            target.listed[directory] = files
        return files

    def _note_file(self, target: _Target, path: str) -> None:
        files = target.listed.get(path.rpartition("/")[0])
        if files is not None:  # (a directory not listed yet will list it)
            files.add(path)

    def _has_file(self, target: _Target, path: str) -> bool:
        return path in self._files(target, path.rpartition("/")[0])

    def _get_text(self, target: _Target, path: str) -> str | None:
        """An artifact's text, or None if the run has no such file."""
        if not self._has_file(target, path):
            return None
        from mlflow.artifacts import download_artifacts

        with tempfile.TemporaryDirectory(prefix="tracklake-mlflow-") as tmp:
            local = download_artifacts(artifact_uri=f"{target.artifact_uri}/{path}",
                                       dst_path=tmp, tracking_uri=self.tracking_uri)
            return Path(local).read_text(encoding="utf-8")

    def _put_text(self, target: _Target, path: str, text: str) -> None:
        self._client.log_text(target.run_id, text, path)
        self._note_file(target, path)


def _event_value(row: Mapping[str, Any]) -> str:
    """An event as a tag value: JSON, its text cut so that it fits MLflow's tag limit."""
    text: str = row["text"] or ""
    while True:
        value = json.dumps({"level": row["level"], "title": row["title"], "text": text,
                            "step": row["step"], "time": row["time"]}, ensure_ascii=False)
        if len(value) <= MAX_TAG_VAL_LENGTH or not text:
            return value[:MAX_TAG_VAL_LENGTH]
        text = text[:max(0, len(text) - (len(value) - MAX_TAG_VAL_LENGTH) - 1)]


def _merge_rows(old: list[list[Any]], new: list[list[Any]]) -> list[list[Any]]:
    """Rows of a generations table: new rows replace old ones with the same (rank,
    attempt, seq, sample); of each rank only its latest attempt is kept."""
    rank, attempt, seq, sample = (TABLE_COLUMNS.index(c)
                                  for c in ("rank", "attempt", "seq", "sample"))
    by_id: dict[tuple[Any, ...], list[Any]] = {}
    for row in (*old, *new):
        by_id[(row[rank], row[attempt], row[seq], row[sample])] = row
    latest: dict[Any, int] = {}
    for row in by_id.values():
        latest[row[rank]] = max(latest.get(row[rank], row[attempt]), row[attempt])
    kept = [r for r in by_id.values() if r[attempt] == latest[r[rank]]]
    return sorted(kept, key=lambda r: (r[rank], r[seq], r[sample]))


def _with_int_times(table: pa.Table, *columns: str) -> pa.Table:
    for name in columns:
        i = table.schema.get_field_index(name)
        table = table.set_column(i, name, table.column(name).cast(pa.int64()))
    return table


def _span_dict(run: RunInfo, row: Mapping[str, Any]) -> dict[str, Any]:
    """A stored span as `mlflow.entities.Span.from_dict` reads it (OTel ids in base64,
    attribute values as JSON text, as MLflow stores them)."""
    import base64

    def b64(hex_id: str) -> str:
        return base64.b64encode(bytes.fromhex(hex_id)).decode()

    trace_hex = _hex_id(row["trace_id"], 16)
    parent = row["parent_id"]
    attributes: dict[str, str] = {
        "mlflow.traceRequestId": json.dumps(f"tr-{trace_hex}"),
        "mlflow.spanType": json.dumps("UNKNOWN"),
    }
    if row["inputs"] is not None:
        attributes["mlflow.spanInputs"] = row["inputs"]
    if row["outputs"] is not None:
        attributes["mlflow.spanOutputs"] = row["outputs"]
    for key, value in json.loads(row["attributes"] or "{}").items():
        name = f"tracklake.attribute.{key}" if key.startswith("mlflow.") else key
        attributes[name] = json.dumps(value, ensure_ascii=False)
    ours = {"tracklake.step": row["step"], "tracklake.rank": row["rank"],
            "tracklake.attempt": row["attempt"], "tracklake.trace_id": row["trace_id"],
            "tracklake.span_id": row["span_id"], "tracklake.token_ids": row["token_ids"]}
    attributes.update((k, json.dumps(v)) for k, v in ours.items() if v is not None)
    if parent is None:  # trace tags ride on the root span
        attributes["mlflow.traceTag.mlflow.traceName"] = json.dumps(row["name"])
        attributes[f"mlflow.traceTag.{RUN_ID_TAG}"] = json.dumps(run.key)
    error = row["status"] == "error"
    end_ns = row["end_time"] * 1000
    return {
        "trace_id": b64(trace_hex),
        "span_id": b64(_hex_id(row["span_id"], 8)),
        "parent_span_id": b64(_hex_id(parent, 8)) if parent is not None else None,
        "name": row["name"],
        "start_time_unix_nano": row["time"] * 1000,
        "end_time_unix_nano": end_ns,
        "status": {"code": "STATUS_CODE_ERROR" if error else "STATUS_CODE_OK",
                   "message": (row["error"] or "") if error else ""},
        "attributes": attributes,
        "events": [{"name": "exception", "time_unix_nano": end_ns,
                    "attributes": {"exception.message": row["error"] or ""}}] if error else [],
    }


def _iso_ms(text: str) -> int:
    import datetime as dt

    return int(dt.datetime.fromisoformat(text).timestamp() * 1000)
