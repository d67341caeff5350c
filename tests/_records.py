"""A run's records as the export loop hands them to a destination, for destination tests."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa

import tracklake
from tracklake.exporters import Destination, RunInfo
from tracklake.exporters._loop.ranks import with_rank


def records_by_kind(root: Path, project: str, run_id: str,
                    skip: Callable[[tracklake.StreamId], bool] | None = None
                    ) -> dict[str, pa.Table]:
    """Every record of the run per kind, with the `rank` and `attempt` columns the loop
    adds (keys unprefixed), leaving out the streams `skip` names."""
    tables: dict[str, list[pa.Table]] = {}
    for stream, batch in tracklake.read_run(root, tracklake.Cursor(project, run_id)):
        if skip is not None and skip(stream):
            continue
        table = with_rank(stream, batch, "0")
        assert table is not None  # only aggregate modes hold records back
        tables.setdefault(stream.kind, []).append(table)
    return {kind: pa.concat_tables(parts) for kind, parts in tables.items()}


def run_info(project: str, run_id: str = "r1", **changes: Any) -> RunInfo:
    """A finished one-attempt rank-0 run named "a name" tagged "t1", with `changes`."""
    fields: dict[str, Any] = {"project": project, "run": run_id, "name": "a name",
                              "status": "finished", "attempts": 1, "ranks": (0,),
                              "tags": ("t1",), "started_at": None}
    fields.update(changes)
    return RunInfo(**fields)


def send(dest: Destination, info: RunInfo, tables: Mapping[str, pa.Table],
         state: Mapping[str, Any]) -> dict[str, Any]:
    """One export pass as the loop makes it: open, write every kind, commit; the state
    back as the loop keeps it (JSON)."""
    dest.open_run(info, state)
    for kind in tracklake.KINDS:
        if kind in tables:
            dest.write(info, kind, tables[kind])
    kept: dict[str, Any] = json.loads(json.dumps(dest.commit(info)))
    return kept


def mlflow_run_id(client: Any, project: str, run_id: str) -> str:
    """The MLflow run an export made of tracklake run `project/run_id` (by its tag)."""
    experiment = client.get_experiment_by_name(project)
    [run] = client.search_runs([experiment.experiment_id],
                               f"tags.`tracklake.run_id` = '{project}/{run_id}'")
    return str(run.info.run_id)
