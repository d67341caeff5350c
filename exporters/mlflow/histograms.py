"""Histogram records as MLflow artifacts: MLflow has no histogram type, so each histogram is
a JSON file ``histograms/<key>/step_<N>.json`` (its bin edges, counts and statistics); the
statistics themselves reach MLflow as metrics (``<key>/mean``, ...) with the metrics."""

from __future__ import annotations

import json
import math
from typing import Any

import pyarrow as pa

from tracklake.exporters._protocol import RunInfo
from tracklake.exporters.mlflow.names import artifact_part, step_name
from tracklake.exporters.mlflow.target import MlflowTarget

FIELDS = ("step", "rank", "attempt", "count", "nonfinite", "min", "max", "mean", "std",
          "edges", "counts")


def histogram_path(key: str, step: int | None) -> str:
    return f"histograms/{artifact_part(key)}/{step_name(step)}.json"


def write_histograms(run: RunInfo, target: MlflowTarget, table: pa.Table) -> None:
    """One JSON file per key and step (a histogram logged twice at a step: the later one);
    rewritten whole, so a re-sent batch leaves it exact."""
    latest: dict[str, dict[str, Any]] = {}
    for row in table.select(["key", *FIELDS]).to_pylist():
        latest[histogram_path(row["key"], row["step"])] = {
            k: _json_number(row[k]) for k in ("key", *FIELDS)}
    for path, value in latest.items():
        target.put_text(path, json.dumps(value))


def _json_number(value: Any) -> Any:
    """NaN and ±inf (the statistics of only NaN/inf values) as strings: JSON has none."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value
