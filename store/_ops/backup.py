"""Backup and restore of a store to and from a directory: incremental by content
checksum, verified, resumable and idempotent. A backup is itself a valid store (its
files keep their paths), with a manifest beside them (docs/lifecycle.md)."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracklake._errors import StoreError
from tracklake._format import fsync_dir, write_atomic

#: The manifest a backup keeps at its top: per file, sha256, size and the source's stat.
MANIFEST = "tracklake-backup.json"
#: Top-level folders that are never backed up: retention's trash, fsck's quarantine.
_SKIPPED_DIRS = {"trash", "quarantine"}
#: Save the manifest after this many copied files, so a killed backup resumes near where
#: it stopped.
_SAVE_EVERY = 64
_CHUNK = 1 << 20
#: Fault injection for the crash tests: SIGKILL this process after the N-th copied file.
KILL_AT_ENV = "TRACKLAKE_BACKUP_KILL_AT"


class BackupError(StoreError):
    """A backup or restore cannot go ahead: damage, a conflict, or no backup there."""


@dataclass
class BackupReport:
    copied: list[str] = field(default_factory=list)
    unchanged: int = 0  # files skipped because the backup holds them already
    bytes_copied: int = 0
    bytes_total: int = 0


def _files(root: Path) -> Iterator[tuple[str, os.stat_result]]:
    """(relative path, stat) of every file of the store worth keeping, in path order."""
    for dirpath, dirnames, names in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        if rel_dir == Path("."):
            dirnames[:] = [d for d in dirnames if d not in _SKIPPED_DIRS]
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(names):
            if name.startswith(".") or (rel_dir == Path(".") and name == MANIFEST):
                continue  # temporaries and claims of writers, compaction, retention
            path = Path(dirpath) / name
            try:
                yield (rel_dir / name).as_posix(), path.stat()
            except FileNotFoundError:
                continue  # compacted or removed since the listing


def _copy(src: Path, dst: Path, *, fsync: bool = True) -> tuple[str, int]:
    """Copy `src` to `dst` through a temporary, renamed into place (fsynced first, and the
    directory after, unless `fsync` is off: then the caller syncs in bulk); (sha256, size)
    of the bytes copied, verified by reading the copy back."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    digest, size = hashlib.sha256(), 0
    try:
        with open(src, "rb") as fin, open(tmp, "wb") as fout:
            for chunk in iter(lambda: fin.read(_CHUNK), b""):
                digest.update(chunk)
                fout.write(chunk)
                size += len(chunk)
            fout.flush()
            if fsync:
                os.fsync(fout.fileno())
        written, _ = file_digest(tmp)
        if written != digest.hexdigest():
            raise BackupError(f"{dst}: the copy does not read back as written (the "
                              "destination's storage is failing)")
        os.replace(tmp, dst)
    finally:
        if tmp.exists():
            tmp.unlink()
    if fsync:
        fsync_dir(dst.parent)
    return digest.hexdigest(), size


def file_digest(path: Path) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def read_manifest(dest: Path) -> dict[str, Any]:
    """The manifest of the backup at `dest` (an empty one if there is none yet)."""
    path = dest / MANIFEST
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return {"format": 1, "files": {}}
    except ValueError as exc:
        raise BackupError(f"{path} is damaged ({exc}); move it away to back up again from "
                          "scratch (files already there are checked, not copied again)") from exc
    if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
        raise BackupError(f"{path} is not a tracklake backup manifest")
    return data


def _save(dest: Path, manifest: dict[str, Any]) -> None:
    """Make every copy so far durable, then record it in the manifest. One sync(2) for a
    batch of files costs a fraction of an fsync of each file and of its directory."""
    os.sync()
    write_atomic(dest / MANIFEST, json.dumps(manifest, sort_keys=True).encode())


def backup(root: Path, dest: Path,
           progress: Callable[[int, int | None, str], None] | None = None) -> BackupReport:
    """Copy to `dest` every file of the store it does not hold yet (by sha256); files
    whose size and modification time have not changed since the last backup are not
    read again. Nothing is ever removed from `dest`. `progress(done, total, note)` is
    called before each file (files)."""
    if root.resolve() == dest.resolve() or dest.resolve().is_relative_to(root.resolve()):
        raise BackupError(f"back up {root} to a directory outside it, not {dest}")
    dest.mkdir(parents=True, exist_ok=True)
    manifest = read_manifest(dest)
    files: dict[str, dict[str, Any]] = manifest["files"]
    report = BackupReport()
    kill_at = os.environ.get(KILL_AT_ENV, "")
    since_save = 0
    listing = list(_files(root))
    for done, (rel, st) in enumerate(listing):
        if progress is not None:
            progress(done, len(listing), rel)
        report.bytes_total += st.st_size
        entry = files.get(rel)
        stat_key = [st.st_size, st.st_mtime_ns]
        target = dest / rel
        if entry is not None and entry.get("source") == stat_key and target.exists():
            report.unchanged += 1
            continue
        digest, size = file_digest(root / rel)
        if entry is not None and entry["sha256"] == digest and target.exists():
            entry["source"] = stat_key  # touched, same content
            report.unchanged += 1
            continue
        if entry is None and target.exists() and file_digest(target)[0] == digest:
            files[rel] = {"sha256": digest, "size": size, "source": stat_key}
            report.unchanged += 1  # copied by a backup killed before it saved the manifest
            continue
        digest, size = _copy(root / rel, target, fsync=False)
        files[rel] = {"sha256": digest, "size": size, "source": stat_key}
        report.copied.append(rel)
        report.bytes_copied += size
        if kill_at.isdigit() and len(report.copied) == int(kill_at):
            os.kill(os.getpid(), 9)
        since_save += 1
        if since_save >= _SAVE_EVERY:
            _save(dest, manifest)
            since_save = 0
    manifest["last_backup"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    manifest["source"] = str(root)
    _save(dest, manifest)
    if progress is not None:
        progress(len(listing), len(listing), "")
    return report


def verify_backup(src: Path) -> list[str]:
    """Files of the backup at `src` whose bytes no longer match the manifest."""
    bad = []
    for rel, entry in sorted(read_manifest(src)["files"].items()):
        path = src / rel
        if not path.exists():
            bad.append(f"{rel}: missing")
        elif file_digest(path)[0] != entry["sha256"]:
            bad.append(f"{rel}: content does not match its checksum")
    return bad


def restore(src: Path, root: Path,
            progress: Callable[[int, int | None, str], None] | None = None) -> BackupReport:
    """Copy the backup at `src` into the store at `root`: every file is verified against
    the manifest first; a file that exists in `root` with other content is a conflict and
    nothing is written. Restoring twice copies nothing the second time.
    `progress(done, total, note)` is called after each file copied (files)."""
    manifest = read_manifest(src)
    if not manifest["files"]:
        raise BackupError(f"{src} holds no tracklake backup ({MANIFEST} is missing or empty)")
    bad = verify_backup(src)
    if bad:
        raise BackupError(f"backup {src} is damaged; nothing was restored: "
                          + "; ".join(bad[:10]) + (f" (and {len(bad) - 10} more)"
                                                  if len(bad) > 10 else ""))
    report = BackupReport()
    todo = []
    conflicts = []
    for rel, entry in sorted(manifest["files"].items()):
        report.bytes_total += entry["size"]
        target = root / rel
        if target.exists():
            if file_digest(target)[0] == entry["sha256"]:
                report.unchanged += 1
                continue
            conflicts.append(rel)
        todo.append(rel)
    if conflicts:
        raise BackupError(
            f"{root} already holds other content at {len(conflicts)} path(s) of the backup, "
            f"e.g. {', '.join(conflicts[:5])}; nothing was restored. Restore into an empty "
            "directory, or move those files away")
    for done, rel in enumerate(todo, 1):
        digest, size = _copy(src / rel, root / rel)
        if digest != manifest["files"][rel]["sha256"]:
            raise BackupError(f"{src / rel} changed while it was restored; run restore again")
        report.copied.append(rel)
        report.bytes_copied += size
        if progress is not None:
            progress(done, len(todo), rel)
    return report
