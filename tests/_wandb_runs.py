"""What a W&B run holds, read from its offline files with wandb's own `Record` reader
(`_wandb_log`), in a form two runs can be compared by: every logged value at its x-axis
value (its `define_metric` step metric's value in the row, else the row's step), the
tables (their files), histograms, config and the summary values set by the code."""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _wandb_log as wlog


@dataclass
class WandbView:
    points: Counter[tuple[str, object, object]] = field(default_factory=Counter)
    strings: Counter[tuple[str, object, str]] = field(default_factory=Counter)
    tables: Counter[tuple[str, object, str]] = field(default_factory=Counter)
    histograms: Counter[tuple[str, object, float, float, float]] = field(
        default_factory=Counter)
    media: Counter[tuple[str, object, str]] = field(default_factory=Counter)
    axes: dict[str, str] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    identity: dict[str, str] = field(default_factory=dict)  # group, job type, notes given


def offline_files(wandb_dir: Path) -> list[Path]:
    """The transaction logs of every offline run under `wandb_dir` (its ``wandb/``), in
    the order of their sessions."""
    return sorted(wandb_dir.glob("offline-run-*/run-*.wandb"))


def read(files: list[Path]) -> WandbView:
    view = WandbView()
    rows: list[tuple[int, dict[str, Any], Path]] = []
    config: dict[str, Any] = {}
    for f in files:
        for r in wlog.records(f):
            kind = r.WhichOneof("record_type")
            if kind == "metric" and r.metric.step_metric:
                view.axes[r.metric.name or r.metric.glob_name] = r.metric.step_metric
            if kind == "run":
                for name, value in (("group", r.run.run_group), ("job_type", r.run.job_type),
                                    ("notes", r.run.notes)):
                    if value:
                        view.identity[name] = value
            if kind in ("run", "config"):  # init's config is in the run record
                updates = r.run.config.update if kind == "run" else r.config.update
                for item in updates:
                    node = config
                    *parents, last = [item.key] if item.key else list(item.nested_key)
                    for part in parents:
                        node = node.setdefault(part, {})
                    node[last] = json.loads(item.value_json)
            elif kind == "summary":
                for item in r.summary.update:
                    if item.key and not item.key.startswith(("_", "tracklake/")):
                        view.summary[item.key] = json.loads(item.value_json)
        rows.extend((step, values, f) for step, values in wlog.history([f]))
    view.config = {k: v for k, v in _flat(config).items() if not k.startswith("_wandb")}
    for step, values, f in rows:
        flat = _flat(values)
        for key, value in flat.items():
            x = _x(view.axes, key, flat, step)
            if isinstance(value, dict):
                _add_object(view, key, x, value, f.parent / "files")
            elif isinstance(value, str):
                view.strings[(key, x, value)] += 1
            elif isinstance(value, (int, float)) and value is not None:
                view.points[(key, x, wlog.same(float(value)))] += 1
    return view


def _flat(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts joined by ``/``; a W&B object (a dict with ``_type``) kept whole."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict) and "_type" not in value:
            out.update(_flat(value, f"{prefix}{key}/"))
        else:
            out[prefix + key] = value
    return out


def _x(axes: dict[str, str], key: str, row: dict[str, Any], step: int) -> object:
    """`key`'s x value in `row`: its step metric's value (exact rule, else the longest
    glob), else the row's step; for a step metric itself, "axis" (compared by value:
    its own row step is W&B's counter, which an export does not reproduce)."""
    if key in axes.values():
        return "axis"  # a step metric: its values are the x values of the keys on it
    axis = axes.get(key)
    if axis is None:
        globs = [g for g in axes if g.endswith("*") and key.startswith(g[:-1])]
        axis = axes[max(globs, key=len)] if globs else None
    if axis is None or axis == key or axis not in row:
        return ("_step", step) if axis is None or axis == key else ("missing", axis)
    value = row[axis]
    return wlog.same(float(value)) if isinstance(value, (int, float)) else value


def _add_object(view: WandbView, key: str, x: object, value: dict[str, Any],
                files: Path) -> None:
    kind = value.get("_type")
    if kind == "table-file":
        table = json.loads((files / value["path"]).read_text())
        view.tables[(key, x, json.dumps({"columns": table["columns"],
                                         "data": table["data"]}, sort_keys=True))] += 1
    elif kind == "histogram":
        counts, bins = value["values"], value["bins"]
        view.histograms[(key, x, float(sum(counts)), bins[0], bins[-1])] += 1
    elif kind:
        view.media[(key, x, kind)] += 1


def close(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-6)
    return a == b
