"""A store for the backup tests (the golden corpus plus a run of ours, partly compacted)
and what a user reads back from it: every view and the five questions of
benchmarks/sql_scale.py."""

from __future__ import annotations

import shutil
from pathlib import Path

from _views import views

import tracklake

GOLDEN = Path(__file__).parent / "golden" / tracklake.FORMAT_VERSION

#: The five questions of benchmarks/sql_scale.py, on these runs.
FIVE_QUESTIONS = (
    "SELECT run, key, arg_max(value, step) AS last_value FROM metrics GROUP BY run, key "
    "ORDER BY ALL",
    "SELECT run, max(value) AS max FROM metrics WHERE key = 'loss' GROUP BY run ORDER BY ALL",
    "SELECT step // 7 * 7 AS step, avg(value) AS value, min(value) AS min, max(value) AS max, "
    "count(*) AS n FROM metrics WHERE run = 'one' AND key = 'loss' GROUP BY 1 ORDER BY 1",
    "SELECT run, key, last_value, min, max FROM metric_summaries ORDER BY ALL",
    "SELECT r.*, s.last_step FROM runs r LEFT JOIN (SELECT project, run, max(last_step) AS "
    "last_step FROM metric_summaries GROUP BY ALL) s USING (project, run) ORDER BY ALL",
)


def answers(root: Path) -> dict[str, object]:
    """Every view's rows and the five questions' answers of the store at `root`."""
    out: dict[str, object] = dict(views(root))
    for i, sql in enumerate(FIVE_QUESTIONS):
        out[f"q{i + 1}"] = tracklake.query(sql, root=root).to_pylist()
    return out


def log_run(root: Path, run_id: str, steps: int = 50, project: str = "bk") -> None:
    with tracklake.init(project=project, run_id=run_id, root=root, config={"lr": 0.1},
                        capture_identity=False) as run:
        for step in range(steps):
            run.log({"loss": 1 / (step + 1)}, step=step)
        run.log_artifact(run_id.encode() * 100, name="ckpt.bin")


def make_store(root: Path) -> Path:
    """The golden corpus (finished, resumed and torn runs, every kind) plus run bk/one,
    with golden/done compacted."""
    shutil.copytree(GOLDEN, root)
    log_run(root, "one")
    tracklake.compact(root=root, run="done")
    return root
