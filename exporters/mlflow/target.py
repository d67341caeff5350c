"""The MLflow run a tracklake run goes to: what is known of its params, tags and artifact
files, kept up to date by the writes that go through it."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracklake.exporters.mlflow.names import (
    MAX_PARAMS_TAGS_PER_BATCH,
    MAX_TAG_VAL_LENGTH,
    chunks,
    json_size,
)

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient


#: What an MLflow run may hold, as JSON ``{"last_step": N, "attempts": [1, 2]}``, raised
#: before metrics past it are written to it: MLflow keeps what a commit wrote even if the
#: exporter dies before it saves that commit, and the last step and the attempts bound to
#: the run decide whether a resumed attempt needs a run of its own.
HELD_TAG = "tracklake.held"


@dataclass
class MlflowTarget:
    """The MLflow run a tracklake run goes to, and what is known of it."""

    client: MlflowClient
    tracking_uri: str
    run_id: str
    experiment_id: str
    artifact_uri: str
    params: dict[str, str]
    tags: dict[str, str]
    status: str
    listed: dict[str, set[str]] = field(default_factory=dict)  # directory -> file paths
    config: dict[str, Any] | None = None  # tracklake/config.json, once read

    def log_tags(self, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        entities = [RunTag(k, v[:MAX_TAG_VAL_LENGTH]) for k, v in tags.items()
                    if self.tags.get(k) != v[:MAX_TAG_VAL_LENGTH]]
        for chunk in chunks(entities, MAX_PARAMS_TAGS_PER_BATCH,
                            lambda t: json_size(t.key, t.value)):
            self.client.log_batch(self.run_id, tags=chunk, synchronous=True)
        self.tags.update((t.key, t.value) for t in entities)

    def held(self) -> tuple[int | None, set[int]]:
        """The last metric step this run may hold and the attempts whose metrics it may
        hold, by its `HELD_TAG` ((None, set()) if it has none, or one not of this form)."""
        try:
            held = json.loads(self.tags.get(HELD_TAG, "{}"))
            step, attempts = held.get("last_step"), held.get("attempts", [])
        except (ValueError, AttributeError):
            return None, set()
        if not _is_int(step) or not isinstance(attempts, list) or \
                not all(_is_int(a) for a in attempts):
            return None, set()
        return step, set(attempts)

    def may_hold(self, attempt: int | None, step: int) -> None:
        """Record, before metrics of `attempt` up to `step` are written, that this run may
        hold them."""
        held, attempts = self.held()
        now = (step if held is None else max(held, step),
               attempts | ({attempt} if attempt is not None else set()))
        if now != (held, attempts):
            self.log_tags({HELD_TAG: json.dumps({"last_step": now[0],
                                                 "attempts": sorted(now[1])})})

    # -- artifact files ------------------------------------------------------------------

    def files(self, directory: str) -> set[str]:
        """Paths (relative to the run's root) of the files in an artifact directory,
        listed once per open run. Listed at the run's artifact location: listing through
        ``runs:/`` (MlflowClient.list_artifacts) also searches logged models each time."""
        files = self.listed.get(directory)
        if files is None:
            from mlflow.artifacts import list_artifacts

            found = list_artifacts(artifact_uri=f"{self.artifact_uri}/{directory}",
                                   tracking_uri=self.tracking_uri)
            files = {f"{directory}/{f.path.rpartition('/')[2]}" for f in found
                     if not f.is_dir}
            self.listed[directory] = files
        return files

    def note_file(self, path: str) -> None:
        files = self.listed.get(path.rpartition("/")[0])
        if files is not None:  # (a directory not listed yet will list it)
            files.add(path)

    def has_file(self, path: str) -> bool:
        return path in self.files(path.rpartition("/")[0])

    def get_text(self, path: str) -> str | None:
        """An artifact's text, or None if the run has no such file."""
        if not self.has_file(path):
            return None
        from mlflow.artifacts import download_artifacts

        with tempfile.TemporaryDirectory(prefix="tracklake-mlflow-") as tmp:
            local = download_artifacts(artifact_uri=f"{self.artifact_uri}/{path}",
                                       dst_path=tmp, tracking_uri=self.tracking_uri)
            return Path(local).read_text(encoding="utf-8")

    def put_text(self, path: str, text: str) -> None:
        self.client.log_text(self.run_id, text, path)
        self.note_file(path)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
