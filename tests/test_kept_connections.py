"""A question about one run asked again is answered on the connection the last one left
(its tables and views made once), only while the run's parts are the files read: never
after the run changed, after a question failed on it, by two questions at once, or in a
forked child."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from _forked import in_forked_child
from _settled import age

import tracklake
from tracklake._read import kept_connections

SQL = "SELECT rank, step, value FROM metrics WHERE run = 'a' AND key = 'loss' ORDER BY ALL"


def _write(root: Path, run_id: str, rank: int, offset: float = 0.0) -> None:
    with tracklake.init(project="p", run_id=run_id, root=root, rank=rank,
                        capture_identity=False, system_metrics=False) as run:
        for step in range(30):
            run.log({"loss": offset + step + rank / 10, "acc": step / 7}, step=step)


@pytest.fixture
def store(root: Path) -> Path:
    for rank in (0, 1):
        _write(root, "a", rank)
    _write(root, "b", 0, offset=100.0)
    tracklake.compact(root=root)
    age(root)  # past the racy window: the run's parts read whole are kept
    return root


@pytest.fixture(autouse=True)
def nothing_kept() -> None:
    with kept_connections._lock:
        kept, kept_connections._kept = kept_connections._kept, {}
    for entry in kept.values():
        entry.connection.close()


def _from_the_parts(root: Path, sql: str = SQL) -> list[dict[str, object]]:
    """The answer of a caller's connection, which reads every part through the dataset."""
    with tracklake.connect(root) as con:
        return con.sql(sql).to_arrow_table().to_pylist()  # type: ignore[no-any-return]


def _kept() -> list[object]:
    return [e.connection for e in kept_connections._kept.values()]


def test_a_run_asked_again_is_answered_on_the_connection_kept_until_the_run_changes(
        store: Path) -> None:
    want = _from_the_parts(store)
    assert len(want) == 60
    assert tracklake.query(SQL, root=store).to_pylist() == want
    (first,) = _kept()
    assert tracklake.query(SQL, root=store).to_pylist() == want
    assert _kept() == [first]  # the same connection, taken and given back
    # the run changes: a third rank, compacted into parts of its own
    _write(store, "a", 2)
    tracklake.compact(root=store)
    age(store)
    changed = _from_the_parts(store)
    assert len(changed) == 90 and changed != want
    assert tracklake.query(SQL, root=store).to_pylist() == changed
    (second,) = _kept()
    assert second is not first


def test_a_run_whose_parts_are_replaced_in_place_is_read_again(store: Path) -> None:
    """Another run's part renamed over this run's (a new inode, as compaction's rename
    makes): the kept connection's table is not the one the next question reads."""
    tracklake.query(SQL, root=store)
    (first,) = _kept()
    (part_a,) = sorted(store.glob("metrics/project=p/run=a/rank=0/**/*.parquet"))
    (part_b,) = sorted(store.glob("metrics/project=p/run=b/rank=0/**/*.parquet"))
    part_b.replace(part_a)
    age(store)
    with tracklake.connect(store) as con:
        rows = con.sql(SQL).to_arrow_table().to_pylist()
    assert [r["value"] for r in rows if r["rank"] == 0] == [100.0 + s for s in range(30)]
    assert tracklake.query(SQL, root=store, problems=tracklake.ReadProblems()
                           ).to_pylist() == rows
    assert first not in _kept()


def test_a_question_that_fails_on_the_kept_connection_leaves_it(store: Path) -> None:
    want = tracklake.query(SQL, root=store).to_pylist()
    assert len(_kept()) == 1
    with pytest.raises(tracklake.QueryError, match="no_such_column"):
        tracklake.query("SELECT no_such_column FROM metrics WHERE run = 'a'", root=store)
    with pytest.raises(tracklake.QueryError, match="stopped after"):
        tracklake.query("SELECT count(*) FROM metrics, range(100000000000) WHERE run = 'a'",
                        root=store, timeout=0.3)
    assert _kept() == []  # taken by each failed question and closed
    assert tracklake.query(SQL, root=store).to_pylist() == want
    assert len(_kept()) == 1


def test_questions_at_once_about_two_runs_each_get_their_own_answers(store: Path) -> None:
    sql_b = SQL.replace("'a'", "'b'")
    want = {SQL: _from_the_parts(store), sql_b: _from_the_parts(store, sql_b)}
    assert want[SQL] != want[sql_b]
    wrong: list[str] = []

    def ask(sql: str) -> None:
        for _ in range(25):
            if tracklake.query(sql, root=store).to_pylist() != want[sql]:
                wrong.append(sql)

    threads = [threading.Thread(target=ask, args=(sql,)) for sql in (SQL, sql_b) * 3]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert wrong == []
    assert 1 <= len(_kept()) <= 2  # one per run, the others closed


def test_at_most_the_bound_of_connections_is_kept(store: Path, monkeypatch: pytest.MonkeyPatch
                                                   ) -> None:
    monkeypatch.setattr(kept_connections, "MOST", 1)
    tracklake.query(SQL, root=store)
    tracklake.query(SQL.replace("'a'", "'b'"), root=store)
    (for_b,) = _kept()  # a's was closed
    monkeypatch.setattr(kept_connections, "MOST_BYTES", 10)  # smaller than any run's table
    tracklake.query(SQL, root=store)
    assert _kept() == [for_b]  # a's tables are past the bound: its connection not kept


def _child_answer(root: str) -> tuple[int, list[dict[str, object]]]:
    return len(kept_connections._kept), tracklake.query(SQL, root=root).to_pylist()


def test_a_forked_child_asks_on_connections_of_its_own(store: Path) -> None:
    want = tracklake.query(SQL, root=store).to_pylist()
    assert len(_kept()) == 1
    assert in_forked_child(_child_answer, str(store)) == (0, want)
    assert tracklake.query(SQL, root=store).to_pylist() == want  # the parent's still answers
