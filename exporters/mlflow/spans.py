"""Stored spans as MLflow traces: sent with the tracking store's ``log_spans``, which
upserts by (trace id, span id), and linked to the run (the mapping is documented in
`tracklake.exporters.mlflow.destination`)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from tracklake import ExportError
from tracklake.exporters._protocol import RunInfo
from tracklake.exporters._shared.json_value import json_value, too_deep
from tracklake.exporters.mlflow.names import (
    MAX_TRACE_LINKS_PER_REQUEST,
    RUN_ID_TAG,
    SPANS_PER_REQUEST,
    chunks,
)
from tracklake.exporters.mlflow.target import MlflowTarget

if TYPE_CHECKING:
    from mlflow.entities import Span as MlflowSpan
    from mlflow.tracing.client import TracingClient


def write_traces(run: RunInfo, target: MlflowTarget, table: pa.Table, *,
                 tracing: TracingClient, destination: str) -> None:
    """Send the spans with `tracing` (`destination` names the exporter in error messages)."""
    from mlflow.entities import Span

    spans = [Span.from_dict(_span_dict(run, row))
             for row in _with_int_times(table, "time", "end_time").to_pylist()]
    for some in chunks(spans, SPANS_PER_REQUEST, lambda s: 0):
        _log_spans(run, target, some, tracing=tracing, destination=destination)
    trace_ids = sorted({s.trace_id for s in spans})
    for ids in chunks(trace_ids, MAX_TRACE_LINKS_PER_REQUEST, lambda t: 0):
        target.client.link_traces_to_run(ids, target.run_id)


def _log_spans(run: RunInfo, target: MlflowTarget, spans: list[MlflowSpan], *,
               tracing: TracingClient, destination: str) -> None:
    try:
        tracing.log_spans(target.experiment_id, spans)
        return
    except NotImplementedError:
        # RestStore.log_spans says this both for a server older than 3.4 and for one
        # it could not reach when it first asked for the version — an answer it then
        # caches (functools.lru_cache) for the whole process. Tell the two apart:
        target.client.get_experiment(target.experiment_id)  # raises if unreachable
    from mlflow.store.tracking.rest_store import RestStore

    clear = getattr(RestStore._get_server_version, "cache_clear", None)
    if callable(clear):
        clear()
    try:
        tracing.log_spans(target.experiment_id, spans)
    except NotImplementedError as exc:
        raise ExportError(f"{destination}: cannot store the traces of {run.key}: "
                          "this tracking store does not take spans (MLflow servers do "
                          "from version 3.4, the file store never); upgrade it, or "
                          "export the other kinds only", retryable=False) from exc


def _with_int_times(table: pa.Table, *columns: str) -> pa.Table:
    for name in columns:
        i = table.schema.get_field_index(name)
        table = table.set_column(i, name, table.column(name).cast(pa.int64()))
    return table


def _hex_id(text: str, nbytes: int) -> str:
    """An OpenTelemetry id: the store's id when it is one already (tracklake writes
    random hex ids of that size), else the first bytes of its SHA-256."""
    if re.fullmatch(f"[0-9a-f]{{{2 * nbytes}}}", text) and int(text, 16):
        return text
    return hashlib.sha256(text.encode()).hexdigest()[:2 * nbytes]


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
        attributes["mlflow.spanInputs"] = _as_json(row["inputs"])
    if row["outputs"] is not None:
        attributes["mlflow.spanOutputs"] = _as_json(row["outputs"])
    given = json_value(row["attributes"] or "{}")
    for key, value in (given if isinstance(given, dict) else {"attributes": given}).items():
        name = f"tracklake.attribute.{key}" if key.startswith("mlflow.") else key
        attributes[name] = _attribute(value)
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


def _as_json(text: str) -> str:
    """A stored input or output (JSON text) as a span attribute: as stored, or as
    `_attribute` makes it of the text itself (not JSON, or nesting too deeply: a planted
    record) or of the string it holds."""
    decoded = json_value(text)
    if decoded is text or isinstance(decoded, str):
        return _attribute(decoded)
    return text


def _attribute(value: Any) -> str:
    """`value` as a span attribute (JSON text). A string that is itself JSON nesting past
    what a writer allows goes as ``{"text": value}``: MLflow's server (3.x) decodes a
    string attribute once more to undo double encoding, and on such a string fails with
    RecursionError (a 422 the export would retry until it gives up on the run)."""
    if isinstance(value, str) and value.lstrip().startswith(("[", "{")) and too_deep(value):
        value = {"text": value}
    return json.dumps(value, ensure_ascii=False)
