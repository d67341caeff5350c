"""Plain DuckDB, Polars and pyarrow, reading a store's files with only what docs/format.md
says (its SQL and code taken from the page), get exactly tracklake's views' answers: on a
resumed run, a key logged twice at one step, a NaN, and run ids that look like a number
or a date. (Polars is in the `test` extra: the test fails, not skips, without it.)"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from _format_doc import block_with, exec_python, questions, reference_views, set_listings

import tracklake
from tracklake.read import PARTITION_SCHEMA

_KINDS = ("metrics", "texts", "configs", "generations", "histograms", "media")
_NAN_FILTER = " WHERE NOT isnan(value)"


def _log(run: Any, steps: Iterable[int], attempt: int) -> None:
    for step in steps:
        run.log({"loss": 100.0 * attempt - step, "acc": step / 100}, step=step)


def _write(root: Path) -> None:
    """Run 0042 resumed at step 30 (each attempt logs a key twice at one step), run
    2025-01-01 on two ranks with a NaN and an inf, run 1e5 without config or generations,
    run a+b@c; everything compacted."""
    opts: dict[str, Any] = {"project": "p", "root": root, "capture_identity": False}
    with tracklake.init(run_id="0042", config={"lr": 1e-3, "model": {"n": 2}}, **opts) as run:
        _log(run, range(50), attempt=1)
        run.log({"acc": 99.0}, step=10)  # a second value at step 10: the later seq wins
        run.log_config({"lr": 2e-3})  # the key logged again in this attempt
        run.log_generations([("q", "a", 1.0), ("q2", "a2", 0.0)], step=5)
        run.log_generations([("q", "superseded", 1.0)], step=40)
        run.log_text("note", "before any step")
        for step in (5, 40):  # the ones at 40 are superseded
            run.log_histogram("w", [float(step), step + 1.5], step=step, bins=2)
            run.log_image("img", np.full((2, 3), step, np.uint8), step=step)
    with tracklake.init(run_id="0042", config={"lr": 5e-4, "model": {"n": 2}}, **opts) as run:
        _log(run, range(30, 60), attempt=2)
        run.log_histogram("w", [1.0, 2.0, 2.0], step=35, bins=3)
        run.log_image("img", np.full((2, 3), 35, np.uint8), step=35)
        run.log({"loss": 7.0}, step=59)  # the last value: logged after -> greater seq
        run.log_generations([("q", "resumed", 0.5)], step=35)
    for rank in (0, 1):
        with tracklake.init(run_id="2025-01-01", rank=rank, config={"seed": rank}, **opts) as run:
            _log(run, range(20), attempt=1)
            run.log({"loss": math.nan}, step=3 + rank)
            run.log({"acc": math.inf}, step=5)
            run.log_generations([("x", "y", rank)], step=2)
    with tracklake.init(run_id="1e5", **opts) as run:
        _log(run, range(5), attempt=1)
    with tracklake.init(run_id="a+b@c", config={"lr": 1}, **opts) as run:
        _log(run, range(3), attempt=1)
    tracklake.compact(root=root)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("plain") / "store"
    _write(root)
    assert not list(root.rglob("*.arrows")) and list(root.rglob("*.parquet"))
    return root


def _rows(table: Any) -> list[tuple[Any, ...]]:
    """A table's rows in a comparable form: sorted tuples, NaN as a string."""
    if not isinstance(table, pa.Table):
        table = table.to_arrow()
    rows = [tuple("nan" if isinstance(v, float) and math.isnan(v) else v for v in r.values())
            for r in table.to_pylist()]
    return sorted(rows, key=repr)


def _duckdb_reference(root: Path) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with the parts opened and the reference views defined, as the
    page says."""
    con = duckdb.connect()
    # a kind with no part has no view (as the page says, DuckDB refuses one over no file)
    kinds = tuple(k for k in _KINDS if any(root.glob(f"{k}/*/*/*/*/part-*.parquet")))
    set_listings(con, root, kinds)
    opening = block_with("sql", "CREATE VIEW KIND_parts")
    for kind in kinds:
        con.execute(opening.replace("KIND", kind).replace("ROOT", str(root)))
    for name, sql in reference_views():
        if all(f"{k}_parts" not in sql for k in set(_KINDS) - set(kinds)):
            con.execute(f"CREATE VIEW {name} AS {sql}")
    return con


def _duckdb_answers(root: Path) -> dict[str, list[tuple[Any, ...]]]:
    con = _duckdb_reference(root)
    return {q: _rows(con.sql(sql).to_arrow_table()) for q, sql in questions().items()}


def _polars_answers(root: Path) -> dict[str, list[tuple[Any, ...]]]:
    scope: dict[str, Any] = {}
    exec_python("pl.SQLContext", root, scope)
    sql = scope["sql"]
    for name, query in reference_views():
        sql.register(name, sql.execute(query))
    return {q: _rows(sql.execute(text.replace(_NAN_FILTER, ""), eager=True))
            for q, text in questions().items()}


def _pyarrow_answers(root: Path) -> dict[str, list[tuple[Any, ...]]]:
    scope: dict[str, Any] = {}
    exec_python("ds.partitioning(", root, scope)
    exec_python("def visible(", root, scope)
    by_question = {
        "last value per run, rank and key": scope["last_values"],
        "points per run": scope["points"],
        "each run's config": scope["run_configs"],
        "generations per run": scope["generations"],
        "max of each key per run, NaN skipped": scope["best"],
    }
    assert set(by_question) == set(questions())
    return {q: _rows(t) for q, t in by_question.items()}


def _tracklake_answers(root: Path) -> dict[str, list[tuple[Any, ...]]]:
    return {q: _rows(tracklake.query(sql, root=root)) for q, sql in questions().items()}


def test_the_views_answers_are_the_ones_expected(store: Path) -> None:
    """Pins the answers themselves, so that the engines cannot agree on a wrong one."""
    answers = _tracklake_answers(store)
    points = dict(((p, r), n) for p, r, n in answers["points per run"])
    # 0042: attempt 1's steps 0..29 and the second acc at 10, attempt 2's 30..59 and the
    # second loss at 59 (read naively: 50 + 1 + 30 + 1 steps), and the five statistics of
    # the histograms at steps 5 (attempt 1) and 35 (attempt 2; attempt 1's at 40 is hidden)
    assert points == {("p", "0042"): 2 * 30 + 1 + 2 * 30 + 1 + 2 * 5,
                      ("p", "2025-01-01"): 2 * 42,
                      ("p", "1e5"): 10, ("p", "a+b@c"): 6}
    last = {(r, rank, k): v for _, r, rank, k, v in answers["last value per run, rank and key"]}
    assert last[("0042", 0, "loss")] == 7.0 and last[("0042", 0, "acc")] == 0.59
    configs = {(r, rank, k): json.loads(v) for _, r, rank, k, v in answers["each run's config"]}
    assert configs[("0042", 0, "lr")] == 5e-4 and configs[("2025-01-01", 1, "seed")] == 1
    assert not [k for k in configs if k[0] == "1e5"]
    generations = {r: n for _, r, n in answers["generations per run"]}
    assert generations == {"0042": 3, "2025-01-01": 2}
    best = {(r, k): v for _, r, k, v in answers["max of each key per run, NaN skipped"]}
    assert best[("2025-01-01", "acc")] == math.inf and best[("2025-01-01", "loss")] == 100.0


def test_the_config_of_a_run_is_its_latest_attempts_as_tracklake_show_prints_it(
        store: Path) -> None:
    record = tracklake.find_run(store, "0042", project="p")
    latest = [a for a in record.attempts if a["rank"] == 0][-1]
    answer = _duckdb_answers(store)["each run's config"]
    assert {k: json.loads(v) for _, r, _, k, v in answer if r == "0042"} == latest["config"]


@pytest.mark.parametrize("engine", [_duckdb_answers, _polars_answers, _pyarrow_answers],
                         ids=["duckdb", "polars", "pyarrow"])
def test_a_plain_engine_gets_the_views_answers(store: Path, engine: Any) -> None:
    assert engine(store) == _tracklake_answers(store)


def test_run_ids_that_look_like_numbers_or_dates_stay_strings(store: Path) -> None:
    scope: dict[str, Any] = {}
    exec_python("ds.partitioning(", store, scope)
    table = scope["metrics"]
    assert table.schema.field("run").type == pa.string()
    assert set(table.column("run").to_pylist()) == {"0042", "2025-01-01", "1e5", "a+b@c"}
    assert table.schema.field("rank").type == pa.int32()
    assert PARTITION_SCHEMA.equals(scope["partitioning"].schema)
    exec_python("to_pandas()", store, scope)
    frame = scope["frame"]
    assert set(frame["run"]) == {"0042", "2025-01-01", "1e5", "a+b@c"}
    assert len(frame) == table.num_rows


def test_the_documented_datasets_open_while_a_run_is_being_written(root: Path) -> None:
    """A live segment beside the parts: the documented pyarrow dataset, DuckDB glob and
    Polars scan read the parts and never trip on it."""
    opts: dict[str, Any] = {"project": "p", "root": root, "capture_identity": False}
    with tracklake.init(run_id="done", config={"lr": 1}, **opts) as run:
        _log(run, range(10), attempt=1)
        run.log_text("note", "every kind has a part", step=1)
        run.log_generations([("q", "a", 1.0)], step=1)
        run.log_histogram("w", [1.0, 2.0], step=1)  # and its 5 statistics: 25 metrics
    tracklake.compact(root=root)
    live = tracklake.init(run_id="live", **opts)
    try:
        _log(live, range(10), attempt=1)
        live.flush()
        (segment,) = root.glob("metrics/project=p/run=live/**/*.arrows")
        assert segment.name.startswith("_seg-")
        scope: dict[str, Any] = {}
        exec_python("ds.partitioning(", root, scope)
        assert set(scope["metrics"].column("run").to_pylist()) == {"done"}
        assert scope["metrics"].num_rows == 25
        plain = ds.dataset(str(root / "metrics"), format="parquet",
                           partitioning="hive").to_table()
        assert plain.num_rows == 25  # Hive discovery skips `_seg-…` by itself
        assert _duckdb_answers(root)["points per run"] == [("p", "done", 25)]
        assert _polars_answers(root)["points per run"] == [("p", "done", 25)]
        exec_python("to_pandas()", root, scope)
        assert len(scope["frame"]) == 25  # pandas too
    finally:
        live.finish()


@pytest.mark.parametrize("view", ["metrics", "texts", "generations", "histograms", "media",
                                  "metric_summaries", "run_configs"])
def test_each_reference_view_is_the_tracklake_view_row_for_row(store: Path, view: str) -> None:
    """Every column of every row, not only the answers to the questions above."""
    con = _duckdb_reference(store)
    ours = tracklake.query(f"SELECT * FROM {view}", root=store)
    columns = con.sql(f"SELECT * FROM {view}").columns  # DuckDB puts Hive columns in name order
    assert sorted(columns) == sorted(ours.column_names)
    reference = con.sql(f"SELECT {', '.join(ours.column_names)} FROM {view}").to_arrow_table()
    assert _rows(reference) == _rows(ours)
    assert reference.num_rows > 0


def test_the_reference_run_attempts_sql_gives_the_view(root: Path) -> None:
    """Attempt files read by DuckDB's read_json: statuses as shown, a crashed one included."""
    opts: dict[str, Any] = {"project": "p", "root": root, "capture_identity": False}
    for run_id in ("0042", "0042", "2025-01-01"):
        with tracklake.init(run_id=run_id, **opts) as run:
            _log(run, range(3), attempt=1)
    stale = root / "runs/project=p/run=2025-01-01/rank=0/attempt=1.json"
    record = json.loads(stale.read_text())
    stale.write_text(json.dumps({  # from a node whose processes a reader cannot probe
        **record, "status": "running", "heartbeat_at": "2026-01-01T00:00:00+00:00",
        "identity": {**record["identity"], "host": "another-node"}}))
    (root / "runs/project=p/run=0042/rank=0/attempt=3.json").write_text("")  # being created
    sql = block_with("sql", "read_json(").replace("ROOT", str(root))
    reference = duckdb.sql(sql).to_arrow_table()
    ours = tracklake.query(f"SELECT {', '.join(reference.column_names)} FROM run_attempts",
                           root=root)
    assert _rows(reference) == _rows(ours)
    assert {(r["run"], r["attempt"], r["status"]) for r in reference.to_pylist()} == {
        ("0042", 1, "finished"), ("0042", 2, "finished"), ("2025-01-01", 1, "crashed")}


def test_a_format_1_0_store_compacted_by_1_1_answers_the_same(tmp_path: Path) -> None:
    """1.0 parts (with their ARROW:schema) beside the 1.1 parts that compaction writes from
    1.0 segments: the reference SQL still gives the views' rows."""
    import shutil

    root = tmp_path / "golden"
    shutil.copytree(Path(__file__).parent / "golden" / "1.0", root)
    tracklake.compact(root=root)
    assert not list(root.rglob("*.arrows"))
    con = _duckdb_reference(root)
    for view in ("metrics", "metric_summaries", "run_configs", "generations"):
        ours = tracklake.query(f"SELECT * FROM {view}", root=root)
        reference = con.sql(f"SELECT {', '.join(ours.column_names)} FROM {view}")
        assert _rows(reference.to_arrow_table()) == _rows(ours), view
    points = dict(con.sql("SELECT run, count(*) FROM metrics GROUP BY run").fetchall())
    assert points == {"done": 2 * 20 * 3, "resumed": 20 * 3, "torn": 9}
