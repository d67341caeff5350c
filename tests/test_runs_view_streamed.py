"""A process's first question on the runs view alone reads the run catalog's files one at
a time, holding the attempts and not every run's entry (`run_index.runs_view_attempts`);
its answers are those of the catalog read whole, which the next question loads and keeps.
The runs view groups by run alone, with each attempt's "latest of its rank" and "first
row of its rank" computed beside the rows (`attempt_rows`): the same as SQL's window and
count of distinct ranks."""

from __future__ import annotations

import json
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from _crafted import age_catalog, catalog_path, catalogued_table, signed_catalog
from _many_runs import PROJECTS, by_sql, catalogued_store, plant_forged_status
from _many_runs import changed as _changed
from click.testing import CliRunner

import tracklake
from tracklake._cli.main import main
from tracklake._read import catalog_shards, run_index, runs_rows, snapshot
from tracklake._read.attempt_rows import _ORDER, _latest_and_first


@pytest.fixture
def store(root: Path) -> Path:
    return catalogued_store(root)


QUESTIONS = [
    "SELECT * FROM runs ORDER BY project, run",
    "SELECT * FROM run_attempts ORDER BY project, run, attempt, rank",
    "SELECT run, status, ranks, attempts FROM runs WHERE project = 'q' ORDER BY run",
]


def _fresh_process() -> None:
    """As a new process: no catalog kept, no runs view answered yet."""
    catalog_shards._read_before.clear()
    run_index._streamed.clear()


def _streamed(root: Path, sql: str, monkeypatch: pytest.MonkeyPatch) -> pa.Table:
    """`sql` as a process's first question: the catalog never loaded whole."""
    _fresh_process()

    def whole(*args: object, **kwargs: object) -> None:
        raise AssertionError("the whole catalog was loaded")
    with monkeypatch.context() as m:
        m.setattr(catalog_shards, "load", whole)
        return tracklake.query(sql, root=root)


def _whole(root: Path, sql: str, monkeypatch: pytest.MonkeyPatch) -> pa.Table:
    """`sql` answered from the catalog loaded whole (as every question was before)."""
    _fresh_process()
    with monkeypatch.context() as m:
        m.setattr(snapshot, "runs_view_streamed", lambda root: False)
        return tracklake.query(sql, root=root)


def _more_shapes(root: Path) -> None:
    """A 2-rank run whose rank 1 alone restarted, and a run that failed."""
    for rank in (0, 1):
        with tracklake.init(project="p", run_id="job", root=root, rank=rank,
                            capture_identity=False, system_metrics=False) as run:
            run.log({"loss": 1.0}, step=0)
    with tracklake.init(project="p", run_id="job", root=root, rank=1,
                        capture_identity=False, system_metrics=False) as run:
        run.log({"loss": 0.5}, step=1)
    with pytest.raises(RuntimeError), tracklake.init(
            project="q", run_id="bad", root=root, capture_identity=False,
            system_metrics=False):
        raise RuntimeError("boom")


@pytest.mark.parametrize("group_at", [1, runs_rows.GROUP_AT], ids=["by-file", "at-once"])
@pytest.mark.parametrize("changed", [False, True], ids=["settled", "changed"])
def test_the_first_questions_answers_are_those_of_the_whole_catalog(
        store: Path, changed: bool, group_at: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Asked of the runs view alone, its rows are grouped a few catalog files at a time
    (by-file: each file's runs apart, then the runs the catalog lacks), no attempt kept;
    with `run_attempts`, the attempts are held: both answer as the whole catalog does."""
    if changed:  # new, resumed, deleted, failed and restarted runs the catalog lacks
        _changed(store)
        _more_shapes(store)
    monkeypatch.setattr(runs_rows, "GROUP_AT", group_at)
    # (the catalog's files are vouched for a few together: by-file, each alone)
    monkeypatch.setattr(run_index, "_VOUCHED_AT", group_at)
    grouped: list[int] = []
    real = runs_rows._grouped

    def counted(con: object, attempts: pa.Table, now: float) -> pa.Table:
        grouped.append(attempts.num_rows)
        return real(con, attempts, now)  # type: ignore[arg-type]
    monkeypatch.setattr(runs_rows, "_grouped", counted)
    for sql in QUESTIONS:
        grouped.clear()
        streamed = _streamed(store, sql, monkeypatch)
        assert streamed.num_rows and streamed.equals(_whole(store, sql, monkeypatch)), sql
        if "run_attempts" in sql:
            assert not grouped  # the attempts held, as `run_attempts` shows them
        elif sql == QUESTIONS[0]:  # every attempt grouped once, a few files at a time
            attempts = _whole(store, "SELECT count(*) AS n FROM run_attempts",
                              monkeypatch).column("n")[0].as_py()
            assert sum(grouped) == attempts
            assert len(grouped) > 2 if group_at == 1 else len(grouped) == 1
    if changed:
        [job] = [r for r in _streamed(store, QUESTIONS[0], monkeypatch).to_pylist()
                 if r["run"] == "job"]
        assert (job["ranks"], job["attempts"], job["status"]) == (2, 2, "finished")
        assert "_latest" not in _streamed(store, QUESTIONS[1], monkeypatch).column_names


def test_the_next_question_loads_the_catalog_and_keeps_it(
        store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fresh_process()
    loads: list[Path] = []
    real = catalog_shards.load

    def load(root: Path, *args: object, **kwargs: object) -> object:
        loads.append(root)
        return real(root, *args, **kwargs)  # type: ignore[arg-type]
    monkeypatch.setattr(catalog_shards, "load", load)
    answers = [tracklake.query(QUESTIONS[0], root=store) for _ in range(3)]
    assert answers[0].equals(answers[1]) and answers[1].equals(answers[2])
    assert len(loads) == 2  # none for the first; the second loads, the third keeps it
    assert catalog_shards.keeps_whole(store)


def test_a_command_that_asks_once_reads_no_catalog_whole(
        store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    expected = _whole(store, QUESTIONS[0], monkeypatch)
    _fresh_process()

    def whole(*args: object, **kwargs: object) -> None:
        raise AssertionError("the whole catalog was loaded")
    monkeypatch.setattr(catalog_shards, "load", whole)
    result = CliRunner().invoke(main, ["sql", QUESTIONS[0], "--root", str(store),
                                       "--format", "json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.output.splitlines()]
    assert [(r["run"], r["status"], r["ranks"]) for r in rows] == [
        (r["run"], r["status"], r["ranks"]) for r in expected.to_pylist()]
    assert len(rows) == sum(PROJECTS.values())


def test_an_entry_planted_in_another_runs_file_is_not_used(
        store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """p09's entry with its status forged as crashed, planted in p08's file: that file is
    not trusted, both runs are read from their files."""
    plant_forged_status(store, "p09", beside="p08", status="crashed")
    sql = "SELECT run, status FROM runs ORDER BY run"
    streamed = _streamed(store, sql, monkeypatch).to_pylist()
    assert {r["status"] for r in streamed} == {"finished"}
    assert len(streamed) == sum(PROJECTS.values())


def test_an_entry_whose_attempt_names_another_run_is_not_used(
        store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """p08's own entry, in its own file, given a crashed attempt naming p09 (of another
    file): counted file by file, p09 would be two runs; the file is not trusted."""
    from tracklake._read.run_index import newest_runs

    table = catalogued_table(store)
    runs = table.column("run").to_pylist()
    attempts = table.column("attempts").to_pylist()
    i = runs.index("p08")
    forged = dict(attempts[i][0], run="p09", status="crashed", attempt=7)
    attempts[i] = [*attempts[i], forged]
    table = table.set_column(table.schema.get_field_index("attempts"), "attempts",
                             pa.array(attempts, table.schema.field("attempts").type))
    path = catalog_path(store, "p08")
    rows = pa.ipc.open_stream(path.read_bytes().partition(b"\n")[2]).read_all()
    mine = rows.column("run").to_pylist()
    path.write_bytes(signed_catalog(table.filter(pa.array([r in mine for r in runs]))))
    age_catalog(store)
    sql = "SELECT run, status, attempts FROM runs ORDER BY run"
    for answer in (_streamed(store, sql, monkeypatch), _whole(store, sql, monkeypatch)):
        rows_ = answer.to_pylist()
        assert len(rows_) == sum(PROJECTS.values())
        assert {(r["status"], r["attempts"]) for r in rows_} == {("finished", 1)}
    found = newest_runs(store, None, 3)
    expected = by_sql(store, None, 3, monkeypatch)
    assert found is not None and (found.total, found.newest) == expected


def test_a_store_whose_mtimes_are_not_trusted_is_read_from_its_files(
        store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    expected = _whole(store, QUESTIONS[0], monkeypatch)
    monkeypatch.setenv("TRACKLAKE_TRUST_MTIMES", "0")
    assert run_index.runs_view_attempts(store, None) is None
    _fresh_process()
    assert tracklake.query(QUESTIONS[0], root=store).equals(expected)


@pytest.mark.parametrize("changed", [False, True], ids=["settled", "changed"])
def test_the_newest_picked_file_by_file_are_the_runs_views(
        store: Path, changed: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The newest runs picked after every catalog file (not once from every run's start,
    which a million runs would hold), and a project's run names counted, not listed,
    where the catalog vouches for as many runs as it holds."""
    from tracklake._read.run_index import newest_runs

    if changed:
        _changed(store)
    listed: list[str] = []
    real = run_index.names_at_by
    monkeypatch.setattr(run_index, "names_at_by", lambda root, rel, prefix, size:
                        listed.append(rel) or real(root, rel, prefix, size))
    monkeypatch.setattr(run_index, "_PICK_AT", 1)
    monkeypatch.setattr(run_index, "_LISTED_AT", 2)  # a project's names a few at a time
    for project in (None, "p", "q"):
        for limit in (1, 3, 100):
            found = newest_runs(store, project, limit)
            expected = by_sql(store, project, limit, monkeypatch)
            if limit == 100:  # nothing left out: read whole
                assert found is None
                continue
            assert found is not None and (found.total, found.newest) == expected
    # (with limit 100 too: whether any run is left out is known once those the catalog
    # lacks are counted)
    assert listed == (["runs/project=p"] * 6 if changed else []), listed


def _window_and_distinct(rows: pa.Table) -> tuple[list[bool], list[int]]:
    """What the runs view computed before, by DuckDB: each row's `attempt = max(attempt)
    OVER (PARTITION BY project, run, rank)`, and each run's count of distinct ranks."""
    con = duckdb.connect()
    con.register("t", rows.append_column("i", pa.array(np.arange(rows.num_rows))))
    latest = con.execute("""SELECT coalesce(attempt = max(attempt) OVER
        (PARTITION BY project, run, rank), false) FROM t ORDER BY i""").fetchall()
    ranks = con.execute("""SELECT count(DISTINCT rank) FROM t GROUP BY project, run
        ORDER BY project, run""").fetchall()
    return [bool(x) for x, in latest], [n for n, in ranks]


@pytest.mark.parametrize("seed", range(8))
def test_latest_and_first_of_rank_are_sqls_window_and_distinct_ranks(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.choice([1, 2, 7, 300])

    def maybe(value: int) -> int | None:
        return None if rng.random() < 0.1 else value
    rows = pa.table({
        "project": [rng.choice(["p", "q", "p q"]) for _ in range(n)],
        "run": [rng.choice(["a", "b", "ab", ""]) for _ in range(n)],
        "rank": pa.array([maybe(rng.choice([0, 1, 2, 2**31 - 1, -2**31]))
                          for _ in range(n)], pa.int32()),
        "attempt": pa.array([maybe(rng.randint(0, 3)) for _ in range(n)], pa.int32()),
    }).sort_by(_ORDER)
    latest, first = _latest_and_first(rows)
    sql_latest, sql_ranks = _window_and_distinct(rows)
    assert latest.tolist() == sql_latest
    runs = sorted({(p, r) for p, r in zip(rows.column("project").to_pylist(),
                                          rows.column("run").to_pylist(), strict=True)})
    counted = {run: 0 for run in runs}
    for p, r, f in zip(rows.column("project").to_pylist(), rows.column("run").to_pylist(),
                       first.tolist(), strict=True):
        counted[(p, r)] += f
    assert [counted[run] for run in runs] == sql_ranks


def test_runs_rows_made_by_threads_at_once_are_each_their_own(store: Path) -> None:
    """Threads grouping attempts at once, each on its cursor of the process's database
    (as questions from a dashboard's threads do), each get the rows of their own
    attempts, as grouped one after the other."""
    groups = list(run_index.runs_view_attempts(store, None) or [])
    every = pa.concat_tables(groups)
    by_project = [every.filter(pa.array([p == name for p in every.column("project")
                                         .to_pylist()])) for name in PROJECTS]
    now = 1e9
    expected = [runs_rows.runs_rows([group], now).sort_by("run") for group in by_project]
    with ThreadPoolExecutor(8) as pool:
        found = list(pool.map(lambda i: runs_rows.runs_rows(
            [by_project[i % 2]], now).sort_by("run"), range(64)))
    assert all(f.equals(expected[i % 2]) for i, f in enumerate(found))
    assert [e.num_rows for e in expected] == list(PROJECTS.values())
