"""Attempt records as the rows of the `run_attempts` view: one row per attempt file,
built once per file version (the run catalog keeps the rows of settled runs as Arrow
columns), with the status shown computed when the view is built."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tracklake._format.attempt import effective_status
from tracklake._format.columns import scalar_of, strings

ATTEMPTS_SCHEMA = pa.schema(
    [("project", pa.string()), ("run", pa.string()), ("name", pa.string()),
     ("rank", pa.int32()), ("attempt", pa.int32()), ("status", pa.string()),
     ("world_size", pa.int32()), ("tags", pa.list_(pa.string())),
     ("started_at", pa.string()), ("heartbeat_at", pa.string()), ("finished_at", pa.string()),
     ("host", pa.string()), ("git_commit", pa.string()), ("git_dirty", pa.bool_()),
     ("command", pa.string()), ("config", pa.string()), ("identity", pa.string())]
)
#: The view's order: by run, then attempt and rank (`any_value` in the runs view reads
#: the rows in this order).
_ORDER = [("project", "ascending"), ("run", "ascending"), ("attempt", "ascending"),
          ("rank", "ascending")]


def attempt_row(record: dict[str, Any]) -> dict[str, Any]:
    """The row of one attempt record, with its status as recorded."""
    ident = record.get("identity") or {}
    git = ident.get("git") or {}
    return {
        "project": record["project"], "run": record["run"], "name": record.get("name"),
        "rank": record["rank"], "attempt": record["attempt"],
        "status": str(record.get("status", "running")),
        "world_size": record.get("world_size"), "tags": record.get("tags") or [],
        "started_at": record.get("started_at"), "heartbeat_at": record.get("heartbeat_at"),
        "finished_at": record.get("finished_at"), "host": ident.get("host"),
        "git_commit": git.get("commit"), "git_dirty": git.get("dirty"),
        "command": " ".join(ident.get("command") or []) or None,
        "config": json.dumps(record.get("config") or {}),
        "identity": json.dumps(ident),
    }


def attempts_view(rows: pa.Table, now: float) -> pa.Table:
    """`rows` (every attempt of each run they hold, statuses as recorded) in the view's
    order, each status as `effective_status` gives it at `now`: only "running" ones can
    differ, and only those are looked at one by one."""
    rows = rows.sort_by(_ORDER)
    status = rows.column("status")
    running = pc.equal(status, scalar_of("running", pa.string()))
    if not pc.any(running).as_py():
        return rows
    shown = status.to_pylist()
    picked = rows.filter(running).select(["heartbeat_at", "identity"]).to_pylist()
    at = pc.indices_nonzero(running).to_pylist()
    for i, a in zip(at, picked, strict=True):
        record = {"status": "running", "heartbeat_at": a["heartbeat_at"],
                  "identity": json.loads(a["identity"] or "{}")}
        shown[i] = effective_status(record, now=now)
    return rows.set_column(rows.schema.get_field_index("status"), "status",
                           strings(shown))
