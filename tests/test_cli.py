"""The `tracklake` command line: every command, its output formats and its exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import tracklake
from tracklake._cli.main import main


def _run(root: Path, run_id: str, *, lr: float, steps: int = 20) -> None:
    with tracklake.init(project="p", run_id=run_id, root=root, config={"optim": {"lr": lr}},
                        capture_identity=True) as run:
        for step in range(steps):
            run.log({"critic/score/mean": step / 10, "actor/pg_loss": -step}, step=step)


@pytest.fixture
def store(root: Path) -> Path:
    _run(root, "run-a", lr=1e-3)
    _run(root, "run-b", lr=1e-4, steps=30)
    return root


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def test_runs_lists_every_run_with_status_last_step_and_chosen_metrics(store: Path) -> None:
    code, out = invoke("runs", "--root", str(store), "--metric", "critic/*")
    assert code == 0
    assert "run-a" in out and "run-b" in out and "finished" in out
    assert "critic/score/mean" in out
    assert "2.9" in out and "29" in out  # run-b's last value and last step


def test_show_prints_identity_attempts_and_metric_summaries(store: Path) -> None:
    code, out = invoke("show", "run-b", "--root", str(store))
    assert code == 0
    assert "p/run-b" in out and "attempts" in out
    assert "0..29" in out and "metrics=60" in out
    assert "optim/lr" in out


def test_diff_shows_the_config_key_that_differs(store: Path) -> None:
    code, out = invoke("diff", "run-a", "run-b", "--root", str(store), "--section", "config")
    assert code == 0
    assert "optim/lr" in out and "0.001" in out and "0.0001" in out


@pytest.mark.parametrize("fmt", ["table", "csv", "json"])
def test_sql_prints_results_in_each_format(store: Path, fmt: str) -> None:
    code, out = invoke("sql", "SELECT run, count(*) AS n FROM metrics GROUP BY run ORDER BY run",
                       "--root", str(store), "--format", fmt)
    assert code == 0
    if fmt == "json":
        assert [json.loads(line) for line in out.splitlines()] == [
            {"run": "run-a", "n": 40}, {"run": "run-b", "n": 60}]
    else:
        assert "run-a" in out and "40" in out and "60" in out


def test_sql_writes_parquet_outside_the_store(store: Path, tmp_path: Path) -> None:
    out_file = tmp_path / "out.parquet"
    code, _ = invoke("sql", "SELECT * FROM metrics", "--root", str(store), "--format",
                     "parquet", "-o", str(out_file))
    assert code == 0
    assert pq.read_table(out_file).num_rows == 100


def test_sql_refuses_to_write_its_output_into_the_store(store: Path) -> None:
    code, out = invoke("sql", "SELECT 1", "--root", str(store), "--format", "csv", "-o",
                       str(store / "metrics" / "x.csv"))
    assert code == 1
    assert "refusing to write" in out
    assert not (store / "metrics" / "x.csv").exists()


def test_sql_that_would_modify_the_store_exits_1_with_a_clear_message(store: Path) -> None:
    code, out = invoke("sql", f"COPY metrics TO '{store}/m.csv'", "--root", str(store))
    assert code == 1
    assert "read-only" in out
    assert not (store / "m.csv").exists()


def test_compact_reports_what_it_did_and_dry_run_changes_nothing(store: Path) -> None:
    before = sorted(p.name for p in store.rglob("*.arrows"))
    code, out = invoke("compact", "--root", str(store), "--dry-run")
    assert code == 0 and "would compact" in out
    assert sorted(p.name for p in store.rglob("*.arrows")) == before
    code, out = invoke("compact", "--root", str(store))
    assert code == 0 and "compacted" in out
    assert not list(store.rglob("*.arrows"))
    assert list(store.rglob("*.parquet"))


def test_watch_once_prints_each_step_of_the_chosen_keys(store: Path) -> None:
    code, out = invoke("watch", "run-a", "--root", str(store), "--once", "--keys", "critic/*")
    assert code == 0
    lines = out.strip().splitlines()
    assert len(lines) == 20
    assert lines[0] == "step:0 - critic/score/mean:0"
    assert "actor/pg_loss" not in out


def test_unknown_run_and_missing_store_exit_1_naming_what_is_wrong(store: Path,
                                                                    tmp_path: Path) -> None:
    code, out = invoke("show", "nope", "--root", str(store))
    assert code == 1 and "no run 'nope'" in out
    code, out = invoke("runs", "--root", str(tmp_path / "absent"))
    assert code == 1 and "no tracklake store" in out


def test_demo_writes_a_multi_rank_run_compacts_it_and_prints_a_summary(root: Path) -> None:
    code, out = invoke("demo", "--root", str(root), "--ranks", "2", "--steps", "120")
    assert code == 0, out
    assert "status=finished" in out and "ranks=2" in out and "steps=120" in out
    counts = tracklake.query(
        "SELECT count(DISTINCT rank) AS ranks, count(*) FILTER (WHERE key = "
        "'critic/score/mean') AS scores, (SELECT count(*) FROM generations) AS gens, "
        "(SELECT count(*) FROM traces) AS spans FROM metrics", root=root).to_pylist()[0]
    assert counts == {"ranks": 2, "scores": 240, "gens": 8, "spans": 4}
    assert not list(root.rglob("*.arrows"))  # everything was compacted
