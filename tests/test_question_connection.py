"""Questions share one in-memory DuckDB database per process, each on a connection of its
own: what one question registers or views is never seen by another, even at the same
time; the database stays locked down; a forked child and another memory limit get their
own."""

from __future__ import annotations

import threading
from pathlib import Path

import duckdb
import pytest
from _forked import in_forked_child

import tracklake
from tracklake._read.readonly import MEMORY_ENV, question_connection


def _store(root: Path, offset: float) -> None:
    with tracklake.init(project="p", run_id="r", root=root, capture_identity=False,
                        system_metrics=False) as run:
        for step in range(20):
            run.log({"loss": offset + step}, step=step)


def _total(root: Path) -> float:
    return tracklake.query("SELECT sum(value) AS s FROM metrics", root=root).to_pylist()[0]["s"]


def test_questions_about_two_stores_at_once_each_see_their_own(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    _store(a, 0.0)
    _store(b, 1000.0)
    want = {a: sum(range(20)), b: 20 * 1000.0 + sum(range(20))}
    wrong: list[tuple[Path, float]] = []

    def ask(root: Path) -> None:
        for _ in range(15):
            got = _total(root)
            if got != want[root]:
                wrong.append((root, got))

    threads = [threading.Thread(target=ask, args=(root,)) for root in (a, b, a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []


def test_what_one_question_registers_or_views_is_gone_for_the_next(root: Path) -> None:
    first = question_connection()
    first.execute("CREATE TEMP VIEW metrics AS SELECT 42 AS value")
    first.register("planted", duckdb.sql("SELECT 1 AS x").arrow())
    second = question_connection()
    with pytest.raises(duckdb.CatalogException):
        second.execute("SELECT * FROM planted")
    with pytest.raises(duckdb.CatalogException):
        second.execute("SELECT * FROM metrics")
    first.close()
    second.close()
    _store(root, 0.0)
    assert _total(root) == sum(range(20))


def test_the_shared_database_stays_locked_down(tmp_path: Path) -> None:
    con = question_connection()
    target = tmp_path / "written.csv"
    for sql in ("SET enable_external_access = true", "SET lock_configuration = false",
                "SET memory_limit = '1TB'", f"COPY (SELECT 1) TO '{target}'"):
        with pytest.raises(duckdb.Error):
            con.execute(sql)
    assert not target.exists()
    con.close()


def test_another_memory_limit_gets_a_database_of_its_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MEMORY_ENV, "300MiB")
    con = question_connection()
    limit = con.execute("SELECT current_setting('memory_limit')").fetchone()
    assert limit is not None and limit[0].replace(" ", "") == "300.0MiB"
    con.close()


def _child_total(root: str) -> float:
    return _total(Path(root))


def test_a_forked_child_asks_on_a_database_of_its_own(root: Path) -> None:
    _store(root, 0.0)
    assert _total(root) == sum(range(20))  # the parent's database exists
    assert in_forked_child(_child_total, str(root)) == sum(range(20))


def test_a_question_that_runs_out_of_memory_or_time_leaves_the_others_answering(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Questions at once share the database's memory limit: one past it fails by name, and
    neither it nor a question stopped by its timeout leaves the database unable to answer
    the questions asked beside it or after it."""
    _store(root, 0.0)
    monkeypatch.setenv(MEMORY_ENV, "64MiB")
    answers: list[float] = []

    def small() -> None:
        for _ in range(10):
            answers.append(_total(root))

    beside = threading.Thread(target=small)
    beside.start()
    with pytest.raises(tracklake.QueryError, match=MEMORY_ENV):
        tracklake.query("SELECT list(i) FROM range(500000000) t(i)", root=root)
    with pytest.raises(tracklake.QueryError, match="stopped after"):
        tracklake.query("SELECT count(*) FROM range(100000000000) a, range(1000) b",
                        root=root, timeout=0.5)
    beside.join(60)
    assert answers == [sum(range(20))] * 10
    assert _total(root) == sum(range(20))
