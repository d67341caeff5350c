"""Media records as MLflow artifacts: the file ``media/<key>/step_<N>.<ext>`` (the blob's
bytes as stored) and beside it ``step_<N>.json`` with what the record says of it (type,
media type, caption, shape, sample rate, fps, digest); the last of a key and step wins."""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa

from tracklake import ExportError
from tracklake.exporters._protocol import ExportContext, RunInfo
from tracklake.exporters._shared.media import EXTENSIONS, named_copy
from tracklake.exporters.mlflow.names import artifact_part, step_name
from tracklake.exporters.mlflow.target import MlflowTarget
from tracklake.read import media_file

logger = logging.getLogger(__name__)

FIELDS = ("key", "step", "rank", "attempt", "type", "media_type", "digest", "size",
          "caption", "shape", "sample_rate", "fps")


def write_media(run: RunInfo, target: MlflowTarget, table: pa.Table, *,
                context: ExportContext | None, destination: str) -> None:
    if context is None:
        raise ExportError(f"{destination}: cannot upload the media of {run.key}: the "
                          "destination was not started (`start()` tells it the store)",
                          retryable=False)
    latest: dict[str, dict[str, Any]] = {}
    for row in table.select(list(FIELDS)).to_pylist():
        latest[f"media/{artifact_part(row['key'])}/{step_name(row['step'])}"] = row
    for base, row in latest.items():
        blob = media_file(context.root, row["digest"], row["size"])
        if blob is None:
            logger.warning("%s: %s %r of %s left out: its blob %s is missing from the store "
                           "or not of the size its record declares", destination, row["type"],
                           row["key"], run.key, row["digest"])
            continue
        directory, _, name = base.rpartition("/")
        with tempfile.TemporaryDirectory(prefix="tracklake-mlflow-") as tmp:
            local = named_copy(blob, Path(tmp) / f"{name}.{EXTENSIONS[row['media_type']]}")
            target.client.log_artifact(target.run_id, str(local), directory)
        target.note_file(f"{base}.{EXTENSIONS[row['media_type']]}")
        target.put_text(f"{base}.json", json.dumps(row))
