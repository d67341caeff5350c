"""The MLflow destination against a real `mlflow server` and a direct sqlite database:
every record kind arrives exactly as stored, re-sending duplicates nothing, the run is
found again by its tag, and errors say whether retrying helps."""

from __future__ import annotations

import contextlib
import json
import math
import os
import sqlite3
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pyarrow as pa
import pytest
from _optional import optional
from _records import records_by_kind
from click.testing import CliRunner

import tracklake

mlflow = optional("mlflow")  # before the destination, which needs it

from mlflow.tracking import MlflowClient

from tracklake import ExportError
from tracklake.exporters import ExportContext, RunInfo
from tracklake.exporters._shared.keys import DIGITS
from tracklake.exporters.mlflow.destination import MlflowDestination, redact_uri
from tracklake.exporters.mlflow.names import RUN_ID_TAG, artifact_part, mlflow_key

pytestmark = [
    # MLflow 3.17's SQL store maps a relationship with `lazy="noload"`, which SQLAlchemy 2.1
    # deprecates; the warning comes once, when mlflow.store.tracking.sqlalchemy_store is
    # first imported (by whichever test opens a sqlite URI first).
    pytest.mark.filterwarnings(
        "ignore:The ``noload`` loader strategy is deprecated"),
]

PROJECT = "tracklake-tests"
MAX_FLOAT = sys.float_info.max
#: Metric keys read back one by one with get_metric_history (the 1,001 wide ones are
#: checked row by row in the database instead, which is faster than 1,001 requests).
NAMED_KEYS = ("loss", "acc@1", "bad key!", "/./a//b/../c/", "nan", "inf", "-inf")
LONG_PROMPT = "x" * 7000


# -- building a run in the store and feeding it to the destination -----------------------


def _log_run(root: Path, run_id: str) -> None:
    """Two attempts of rank 0 and one of rank 1, with every kind of record."""
    config = {"lr": 0.1, "model": {"name": "qwen", "layers": 4}, "prompt": LONG_PROMPT}
    with tracklake.init(project=PROJECT, run_id=run_id, name="my run", root=root, rank=0,
                        capture_identity=False, tags=["baseline", "team:nlp"],
                        config=config) as run:
        for step in range(3):
            run.log({"loss": 1.0 / (step + 1), "acc@1": step / 10, "bad key!": step,
                     "/./a//b/../c/": step * 2, "nan": math.nan, "inf": math.inf,
                     "-inf": -math.inf}, step=step)
        run.log({f"wide/{i:04d}": float(i) for i in range(1001)}, step=3)
        run.log_text("notes/summary", "hello\nworld", step=2)
        run.log_text("notes/summary", "later", step=3)
        run.log_text("time: ms/ü", "odd key", step=3)
        run.log_generations([{"input": "q1", "output": "a1", "score": 1.0, "id": 7},
                             ("q2", "a2", math.nan)], step=2, key="val")
        with run.span("rollout", inputs={"prompt": "q1"}, token_ids=[1, 2, 3],
                      turn=1) as span:
            with run.span("tool", inputs="call") as tool:
                tool.outputs = {"result": 42}
            span.outputs = {"answer": "a1"}
        with pytest.raises(ValueError), run.span("failing"):
            raise ValueError("boom")
        files = root.parent / "files"
        (files / "sub").mkdir(parents=True)
        (files / "sub" / "data.bin").write_bytes(b"artifact bytes \x00\xff")
        (files / "a.txt").write_text("text")
        run.log_artifact(files)  # named files/a.txt and files/sub/data.bin
        run.alert("Loss spike", "loss went up", level="warning", step=2)
    with tracklake.init(project=PROJECT, run_id=run_id, root=root, rank=1,
                        capture_identity=False, config=config) as run:
        run.log_generations([("q3", "a3", 0.5)], step=2, key="val")
    with tracklake.init(project=PROJECT, run_id=run_id, name="my run", root=root, rank=0,
                        capture_identity=False, tags=["baseline", "team:nlp"],
                        config=config | {"lr": 0.2}) as run:
        run.log({"loss": 0.05}, step=4)  # continues after attempt 1
        run.log_generations([("q4", "a4", 0.25)], step=2, key="val")  # supersedes attempt 1


def _info(root: Path, run_id: str) -> RunInfo:
    record = tracklake.find_run(root, run_id, PROJECT)
    latest = max(record.attempt_numbers)
    rank0 = max((a for a in record.attempts if a["rank"] == 0), key=lambda a: a["attempt"])
    return RunInfo(PROJECT, run_id, rank0["name"], rank0["status"], latest,
                   tuple(record.ranks), tuple(rank0["tags"]), record.attempts[0]["started_at"])


def _records(root: Path, run_id: str) -> dict[str, pa.Table]:
    """Every record of the run per kind, with `rank` and `attempt` columns, as the loop
    hands them over (metrics and texts of rank 0 only, as in its default rank mode)."""
    return records_by_kind(root, PROJECT, run_id, skip=lambda s: s.kind in (
        "metrics", "texts") and s.rank != 0)


def _export(dest: MlflowDestination, info: RunInfo, records: dict[str, pa.Table]) -> str:
    dest.open_run(info, {})
    for kind in tracklake.KINDS:
        if kind in records:
            dest.write(info, kind, records[kind])
    state = dest.commit(info)
    dest.finish_run(info)
    return str(state["run_id"])


@pytest.fixture(params=["server", "sqlite"])
def backend(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
            monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    """(tracking URI, its sqlite database): a real server, or the database directly."""
    if request.param == "server":
        server = request.getfixturevalue("_mlflow_server_process")
        return server.uri, server.database
    base = tmp_path_factory.getbasetemp() / "mlflow-direct"
    base.mkdir(exist_ok=True)
    # without a server, MLflow puts artifacts under ./mlruns of the working directory
    monkeypatch.chdir(base)
    return f"sqlite:///{base / 'mlflow.db'}", base / "mlflow.db"


def _started(dest: MlflowDestination, root: Path) -> MlflowDestination:
    """The destination as the loop hands it over: started on the store `root`."""
    dest.start(ExportContext(root=root, ranks="0"))
    return dest


@pytest.fixture
def dest(backend: tuple[str, Path], root: Path) -> Iterator[MlflowDestination]:
    d = _started(MlflowDestination(tracking_uri=backend[0]), root)
    yield d
    d.close()


@pytest.fixture
def run_id() -> str:
    return f"r-{uuid.uuid4().hex[:12]}"


# -- what the store says MLflow must hold, and what MLflow holds ---------------------------


def _metric_value(value: float) -> float | str:
    """How MLflow's SQL store keeps a value: NaN as NaN, ±inf as ±max float."""
    if math.isnan(value):
        return "nan"
    return max(-MAX_FLOAT, min(MAX_FLOAT, value))


def _expected_metrics(records: dict[str, pa.Table]) -> list[tuple[Any, ...]]:
    t = records["metrics"]
    times = t.column("time").cast(pa.int64()).to_pylist()
    return sorted({(mlflow_key(k), s, _metric_value(v), us // 1000) for k, s, v, us in zip(
        t.column("key").to_pylist(), t.column("step").to_pylist(),
        t.column("value").to_pylist(), times, strict=True)}, key=repr)


def _database_metrics(database: Path, mlflow_run_id: str) -> list[tuple[Any, ...]]:
    # closed, not only ended: a sqlite3 connection's own `with` leaves it open, which
    # Python 3.13 reports (ResourceWarning) when it is collected
    with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as db:
        rows = db.execute("SELECT key, step, value, is_nan, timestamp FROM metrics "
                          "WHERE run_uuid = ?", (mlflow_run_id,)).fetchall()
    return sorted(((k, s, "nan" if nan else v, ts) for k, s, v, nan, ts in rows), key=repr)


def _history(client: MlflowClient, mlflow_run_id: str) -> list[tuple[Any, ...]]:
    points = [(m.key, m.step, _metric_value(m.value), m.timestamp)
              for key in NAMED_KEYS for m in client.get_metric_history(mlflow_run_id,
                                                                        mlflow_key(key))]
    return sorted(points, key=repr)


def _artifacts(client: MlflowClient, mlflow_run_id: str, tmp: Path) -> dict[str, bytes]:
    """Every artifact file of the run (path -> bytes), downloaded in one call."""
    tmp.mkdir(parents=True)
    local = Path(client.download_artifacts(mlflow_run_id, "", str(tmp)))
    return {p.relative_to(local).as_posix(): p.read_bytes()
            for p in sorted(local.rglob("*")) if p.is_file()}


def _expected_tables(records: dict[str, pa.Table]) -> dict[str, list[list[Any]]]:
    rows = records["generations"].to_pylist()
    latest: dict[tuple[Any, ...], int] = {}
    for r in rows:
        at = (r["key"], r["step"], r["rank"])
        latest[at] = max(latest.get(at, 0), r["attempt"])
    tables: dict[str, list[list[Any]]] = {}
    for r in sorted(rows, key=lambda r: (r["rank"], r["seq"], r["sample"])):
        if r["attempt"] == latest[(r["key"], r["step"], r["rank"])]:
            score = r["score"] if r["score"] is not None and math.isfinite(r["score"]) else None
            tables.setdefault(f"generations/{r['key']}/step_{r['step']:08d}.json", []).append(
                [r["rank"], r["attempt"], r["seq"], r["sample"], r["input"], r["output"],
                 score, r["extra"]])
    return tables


def _expected_spans(records: dict[str, pa.Table]) -> list[dict[str, Any]]:
    spans = []
    t = records["traces"]
    for row, start, end in zip(t.to_pylist(), t.column("time").cast(pa.int64()).to_pylist(),
                               t.column("end_time").cast(pa.int64()).to_pylist(), strict=True):
        attributes = json.loads(row["attributes"] or "{}") | {
            "tracklake.step": row["step"], "tracklake.rank": row["rank"],
            "tracklake.attempt": row["attempt"], "tracklake.trace_id": row["trace_id"],
            "tracklake.span_id": row["span_id"]}
        if row["token_ids"] is not None:
            attributes["tracklake.token_ids"] = row["token_ids"]
        spans.append({
            "trace_id": f"tr-{row['trace_id']}", "span_id": row["span_id"],
            "parent_id": row["parent_id"], "name": row["name"],
            "start_ns": start * 1000, "end_ns": end * 1000,
            "status": "ERROR" if row["status"] == "error" else "OK",
            "message": row["error"] or "",
            "inputs": json.loads(row["inputs"]) if row["inputs"] else None,
            "outputs": json.loads(row["outputs"]) if row["outputs"] else None,
            "attributes": {k: v for k, v in attributes.items() if v is not None}})
    return sorted(spans, key=lambda s: (s["trace_id"], s["span_id"]))


def _mlflow_spans(client: MlflowClient, experiment_id: str,
                  mlflow_run_id: str) -> tuple[list[dict[str, Any]], dict[str, dict[str, str]]]:
    traces = client.search_traces(locations=[experiment_id], run_id=mlflow_run_id)
    spans = []
    for trace in traces:
        for s in trace.data.spans:
            spans.append({
                "trace_id": s.trace_id, "span_id": s.span_id, "parent_id": s.parent_id,
                "name": s.name, "start_ns": s.start_time_ns, "end_ns": s.end_time_ns,
                "status": s.status.status_code.value, "message": s.status.description,
                "inputs": s.inputs, "outputs": s.outputs,
                "attributes": {k: v for k, v in s.attributes.items()
                               if not k.startswith("mlflow.")}})
    tags = {t.info.trace_id: {k: v for k, v in t.info.tags.items()
                              if k in ("mlflow.traceName", "tracklake.run_id")}
            for t in traces}
    return sorted(spans, key=lambda s: (s["trace_id"], s["span_id"])), tags


def _snapshot(client: MlflowClient, database: Path, mlflow_run_id: str,
              tmp: Path) -> dict[str, Any]:
    """Everything MLflow holds of one run, read back through MlflowClient (and the metric
    rows of its database)."""
    run = client.get_run(mlflow_run_id)
    contents = _artifacts(client, mlflow_run_id, tmp)
    return {
        "name": run.info.run_name, "status": run.info.status,
        "start_time": run.info.start_time, "experiment_id": run.info.experiment_id,
        "params": run.data.params,
        "tags": {k: v for k, v in run.data.tags.items() if not k.startswith("mlflow.")
                 or k == "mlflow.loggedArtifacts"},
        "rows": _database_metrics(database, mlflow_run_id),
        "history": _history(client, mlflow_run_id),
        "files": sorted(contents),
        "contents": contents,
        "spans": _mlflow_spans(client, run.info.experiment_id, mlflow_run_id),
    }


def _runs_tagged(client: MlflowClient, experiment_id: str, key: str) -> list[str]:
    found = client.search_runs([experiment_id], f"tags.`tracklake.run_id` = '{key}'")
    return [r.info.run_id for r in found]


# -- the tests -------------------------------------------------------------------------------


def test_limits_are_mlflows_own() -> None:
    from mlflow.store import tracking as tracking_store
    from mlflow.utils import validation

    from tracklake.exporters.mlflow import names as dest_module

    for name in ("MAX_METRICS_PER_BATCH", "MAX_PARAMS_TAGS_PER_BATCH",
                 "MAX_BATCH_LOG_REQUEST_SIZE", "MAX_PARAM_VAL_LENGTH", "MAX_TAG_VAL_LENGTH",
                 "MAX_ENTITY_KEY_LENGTH"):
        assert getattr(dest_module, name) == getattr(validation, name), name
    assert dest_module.MAX_TRACE_LINKS_PER_REQUEST == tracking_store.MAX_TRACE_LINKS_PER_REQUEST
    assert dest_module.REQUEST_BUDGET < validation.MAX_BATCH_LOG_REQUEST_SIZE


@pytest.mark.parametrize(("key", "cleaned"), [
    ("actor/pg_loss", "actor/pg_loss"),
    ("time: ms", "time: ms"),
    ("损失", "损失"),
    ("bad key!", "bad key_"),
    ("/./a//b/../c/", "_/a/b/__/c"),
    ("..hidden", "_.hidden"),
    ("/", "_"),
    ("a\tb", "a_b"),
])
def test_keys_map_to_names_mlflow_accepts(key: str, cleaned: str) -> None:
    """A key MLflow takes keeps its name; any other gets its cleaned form and a hash of
    the key, so that `bad key!` and `bad key_` stay apart (``@`` is verl's rule:
    tests/exporters/test_mlflow_verl_names.py)."""
    from mlflow.utils.validation import _validate_metric_name

    name = mlflow_key(key)
    if cleaned == key:
        assert name == key
    else:
        assert name.startswith(cleaned + "-") and len(name) == len(cleaned) + 1 + DIGITS
        assert name != mlflow_key(cleaned)
    _validate_metric_name(name)  # MLflow's own check raises if it refuses the name


def test_long_keys_keep_a_stable_distinct_suffix() -> None:
    a, b = mlflow_key("k" * 300), mlflow_key("k" * 301)
    assert len(a) == len(b) == 250
    assert a != b and a == mlflow_key("k" * 300)
    assert artifact_part("time: ms/x").startswith("time_ ms/x-")


@pytest.mark.parametrize(("uri", "shown"), [
    ("https://user:secret@mlflow.example:5000/base?token=abc#x",
     "https://mlflow.example:5000/base"),
    ("postgresql+psycopg2://u:p@db:5432/mlflow?sslmode=require",
     "postgresql+psycopg2://db:5432/mlflow"),
    ("mysql://user@db/mlflow", "mysql://db/mlflow"),
    ("sqlite:////abs/mlflow.db", "sqlite:////abs/mlflow.db"),
    ("sqlite:///mlflow.db", "sqlite:///mlflow.db"),
    ("file:///tmp/mlruns", "file:///tmp/mlruns"),
    ("databricks", "databricks"),
])
def test_describe_hides_credentials(uri: str, shown: str) -> None:
    assert redact_uri(uri) == shown


def test_describe_names_the_destination() -> None:
    dest = MlflowDestination(tracking_uri="https://u:p@mlflow.example/base")
    assert dest.describe() == "mlflow:https://mlflow.example/base"


def test_cli_options_default_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}
    command = click.Command("export", params=list(MlflowDestination.cli_options()),
                            callback=lambda **kw: seen.update(kw))
    result = CliRunner().invoke(command, [], env={"MLFLOW_TRACKING_URI": "http://h:1"})
    assert result.exit_code == 0, result.output
    assert seen == {"tracking_uri": "http://h:1", "telemetry": False, "artifact_root": None}
    CliRunner().invoke(command, ["--tracking-uri", "sqlite:///x.db", "--allow-telemetry",
                                 "--artifact-root", "arts"])
    assert seen == {"tracking_uri": "sqlite:///x.db", "telemetry": True,
                    "artifact_root": "arts"}
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://from-env:5000")
    assert MlflowDestination(**seen | {"tracking_uri": None}).tracking_uri == (
        "http://from-env:5000")


@pytest.mark.parametrize(("error", "retryable"), [
    ("TEMPORARILY_UNAVAILABLE", True), ("INTERNAL_ERROR", True),
    ("REQUEST_LIMIT_EXCEEDED", True), ("DEADLINE_EXCEEDED", True),
    ("NOT_IMPLEMENTED", False), ("INVALID_PARAMETER_VALUE", False),
    ("RESOURCE_DOES_NOT_EXIST", False), ("PERMISSION_DENIED", False),
    ("UNAUTHENTICATED", False),
])
def test_mlflow_errors_are_retryable_by_their_code(error: str, retryable: bool) -> None:
    from mlflow.exceptions import MlflowException
    from mlflow.protos import databricks_pb2

    from tracklake.exporters.mlflow.errors import _retryable

    exc = MlflowException("message text is not looked at",
                          error_code=databricks_pb2.ErrorCode.Value(error))
    assert _retryable(exc) is retryable


def test_transport_errors_are_retryable_unless_permanent() -> None:
    import errno

    import requests

    from tracklake.exporters.mlflow.errors import _retryable

    assert _retryable(requests.ConnectionError("refused"))
    assert _retryable(requests.Timeout("slow"))
    assert not _retryable(requests.exceptions.InvalidURL("bad"))
    assert _retryable(OSError(errno.ENOSPC, "full"))
    assert not _retryable(OSError(errno.EACCES, "denied"))


def test_no_tracking_uri_is_a_clear_error() -> None:
    with pytest.raises(ExportError, match="MLFLOW_TRACKING_URI") as err:
        MlflowDestination()
    assert not err.value.retryable


def test_telemetry_is_off_unless_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.telemetry import get_telemetry_client

    monkeypatch.delenv("MLFLOW_DISABLE_TELEMETRY", raising=False)
    MlflowDestination(tracking_uri="http://127.0.0.1:9")
    assert os.environ["MLFLOW_DISABLE_TELEMETRY"] == "true"
    assert get_telemetry_client() is None


def test_every_kind_arrives_exactly_as_stored(dest: MlflowDestination, root: Path,
                                              run_id: str, backend: tuple[str, Path],
                                              tmp_path: Path) -> None:
    _log_run(root, run_id)
    info, records = _info(root, run_id), _records(root, run_id)
    mlflow_run_id = _export(dest, info, records)
    client = MlflowClient(backend[0])
    got = _snapshot(client, backend[1], mlflow_run_id, tmp_path / "artifacts")

    assert (got["name"], got["status"]) == ("my run", "FINISHED")
    assert got["start_time"] == _iso_ms(info.started_at)
    # metrics: every point once, NaN as NaN, ±inf as ±max float, time in ms of the record
    expected = _expected_metrics(records)
    assert got["rows"] == expected
    assert len(expected) == 7 * 3 + 1001 + 1
    assert got["history"] == [p for p in expected if p[0] in map(mlflow_key, NAMED_KEYS)]
    # params: the first value, cut to MLflow's limit; a later value as a tag; the whole
    # config, untruncated, as an artifact
    assert got["params"] == {"lr": "0.1", "model/name": "qwen", "model/layers": "4",
                             "prompt": LONG_PROMPT[:6000]}
    config = json.loads(got["contents"]["tracklake/config.json"])
    assert config == {"lr": 0.2, "model/name": "qwen", "model/layers": 4,
                      "prompt": LONG_PROMPT}
    alerts = records["events"].to_pylist()
    assert len(alerts) == 1
    alert_time = records["events"].column("time").cast(pa.int64())[0].as_py()
    assert got["tags"] == {
        "tracklake.run_id": f"{PROJECT}/{run_id}", "tracklake.project": PROJECT,
        "tracklake.attempts": "2", "tracklake.ranks": "0,1",
        "tracklake.tags": '["baseline", "team:nlp"]', "baseline": "", "team:nlp": "",
        "tracklake.param_changed.lr": "0.2", "tracklake.config_attempt": "2",
        "tracklake.held": '{"last_step": 4, "attempts": [1, 2]}',
        f"tracklake.alert.0.1.{alerts[0]['seq']}": json.dumps({
            "level": "warning", "title": "Loss spike", "text": "loss went up", "step": 2,
            "time": alert_time}),
        "mlflow.loggedArtifacts": json.dumps(
            [{"path": "generations/val/step_00000002.json", "type": "table"}]),
    }
    # texts, generations (rows of both ranks, attempt 2 replacing attempt 1 of rank 0),
    # the artifact's bytes
    tables = _expected_tables(records)
    assert records["artifacts"].column("name").to_pylist() == ["files/a.txt",
                                                               "files/sub/data.bin"]
    assert got["files"] == sorted(["artifacts/files/a.txt", "artifacts/files/sub/data.bin",
                                   "tracklake/config.json",
                                   "texts/notes/summary/step_00000002.txt",
                                   "texts/notes/summary/step_00000003.txt",
                                   f"texts/{artifact_part('time: ms/ü')}/step_00000003.txt",
                                   *tables])
    assert got["contents"]["texts/notes/summary/step_00000002.txt"] == b"hello\nworld"
    assert got["contents"]["texts/notes/summary/step_00000003.txt"] == b"later"
    odd = f"texts/{artifact_part('time: ms/ü')}/step_00000003.txt"
    assert odd.startswith("texts/time_ ms/ü-")  # `:` is refused in artifact paths
    assert got["contents"][odd] == b"odd key"
    assert got["contents"]["artifacts/files/sub/data.bin"] == b"artifact bytes \x00\xff"
    assert got["contents"]["artifacts/files/a.txt"] == b"text"
    for path, rows in tables.items():
        table = json.loads(got["contents"][path])
        assert table == {"columns": ["rank", "attempt", "seq", "sample", "input", "output",
                                     "score", "extra"], "data": rows}
    assert [r[4] for r in tables["generations/val/step_00000002.json"]] == ["q4", "q3"]
    # traces: the store's ids, parents, times, status, inputs, outputs and attributes
    spans, trace_tags = got["spans"]
    assert spans == _expected_spans(records)
    assert len(spans) == 3 and len(trace_tags) == 2
    roots = {r["trace_id"]: r["name"] for r in records["traces"].to_pylist()
             if r["parent_id"] is None}
    assert trace_tags == {f"tr-{t}": {"mlflow.traceName": name,
                                      "tracklake.run_id": f"{PROJECT}/{run_id}"}
                          for t, name in roots.items()}


def test_resending_duplicates_nothing_and_finds_the_run_by_its_tag(
        dest: MlflowDestination, root: Path, run_id: str, backend: tuple[str, Path],
        tmp_path: Path) -> None:
    _log_run(root, run_id)
    info, records = _info(root, run_id), _records(root, run_id)
    first = _export(dest, info, records)
    client = MlflowClient(backend[0])
    client.update_run(first, name="renamed in the UI")  # the name is not how it is found
    before = _snapshot(client, backend[1], first, tmp_path / "before")
    # a crash before commit: a new exporter process sends everything again
    again = _started(MlflowDestination(tracking_uri=backend[0]), root)
    assert _export(again, info, records) == first
    after = _snapshot(client, backend[1], first, tmp_path / "after")
    assert after == before
    assert _runs_tagged(client, before["experiment_id"], info.key) == [first]
    # and the same records sent twice within one open run
    again.open_run(info, {"run_id": first})
    for kind in ("metrics", "configs", "generations", "traces"):
        again.write(info, kind, records[kind])
    assert _snapshot(client, backend[1], first, tmp_path / "twice") == before


def test_requests_stay_within_mlflows_count_and_size_limits(
        dest: MlflowDestination, root: Path, run_id: str, backend: tuple[str, Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """150 params of 6,000 non-ASCII characters make 5.4 MB of JSON as MLflow sends it: they
    go in requests under 1 MB (the 3.17 server no longer checks the size, other servers
    refuse larger ones); 2,500 metrics of one step go in three requests."""
    from mlflow.protos.service_pb2 import LogBatch
    from mlflow.utils.proto_json_utils import message_to_json

    requests: list[tuple[int, int, int, int]] = []
    log_batch = MlflowClient.log_batch

    def measured(self: MlflowClient, run_id: str, metrics: Any = (), params: Any = (),
                 tags: Any = (), synchronous: bool | None = None) -> Any:
        body = message_to_json(LogBatch(run_id=run_id, metrics=[m.to_proto() for m in metrics],
                                        params=[p.to_proto() for p in params],
                                        tags=[t.to_proto() for t in tags]))
        requests.append((len(metrics), len(params), len(tags), len(body)))
        return log_batch(self, run_id, metrics, params, tags, synchronous)

    monkeypatch.setattr(MlflowClient, "log_batch", measured)
    config = {f"p{i:03d}": "é" * 6000 for i in range(150)}
    with tracklake.init(project=PROJECT, run_id=run_id, root=root, capture_identity=False,
                        config=config) as run:
        run.log({f"m{i:04d}": float(i) for i in range(2500)}, step=0)
    info, records = _info(root, run_id), _records(root, run_id)
    mlflow_run_id = _export(dest, info, records)
    got = MlflowClient(backend[0]).get_run(mlflow_run_id).data
    assert got.params == config
    assert got.metrics == {f"m{i:04d}": float(i) for i in range(2500)}
    assert all(m <= 1000 and p <= 100 and t <= 100 and size <= 1_000_000
               for m, p, t, size in requests), requests
    assert [m for m, _, _, _ in requests if m] == [1000, 1000, 500]
    assert sum(p for _, p, _, _ in requests) == 150
    assert len([p for _, p, _, _ in requests if p]) >= 6  # not 2: split by size


def test_a_new_attempt_sets_the_run_running_again(dest: MlflowDestination, root: Path,
                                                  run_id: str,
                                                  backend: tuple[str, Path]) -> None:
    with tracklake.init(project=PROJECT, run_id=run_id, root=root,
                        capture_identity=False) as run:
        run.log({"loss": 1.0}, step=0)
    info = _info(root, run_id)
    mlflow_run_id = _export(dest, info, _records(root, run_id))
    client = MlflowClient(backend[0])
    assert client.get_run(mlflow_run_id).info.status == "FINISHED"
    resumed = RunInfo(PROJECT, run_id, None, "running", 2, (0,), (), info.started_at)
    dest.open_run(resumed, {})
    got = client.get_run(mlflow_run_id)
    assert (got.info.status, got.info.run_name) == ("RUNNING", run_id)
    assert got.data.tags["tracklake.attempts"] == "2"
    dest.finish_run(RunInfo(PROJECT, run_id, None, "crashed", 2, (0,), (), info.started_at))
    assert client.get_run(mlflow_run_id).info.status == "KILLED"


def test_an_outage_is_retryable_and_the_export_resumes(
        mlflow_server_control: Any, root: Path, run_id: str) -> None:
    _log_run(root, run_id)
    info, records = _info(root, run_id), _records(root, run_id)
    dest = _started(MlflowDestination(tracking_uri=mlflow_server_control.uri), root)
    dest.open_run(info, {})
    with mlflow_server_control.outage():
        with pytest.raises(ExportError) as err:
            MlflowDestination(tracking_uri=mlflow_server_control.uri).open_run(info, {})
        assert err.value.retryable
        for kind in ("metrics", "configs", "texts", "generations", "artifacts", "events",
                     "traces"):
            with pytest.raises(ExportError, match="failed") as err:
                dest.write(info, kind, records[kind])
            assert err.value.retryable, kind
            assert isinstance(err.value.__cause__, Exception)
    mlflow_run_id = _export(dest, info, records)  # what the loop does after its backoff
    rows = _database_metrics(mlflow_server_control.database, mlflow_run_id)
    assert rows == _expected_metrics(records)


def test_a_refused_write_is_not_retryable(dest: MlflowDestination, root: Path, run_id: str,
                                          backend: tuple[str, Path]) -> None:
    with tracklake.init(project=PROJECT, run_id=run_id, root=root,
                        capture_identity=False) as run:
        run.log({"loss": 1.0}, step=0)
    info, records = _info(root, run_id), _records(root, run_id)
    dest.open_run(info, {})
    mlflow_run_id = dest.commit(info)["run_id"]
    MlflowClient(backend[0]).delete_run(mlflow_run_id)  # MLflow refuses writes to it now
    with pytest.raises(ExportError, match=f"{PROJECT}/{run_id}") as err:
        dest.write(info, "metrics", records["metrics"])
    assert not err.value.retryable
    dest.open_run(info, {})  # a deleted run is not found again: a new one is made
    assert dest.commit(info)["run_id"] != mlflow_run_id


def test_artifacts_need_the_destination_started(backend: tuple[str, Path], root: Path,
                                       run_id: str) -> None:
    with tracklake.init(project=PROJECT, run_id=run_id, root=root,
                        capture_identity=False) as run:
        run.log_artifact(b"x", name="x.bin")
    info, records = _info(root, run_id), _records(root, run_id)
    dest = MlflowDestination(tracking_uri=backend[0])
    dest.open_run(info, {})
    with pytest.raises(ExportError, match="not started") as err:
        dest.write(info, "artifacts", records["artifacts"])
    assert not err.value.retryable


def _iso_ms(text: str | None) -> int:
    import datetime as dt

    assert text is not None
    return int(dt.datetime.fromisoformat(text).timestamp() * 1000)


def test_an_artifact_whose_blob_is_missing_is_left_out_and_named_in_a_tag(
        dest: MlflowDestination, backend: tuple[str, Path], root: Path, run_id: str) -> None:
    from tracklake.read import blob_path
    with tracklake.init(project=PROJECT, run_id=run_id, root=root,
                        capture_identity=False) as run:
        run.log_artifact(b"kept", name="kept.bin")
        lost = run.log_artifact(b"lost", name="lost.bin")
    assert lost is not None
    blob_path(root, lost).unlink()
    info = _info(root, run_id)
    mlflow_run_id = _export(dest, info, _records(root, run_id))
    client = MlflowClient(backend[0])
    assert [f.path for f in client.list_artifacts(mlflow_run_id, "artifacts")] == [
        "artifacts/kept.bin"]
    tags = client.get_run(mlflow_run_id).data.tags
    assert tags["tracklake.missing_artifact.artifacts/lost.bin"] == lost


def test_an_artifact_root_keeps_new_experiments_artifacts_under_it(
        root: Path, run_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a database URI MLflow would put artifacts in ./mlruns of the current
    directory; --artifact-root puts those of experiments the exporter creates under it."""
    monkeypatch.chdir(tmp_path)
    with tracklake.init(project=PROJECT, run_id=run_id, root=root,
                        capture_identity=False) as run:
        run.log_artifact(b"weights", name="model.bin")
    uri = f"sqlite:///{tmp_path}/fresh.db"  # the experiment does not exist yet
    dest = _started(MlflowDestination(tracking_uri=uri,
                                      artifact_root=str(tmp_path / "artifact-root")), root)
    mlflow_run_id = _export(dest, _info(root, run_id), _records(root, run_id))
    artifact_uri = MlflowClient(uri).get_run(mlflow_run_id).info.artifact_uri
    assert artifact_uri.startswith((tmp_path / "artifact-root" / PROJECT).as_uri())
    assert list((tmp_path / "artifact-root").rglob("model.bin"))
    assert not (tmp_path / "mlruns").exists()


def test_two_exporters_starting_on_one_new_sqlite_database_both_deliver(
        root: Path, tmp_path: Path) -> None:
    """MLflow migrates a new database's schema when a client first connects; two exporters
    doing so at once raced (one died with the migration's traceback). Both now deliver,
    read back with MlflowClient."""
    import subprocess

    for run_id in ("a", "b"):
        with tracklake.init(project=PROJECT, run_id=run_id, root=root) as run:
            run.log({"loss": 1.0}, step=0)
    uri = f"sqlite:///{tmp_path / 'new.db'}"
    procs = [subprocess.Popen(
        [sys.executable, "-m", "tracklake._cli", "export", "mlflow", "--root", str(root),
         "--run", run_id, "--tracking-uri", uri], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True) for run_id in ("a", "b")]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        assert "Traceback" not in err
    client = MlflowClient(tracking_uri=uri)
    [experiment] = [e for e in client.search_experiments() if e.name == PROJECT]
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(r.data.tags[RUN_ID_TAG] for r in runs) == [f"{PROJECT}/a", f"{PROJECT}/b"]
