"""The store's own record of its backups, ``ROOT/backups/<id>.json``: per destination,
when it was last backed up and which files (by path, size and modification time) it
holds, so that retention can refuse to drop data no backup holds yet."""

from __future__ import annotations

import datetime as _dt
import errno
import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tracklake._format import bounded_json
from tracklake._format.files import NotRegularFileError, read_state, write_state

LEDGER_DIR = "backups"
#: The most a backup record may hold (a path, size and time per file of the store: a
#: few million files).
MAX_RECORD_BYTES = 512 << 20


def ledger_path(root: Path, url: str) -> Path:
    return root / LEDGER_DIR / f"{hashlib.sha256(url.encode()).hexdigest()[:16]}.json"


def record_backup(root: Path, url: str, files: dict[str, dict[str, Any]]) -> str | None:
    """Record in the store what the backup at `url` holds; the reason if the store could
    not be written (a read-only store can still be backed up)."""
    held = {rel: e["source"] for rel, e in files.items()
            if isinstance(e.get("source"), list) and len(e["source"]) == 2}
    data = {"format": 1, "destination": url, "files": held,
            "at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    try:
        write_state(root, ledger_path(root, url).relative_to(root).as_posix(),
                    json.dumps(data, sort_keys=True).encode())
    except OSError as exc:
        return f"the store cannot record this backup ({exc}); retention that requires a " \
               "backup will not count it"
    return None


def load_record(root: Path, path: Path) -> dict[str, Any]:
    """One backup record of the store at `root` (read as a regular file, through no
    link, bounded); ValueError saying what is wrong with it."""
    try:
        raw = read_state(root, f"{LEDGER_DIR}/{path.name}", MAX_RECORD_BYTES)
    except NotRegularFileError as exc:
        raise ValueError(exc.strerror) from exc
    except OSError as exc:
        if exc.errno != errno.EFBIG:
            raise
        raise ValueError(exc.strerror) from exc
    data = bounded_json.loads(raw)
    if not isinstance(data, dict) or data.get("format") != 1:
        raise ValueError("not a tracklake backup record of format 1")
    if not isinstance(data.get("destination"), str) or not isinstance(data.get("at"), str):
        raise ValueError("destination and at must be strings")
    files = data.get("files")
    if not isinstance(files, dict) or not all(
            isinstance(v, list) and len(v) == 2 and all(type(x) is int for x in v)
            for v in files.values()):
        raise ValueError("files must map paths to [size, mtime_ns]")
    return data


def record_paths(root: Path) -> list[Path]:
    return sorted((root / LEDGER_DIR).glob("*.json"))


def backups(root: Path) -> list[dict[str, Any]]:
    """Every backup the store recorded. A damaged record is left out (fsck reports it):
    it protects nothing, so retention that requires a backup keeps more, never less."""
    out = []
    for path in record_paths(root):
        try:
            out.append(load_record(root, path))
        except (OSError, ValueError):
            continue
    return out


def unbacked_files(root: Path, dirs: Iterable[Path]) -> list[str]:
    """Files under `dirs` (relative to root) that no recorded backup holds as they are
    now (same path, size and modification time)."""
    held: dict[str, set[tuple[int, int]]] = {}
    for record in backups(root):
        for rel, key in record["files"].items():
            held.setdefault(rel, set()).add((key[0], key[1]))
    missing = []
    for directory in dirs:
        for dirpath, dirnames, names in os.walk(directory):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for name in sorted(names):
                if name.startswith("."):
                    continue
                path = Path(dirpath) / name
                try:
                    st = path.stat()
                except FileNotFoundError:
                    continue
                rel = path.relative_to(root).as_posix()
                if (st.st_size, st.st_mtime_ns) not in held.get(rel, ()):
                    missing.append(rel)
    return sorted(missing)
