"""Record tables as MLflow calls: metric batches, params and the config artifact, text and
generation-table artifacts, uploaded artifacts and event tags (the mapping is documented
in `tracklake.exporters.mlflow.destination`; traces are in `spans`)."""

from __future__ import annotations

import json
import logging
import math
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa

from tracklake import ExportError
from tracklake.exporters._protocol import ExportContext, RunInfo
from tracklake.exporters._shared import verl
from tracklake.exporters._shared.json_value import json_value
from tracklake.exporters.mlflow.names import (
    MAX_METRICS_PER_BATCH,
    MAX_PARAMS_TAGS_PER_BATCH,
    MAX_TAG_VAL_LENGTH,
    artifact_part,
    chunks,
    json_size,
    mlflow_key,
    step_name,
)
from tracklake.exporters.mlflow.params import config_params, is_verl_run
from tracklake.exporters.mlflow.target import MlflowTarget
from tracklake.read import blob_path, stored_blob

logger = logging.getLogger(__name__)

LOGGED_ARTIFACTS_TAG = "mlflow.loggedArtifacts"
CONFIG_ARTIFACT = "tracklake/config.json"
#: The latest attempt whose config was applied (records of older attempts that arrive
#: later, e.g. from another rank, do not overwrite its values).
CONFIG_ATTEMPT_TAG = "tracklake.config_attempt"
TABLE_COLUMNS = ("rank", "attempt", "seq", "sample", "input", "output", "score", "extra")


def write_metrics(run: RunInfo, target: MlflowTarget, table: pa.Table) -> None:
    from mlflow.entities import Metric

    times = table.column("time").cast(pa.int64()).to_pylist()
    metrics = [Metric(mlflow_key(k), float(v), t // 1000, s if s is not None else 0)
               for k, v, t, s in zip(table.column("key").to_pylist(),
                                     table.column("value").to_pylist(), times,
                                     table.column("step").to_pylist(), strict=True)
               if v is not None]
    for chunk in chunks(metrics, MAX_METRICS_PER_BATCH, lambda m: json_size(m.key)):
        target.client.log_batch(target.run_id, metrics=chunk, synchronous=True)


def write_configs(run: RunInfo, target: MlflowTarget, table: pa.Table) -> None:
    from mlflow.entities import Param

    # Oldest first: the loop sends stream by stream (rank 1's first attempt after rank
    # 0's second), but a later attempt's value must win.
    rows = sorted(table.select(["attempt", "time", "key", "value"]).to_pylist(),
                  key=lambda r: (r["attempt"], r["time"]))
    applied = int(target.tags.get(CONFIG_ATTEMPT_TAG, "0"))
    new: dict[str, str] = {}
    changed: dict[str, str] = {}
    latest: dict[str, Any] = {}
    verl_names = is_verl_run(run.tags)
    for row in rows:
        leaf_params = config_params(row["key"], row["value"], verl=verl_names)
        firsts = {name: target.params.get(name, new.get(name)) for name in leaf_params}
        new.update({name: v for name, v in leaf_params.items() if firsts[name] is None})
        if row["attempt"] < applied:
            continue  # an older attempt than one already applied: not the latest value
        applied = row["attempt"]
        latest[row["key"]] = json_value(row["value"])
        for name, value in leaf_params.items():
            first = firsts[name]
            change_tag = mlflow_key(f"tracklake.param_changed.{name}")
            if first is not None and (value != first or change_tag in target.tags
                                      or change_tag in changed):
                changed[change_tag] = value
    params = [Param(k, v) for k, v in new.items()]
    for chunk in chunks(params, MAX_PARAMS_TAGS_PER_BATCH,
                        lambda p: json_size(p.key, p.value)):
        target.client.log_batch(target.run_id, params=chunk, synchronous=True)
    target.params.update(new)
    config = _config(target)
    if (any(k not in config or config[k] != v for k, v in latest.items())
            or not target.has_file(CONFIG_ARTIFACT)):
        config.update(latest)
        target.put_text(CONFIG_ARTIFACT,
                        json.dumps(config, indent=1, sort_keys=True, ensure_ascii=False))
    target.log_tags(changed | {CONFIG_ATTEMPT_TAG: str(applied)})


def _config(target: MlflowTarget) -> dict[str, Any]:
    if target.config is None:
        text = target.get_text(CONFIG_ARTIFACT)
        target.config = json.loads(text) if text is not None else {}
    return target.config


def write_texts(run: RunInfo, target: MlflowTarget, table: pa.Table) -> None:
    latest: dict[str, str] = {}  # the last text of each path wins
    for key, step, text in zip(table.column("key").to_pylist(),
                               table.column("step").to_pylist(),
                               table.column("text").to_pylist(), strict=True):
        latest[f"texts/{artifact_part(key)}/{step_name(step)}.txt"] = text
    for path, text in latest.items():
        target.put_text(path, text)


def write_generations(run: RunInfo, target: MlflowTarget, table: pa.Table) -> None:
    groups: dict[str, list[list[Any]]] = {}
    verl_steps: dict[str, int] = {}  # table path -> step, for verl's val_step{N}.json
    for row in table.select(["key", "step", *TABLE_COLUMNS]).to_pylist():
        path = f"generations/{artifact_part(row['key'])}/{step_name(row['step'])}.json"
        score = row["score"]
        row["score"] = None if score is None or not math.isfinite(score) else score
        groups.setdefault(path, []).append([row[c] for c in TABLE_COLUMNS])
        if row["key"] == verl.VAL_GENERATIONS and row["step"] is not None:
            verl_steps[path] = row["step"]
    for path, rows in groups.items():
        old = target.get_text(path)
        if old is not None:
            rows = _merge_rows(json.loads(old)["data"], rows)
        else:
            rows = _merge_rows([], rows)
        target.put_text(path, json.dumps({"columns": list(TABLE_COLUMNS), "data": rows},
                                         ensure_ascii=False))
        if path in verl_steps:
            _put_verl_samples(target, verl_steps[path], rows)
    _register_tables(target, groups)


def _put_verl_samples(target: MlflowTarget, step: int, rows: list[list[Any]]) -> None:
    """verl's own artifact of one step's validation samples, ``val_step{N}.json`` at the
    run's artifact root: a list of ``{input, output, score}``, rewritten from the merged
    table so that a re-sent batch leaves it exact."""
    columns = [TABLE_COLUMNS.index(c) for c in ("input", "output", "score")]
    samples = [dict(zip(("input", "output", "score"), (r[i] for i in columns), strict=True))
               for r in rows]
    target.put_text(verl.mlflow_file(step), json.dumps(samples, ensure_ascii=False))


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


def _register_tables(target: MlflowTarget, paths: Iterable[str]) -> None:
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
        target.log_tags({LOGGED_ARTIFACTS_TAG: json.dumps(listed)})


def write_artifacts(run: RunInfo, target: MlflowTarget, table: pa.Table, *,
                    context: ExportContext | None, destination: str) -> None:
    """Upload the artifacts' blobs from the store being exported (`destination` names
    the exporter in messages). A blob missing from the store is left out, warned about
    and recorded as the tag ``tracklake.missing_artifact.<path>`` = its sha256."""
    if context is None:
        raise ExportError(f"{destination}: cannot upload the artifacts of {run.key}: "
                          "the destination was not started (`start()` tells it the store)",
                          retryable=False)
    latest: dict[str, str] = {}  # artifact path -> digest; the last one of a name wins
    for name, digest in zip(table.column("name").to_pylist(),
                            table.column("digest").to_pylist(), strict=True):
        latest[f"artifacts/{artifact_part(name)}"] = digest
    missing: dict[str, str] = {}
    for path, digest in latest.items():
        blob = stored_blob(context.root, digest)
        if blob is None:  # lost from the store, or a link in its place: say so, go on
            missing[mlflow_key(f"tracklake.missing_artifact.{path}")] = digest
            logger.warning("%s: artifact %r of %s left out: its blob %s is missing from the "
                           "store (or is not a regular file)", destination, path, run.key,
                           blob_path(context.root, digest))
            continue
        directory, _, filename = path.rpartition("/")
        with tempfile.TemporaryDirectory(prefix="tracklake-mlflow-") as tmp:
            local = Path(tmp) / filename
            try:
                local.symlink_to(blob)
            except OSError:  # no symlinks here (some file systems): copy instead
                local.write_bytes(blob.read_bytes())
            target.client.log_artifact(target.run_id, str(local), directory)
        target.note_file(path)
    if missing:
        target.log_tags(missing)


def write_events(run: RunInfo, target: MlflowTarget, table: pa.Table) -> None:
    tags: dict[str, str] = {}
    times = table.column("time").cast(pa.int64()).to_pylist()
    for row, t in zip(table.select(["seq", "step", "level", "kind", "title", "text",
                                    "rank", "attempt"]).to_pylist(), times, strict=True):
        key = mlflow_key(f"tracklake.{row['kind']}.{row['rank']}.{row['attempt']}."
                         f"{row['seq']}")
        tags[key] = _event_value(row | {"time": t})
    target.log_tags(tags)


def _event_value(row: Mapping[str, Any]) -> str:
    """An event as a tag value: JSON, its text cut so that it fits MLflow's tag limit."""
    text: str = row["text"] or ""
    while True:
        value = json.dumps({"level": row["level"], "title": row["title"], "text": text,
                            "step": row["step"], "time": row["time"]}, ensure_ascii=False)
        if len(value) <= MAX_TAG_VAL_LENGTH or not text:
            return value[:MAX_TAG_VAL_LENGTH]
        text = text[:max(0, len(text) - (len(value) - MAX_TAG_VAL_LENGTH) - 1)]
