"""Records to W&B history rows: metrics merged per step, other kinds as `wandb.Table`s
(the mapping is documented in docs/exporters.md, Weights & Biases)."""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import wandb

from tracklake.exporters._shared import verl
from tracklake.exporters._shared.json_value import json_value
from tracklake.exporters._shared.keys import distinct_name
from tracklake.exporters.wandb.axes import TABLE_TYPE_TAG, AxisRow, AxisRules, valid_rule
from tracklake.exporters.wandb.media import MEDIA_TYPE_TAG, media_values

GENERATION_COLUMNS = ["step", "sample", "input", "output", "score", "extra", "rank", "attempt"]
TEXT_COLUMNS = ["step", "text", "rank", "attempt"]
ALERT_COLUMNS = ["step", "level", "title", "text", "time", "rank", "attempt"]
SPAN_COLUMNS = ["step", "trace_id", "span_id", "parent_id", "name", "status", "error",
                "duration_ms", "attributes", "rank", "attempt"]
ARTIFACT_COLUMNS = ["step", "name", "digest", "size", "media_type", "rank", "attempt"]


#: What `tracklake.wandb` records for the W&B exporter (docs/format.md, "Records of
#: tracklake.wandb"): event kinds, and the key in a generation's ``extra`` that keeps the
#: columns and roles of the W&B table it came from.
DEFINE_METRIC_EVENT = "wandb.define_metric"
SUMMARY_EVENT = "wandb.summary"
INIT_EVENT = "wandb.init"
#: What of a `wandb.init` event the W&B run takes (its other fields are only recorded).
IDENTITY = ("group", "job_type", "notes")
TABLE_LAYOUT = "_wandb_table"

#: A history value: a metric, or a histogram as W&B's JSON form of it (``{"_type":
#: "histogram", "values": counts, "bins": edges}``), which the state can hold as it is.
Value = float | dict[str, Any]

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
#: Longest table key kept as it is: W&B names an artifact `run-<run id>-<key>` (at most
#: 128 characters, the run id is 18) and a file after it.
MAX_TABLE_KEY = 100


@dataclass
class WandbPending:
    """What `write()` received since the last commit, grouped per step and key."""

    metrics: dict[int, dict[str, Value]] = field(default_factory=dict)
    times: dict[int, dict[str, int]] = field(default_factory=dict)  # µs, of each metric
    #: values of keys on an axis of their own, per (axis, axis value) (`axes.extract`)
    axis_rows: dict[tuple[str, int], AxisRow] = field(default_factory=dict)
    tables: dict[tuple[int, str], list[list[Any]]] = field(default_factory=dict)
    columns: dict[str, list[str]] = field(default_factory=dict)
    table_times: dict[tuple[int, str], int] = field(default_factory=dict)  # µs, the first
    config: dict[str, Any] = field(default_factory=dict)  # flattened key -> value
    alerts: list[dict[str, Any]] = field(default_factory=list)
    artifacts: list[dict[str, Any]] = field(default_factory=list)  # records, for their files
    metric_rules: list[dict[str, Any]] = field(default_factory=list)  # define_metric calls
    summary: dict[str, Any] = field(default_factory=dict)  # values set by the training code
    identity: dict[str, str] = field(default_factory=dict)  # group, job type, notes given

    def empty(self) -> bool:
        return not (self.metrics or self.axis_rows or self.tables or self.config or self.artifacts
                    or self.metric_rules or self.summary)

    def merge(self, later: WandbPending) -> None:
        """Add what `later` collected; its metric values win at the same step and key."""
        for step, values in later.metrics.items():
            self.metrics.setdefault(step, {}).update(values)
        for step, times in later.times.items():
            self.times.setdefault(step, {}).update(times)
        for place, row in later.axis_rows.items():
            into = self.axis_rows.setdefault(place, AxisRow(None, {}))
            for key, value in row.values.items():
                into.add(key, value, row.time)
        for at, cells in later.tables.items():
            self.tables.setdefault(at, []).extend(cells)
        for at, time in later.table_times.items():
            self.table_times[at] = min(time, self.table_times.get(at, time))
        for key, columns in later.columns.items():
            self._widen(key, columns)
        self.config.update(later.config)
        self.alerts.extend(later.alerts)
        self.artifacts.extend(later.artifacts)
        self.metric_rules.extend(later.metric_rules)
        self.summary.update(later.summary)
        self.identity = {**later.identity, **self.identity}  # the first init's wins

    def add_value(self, step: int, key: str, value: Value, time: int | None) -> None:
        self.metrics.setdefault(step, {})[key] = value
        if time is not None:
            self.times.setdefault(step, {})[key] = time

    def _widen(self, key: str, columns: list[str]) -> None:
        """Keep the widest column list of a key (verl's wide rows grow with the samples)."""
        if len(columns) >= len(self.columns.get(key, ())):
            self.columns[key] = columns

    def add_row(self, key: str, columns: list[str], step: int | None, row: list[Any],
                time: datetime.datetime | None = None) -> None:
        key = table_key(key)
        self._widen(key, columns)
        at = (_step(step), key)
        self.tables.setdefault(at, []).append(row)
        if time is not None:
            micros = _micros(time)
            self.table_times[at] = min(micros, self.table_times.get(at, micros))

    def add_rows(self, key: str, columns: list[str], rows: Iterable[dict[str, Any]]) -> None:
        key = table_key(key)
        self._widen(key, columns)
        for row in rows:
            step = _step(row.get("step"))
            self.tables.setdefault((step, key), []).append([row.get(c) for c in columns])


def table_key(key: str) -> str:
    """The W&B key of a table: W&B stores a table as a file named after its key, and
    refuses a path that is absolute or has empty, ``.`` or ``..`` segments (or ``\\``):
    such a key gets its cleaned form with ``~`` and a hash of the key (`distinct_name`)."""
    return distinct_name(key, _clean_path, limit=MAX_TABLE_KEY, sep="~")


def _clean_path(key: str) -> str:
    parts = [p for p in key.replace("\\", "_").split("/") if p]
    return "/".join("_" * len(p) if p in (".", "..") else p for p in parts) or "_"


def _micros(time: datetime.datetime) -> int:
    return (time - _EPOCH) // datetime.timedelta(microseconds=1)


def _step(step: int | None) -> int:
    return 0 if step is None else int(step)


def _column(table: pa.Table, name: str) -> list[Any]:
    if name in table.column_names:
        return list(table.column(name).to_pylist())
    return [None] * table.num_rows


def _times(records: pa.Table) -> list[int | None]:
    """Each record's time in µs since the epoch."""
    if "time" not in records.column_names:
        return [None] * records.num_rows
    times: list[int | None] = records.column("time").cast(pa.int64()).to_pylist()
    return times


def add_metrics(pending: WandbPending, records: pa.Table) -> None:
    for step, key, value, time in zip(_column(records, "step"), _column(records, "key"),
                                      _column(records, "value"), _times(records), strict=True):
        if value is not None and key is not None:
            pending.add_value(_step(step), key, float(value), time)


def add_histograms(pending: WandbPending, records: pa.Table) -> None:
    """Histograms with bins join their step's row (a record of only NaN/inf values has
    none: its statistics went as metrics)."""
    for step, key, edges, counts, time in zip(
            _column(records, "step"), _column(records, "key"), _column(records, "edges"),
            _column(records, "counts"), _times(records), strict=True):
        if edges and key is not None:
            pending.add_value(_step(step), key,
                              {"_type": "histogram", "values": counts, "bins": edges}, time)


def add_media(pending: WandbPending, records: pa.Table) -> None:
    """Media join their step's row (the last of a key and step wins)."""
    for (step, key, value), time in zip(media_values(records), _times(records), strict=True):
        if key is not None:
            pending.add_value(step, key, value, time)


def _history_value(value: Value, media: Callable[[dict[str, Any]], Any] | None) -> Any:
    if isinstance(value, dict) and value.get("_type") == MEDIA_TYPE_TAG:
        return None if media is None else media(value)
    if isinstance(value, dict) and value.get("_type") == TABLE_TYPE_TAG:
        return _table(value["columns"], value["data"])
    if isinstance(value, dict):
        return wandb.Histogram(np_histogram=(value["values"], value["bins"]))
    return value


def add_texts(pending: WandbPending, records: pa.Table) -> None:
    for key in dict.fromkeys(_column(records, "key")):
        rows = records.filter(pc.equal(records.column("key"), key)).to_pylist()
        pending.add_rows(f"texts/{key}", TEXT_COLUMNS, rows)


def add_generations(pending: WandbPending, records: pa.Table) -> None:
    for key in dict.fromkeys(_column(records, "key")):
        rows = records.filter(pc.equal(records.column("key"), key)).to_pylist()
        samples = []
        for row in rows:
            extra = json_value(row.get("extra"))
            if isinstance(extra, dict) and isinstance(extra.get(TABLE_LAYOUT), dict):
                _add_wandb_table_row(pending, key, row, extra)
            else:
                samples.append(row)
        if key == verl.VAL_GENERATIONS:
            _add_verl_rows(pending, samples)
        elif samples:
            pending.add_rows(f"generations/{key}", GENERATION_COLUMNS, samples)


def _add_wandb_table_row(pending: WandbPending, key: str, row: dict[str, Any],
                         extra: dict[str, Any]) -> None:
    """A sample logged as a row of a W&B table (by `tracklake.wandb`): that row again,
    under the table's own key and columns."""
    layout = extra.pop(TABLE_LAYOUT)
    columns = [str(c) for c in layout.get("columns") or ()]
    roles = {layout.get(role): role for role in ("input", "output", "score")
             if layout.get(role) is not None}
    cells = [row.get(roles[c]) if c in roles else extra.get(c) for c in columns]
    pending.add_row(key, columns, row.get("step"), cells, row.get("time"))


def _add_verl_rows(pending: WandbPending, rows: list[dict[str, Any]]) -> None:
    """verl's validation samples as verl logs them: table ``val/generations``, one wide row
    per step (``step, input_1, output_1, score_1, ...``)."""
    by_step: dict[int | None, list[dict[str, Any]]] = {}
    for row in rows:
        by_step.setdefault(row.get("step"), []).append(row)
    for step, samples in by_step.items():
        samples.sort(key=lambda r: (r.get("rank") or 0, r.get("seq") or 0, r["sample"]))
        pending.add_row(verl.VAL_GENERATIONS, verl.wide_columns(len(samples)), step,
                        verl.wide_row(step, samples))


def add_events(pending: WandbPending, records: pa.Table) -> None:
    """Alerts, and the `define_metric` calls, summary values and init identity (group,
    job type, notes) of `tracklake.wandb`."""
    add_alerts(pending, records)
    for row in records.filter(pc.is_in(records.column("kind"), pa.array(
            [DEFINE_METRIC_EVENT, SUMMARY_EVENT, INIT_EVENT]))).to_pylist():
        value = json_value(row.get("text"))
        if not isinstance(value, dict):
            continue
        if row["kind"] == INIT_EVENT:
            if not pending.identity:
                pending.identity = {k: value[k] for k in IDENTITY
                                    if isinstance(value.get(k), str) and value[k]}
        elif row["kind"] == SUMMARY_EVENT:
            pending.summary.update(value)
        else:
            rule = valid_rule({**value, "name": row.get("title")})
            if rule is not None:
                pending.metric_rules.append(rule)


def add_alerts(pending: WandbPending, records: pa.Table) -> None:
    alerts = records.filter(pc.equal(records.column("kind"), "alert")).to_pylist()
    for row in alerts:
        row["time"] = row["time"].isoformat() if row.get("time") is not None else None
    pending.add_rows("alerts", ALERT_COLUMNS, alerts)
    pending.alerts.extend(alerts)


def add_traces(pending: WandbPending, records: pa.Table) -> None:
    rows = records.to_pylist()
    for row in rows:
        start, end = row.get("time"), row.get("end_time")
        row["duration_ms"] = ((end - start).total_seconds() * 1000
                              if start is not None and end is not None else None)
    pending.add_rows("traces", SPAN_COLUMNS, rows)


def add_artifacts(pending: WandbPending, records: pa.Table) -> None:
    rows = records.to_pylist()
    pending.add_rows("artifacts", ARTIFACT_COLUMNS, rows)
    pending.artifacts.extend(rows)


def add_configs(pending: WandbPending, records: pa.Table) -> None:
    for key, value in zip(_column(records, "key"), _column(records, "value"), strict=True):
        if key is not None:
            pending.config[key] = json_value(value)


def _cell(value: Any) -> Any:
    """A table cell W&B can serialise: JSON-able scalars; NaN/inf as strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True, default=str)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def extract_axes(pending: WandbPending, rules: AxisRules) -> None:
    """Move the values and tables of keys on an axis of their own from `pending.metrics`
    and `pending.tables` into `pending.axis_rows` (`axes`), each row with its axis value
    (W&B's step_sync)."""
    if not rules:
        return
    found = pending.axis_rows
    for step in list(pending.metrics):
        values = pending.metrics[step]
        times = pending.times.get(step, {})
        for key in list(values):
            axis = rules.axis_at(key, step, values, found)
            if axis is not None:
                found.setdefault((axis, step), AxisRow(None, {})).add(
                    key, values.pop(key), times.pop(key, None))
        if not values:
            del pending.metrics[step]
            pending.times.pop(step, None)
    for step, key in list(pending.tables):
        axis = rules.axis_at(key, step, {}, found)
        if axis is not None:
            cells = pending.tables.pop((step, key))
            table = {"_type": TABLE_TYPE_TAG, "columns": pending.columns[key],
                     "data": [[_cell(c) for c in row] for row in cells]}
            found.setdefault((axis, step), AxisRow(None, {})).add(
                key, table, pending.table_times.pop((step, key), None))
    for (axis, step), row in found.items():
        row.values.setdefault(axis, float(step))


def own_steps(pending: WandbPending, last_step: int | None) -> dict[int, int | None]:
    """The steps of W&B's own axis `rows_by_step` logs, with the earliest time of each."""
    return {step: min(pending.times.get(step, {}).values(), default=None)
            for step in pending.metrics if last_step is None or step > last_step}


def rows_by_step(pending: WandbPending, last_step: int | None,
                 media: Callable[[dict[str, Any]], Any] | None = None,
                 placed: dict[int, dict[str, Value]] | None = None
                 ) -> tuple[list[tuple[int, dict[str, Any]]], int, int]:
    """History rows in increasing step order, with the metric steps and records dropped
    because W&B already holds a row at or after their step (see the module docs of
    `tracklake.exporters.wandb.destination`). Tables of such steps go to the latest row instead.
    `media` makes the W&B object of a media value (None leaves it out); `placed` are the
    axis rows (`axes.place`), at W&B steps above `last_step`."""
    rows: dict[int, dict[str, Any]] = {}
    dropped_steps = dropped_records = 0
    for step, values in pending.metrics.items():
        if last_step is not None and step <= last_step:
            dropped_steps += 1
            dropped_records += len(values)
            continue
        made = {k: _history_value(v, media) for k, v in values.items()}
        rows.setdefault(step, {}).update({k: v for k, v in made.items() if v is not None})
    for step, values in (placed or {}).items():
        made = {k: _history_value(v, media) for k, v in values.items()}
        rows.setdefault(step, {}).update({k: v for k, v in made.items() if v is not None})
    tables: dict[tuple[int, str], list[list[Any]]] = {}
    for (step, key), cells in sorted(pending.tables.items()):
        at = step if last_step is None or step > last_step else last_step
        tables.setdefault((at, key), []).extend(cells)
    for (at, key), cells in tables.items():
        rows.setdefault(at, {})[key] = _table(pending.columns[key], cells)
    return sorted(rows.items()), dropped_steps, dropped_records


def _table(columns: list[str], cells: list[list[Any]]) -> Any:
    """A `wandb.Table` (rows narrower than the widest are padded)."""
    return wandb.Table(columns=list(columns),
                       data=[[_cell(c) for c in row] + [None] * (len(columns) - len(row))
                             for row in cells])
