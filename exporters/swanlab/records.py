"""Records to SwanLab rows: metric values merged per step, every other kind as one text
per record with a caption (the mapping is documented in docs/exporters.md, SwanLab).

Nothing here imports swanlab: texts are (content, caption) pairs until a session turns
them into `swanlab.Text`. SwanLab keeps one value per key and step (the first one it
gets) and, on a resumed cloud run, drops steps at or below the last step it holds for
that key. So `rows_by_step` is given the last step exported per key (`last_steps`):
metric values at or below it are dropped and counted; texts at or below it move to the
key's next step, their caption naming the step they were logged at.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from tracklake.exporters._shared.json_value import json_value
from tracklake.exporters._shared.keys import distinct_name
from tracklake.exporters._shared.nest import nest as nest_keys
from tracklake.read import media_file

logger = logging.getLogger(__name__)

#: SwanLab refuses steps above this (``swanlab.sdk.internal.core_python.metrics``).
MAX_STEP = 1 << 48
#: SwanLab's longest key (its ``METRIC_KEY_MAX_LENGTH``).
MAX_KEY = 512
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_EDGES = " \t\n\r./"


@dataclass(frozen=True)
class TextItem:
    """One record shown as one SwanLab text: markdown content, a caption, its own step."""

    content: str
    caption: str
    step: int


@dataclass(frozen=True)
class HistogramItem:
    """One histogram, shown as a SwanLab bar chart (SwanLab has no histogram type)."""

    edges: tuple[float, ...]
    counts: tuple[int, ...]
    caption: str

    def labels(self) -> list[str]:
        """Each bin's range, to 6 significant digits."""
        return [f"[{lo:.6g}, {hi:.6g})" for lo, hi in itertools.pairwise(self.edges)]


@dataclass(frozen=True)
class MediaRef:
    """One media record with its blob: a SwanLab `Image` or `Video` (GIF), or `Audio`
    where SwanLab can write it (it needs the soundfile package); else a text."""

    type: str
    media_type: str
    blob: str
    caption: str


@dataclass
class SwanlabPending:
    """What `write()` received since the last commit."""

    # step -> key -> value (a histogram's is the bar chart to draw)
    metrics: dict[int, dict[str, float | HistogramItem | MediaRef]] = field(
        default_factory=dict)
    texts: dict[str, list[TextItem]] = field(default_factory=dict)  # SwanLab key -> items
    config: dict[str, Any] = field(default_factory=dict)  # flattened key -> value

    def empty(self) -> bool:
        return not (self.metrics or self.texts or self.config)

    def merge(self, later: SwanlabPending) -> None:
        """Add what `later` collected; its metric values win at the same step and key."""
        for step, values in later.metrics.items():
            self.metrics.setdefault(step, {}).update(values)
        for key, items in later.texts.items():
            self.texts.setdefault(key, []).extend(items)
        self.config.update(later.config)

    def add_text(self, key: str, item: TextItem) -> None:
        self.texts.setdefault(swanlab_key(key), []).append(item)


def swanlab_key(key: str) -> str:
    """The key SwanLab stores for `key`: the key itself if SwanLab takes it unchanged,
    else its cleaned form with ``~`` and a hash of the key (`distinct_name`), so that two
    keys never share one."""
    return distinct_name(key, _clean, limit=MAX_KEY, sep="~")


def _clean(key: str) -> str:
    """Control characters become ``_``; leading and trailing ``. / space`` go (SwanLab
    strips them); SwanLab's own prefix ``__swanlab__.`` gets one more ``_``."""
    cleaned = _CONTROL.sub("_", key).strip(_EDGES) or "_"
    return "_" + cleaned if cleaned.startswith("__swanlab__.") else cleaned


def _rows(table: pa.Table) -> Iterator[dict[str, Any]]:
    yield from table.to_pylist()


def _step(value: Any) -> int:
    return 0 if value is None else int(value)


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str, ensure_ascii=False)


def _origin(row: Mapping[str, Any]) -> str:
    return f"rank {row.get('rank', 0)} · attempt {row.get('attempt', 1)}"


def add_metrics(pending: SwanlabPending, records: pa.Table) -> None:
    steps = records.column("step").to_pylist()
    keys = records.column("key").to_pylist()
    values = records.column("value").to_pylist()
    for step, key, value in zip(steps, keys, values, strict=True):
        if key is not None and value is not None:
            pending.metrics.setdefault(_step(step), {})[swanlab_key(key)] = float(value)


def add_histograms(pending: SwanlabPending, records: pa.Table) -> None:
    """Histograms with bins join their step's row, as metric values do (a record of only
    NaN/inf values has none: its statistics went as metrics)."""
    for row in _rows(records):
        if row.get("edges") and row.get("key") is not None:
            caption = (f"{row.get('count')} values from {row.get('min')} to {row.get('max')}"
                       f" · {_origin(row)}")
            pending.metrics.setdefault(_step(row.get("step")), {})[swanlab_key(row["key"])] = \
                HistogramItem(tuple(row["edges"]), tuple(row["counts"]), caption)


def add_media(root: Path, pending: SwanlabPending, records: pa.Table) -> None:
    """Media join their step's row as metric values do (the first of a key and step is
    the one SwanLab keeps); one whose blob the store lacks is left out with a warning."""
    for row in _rows(records):
        blob = media_file(root, row["digest"], row["size"])
        if blob is None or row.get("key") is None:
            logger.warning("%s %r at step %s left out: its blob %s is missing from the store "
                           "or not of the size its record declares", row.get("type"),
                           row.get("key"), row.get("step"), row.get("digest"))
            continue
        caption = " · ".join(c for c in (row.get("caption"), _origin(row)) if c)
        pending.metrics.setdefault(_step(row.get("step")), {})[swanlab_key(row["key"])] = \
            MediaRef(row["type"], row["media_type"], str(blob), caption)


def add_texts(pending: SwanlabPending, records: pa.Table) -> None:
    for row in _rows(records):
        pending.add_text(f"texts/{row.get('key')}", TextItem(
            str(row.get("text") or ""), _origin(row), _step(row.get("step"))))


def add_generations(pending: SwanlabPending, records: pa.Table) -> None:
    for row in _rows(records):
        parts = [f"**input**\n\n{row.get('input') or ''}",
                 f"**output**\n\n{row.get('output') or ''}"]
        if row.get("extra"):
            parts.append(f"**extra**\n\n```json\n{row['extra']}\n```")
        score = row.get("score")
        caption = f"sample {row.get('sample')} · score {score} · {_origin(row)}"
        pending.add_text(f"generations/{row.get('key')}", TextItem(
            "\n\n".join(parts), caption, _step(row.get("step"))))


def add_traces(pending: SwanlabPending, records: pa.Table) -> None:
    for row in _rows(records):
        start, end = row.get("time"), row.get("end_time")
        duration = ((end - start).total_seconds() * 1000
                    if start is not None and end is not None else None)
        lines = [f"- trace `{row.get('trace_id')}`, span `{row.get('span_id')}`, parent "
                 f"`{row.get('parent_id') or '-'}`",
                 f"- status: {row.get('status')}" + (f" ({row['error']})" if row.get("error")
                                                     else ""),
                 f"- start: {start.isoformat() if start is not None else '-'}",
                 f"- duration: {'-' if duration is None else f'{duration:.3f} ms'}"]
        for column in ("attributes", "inputs", "outputs"):
            if row.get(column):
                lines.append(f"- {column}: `{row[column]}`")
        caption = f"{row.get('name')} · {row.get('status')} · {_origin(row)}"
        pending.add_text("traces", TextItem("\n".join(lines), caption,
                                            _step(row.get("step"))))


def add_artifacts(pending: SwanlabPending, records: pa.Table) -> None:
    for row in _rows(records):
        content = (f"- name: {row.get('name')}\n- digest: `{row.get('digest')}`\n"
                   f"- size: {row.get('size')} bytes\n- media type: {row.get('media_type')}")
        if row.get("metadata"):
            content += f"\n- metadata: `{row['metadata']}`"
        pending.add_text("artifacts", TextItem(content, str(row.get("name")),
                                               _step(row.get("step"))))


def add_alerts(pending: SwanlabPending, records: pa.Table) -> None:
    for row in _rows(records):
        if row.get("kind") != "alert":
            continue  # write_error events are the store's own bookkeeping
        level = str(row.get("level") or "warning").upper()
        content = f"**{level}: {row.get('title') or ''}**\n\n{row.get('text') or ''}"
        pending.add_text("alerts", TextItem(content, f"{level} · {row.get('title')}",
                                            _step(row.get("step"))))


def add_configs(pending: SwanlabPending, records: pa.Table) -> None:
    for row in _rows(records):
        if row.get("key") is not None:
            pending.config[str(row["key"])] = json_value(row.get("value"))


def nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    """The config nested at ``/`` as SwanLab shows it (`tracklake.exporters._shared.nest`), with
    non-finite floats as strings (SwanLab's config file is YAML written for JSON readers)."""
    return nest_keys({k: str(v) if isinstance(v, float) and not math.isfinite(v) else v
                      for k, v in flat.items()})


@dataclass
class Rows:
    """One commit's rows in increasing step order, and what changed in the state."""

    rows: list[tuple[int, dict[str, Any]]]  # step -> key -> float or list[TextItem]
    last_steps: dict[str, int]  # per key, the last step after these rows
    dropped: int  # metric values at or below their key's last step, or out of range
    moved: int  # texts placed at a later step than logged


def rows_by_step(pending: SwanlabPending, last_steps: Mapping[str, int]) -> Rows:
    """Rows SwanLab takes as they are (see the module docstring)."""
    rows: dict[int, dict[str, Any]] = {}
    after = dict(last_steps)
    dropped = moved = 0
    for step, values in pending.metrics.items():
        for key, value in values.items():
            if step <= last_steps.get(key, -1) or step > MAX_STEP:
                dropped += 1
                continue
            rows.setdefault(step, {})[key] = value
            after[key] = max(after.get(key, -1), step)
    for key, items in pending.texts.items():
        last = last_steps.get(key, -1)
        for item in items:
            at = item.step if last < item.step <= MAX_STEP else last + 1
            if at != item.step:
                moved += 1
                item = TextItem(item.content, f"{item.caption} · logged at step {item.step}",
                                item.step)
            rows.setdefault(at, {}).setdefault(key, []).append(item)
            after[key] = max(after.get(key, -1), at)
    return Rows(sorted(rows.items()), after, dropped, moved)
