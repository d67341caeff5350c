"""The manifest a backup keeps at its top, ``tracklake-backup.json``: per file its sha256,
its size, the source's size and modification time when it was copied, and for blobs the
runs that refer to them (docs/lifecycle.md)."""

from __future__ import annotations

import datetime as _dt
import json
import os
from typing import Any

from tracklake._format import bounded_json
from tracklake._ops.backup.errors import BackupError
from tracklake._ops.backup.target import Target, open_target

MANIFEST = "tracklake-backup.json"
FORMAT = 1


def empty_manifest() -> dict[str, Any]:
    return {"format": FORMAT, "files": {}}


def _check_entry(rel: str, entry: object) -> bool:
    return (isinstance(entry, dict) and isinstance(entry.get("sha256"), str)
            and len(entry["sha256"]) == 64 and isinstance(entry.get("size"), int)
            and not rel.startswith("/") and ".." not in rel.split("/"))


def read_manifest(target: Target | str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of the backup at `target` (an empty one if there is none yet); a
    damaged or foreign one is a BackupError naming it."""
    if isinstance(target, (str, os.PathLike)):
        target = open_target(target)
    where = f"{target.url}/{MANIFEST}"
    raw = target.read(MANIFEST)
    if raw is None:
        return empty_manifest()
    try:
        data = bounded_json.loads(raw)
    except ValueError as exc:
        raise BackupError(f"{where} is damaged ({exc}); move it away to back up again from "
                          "scratch (files already there are checked, not copied again)") from exc
    if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
        raise BackupError(f"{where} is not a tracklake backup manifest")
    if not isinstance(data.get("format"), int) or data["format"] > FORMAT:
        raise BackupError(f"{where} has format {data.get('format')!r}; this tracklake reads "
                          f"format {FORMAT} or older: upgrade tracklake")
    bad = [rel for rel, entry in data["files"].items() if not _check_entry(rel, entry)]
    if bad:
        raise BackupError(f"{where}: malformed entries for {', '.join(sorted(bad)[:5])}")
    return data


def save_manifest(target: Target, manifest: dict[str, Any], source: str, *,
                  copied: bool = True) -> None:
    """Make every copy so far durable (unless nothing was `copied`), then record it: the
    manifest never names a file a crash could lose."""
    if copied:
        target.make_durable()
    manifest["last_backup"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    manifest["source"] = source
    target.write(MANIFEST, json.dumps(manifest, sort_keys=True).encode())


def run_of(rel: str) -> str | None:
    """``project/run`` a store path belongs to (data, attempt files, pins, exporter
    states), or None for files of the whole store (blobs, the policy file)."""
    project = run = None
    for part in rel.split("/"):
        if part.startswith("project="):
            project = part[len("project="):]
        elif part.startswith("run="):
            run = part[len("run="):].removesuffix(".json")
    return f"{project}/{run}" if project is not None and run is not None else None
