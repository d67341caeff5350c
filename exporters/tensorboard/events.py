"""Records to TensorBoard events: scalars, markdown text tables, hparams and traces
(the mapping is documented in docs/exporters.md, TensorBoard)."""


from __future__ import annotations

import datetime as _dt
import html
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

# TensorBoard ships no type information; everything from it is Any.
from tensorboard.compat.proto import (  # type: ignore[import-untyped, unused-ignore]
    event_pb2,
    summary_pb2,
)
from tensorboard.plugins.hparams import (  # type: ignore[import-untyped, unused-ignore]
    summary_v2 as hparams_summary,
)
from tensorboard.plugins.text import (  # type: ignore[import-untyped, unused-ignore]
    summary_v2 as text_summary,
)

from tracklake.exporters._protocol import RunInfo
from tracklake.exporters._shared import verl
from tracklake.exporters._shared.json_value import json_value

#: Child spans held until their root arrives (kept in the commit state, so bounded).
MAX_HELD_SPANS = 200
#: Lines of one rendered trace (root and descendants) before "… N more spans".
MAX_TRACE_LINES = 40
#: Characters of a span error message shown in a trace.
MAX_ERROR_CHARS = 200

STATUS_TAG = "tracklake/status"
_MD_SPECIAL = re.compile(r"([\\`*_\[\]|#])")



# -- records to events -----------------------------------------------------------------


def _column(table: pa.Table, name: str) -> list[Any]:
    if name in table.column_names:
        return list(table.column(name).to_pylist())
    return [None] * table.num_rows


def _times(table: pa.Table) -> list[float]:
    """Record times in seconds since the epoch, as TensorBoard wall times."""
    return [us / 1_000_000 for us in table.column("time").cast(pa.int64()).to_pylist()]


def _step(step: int | None) -> int:
    return 0 if step is None else step


def cell(value: object) -> str:
    """Text shown literally in markdown (a table cell or a list item)."""
    text = "" if value is None else str(value)
    text = _MD_SPECIAL.sub(r"\\\1", html.escape(text, quote=False))
    return text.replace("\r\n", "\n").replace("\n", "<br>")


def _number(value: float | None) -> str:
    return "" if value is None else repr(float(value))


def _md_table(headers: list[str], rows: Iterable[list[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def text_event(tag: str, text: str, step: int, wall_time: float) -> Any:
    return event_pb2.Event(wall_time=wall_time, step=step,
                           summary=text_summary.text_pb(tag, text))


def _several(ranks: Iterable[int | None]) -> bool:
    return len(set(ranks)) > 1


def metric_events(records: pa.Table) -> Iterator[Any]:
    """One event per record group (same step and time), one scalar per key."""
    values: list[Any] = []
    current: tuple[int, float] | None = None
    for step, key, value, t in zip(_column(records, "step"), _column(records, "key"),
                                   _column(records, "value"), _times(records), strict=True):
        if value is None:
            continue
        group = (_step(step), t)
        if group != current and values:
            yield _scalar_event(current, values)
            values = []
        current = group
        values.append(summary_pb2.Summary.Value(tag=key, simple_value=value))
    if values:
        yield _scalar_event(current, values)


def _scalar_event(group: tuple[int, float] | None, values: list[Any]) -> Any:
    assert group is not None
    return event_pb2.Event(wall_time=group[1], step=group[0],
                           summary=summary_pb2.Summary(value=values))


def text_events(records: pa.Table) -> Iterator[Any]:
    for step, key, text, t in zip(_column(records, "step"), _column(records, "key"),
                                  _column(records, "text"), _times(records), strict=True):
        yield text_event(key, text or "", _step(step), t)


def _groups(records: pa.Table, *names: str) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    """Rows (as dicts, with ``wall_time``) grouped by the given columns, in first-seen order."""
    out: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row, t in zip(records.to_pylist(), _times(records), strict=True):
        row["wall_time"] = t
        out.setdefault(tuple(row.get(n) for n in names), []).append(row)
    return out


def generation_events(records: pa.Table) -> Iterator[Any]:
    """A markdown table per key and step; verl's ``val/generations`` as verl writes it."""
    for (key, step), rows in _groups(records, "key", "step").items():
        if key == verl.VAL_GENERATIONS:
            ordered = sorted(rows, key=lambda r: (r.get("rank") or 0, r["sample"]))
            yield text_event(key, verl.markdown(step, ordered), _step(step),
                             rows[0]["wall_time"])
            continue
        by_rank = _several(r.get("rank") for r in rows)
        extra = any(r.get("extra") for r in rows)
        headers = [*(["rank"] if by_rank else []), "sample", "input", "output", "score",
                   *(["extra"] if extra else [])]
        table = [[*([r.get("rank")] if by_rank else []), r["sample"], r["input"], r["output"],
                  _number(r["score"]), *([r.get("extra")] if extra else [])] for r in rows]
        yield text_event(f"generations/{key}", _md_table(headers, table), _step(step),
                          rows[0]["wall_time"])


def artifact_events(records: pa.Table) -> Iterator[Any]:
    for (step,), rows in _groups(records, "step").items():
        by_rank = _several(r.get("rank") for r in rows)
        headers = [*(["rank"] if by_rank else []), "name", "digest", "size", "media type"]
        table = [[*([r.get("rank")] if by_rank else []), r["name"], r["digest"],
                  f"{r['size']:,} B" if r["size"] is not None else "", r["media_type"]]
                 for r in rows]
        yield text_event("artifacts", _md_table(headers, table), _step(step),
                          rows[0]["wall_time"])


def alert_events(records: pa.Table) -> Iterator[Any]:
    alerts = records.filter(pc.equal(records.column("kind"), "alert"))
    for (step,), rows in _groups(alerts, "step").items():
        by_rank = _several(r.get("rank") for r in rows)
        parts = []
        for r in rows:
            where = f" (rank {r.get('rank')})" if by_rank else ""
            head = f"**{cell((r['level'] or 'warning').upper())}**{where}: {cell(r['title'])}"
            parts.append(head + (f"\n\n{r['text']}" if r["text"] else ""))
        yield text_event("alerts", "\n\n".join(parts), _step(step), rows[0]["wall_time"])


def config_events(run: RunInfo, records: pa.Table, with_hparams: bool) -> Iterator[Any]:
    rows = records.to_pylist()
    if not rows:
        return
    wall_time = _times(records)[0]
    by_rank = _several(r.get("rank") for r in rows)
    headers = [*(["rank"] if by_rank else []), "key", "value"]
    table = [[*([r.get("rank")] if by_rank else []), r["key"], r["value"]] for r in rows]
    yield text_event("config", _md_table(headers, table), 0, wall_time)
    if with_hparams:
        values = {k: _hparam(v) for k, v in run.config.items()}
        values.update((r["key"], _hparam(json_value(r["value"]))) for r in rows)
        start = _start_time(run.started_at)
        summary = hparams_summary.hparams_pb(values, trial_id=run.key,
                                             start_time_secs=wall_time if start is None
                                             else start)
        yield event_pb2.Event(wall_time=wall_time, step=0, summary=summary)


def _hparam(value: Any) -> bool | int | float | str:
    """An hparam value TensorBoard takes: bool, number or string (JSON for the rest)."""
    if isinstance(value, (bool, int, float, str)):
        return value
    return json.dumps(value, sort_keys=True, default=str)


def _start_time(started_at: str | None) -> float | None:
    if not started_at:
        return None
    try:
        return _dt.datetime.fromisoformat(started_at).timestamp()
    except ValueError:
        return None


# -- traces ------------------------------------------------------------------------------


def _span(row: Mapping[str, Any], start: float) -> dict[str, Any]:
    """What a trace text needs of a span (JSON, for the commit state)."""
    end = row.get("end_time")
    ms = (end.timestamp() - start) * 1000 if end is not None else None
    error = row.get("error")
    return {"id": row["span_id"], "parent": row["parent_id"], "trace": row["trace_id"],
            "name": row["name"], "status": row["status"], "ms": ms, "t": start,
            "step": row.get("step"),
            "error": error[:MAX_ERROR_CHARS] if isinstance(error, str) else None}


def _span_line(span: Mapping[str, Any]) -> str:
    ms = f", {span['ms']:.1f} ms" if span.get("ms") is not None else ""
    error = f": {cell(span['error'])}" if span.get("error") else ""
    return f"{cell(span['name'])} ({cell(span['status'])}{ms}){error}"


def _render_trace(root: Mapping[str, Any], spans: list[dict[str, Any]], omitted: int,
                  note: str = "") -> str:
    """A root span in bold, then its descendants as a nested list (at most
    `MAX_TRACE_LINES` of them)."""
    children: dict[str | None, list[dict[str, Any]]] = {}
    for s in sorted(spans, key=lambda s: s["t"]):
        children.setdefault(s["parent"], []).append(s)
    lines: list[str] = []
    seen = {root["id"]}
    total = 0
    stack = [(c, 0) for c in reversed(children.get(root["id"], []))]
    while stack:
        span, depth = stack.pop()
        if span["id"] in seen:
            continue  # a span listed as its own ancestor: damaged ids, shown once
        seen.add(span["id"])
        total += 1
        if len(lines) < MAX_TRACE_LINES:
            lines.append(f"{'    ' * depth}- {_span_line(span)}")
        stack.extend((c, depth + 1) for c in reversed(children.get(span["id"], [])))
    rest = total - len(lines) + omitted
    if rest > 0:
        lines.append(f"- … {rest} more spans")
    head = f"**{_span_line(root)}**{note}"
    return head + ("\n\n" + "\n".join(lines) if lines else "")


@dataclass
class Held:
    """Child spans waiting for their root; saved in the commit state."""

    spans: dict[str, dict[str, Any]] = field(default_factory=dict)
    omitted: dict[str, int] = field(default_factory=dict)  # trace id -> spans not kept

    def copy(self) -> Held:
        return Held(dict(self.spans), dict(self.omitted))

    def add(self, span: dict[str, Any]) -> None:
        if span["id"] in self.spans or len(self.spans) < MAX_HELD_SPANS:
            self.spans[span["id"]] = span
        else:
            self.omitted[span["trace"]] = self.omitted.get(span["trace"], 0) + 1

    def take(self, trace: str) -> tuple[list[dict[str, Any]], int]:
        spans = [s for s in self.spans.values() if s["trace"] == trace]
        for s in spans:
            del self.spans[s["id"]]
        return spans, self.omitted.pop(trace, 0)


def trace_events(records: pa.Table, held: Held) -> Iterator[Any]:
    """Texts of the root spans in `records`; their children come from `held` (updated)."""
    roots: dict[tuple[str, int], list[str]] = {}
    wall: dict[tuple[str, int], float] = {}
    for row, t in zip(records.to_pylist(), _times(records), strict=True):
        span = _span(row, t)
        if span["parent"] is not None:
            held.add(span)
            continue
        spans, omitted = held.take(span["trace"])
        key = (span["name"], _step(span["step"]))
        roots.setdefault(key, []).append(_render_trace(span, spans, omitted))
        wall.setdefault(key, t)
    for (name, step), texts in roots.items():
        yield text_event(f"traces/{name}", "\n\n".join(texts), step, wall[(name, step)])


def orphan_events(held: Held) -> Iterator[Any]:
    """Traces whose root span never came: each outermost held span stands for the root."""
    traces = sorted({s["trace"] for s in held.spans.values()})
    for trace in traces:
        spans, omitted = held.take(trace)
        ids = {s["id"] for s in spans}
        for top in sorted((s for s in spans if s["parent"] not in ids), key=lambda s: s["t"]):
            text = _render_trace(top, spans, omitted,
                                 note=" — the root span of this trace was not recorded")
            omitted = 0
            yield text_event(f"traces/{top['name']}", text, _step(top["step"]), top["t"])


