"""Restoring a backup into a store: every file is downloaded into a hidden staging folder
and checked against the manifest before any of them is moved into place, so a damaged
backup or a conflict leaves the store as it was."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import stat
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tracklake._errors import FormatError
from tracklake._format import fsync_dir
from tracklake._format.attempt import MAX_ATTEMPT_BYTES, parse_attempt
from tracklake._format.files import (
    NotRegularFileError,
    is_regular_file,
    no_link_on_the_way,
    read_regular,
    store_dir,
)
from tracklake._ops.backup.backup import BackupReport, Progress
from tracklake._ops.backup.errors import BackupError
from tracklake._ops.backup.manifest import MANIFEST, read_manifest
from tracklake._ops.backup.paths import POLICY, is_data_path, is_export_state
from tracklake._ops.backup.select import EVERYTHING, Selection
from tracklake._ops.backup.target import Target, local_digest, open_target
from tracklake._ops.claims import owner_is_gone, write_owner


def _listed(problems: list[str]) -> str:
    more = f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""
    return "; ".join(problems[:10]) + more


def selected_files(manifest: dict[str, Any], selection: Selection) -> dict[str, dict[str, Any]]:
    return {rel: e for rel, e in sorted(manifest["files"].items())
            if selection.takes(rel, e.get("runs"))}


def verify_backup(src: str | Path, selection: Selection = EVERYTHING) -> list[str]:
    """Files of the backup at `src` whose bytes no longer match the manifest."""
    target = open_target(src)
    files = selected_files(read_manifest(target), selection)
    held = target.listing()

    def check(item: tuple[str, dict[str, Any]]) -> str | None:
        rel, entry = item
        if rel not in held:
            return f"{rel}: missing"
        if held[rel] != entry["size"] or target.digest(rel)[0] != entry["sha256"]:
            return f"{rel}: content does not match its checksum"
        return None

    with ThreadPoolExecutor(8) as pool:
        return [p for p in pool.map(check, files.items()) if p is not None]


def _stage(target: Target, files: dict[str, dict[str, Any]], staging: Path,
           progress: Progress | None = None) -> list[str]:
    """Download every file into `staging` and verify it; the problems found (nothing is
    moved). `progress(done, total, note)` is called as each file is verified."""
    held = target.listing()

    def fetch(item: tuple[str, dict[str, Any]]) -> str | None:
        rel, entry = item
        if rel not in held:
            return f"{rel}: missing"
        digest, size = target.fetch(rel, staging / rel)
        if (digest, size) != (entry["sha256"], entry["size"]):
            return f"{rel}: content does not match its checksum"
        return None

    problems: list[str] = []
    refreshed = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        for done, (problem, rel) in enumerate(zip(pool.map(fetch, files.items()), files,
                                                  strict=True), 1):
            if problem is not None:
                problems.append(problem)
            if time.monotonic() - refreshed > OWNER_REFRESH:  # this restore still lives
                write_owner(staging / STAGING_OWNER)
                refreshed = time.monotonic()
            if progress is not None:
                progress(done, len(files), rel)
    return problems


STAGING_OWNER = ".owner"
#: A staging folder whose owner cannot be probed (another host or PID namespace) is left
#: alone until its owner file stood still this long: a restore rewrites it as files
#: arrive (`OWNER_REFRESH`), and one file from a slow object store may take hours.
STAGING_STALE_SECONDS = 86_400.0
OWNER_REFRESH = 60.0


def _remove_dead_staging(root: Path) -> None:
    """Remove the staging folders of restores that are known gone (never moved into
    place, so nothing of them is in the store): their owner file names the process
    (`claims.write_owner`), judged by the one liveness rule of claims. Anything else by
    that name (a planted link or file) is removed without being followed."""
    for path in root.glob(".restore-*"):
        try:
            st = path.lstat()
        except FileNotFoundError:
            continue
        if not stat.S_ISDIR(st.st_mode):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        elif owner_is_gone(path / STAGING_OWNER, root, STAGING_STALE_SECONDS, stand_in=path):
            shutil.rmtree(path, ignore_errors=True)


def restorable(rel: str, *, policy: bool = False, exports: bool = False) -> bool:
    """True for a backup path restore may write: the store's data and metadata, the
    policy file only if `policy`, exporter states only if `exports`."""
    return (is_data_path(rel) or (policy and rel == POLICY)
            or (exports and is_export_state(rel)))


def _check_attempts(staging: Path, todo: dict[str, dict[str, Any]]) -> list[str]:
    """Problems of the staged attempt files, each checked by the attempt validator."""
    problems = []
    for rel in todo:
        if rel.startswith("runs/"):
            try:
                parse_attempt(read_regular(staging / rel, MAX_ATTEMPT_BYTES), rel)
            except (FormatError, OSError) as exc:
                problems.append(str(exc))
    return problems


def _holds(path: Path, entry: dict[str, Any]) -> bool:
    """Whether the store's file at `path` is a regular file with the backup's content (a
    link or FIFO there is other content, and is never opened)."""
    return is_regular_file(path) and local_digest(path) == (entry["sha256"], entry["size"])


def restore(src: str | Path, root: Path, *, selection: Selection = EVERYTHING,
            progress: Progress | None = None, policy: bool = False,
            exports: bool = False) -> BackupReport:
    """Copy the backup at `src` (a directory or URL) into the store at `root`. A file the
    store holds already with the same content is skipped; other content at a path of the
    backup is a conflict, and then, as for any damage, nothing is written.
    `progress(done, total, note)` is called as each file is fetched and verified. Only
    paths of `restorable` are written; the others are skipped and listed in
    `report.skipped`."""
    target = open_target(src)
    try:
        return _restore(target, root, selection, progress, policy, exports)
    except NotRegularFileError as exc:  # a link or FIFO planted: running again won't help
        raise BackupError(f"restore of {target.url} into {root} refused: {exc}; every file "
                          "in place is whole and verified") from exc
    except OSError as exc:
        raise BackupError(f"restore of {target.url} into {root} stopped: {exc}; every file "
                          "in place is whole and verified, run the restore again") from exc


def _restore(target: Target, root: Path, selection: Selection,
             progress: Progress | None, policy: bool, exports: bool) -> BackupReport:
    manifest = read_manifest(target)
    if not manifest["files"]:
        raise BackupError(f"{target.url} holds no tracklake backup ({MANIFEST} is missing "
                          "or empty)")
    files = selected_files(manifest, selection)
    if not files:
        raise BackupError(f"backup {target.url} holds nothing of the selected runs")
    report = BackupReport()
    todo: dict[str, dict[str, Any]] = {}
    conflicts = []
    for rel, entry in files.items():
        if not restorable(rel, policy=policy, exports=exports):
            report.skipped.append(rel)
            continue
        report.bytes_total += entry["size"]
        path = root / rel
        if not no_link_on_the_way(root, rel):
            conflicts.append(f"{rel} (reached through a symbolic link)")
        elif os.path.lexists(path):
            if _holds(path, entry):
                report.unchanged += 1
                continue
            conflicts.append(rel)
        todo[rel] = entry
    if conflicts:
        raise BackupError(
            f"{root} already holds other content at {len(conflicts)} path(s) of the backup, "
            f"e.g. {', '.join(conflicts[:5])}; nothing was restored. Restore into an empty "
            "directory, or move those files away")
    if not todo:
        return report
    created = not root.exists()
    root.mkdir(parents=True, exist_ok=True)
    _remove_dead_staging(root)
    staging = root / f".restore-{os.getpid()}-{uuid.uuid4().hex[:12]}-{socket.gethostname()}"
    try:
        staging.mkdir()
        write_owner(staging / STAGING_OWNER)
        bad = _stage(target, todo, staging, progress)
        bad = bad or _check_attempts(staging, todo)
        if bad:
            shutil.rmtree(staging)
            if created:
                root.rmdir()  # leave no trace of a restore that did not happen
            raise BackupError(f"backup {target.url} is damaged; nothing was restored: "
                              + _listed(bad))
        for rel, entry in todo.items():
            dst = root / rel
            store_dir(root, dst.parent)
            if os.path.lexists(dst):  # written meanwhile: same rule as above
                if not _holds(dst, entry):
                    raise BackupError(f"{dst} was written while the restore ran; run restore "
                                      "again")
                report.unchanged += 1
                continue
            os.replace(staging / rel, dst)
            report.copied.append(rel)
            report.bytes_copied += entry["size"]
        for directory in sorted({(root / rel).parent for rel in todo}):
            fsync_dir(directory)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return report
