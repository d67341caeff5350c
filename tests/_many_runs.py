"""A store of many catalogued runs in two projects, for the questions that read the run
catalog's files one at a time (`run_index`), and the runs view's own answers to compare
them with."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from _crafted import age_catalog, catalog_path, catalogued_table, signed_catalog
from _settled import age

import tracklake
from tracklake._read import catalog_shards, snapshot

PROJECTS = {"p": 10, "q": 4}


def run(root: Path, project: str, run_id: str, value: float) -> None:
    with tracklake.init(project=project, run_id=run_id, root=root, capture_identity=False,
                        system_metrics=False) as run:
        run.log({"critic/score/mean": value, "loss": -value}, step=int(value))


def catalogued_store(root: Path) -> Path:
    """Runs of two projects, started one after the other, compacted, settled and
    catalogued."""
    for i in range(max(PROJECTS.values())):
        for project, count in PROJECTS.items():
            if i < count:
                run(root, project, f"{project}{i:02d}", float(i))
    tracklake.compact(root=root)
    age(root)
    tracklake.query("SELECT count(*) FROM metric_summaries", root=root)  # catalogues
    age_catalog(root)
    catalog_shards._read_before.clear()
    return root


def by_sql(root: Path, project: str | None, limit: int,
           monkeypatch: pytest.MonkeyPatch) -> tuple[int, list[tuple[str, str]]]:
    """The count of the runs view's runs and its newest `limit`, the catalog read whole
    (as before `run_index`)."""
    where = f"WHERE project = '{project}'" if project else ""
    with monkeypatch.context() as m:
        m.setattr(snapshot, "runs_view_streamed", lambda root: False)
        total = tracklake.query(f"SELECT count(*) AS n FROM runs {where}", root=root)
        newest = tracklake.query(f"""SELECT project, run FROM runs {where}
            ORDER BY started_at DESC, project DESC, run DESC LIMIT {limit}""", root=root)
    return (total.column("n")[0].as_py(),
            [(r["project"], r["run"]) for r in newest.to_pylist()])


def changed(root: Path) -> None:
    """A new run (not settled: read from its files), a resumed run (its entry stale) and
    a deleted one (its entry names paths that are gone)."""
    run(root, "p", "fresh", 20.0)
    run(root, "p", "p03", 21.0)  # resumed: attempt 2, its first start stays the old one
    for kind in ("metrics", "runs"):
        shutil.rmtree(root / kind / "project=p" / "run=p05")


def plant_forged_status(root: Path, run: str, beside: str, status: str) -> None:
    """`run`'s catalog entry with its first attempt's status set to `status`, planted in
    the catalog file of `beside` (another file's run), signed as a reader would."""
    table = catalogued_table(root)
    forged = table.filter(pa.array([r == run for r in table.column("run").to_pylist()]))
    attempts = forged.column("attempts").to_pylist()
    attempts[0][0]["status"] = status
    forged = forged.set_column(forged.schema.get_field_index("attempts"), "attempts",
                               pa.array(attempts, forged.schema.field("attempts").type))
    path = catalog_path(root, beside)
    rows = pa.ipc.open_stream(path.read_bytes().partition(b"\n")[2]).read_all()
    path.write_bytes(signed_catalog(pa.concat_tables([rows, forged])))
    age_catalog(root)
