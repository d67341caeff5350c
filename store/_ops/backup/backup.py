"""Backing a store up: only what the destination does not hold yet (by sha256), copies in
parallel, verified, made durable before the manifest names them, resumable after a kill."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracklake._format.schema import BLOB_KINDS
from tracklake._ops.backup.blobcopy import DamagedBlobError, blob_digest
from tracklake._ops.backup.errors import BackupError
from tracklake._ops.backup.ledger import record_backup
from tracklake._ops.backup.manifest import read_manifest, save_manifest
from tracklake._ops.backup.select import EVERYTHING, Selection, is_unsealed_segment, store_files
from tracklake._ops.backup.target import LocalTarget, Target, local_digest, open_target
from tracklake._read.listing import refuse_unknown_kinds
from tracklake._read.reader import ReadProblems, list_streams, read_stream

#: `progress(done, total, note)`: how a long operation reports (the command line draws it).
Progress = Callable[[int, int | None, str], None]

#: Save the manifest (after making the copies durable) at least this often, so a killed
#: backup resumes near where it stopped without paying a sync per file.
SAVE_EVERY_SECONDS = 5.0
SAVE_EVERY_FILES = 4096
#: Copies handed to the thread pool at a time (the manifest is saved between batches).
_BATCH = 256
#: Fault injection for the crash tests: SIGKILL this process after the N-th copied file.
KILL_AT_ENV = "TRACKLAKE_BACKUP_KILL_AT"


@dataclass
class BackupReport:
    copied: list[str] = field(default_factory=list)
    unchanged: int = 0  # files skipped because the backup holds them already
    skipped_live: int = 0  # segments a writer still appends to (``sealed_only``)
    bytes_copied: int = 0
    bytes_total: int = 0
    unrecorded: str | None = None  # why the store could not record this backup
    damaged: list[str] = field(default_factory=list)  # store blobs not hashing to their name
    skipped: list[str] = field(default_factory=list)  # backup paths restore may not write


class DamagedSourceError(BackupError):
    """Some store blobs are damaged and were left out; every other file was backed up
    and recorded (`report` says what)."""

    def __init__(self, root: Path, report: BackupReport) -> None:
        names = ", ".join(report.damaged[:5]) + (", ..." if len(report.damaged) > 5 else "")
        super().__init__(
            f"{len(report.damaged)} blob(s) of the store at {root} are damaged (their bytes "
            f"do not hash to their names) and were not backed up: {names}; every other file "
            f"was backed up; run `tracklake fsck --root {root}` to see what they hold")
        self.report = report


def _workers(target: Target) -> int:
    """Parallel copies: local copies are bound by system calls, uploads by round trips."""
    cpus = os.cpu_count() or 1
    return min(32, cpus * 2) if isinstance(target, LocalTarget) else min(32, cpus * 4 + 4)


def blob_runs(root: Path, selection: Selection) -> dict[str, list[str]]:
    """``blobs/...`` path -> the selected runs whose artifact or media records name that blob
    (records in damaged files are skipped: fsck reports those, a backup goes on)."""
    refs: dict[str, set[str]] = {}
    for s in list_streams(root, kinds=BLOB_KINDS):
        key = f"{s.project}/{s.run}"
        if not selection.takes_run(key):
            continue
        for batch in read_stream(root, s, problems=ReadProblems()):
            for digest in batch.column("digest").to_pylist():
                if digest:
                    refs.setdefault(f"blobs/sha256/{digest[:2]}/{digest}", set()).add(key)
    return {rel: sorted(keys) for rel, keys in refs.items()}


def _check_places(root: Path, target: Target) -> None:
    if not root.is_dir():
        raise BackupError(f"no tracklake store at {root}")
    if isinstance(target, LocalTarget):
        dest = target.path.resolve()
        if dest == root.resolve() or dest.is_relative_to(root.resolve()):
            raise BackupError(f"back up {root} to a directory outside it, not {target.path}")


class _Job:
    """Bring one store file into the backup; returns its manifest entry and whether it
    was copied (False: the destination held those bytes already)."""

    def __init__(self, root: Path, target: Target, rel: str, st: os.stat_result,
                 entry: dict[str, Any] | None, held: int | None,
                 runs: list[str] | None) -> None:
        self.root, self.target, self.rel = root, target, rel
        self.stat_key = [st.st_size, st.st_mtime_ns]
        self.entry, self.held, self.runs = entry, held, runs

    def __call__(self) -> tuple[dict[str, Any], bool] | DamagedBlobError | None:
        try:
            name = blob_digest(self.rel)
            return self._bring() if name is None else self._bring_blob(name)
        except DamagedBlobError as exc:
            return exc
        except FileNotFoundError:
            if (self.root / self.rel).exists():
                raise
            return None  # compaction or retention removed it since the listing

    def _bring(self) -> tuple[dict[str, Any], bool]:
        src = self.root / self.rel
        if self.held is not None:
            digest, size = local_digest(src)
            if self.entry is not None and self.entry["sha256"] == digest:
                return self._entry(digest, size), False  # touched, same content
            if self.entry is None and self.held == size and self.target.digest(
                    self.rel)[0] == digest:
                return self._entry(digest, size), False  # copied by a killed backup
        digest, size = self.target.put(src, self.rel)
        return self._entry(digest, size), True

    def _bring_blob(self, name: str) -> tuple[dict[str, Any], bool]:
        """A blob's content is its name: what the backup holds under it is checked
        against the name, and the source is read only to copy it."""
        if self.held is not None:
            if (self.entry is not None and self.entry["sha256"] == name
                    and self.entry["size"] == self.held):
                return self._entry(name, self.held), False  # touched, same content
            if self.entry is None and self.target.digest(self.rel)[0] == name:
                return self._entry(name, self.held), False  # copied by a killed backup
        size = self.target.put_blob(self.root / self.rel, self.rel, name)
        return self._entry(name, size), True

    def _entry(self, digest: str, size: int) -> dict[str, Any]:
        out = dict(self.entry or {})
        out.update(sha256=digest, size=size, source=self.stat_key)
        if self.runs is not None:
            out["runs"] = sorted(set(out.get("runs", [])) | set(self.runs))
        return out


def _plan(root: Path, target: Target, manifest: dict[str, Any], selection: Selection,
          sealed_only: bool, report: BackupReport) -> Iterator[_Job]:
    """The files to hash or copy; files whose size and mtime match the manifest and
    that the destination still holds are counted as unchanged and not read."""
    files: dict[str, dict[str, Any]] = manifest["files"]
    held = target.listing()
    refs: dict[str, list[str]] | None = None
    for rel, st in store_files(root):
        if rel.startswith("blobs/") and (not selection.everything or rel not in files):
            if refs is None:
                refs = blob_runs(root, selection)
            if not selection.takes(rel, refs.get(rel, [])):
                continue
        elif not selection.takes(rel):
            continue
        entry = files.get(rel)
        if (entry is not None and entry.get("source") == [st.st_size, st.st_mtime_ns]
                and held.get(rel) == entry["size"]):
            report.unchanged += 1
            report.bytes_total += st.st_size
            continue
        if sealed_only and is_unsealed_segment(root / rel, st.st_size):
            report.skipped_live += 1
            continue
        report.bytes_total += st.st_size
        runs = refs.get(rel) if refs is not None and rel.startswith("blobs/") else None
        yield _Job(root, target, rel, st, entry, held.get(rel), runs)


def backup(root: Path, dest: str | Path, *, selection: Selection = EVERYTHING,
           sealed_only: bool = False, workers: int | None = None,
           progress: Progress | None = None) -> BackupReport:
    """Copy to `dest` (a directory or a URL) every selected file of the store that it
    does not hold yet. Nothing is ever removed from `dest`. `sealed_only` leaves out
    segments a writer may still append to. `progress(files_done, files_todo, note)` is
    called as copies finish."""
    refuse_unknown_kinds(root, "a backup")
    target = open_target(dest)
    _check_places(root, target)
    try:
        return _backup(root, target, selection, sealed_only, workers, progress)
    except OSError as exc:
        raise BackupError(f"backup of {root} to {target.url} stopped: {exc}; what was "
                          "copied is kept, run the backup again to resume") from exc


def _backup(root: Path, target: Target, selection: Selection, sealed_only: bool,
            workers: int | None, progress: Progress | None) -> BackupReport:
    manifest = read_manifest(target)
    files: dict[str, dict[str, Any]] = manifest["files"]
    report = BackupReport()
    jobs = list(_plan(root, target, manifest, selection, sealed_only, report))
    kill_at = os.environ.get(KILL_AT_ENV, "")
    last_save, since_save, done = time.monotonic(), 0, 0
    with ThreadPoolExecutor(workers or _workers(target)) as pool:
        for start in range(0, len(jobs), _BATCH):
            batch = jobs[start:start + _BATCH]
            for job, result in zip(batch, pool.map(_Job.__call__, batch), strict=True):
                _collect(result, job.rel, files, report, kill_at)
            done += len(batch)
            since_save += len(batch)
            if progress is not None:
                progress(done, len(jobs), "")
            if (since_save >= SAVE_EVERY_FILES
                    or time.monotonic() - last_save > SAVE_EVERY_SECONDS):
                save_manifest(target, manifest, str(root))
                last_save, since_save = time.monotonic(), 0
    if progress is not None:
        progress(done, len(jobs), "")
    save_manifest(target, manifest, str(root), copied=bool(report.copied))
    report.unrecorded = record_backup(root, target.url, files)
    if report.damaged:
        raise DamagedSourceError(root, report)
    return report


def _collect(result: tuple[dict[str, Any], bool] | DamagedBlobError | None, rel: str,
             files: dict[str, dict[str, Any]], report: BackupReport, kill_at: str) -> None:
    if result is None:
        return
    if isinstance(result, DamagedBlobError):
        report.damaged.append(rel)
        files.pop(rel, None)  # the manifest names only what the backup holds intact
        return
    entry, copied = result
    files[rel] = entry
    if copied:
        report.copied.append(rel)
        report.bytes_copied += entry["size"]
        if kill_at.isdigit() and len(report.copied) == int(kill_at):
            os.kill(os.getpid(), 9)
    else:
        report.unchanged += 1


