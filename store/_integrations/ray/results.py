"""A Ray result (Tune's or a Train worker's report) as metrics and config."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tracklake._write.coerce import SEPARATOR

#: What Tune adds to every result that says where and when, not how well: kept once as
#: the run's config (as W&B's Ray callback does), not logged at every step.
INFO_KEYS = frozenset({"trial_id", "experiment_tag", "node_ip", "experiment_id", "hostname",
                       "pid", "date"})
#: Tune's bookkeeping, never a metric.
SKIPPED_KEYS = frozenset({"done", "should_checkpoint", "config", "checkpoint_dir_name"})


def split_result(result: Mapping[str, Any], excludes: Iterable[str] = ()
                 ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(metrics, info) of one result: metrics nested as given, minus the info keys,
    Tune's bookkeeping and `excludes` (a key, or a prefix ending at a separator)."""
    excluded = tuple(excludes)
    metrics: dict[str, Any] = {}
    info: dict[str, Any] = {}
    for key, value in result.items():
        if key in INFO_KEYS:
            info[key] = value
        elif key not in SKIPPED_KEYS and not any(
                key == e or key.startswith(e + SEPARATOR) for e in excluded):
            metrics[key] = value
    return metrics, info
