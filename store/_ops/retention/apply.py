"""Carrying out a retention plan, atomically per run and kind, and finishing what a killed
`retain --apply` left half done.

Each action first writes a journal (``ROOT/trash/<id>/action.json``) naming every path it
will move. Deletes rename whole directories (one per kind of the run, then its attempt
files) into ``ROOT/trash/<id>/data/``, so a reader sees each kind of a run either whole or
gone; then the bundles holding the run's metrics are deleted (derived copies,
store/_read/bundles.py); then the audit record is appended; then the trash is removed.
Downsampling replaces each metrics part by a thinner one under the same name with one
rename. A re-run first finishes every journal it finds, then plans again.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import json
import os
import re
import shutil
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tracklake._errors import StoreError
from tracklake._format import KINDS, blob_path, bounded_json, fsync_dir, write_atomic
from tracklake._format.attempt import read_attempt
from tracklake._format.files import store_dir
from tracklake._format.part import FOOTER_CRC_KEY, SUMMARY_KEY, summary_json, write_part_file
from tracklake._format.schema import BLOB_KINDS
from tracklake._ops.bundle import forget_run
from tracklake._ops.claims import RETAINING, hold_claim, remove_leftovers
from tracklake._ops.compact import compact, metric_summary
from tracklake._ops.retention.audit import AuditLog, audit_records
from tracklake._ops.retention.inventory import host, live_reason, now_iso, who
from tracklake._ops.retention.journal import JournalError, read_journal
from tracklake._ops.retention.plan import DOWNSAMPLED_KEY, Action, Plan, downsampled_already
from tracklake._read.blob_refs import blob_refs
from tracklake._read.location import through_no_link
from tracklake._read.reader import list_stream, list_streams, read_part

#: Fault injection for the crash tests: SIGKILL this process at the N-th step of applying.
KILL_AT_ENV = "TRACKLAKE_RETAIN_KILL_AT"


class RetainBusyError(StoreError):
    """Another `retain --apply` is working on this store."""


@dataclass
class ApplyReport:
    done: list[dict[str, Any]] = field(default_factory=list)  # the audit records written
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (run key, why)
    resumed: int = 0  # journals of a killed earlier run finished


class _Steps:
    """Counts the steps of applying; kills the process at the step named in the
    environment (the crash tests use it to stop at every point in turn)."""

    def __init__(self) -> None:
        raw = os.environ.get(KILL_AT_ENV, "")
        self.kill_at = int(raw) if raw.isdigit() else None
        self.count = 0

    def __call__(self) -> None:
        self.count += 1
        if self.count == self.kill_at:
            os.kill(os.getpid(), 9)


#: The name of an action's trash folder (`apply_plan`).
_ACTION_ID = re.compile(r"^\d{8}T\d{6}-[0-9a-f]{8}$")


def trash_dir(root: Path) -> Path:
    return root / "trash"


@contextlib.contextmanager
def _claim(root: Path) -> Iterator[None]:
    """One applier per store: the trash directory's `.retaining` claim, made and judged as
    a compactor's (`hold_claim`): written whole, and broken only when its holder is known
    gone (or, from another host or PID namespace, once it is old)."""
    directory = store_dir(root, trash_dir(root))
    with hold_claim(directory, RETAINING, remove_leftovers, root=root) as claim:
        if claim is None:
            raise RetainBusyError(
                f"another `tracklake retain --apply` holds {directory / RETAINING}; wait "
                "for it, or remove the file if that process is gone")
        yield


def _rel(root: Path, path: Path) -> str:
    return path.relative_to(root).as_posix()


def _removes(action: Action, user: tuple[str, str]) -> bool:
    """True if `action` removes the records of `user` (a run and a kind)."""
    return user[0] == action.key and (action.verb == "delete" or user[1] in action.kinds)


def _moves(root: Path, action: Action, refs: dict[str, set[tuple[str, str]]]
           ) -> tuple[list[str], int]:
    """Paths (relative to root) an action moves to the trash, in order, and blob bytes."""
    base = [root / kind / f"project={action.project}" / f"run={action.run}"
            for kind in (KINDS if action.verb == "delete" else action.kinds)]
    if action.verb == "delete":
        base.append(root / "runs" / f"project={action.project}" / f"run={action.run}")
    moves = [_rel(root, p) for p in base if p.exists()]
    blob_bytes = 0
    if action.verb == "delete" or any(k in BLOB_KINDS for k in action.kinds):
        for digest, users in sorted(refs.items()):
            if all(_removes(action, u) for u in users):  # no other run or kind names it
                path = blob_path(root, digest)
                if path.exists():
                    moves.append(_rel(root, path))
                    blob_bytes += path.stat().st_size
    return moves, blob_bytes


def _move(root: Path, trash: Path, rel: str) -> None:
    src, dst = root / rel, trash / "data" / rel
    if not src.exists():
        return  # moved before a kill
    store_dir(root, dst.parent)
    os.rename(src, dst)
    fsync_dir(src.parent)
    _remove_empty(src.parent, root)


def _remove_empty(directory: Path, root: Path) -> None:
    """Remove `directory` and its parents up to a kind directory while they are empty."""
    while directory.parent != root and directory.parent.parent != root:
        try:
            directory.rmdir()
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
                return  # still in use (another run, a writer creating it) or gone
            raise
        directory = directory.parent


def _downsample_table(table: pa.Table, every: int) -> pa.Table:
    """Every `every`-th step of each key, plus its first, last, min and max points."""
    import duckdb

    con = duckdb.connect()
    try:
        con.register("t", table)
        return con.sql(f"""
            SELECT seq, time, step, key, value FROM t
            QUALIFY (dense_rank() OVER (PARTITION BY key ORDER BY step) - 1) % {every} = 0
              OR seq = max(seq) OVER ()  -- the stream keeps its last seq: cursors stay valid
              OR row_number() OVER (PARTITION BY key ORDER BY step, seq) = 1
              OR row_number() OVER (PARTITION BY key ORDER BY step DESC, seq DESC) = 1
              OR row_number() OVER (PARTITION BY key
                   ORDER BY isnan(value), value ASC, seq) = 1
              OR row_number() OVER (PARTITION BY key
                   ORDER BY isnan(value), value DESC, seq) = 1
            ORDER BY seq""").to_arrow_table().cast(table.schema)
    finally:
        con.close()


def _downsample_run(root: Path, trash: Path, action: Action, every: int, step: _Steps
                    ) -> tuple[int, list[str]]:
    """Thin every metrics part of the run (compacting its segments first); bytes saved and
    problems (segments that could not be compacted)."""
    compact(root=root, project=action.project, run=action.run, kinds=("metrics",))
    saved, problems = 0, []
    marker = json.dumps({"every": every, "at": now_iso()})
    for s in list_streams(root, action.project, action.run, ("metrics",)):
        files = list_stream(root, s)
        problems += [f"{g.path} was not compacted (damaged?): left whole" for g in files.segments]
        for part in files.parts:
            meta = pq.read_schema(part.path).metadata or {}
            done = meta.get(DOWNSAMPLED_KEY)
            if done is not None and int(bounded_json.loads(done)["every"]) >= every:
                continue
            table = _downsample_table(read_part(part), every)
            new_meta = {k: v for k, v in meta.items() if k != b"tracklake.summary"}
            new_meta[SUMMARY_KEY.encode()] = summary_json(metric_summary(table)).encode()
            new_meta[DOWNSAMPLED_KEY] = marker.encode()
            tmp = trash / "staging" / part.path.name
            store_dir(root, tmp.parent)
            write_part_file(tmp, table.replace_schema_metadata(
                {k: v for k, v in new_meta.items() if k != FOOTER_CRC_KEY.encode()}), "metrics")
            step()
            before = part.path.stat().st_size
            os.replace(tmp, part.path)  # one rename: readers see the old part or the new
            fsync_dir(part.path.parent)
            saved += before - part.path.stat().st_size
            step()
    return saved, problems


def _recheck(root: Path, action: Action, now: float) -> str | None:
    """Why the action must not go ahead now (the run resumed, or is gone), or None."""
    paths = sorted((root / "runs" / f"project={action.project}" / f"run={action.run}").glob(
        "rank=*/attempt=*.json"))
    attempts = [a for a in (read_attempt(p) for p in paths) if a is not None]
    if not paths:
        return "already gone (a journal of a killed earlier run finished it)"
    attempts.sort(key=lambda a: (a["attempt"], a["rank"]))
    live = live_reason(root, action.project, action.run, tuple(attempts), now)
    return None if live is None else f"became live: {live}"


def _audit_record(action: Action, action_id: str, extra: dict[str, Any]) -> dict[str, Any]:
    return {"id": action_id, "action": action.verb, "project": action.project,
            "run": action.run, "kinds": list(action.kinds), "rule": action.rule,
            "why": action.why, "bytes": action.bytes, "forced": action.forced,
            "at": now_iso(), "user": who(), "host": host(), **extra}


def _finish(root: Path, trash: Path, journal: dict[str, Any], logged: set[str],
            audit: AuditLog, step: _Steps, report: ApplyReport) -> None:
    """Carry a journalled action through: moves, audit record, removal of the trash."""
    action = Action(**journal["action"])
    extra: dict[str, Any] = {"blob_bytes": journal["blob_bytes"]}
    if action.verb == "downsample":
        saved, problems = _downsample_run(root, trash, action, journal["every"], step)
        extra |= {"every": journal["every"], "saved_bytes": saved, "problems": problems}
    else:
        for rel in journal["moves"]:
            if through_no_link(root, rel):
                _move(root, trash, rel)
            else:
                report.skipped.append((rel, "reached through a symbolic link: left in "
                                            "place (retention never follows a link)"))
            step()
    if action.verb != "drop" or "metrics" in action.kinds:
        forget_run(root, action.project, action.run)  # bundled copies of its metrics
    if journal["id"] not in logged:
        record = _audit_record(action, journal["id"], extra)
        audit.append(record)
        logged.add(journal["id"])
        report.done.append(record)
        step()
    _remove_trash(trash)
    step()


def _remove_trash(trash: Path) -> None:
    """Remove one action's trash folder, its journal last (so a kill here is finished by
    the next run)."""
    for name in ("data", "staging"):
        if (trash / name).is_symlink():
            (trash / name).unlink()  # planted: removed itself, never what it points to
        elif (trash / name).exists():
            shutil.rmtree(trash / name)
    with contextlib.suppress(FileNotFoundError):
        (trash / "action.json").unlink()
    shutil.rmtree(trash)
    fsync_dir(trash.parent)


def pending_journals(root: Path) -> list[Path]:
    """Journals of actions a killed `retain --apply` left unfinished."""
    return sorted(trash_dir(root).glob("*/action.json"))


def apply_plan(root: Path, plan: Plan, now: float,
               progress: Callable[[int, int | None, str], None] | None = None
               ) -> ApplyReport:
    """Finish what a killed earlier apply left, then carry out `plan` action by action;
    `progress(done, total, note)` is called before each action (actions)."""
    report = ApplyReport()
    step = _Steps()
    with _claim(root):
        logged = {str(r.get("id")) for r in audit_records(root)}
        audit = AuditLog(root)
        for trash in sorted(p for p in trash_dir(root).iterdir()
                            if p.is_dir() and not p.is_symlink()):
            journal_path = trash / "action.json"
            if os.path.lexists(journal_path):
                try:
                    journal = read_journal(journal_path)
                except JournalError as exc:
                    refused = (f"not acted on: {exc}; retention did not write it as it stands "
                           "(move the folder out of the store after looking at it)")
                    print(f"tracklake: warning: {journal_path}: {refused}",
                          file=sys.stderr, flush=True)
                    report.skipped.append((str(journal_path), refused))
                    continue
                _finish(root, trash, journal, logged, audit, step, report)
                report.resumed += 1
            elif _ACTION_ID.match(trash.name):  # killed before its journal was written,
                _remove_trash(trash)                 # or while removing it
            elif not trash.name.startswith("."):  # a claim's own names are hold_claim's
                refused = ("not acted on: a folder retention did not make (its actions' "
                           "folders are named TIMESTAMP-HEX); left as it is")
                print(f"tracklake: warning: {trash}: {refused}", file=sys.stderr, flush=True)
                report.skipped.append((str(trash), refused))
        refs = blob_refs(root) if any(a.verb != "downsample" for a in plan.actions) else {}
        for done, action in enumerate(plan.actions):
            if progress is not None:
                progress(done, len(plan.actions), f"{action.verb} {action.key}")
            if (why := _recheck(root, action, now)) is not None:
                report.skipped.append((action.key, why))
                continue
            action_id = (_dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
                         + "-" + uuid.uuid4().hex[:8])
            trash = trash_dir(root) / action_id
            moves, blob_bytes = _moves(root, action, refs) if action.verb != "downsample" \
                else ([], 0)
            if action.verb == "drop" and not moves:
                report.skipped.append((action.key, "nothing left to drop"))
                continue
            if action.verb == "downsample" and downsampled_already(
                    root, action.project, action.run, plan.policy.downsample_every):
                report.skipped.append((action.key, "already downsampled"))
                continue
            journal = {"id": action_id, "action": asdict(action), "moves": moves,
                       "blob_bytes": blob_bytes, "every": plan.policy.downsample_every}
            write_atomic(trash / "action.json", json.dumps(journal).encode(), root=root)
            step()
            _finish(root, trash, journal, logged, audit, step, report)
            for users in refs.values():
                users.difference_update([u for u in users if _removes(action, u)])
    if progress is not None:
        progress(len(plan.actions), len(plan.actions), "")
    return report
