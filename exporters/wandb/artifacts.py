"""The store's artifacts as W&B artifacts.

Records logged together under one name (a file, or a directory's files ``name/…``) at
one step become one W&B artifact version: artifact name = the first part of the record
name (characters W&B refuses become ``_``), type ``tracklake``, each file at its record
name, aliases ``step-<N>``, metadata the record's digest, size, media type and metadata.
Files are added with ``policy="immutable"``: W&B references the store's blob instead of
copying it (blobs are content-addressed and never change), so offline runs take no extra
space, and ``wandb sync`` reads the contents from the store. W&B versions an artifact by
its contents, so logging the same files again adds no version.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import wandb

from tracklake.exporters._shared.json_value import json_value
from tracklake.read import stored_blob

_REFUSED = re.compile(r"[^A-Za-z0-9_.\-]")


def artifact_name(name: str) -> str:
    """The W&B artifact a record named `name` belongs to."""
    first = name.strip("/").split("/", 1)[0]
    return (_REFUSED.sub("_", first) or "_")[:128]


def build(records: Iterable[Mapping[str, Any]], store_root: Path
          ) -> tuple[list[tuple[Any, list[str]]], list[str]]:
    """(artifact, aliases) per name and step, and the record names whose blob is missing
    from the store (left out)."""
    groups: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    for record in records:
        step = int(record.get("step") or 0)
        groups.setdefault((artifact_name(str(record["name"])), step), []).append(record)
    built: list[tuple[Any, list[str]]] = []
    missing: list[str] = []
    for (name, step), members in sorted(groups.items()):
        files: dict[str, Path] = {}
        metadata: dict[str, Any] = {}
        for record in members:
            blob = stored_blob(store_root, str(record["digest"]))
            if blob is None:  # missing, or a link or device in its place
                missing.append(str(record["name"]))
                continue
            files[str(record["name"])] = blob  # the last record of a file name wins
            metadata[str(record["name"])] = {
                "sha256": record["digest"], "size": record.get("size"),
                "media_type": record.get("media_type"),
                "metadata": json_value(record.get("metadata")), "rank": record.get("rank"),
                "attempt": record.get("attempt")}
        if not files:
            continue
        artifact = wandb.Artifact(name, type="tracklake", metadata={"files": metadata})
        for file_name, blob in files.items():
            artifact.add_file(str(blob), name=file_name, policy="immutable")
        built.append((artifact, [f"step-{step}"]))
    return built, missing

