"""What retention needs to know about a store: its runs (ended or live, when, how big,
pinned or not) and what registered exporters have not exported yet."""

from __future__ import annotations

import datetime as _dt
import getpass
import json
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracklake._errors import CursorError, FormatError
from tracklake._format import KINDS, StreamId, write_atomic
from tracklake._format.attempt import attempt_numbers
from tracklake._format.cursor import read_state
from tracklake._format.liveness import writer_known_gone
from tracklake._format.part import open_part, summary_rows
from tracklake._format.segment import read_segment
from tracklake._ops.compact import STALE_AFTER_SECONDS
from tracklake._read.reader import (
    list_runs,
    list_stream,
    list_streams,
    stream_last_seq,
)

#: The tag that pins a run, like `tracklake pin`.
KEEP_TAG = "keep"


def _ts(value: object) -> float | None:
    return _dt.datetime.fromisoformat(value).timestamp() if isinstance(value, str) else None


def run_data_dirs(root: Path, project: str, run: str) -> list[Path]:
    """Every directory holding data of one run: one per kind, then its attempt files."""
    return [root / kind / f"project={project}" / f"run={run}" for kind in KINDS] + [
        root / "runs" / f"project={project}" / f"run={run}"]


def tree_bytes(path: Path) -> int:
    total = 0
    for dirpath, _, names in os.walk(path):
        for name in names:
            try:
                total += os.stat(os.path.join(dirpath, name)).st_size
            except FileNotFoundError:
                continue  # removed while we counted (compaction)
    return total


def pin_path(root: Path, project: str, run: str) -> Path:
    return root / "pins" / f"project={project}" / f"run={run}.json"


def pin(root: Path, project: str, run: str, reason: str = "") -> Path:
    """Pin a run: retention never removes or thins it."""
    path = pin_path(root, project, run)
    write_atomic(path, json.dumps({"project": project, "run": run, "reason": reason,
                                   "pinned_at": now_iso(), "by": who()}).encode(), root=root)
    return path


def unpin(root: Path, project: str, run: str) -> bool:
    """Remove a run's pin; False if it had none (a `keep` tag still pins it)."""
    try:
        pin_path(root, project, run).unlink()
    except FileNotFoundError:
        return False
    return True


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")


def who() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers): the uid says who
        return str(os.getuid())


def host() -> str:
    return socket.gethostname()


@dataclass
class RunInfo:
    """One run as retention sees it."""

    project: str
    run: str
    started: float
    ended: float
    live: str | None  # why the run counts as live, or None when it ended
    tags: tuple[str, ...]
    pinned: bool
    kind_bytes: dict[str, int] = field(default_factory=dict)  # kind -> bytes, "runs" too

    @property
    def key(self) -> str:
        return f"{self.project}/{self.run}"

    @property
    def bytes(self) -> int:
        return sum(self.kind_bytes.values())


def live_reason(root: Path, project: str, run: str, attempts: tuple[dict[str, Any], ...],
                now: float) -> str | None:
    """Why a run must be left alone as live, or None when every attempt's writer is known
    gone (`writer_known_gone`, as compaction judges), or an attempt file is being
    created right now."""
    runs_dir = root / "runs" / f"project={project}" / f"run={run}"
    for rank_dir in sorted(runs_dir.glob("rank=*")):
        for number in attempt_numbers(rank_dir):
            path = rank_dir / f"attempt={number}.json"
            try:
                empty = path.stat().st_size == 0
            except FileNotFoundError:
                continue
            if empty:
                return f"{rank_dir.name} attempt {number} is starting (its file is empty)"
    for a in attempts:  # every attempt: an older one may still write beside a later one
        if not writer_known_gone(a, now, STALE_AFTER_SECONDS, root):
            beat = _ts(a.get("heartbeat_at")) or _ts(a.get("started_at")) or now
            return (f"rank {a['rank']} attempt {a['attempt']} is running (heartbeat "
                    f"{now - beat:.0f} s ago)")
    return None


def inventory(root: Path, now: float) -> list[RunInfo]:
    """Every run of the store with its times, liveness, pin and size per kind."""
    out: list[RunInfo] = []
    for record in list_runs(root):
        attempts = record.attempts
        started = min((_ts(a.get("started_at")) or now) for a in attempts)
        ended = max((_ts(a.get("finished_at")) or _ts(a.get("heartbeat_at")) or started)
                    for a in attempts)
        tags = tuple(sorted({str(t) for a in attempts for t in a.get("tags") or ()}))
        pinned = KEEP_TAG in tags or pin_path(root, record.project, record.run).exists()
        dirs = run_data_dirs(root, record.project, record.run)
        sizes = {d.parent.parent.name: tree_bytes(d) for d in dirs}
        out.append(RunInfo(record.project, record.run, started, ended,
                           live_reason(root, record.project, record.run, attempts, now),
                           tags, pinned, {k: v for k, v in sizes.items() if v}))
    return out


def blobs_bytes(root: Path) -> int:
    return tree_bytes(root / "blobs" / "sha256")


def metric_extreme(root: Path, project: str, run: str, key: str, mode: str) -> float | None:
    """The max (or min) of metric `key` over every rank and attempt of a run, from the
    parts' summaries and the segments not yet compacted; None if it was never logged."""
    found: list[float] = []
    for s in list_streams(root, project, run, ("metrics",)):
        files = list_stream(root, s)
        for part in files.parts:
            # the footer's checksum verified: a damaged summary must not pick the best runs
            for row in summary_rows(open_part(part.path), part.path):
                if row["key"] == key and row[mode] is not None:
                    found.append(float(row[mode]))
        for seg in files.segments:
            for batch in read_segment(seg.path).batches:
                for k, v in zip(batch.column("key").to_pylist(),
                                batch.column("value").to_pylist(), strict=True):
                    if k == key and v == v:  # NaN never wins
                        found.append(float(v))
    found = [v for v in found if v == v]
    if not found:
        return None
    return max(found) if mode == "max" else min(found)


def pending_exports(root: Path) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """Per run, the (exporter, stream) pairs holding records that an exporter registered
    in ``ROOT/exports/*/`` has not exported yet.

    An exporter protects the runs it has a state file for: every stream of a rank its rank
    mode reads whose records go past its cursor. A stream absent from the cursor of a run
    the exporter finished is a kind it does not export. A state file that cannot be read
    protects the whole run.
    """
    out: dict[tuple[str, str], list[tuple[str, str]]] = {}
    last_seqs: dict[StreamId, int] = {}
    for directory in sorted((root / "exports").glob("*/")):
        for path in sorted(directory.glob("project=*/run=*.json")):
            project = path.parent.name.split("=", 1)[1]
            run = path.stem.split("=", 1)[1]
            try:
                cursor, data = read_state(path, project, run)
                positions = cursor.positions
                mode = data.get("ranks") or "0"
                finished = bool(data.get("finished"))
            except (OSError, FormatError, CursorError) as exc:
                out.setdefault((project, run), []).append(
                    (directory.name, f"its state {path} is unreadable ({exc})"))
                continue
            seen_attempt = max((int(k.split("/")[1]) for k in positions), default=0)
            for s in list_streams(root, project, run):
                if mode.isdigit() and s.rank != int(mode):
                    continue
                if finished and s.key() not in positions and s.attempt <= seen_attempt:
                    continue  # a kind this exporter does not export
                if s not in last_seqs:
                    last_seqs[s] = stream_last_seq(root, s)
                position = positions.get(s.key(), -1)
                if last_seqs[s] > position:
                    out.setdefault((project, run), []).append(
                        (directory.name, f"{s.key()} up to seq {position} of "
                                         f"{last_seqs[s]}"))
                elif position > last_seqs[s]:  # not a cursor it made: trust none of it
                    out.setdefault((project, run), []).append(
                        (directory.name, f"{s.key()} not trusted: its state {path} says "
                                         f"seq {position} was exported, past the stream's "
                                         f"last seq {last_seqs[s]}"))
    return out
