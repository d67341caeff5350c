"""`tracklake export status`: how far behind each exporter is, per run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tracklake import ExportError
from tracklake.exporters._loop.ranks import ranks_to_read
from tracklake.exporters._loop.state import list_states, load_state
from tracklake.files import read_regular
from tracklake.read import read_run, resolve_root

#: What `export status` reads of a destination's description at most.
_MOST_DESCRIPTION_BYTES = 1 << 20


def export_status(root: str | Path | None = None) -> list[dict[str, Any]]:
    """One row per exporter and run: records exported and still behind, how many seconds
    the newest unexported record is ahead of the newest exported one, last error."""
    root_path = resolve_root(root)
    rows: list[dict[str, Any]] = []
    if (root_path / "exports").is_symlink():
        return rows  # a link planted there: what it leads to is not the store's
    for directory in sorted((root_path / "exports").glob("*/")):
        if directory.is_symlink():
            continue
        try:
            description = json.loads(read_regular(directory / "destination.json",
                                                  _MOST_DESCRIPTION_BYTES))["description"]
        except (OSError, ValueError, KeyError, TypeError, RecursionError):
            description = directory.name  # none, a FIFO or a link, or not JSON
        for path in list_states(directory):
            project = path.parent.name.split("=", 1)[1]
            run = path.stem.split("=", 1)[1]
            row: dict[str, Any] = {"destination": description, "run": f"{project}/{run}"}
            try:
                state = load_state(directory, project, run)
            except ExportError as exc:
                rows.append(row | {"error": str(exc)})
                continue
            behind = 0
            newest = state.last_time_us or 0
            for _, batch in read_run(root_path, state.cursor, ranks=ranks_to_read(state.ranks)):
                behind += batch.num_rows
                newest = max(newest, max(batch.column("time").cast("int64").to_pylist()))
            lag = (newest - (state.last_time_us or newest)) / 1e6
            rows.append(row | {
                "exported": state.records, "behind": behind,
                "seconds_behind": round(lag, 3) if behind else 0.0,
                "finished": state.finished, "last_success": state.last_success,
                "last_error": state.last_error, "last_error_at": state.last_error_at,
            })
    return rows
