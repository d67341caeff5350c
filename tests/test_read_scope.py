"""A question reads what it names: a query builds only the views its SQL names, `show`
reads one run, and the answers are those of a connection over everything (superseded
steps of a resumed run stay hidden even when only texts are asked for)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _listings import record_listings

import tracklake
from tracklake._read.scope import EVERYTHING, scope_of_sql


def _resumed_run(root: Path) -> None:
    """Run `r` (numeric-looking id `0042` beside it): attempt 1 logs steps 0..9 with a text
    at every step, attempt 2 logs steps 5..7 again, metrics and texts."""
    for attempt_steps in (range(10), range(5, 8)):
        with tracklake.init(project="p", run_id="r", root=root, capture_identity=False) as run:
            for step in attempt_steps:
                run.log({"loss": float(step)}, step=step)
                run.log_text("note", f"step {step}", step=step)
    with tracklake.init(project="p", run_id="0042", root=root, capture_identity=False) as run:
        run.log_text("note", "other run", step=0)


def _damage_metrics(root: Path) -> Path:
    """Compact, then make every metrics part unreadable; returns one of them."""
    tracklake.compact(root=root)
    parts = sorted((root / "metrics").rglob("*.parquet"))
    assert parts
    for part in parts:
        part.write_bytes(b"not parquet")
    return parts[0]


def test_a_query_on_texts_does_not_read_the_metrics(root: Path) -> None:
    with tracklake.init(project="p", run_id="a", root=root, capture_identity=False) as run:
        run.log({"loss": 1.0}, step=0)
        run.log_text("note", "hello", step=0)
    damaged = _damage_metrics(root)
    problems = tracklake.ReadProblems()
    texts = tracklake.query("SELECT text FROM texts", root=root, problems=problems)
    assert texts.to_pylist() == [{"text": "hello"}]
    assert problems.damaged == []  # the metrics were not opened
    tracklake.query("SELECT count(*) AS n FROM metrics", root=root, problems=problems)
    assert [path for path, _ in problems.damaged] == [damaged]


@pytest.mark.parametrize("sql", [
    "SELECT run, attempt, step, text FROM texts ORDER BY ALL",
    "SELECT run, attempt, step, value FROM metrics ORDER BY ALL",
    "SELECT run, key, count, last_value FROM metric_summaries ORDER BY ALL",
    "SELECT run, status, attempts FROM runs ORDER BY ALL",
    "SELECT t.run, t.step, m.value FROM texts t JOIN metrics m USING (run, rank, attempt, step) "
    "ORDER BY ALL",
])
@pytest.mark.parametrize("compacted", [False, True])
def test_scoped_answers_equal_the_answers_over_everything(root: Path, sql: str,
                                                          compacted: bool) -> None:
    _resumed_run(root)
    if compacted:
        tracklake.compact(root=root)
    with tracklake.connect(root) as con:
        everything = con.sql(sql).to_arrow_table()
    assert tracklake.query(sql, root=root).equals(everything)
    assert everything.num_rows > 0


def test_texts_alone_still_hide_the_steps_a_later_attempt_logged_again(root: Path) -> None:
    _resumed_run(root)
    rows = tracklake.query("SELECT attempt, step FROM texts WHERE run = 'r' ORDER BY step",
                           root=root).to_pylist()
    assert [(r["attempt"], r["step"]) for r in rows] == [
        (1, 0), (1, 1), (1, 2), (1, 3), (1, 4), (2, 5), (2, 6), (2, 7)]


def test_live_partition_columns_hold_each_streams_values(root: Path) -> None:
    for run_id in ("0042", "b", "0007"):
        for rank in (0, 3):
            with tracklake.init(project="p", run_id=run_id, root=root, rank=rank,
                                capture_identity=False) as run:
                for step in range(rank + 2):
                    run.log({"x": 1.0}, step=step)
    rows = tracklake.query("SELECT project, run, rank, attempt, count(*) AS n FROM metrics "
                           "GROUP BY ALL ORDER BY ALL", root=root).to_pylist()
    assert rows == [{"project": "p", "run": r, "rank": k, "attempt": 1, "n": k + 2}
                    for r in ("0007", "0042", "b") for k in (0, 3)]
    types = tracklake.query("SELECT typeof(run) AS t, typeof(rank) AS k FROM metrics LIMIT 1",
                            root=root).to_pylist()
    assert types == [{"t": "VARCHAR", "k": "INTEGER"}]


def test_a_question_naming_no_view_sees_every_view(root: Path) -> None:
    _resumed_run(root)
    assert scope_of_sql("SELECT 1") == EVERYTHING
    names = {r["view_name"] for r in tracklake.query(
        "SELECT view_name FROM duckdb_views() WHERE NOT internal", root=root).to_pylist()}
    assert {"runs", "metrics", "texts", "metric_summaries", "generations_all"} <= names


def test_a_question_of_deeply_nested_calls_is_answered_over_everything(
        root: Path) -> None:
    """600 nested calls (DuckDB allows 1,000 levels): the parse tree DuckDB gives of it
    nests past what Python's json decodes, which raised RecursionError out of the query; the
    question is now answered without narrowing to the run, as one the parser gives no
    tree of."""
    _resumed_run(root)
    deep = "abs(" * 600 + "value" + ")" * 600
    rows = tracklake.query(f"SELECT max({deep}) AS m FROM metrics WHERE run = 'r'",
                           root=root).to_pylist()
    assert rows == [{"m": 7.0}]  # attempt 2 logged steps 5..7 again: the views hide 8, 9


def test_views_the_parser_cannot_see_are_built_on_a_second_try(root: Path) -> None:
    _resumed_run(root)
    from tracklake._read.query import with_connection
    from tracklake._read.scope import Scope

    rows = with_connection(root, tracklake.ReadProblems(),
                           lambda con: tracklake.query("SELECT count(*) AS n FROM texts",
                                                       connection=con).to_pylist(),
                           Scope(frozenset({"metrics"}), attempts=False))
    assert rows == [{"n": 9}]  # 5 of attempt 1 + 3 of attempt 2 + 1 of run 0042


def test_a_part_gone_between_listing_and_reading_makes_the_stream_be_listed_again(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As when compaction merges parts while a reader lists them: nothing is left out."""
    from tracklake._read import decoded

    with tracklake.init(project="p", run_id="a", root=root, capture_identity=False) as run:
        for step in range(10):
            run.log({"loss": float(step)}, step=step)
    tracklake.compact(root=root)
    real = decoded.DecodedCache.get
    failures = {"left": 2}

    def flaky(self: decoded.DecodedCache, path: Path, decode: object) -> object:
        if path.suffix == ".parquet" and failures["left"]:
            failures["left"] -= 1
            raise FileNotFoundError(2, "merged away", str(path))
        return real(self, path, decode)  # type: ignore[arg-type]

    monkeypatch.setattr(decoded.DecodedCache, "get", flaky)
    rows = tracklake.query("SELECT count(*) AS n FROM metrics", root=root).to_pylist()
    assert rows == [{"n": 10}] and failures["left"] == 0
    failures["left"] = 100  # a stream that never holds still is an error naming it
    with pytest.raises(tracklake.StoreError, match="attempt=1: its parts kept changing"):
        tracklake.query("SELECT count(*) AS n FROM metrics", root=root)


@pytest.mark.parametrize("compacted", [False, True])
def test_a_question_on_metric_summaries_reads_the_values_of_resumed_runs_only(
        root: Path, compacted: bool) -> None:
    """The run table's question: the summaries come from part footers (or the catalog),
    so the parts' dataset holds only the resumed run's parts, whose summaries are
    computed from the values its later attempt did not log again."""
    from tracklake._read.query import with_connection
    from tracklake._read.scope import scope_of_views

    _resumed_run(root)
    with tracklake.init(project="p", run_id="plain", root=root, capture_identity=False) as run:
        run.log({"loss": 3.0}, step=0)
    if compacted:
        tracklake.compact(root=root)
    sql = "SELECT run, key, count, min, max, last_value FROM metric_summaries ORDER BY ALL"

    def read(con: object) -> tuple[list[dict[str, object]], list[str]]:
        answer = tracklake.query(sql, connection=con).to_pylist()  # type: ignore[arg-type]
        runs = tracklake.query("SELECT DISTINCT run FROM metrics_all ORDER BY run",
                               connection=con)  # type: ignore[arg-type]
        return answer, runs.column("run").to_pylist()

    answer, values_of = with_connection(root, tracklake.ReadProblems(), read,
                                        scope_of_views({"metric_summaries"}))
    assert answer == tracklake.query(sql, root=root).to_pylist()
    # attempt 1's steps 0..4, then attempt 2's 5..7 (its 5..9 are superseded)
    assert {"run": "r", "key": "loss", "count": 8, "min": 0.0, "max": 7.0,
            "last_value": 7.0} in answer
    assert {"run": "plain", "key": "loss", "count": 1, "min": 3.0, "max": 3.0,
            "last_value": 3.0} in answer
    assert values_of == (["r"] if compacted else ["plain", "r"])  # live tails are read


@pytest.mark.parametrize(("sql", "project", "run"), [
    ("SELECT step, value FROM metrics WHERE run = 'a' AND key = 'k' ORDER BY step", None, "a"),
    ("SELECT * FROM metrics m WHERE m.run = 'a' AND m.project = 'p'", "p", "a"),
    ("SELECT count(*) FROM texts WHERE 'a' = RUN", None, "a"),
    ("SELECT * FROM runs WHERE run = 'a'", None, "a"),
    ("SELECT * FROM (SELECT step FROM metrics WHERE run = 'a' ORDER BY step) LIMIT 101",
     None, "a"),  # what `tracklake sql` asks to show the first rows
    ("SELECT * FROM (SELECT * FROM metrics) WHERE run = 'a'", None, None),
    ("SELECT * FROM (SELECT * FROM metrics WHERE run = 'a') WHERE step IN (SELECT 1)",
     None, None),
    ("SELECT * FROM metrics WHERE run = 'a' OR key = 'k'", None, None),
    ("SELECT * FROM metrics m JOIN texts t USING (run) WHERE run = 'a'", None, None),
    ("SELECT * FROM metrics WHERE run = 'a' AND step > (SELECT max(step) FROM texts)",
     None, None),
    ("WITH x AS (SELECT 1) SELECT * FROM metrics WHERE run = 'a'", None, None),
    ("SELECT * FROM metrics WHERE run = 'a' UNION ALL SELECT * FROM metrics", None, None),
    ("SELECT * FROM metrics USING SAMPLE 10 ROWS (reservoir, 42) WHERE run = 'a'",
     None, None),
    ("SELECT * FROM metrics t(x, y) WHERE run = 'a'", None, None),
    ("SELECT * FROM metrics WHERE run = '../../elsewhere'", None, None),
    ("SELECT * FROM metrics WHERE run = $1", None, None),
    ("SELECT * FROM metrics WHERE run = 'a' AND run = 'b'", None, None),
    ("SELECT * FROM metrics WHERE run = 'a'; SELECT 1", None, None),
])
def test_a_question_is_narrowed_to_one_run_only_where_no_other_run_can_reach_its_answer(
        sql: str, project: str | None, run: str | None) -> None:
    scope = scope_of_sql(sql)
    assert (scope.project, scope.run) == (project, run)


@pytest.mark.parametrize(("params", "project", "run"), [
    ({"r": "a", "p": "p"}, "p", "a"),
    ({"r": "a", "p": 3}, None, "a"),  # a number is no stored name
    ({"r": "../elsewhere", "p": "p"}, "p", None),
    (None, None, None),
    (["a", "p"], None, None),
])
def test_named_parameters_narrow_a_question_as_their_texts_would(
        params: object, project: str | None, run: str | None) -> None:
    scope = scope_of_sql("SELECT * FROM metrics WHERE run = $r AND project = $p", params)
    assert (scope.project, scope.run) == (project, run)


def test_a_question_asked_again_with_other_parameters_is_narrowed_to_each(
        root: Path) -> None:
    """The scope of a question is kept for the next time it is asked: with other values
    of its parameters (or values equal to them of another type) it narrows to the runs
    those name."""
    for run_id in ("1", "b"):
        with tracklake.init(project="p", run_id=run_id, root=root,
                            capture_identity=False, system_metrics=False) as run:
            run.log({"loss": 7.0 if run_id == "b" else 1.0}, step=0)
    sql = "SELECT run, value FROM metrics WHERE run = $r"
    for r in ("b", "1", "b", "1"):
        answer = tracklake.query(sql, params={"r": r}, root=root).to_pylist()
        assert answer == [{"run": r, "value": 7.0 if r == "b" else 1.0}]
    # a number is no stored name: not narrowed, whatever text equal to it was asked before
    assert [scope_of_sql(sql, {"r": r}).run for r in ("1", 1, True, 1.0, "1")] == \
        ["1", None, None, None, "1"]


@pytest.mark.parametrize("named", [False, True])
@pytest.mark.parametrize("compacted", [False, True])
def test_a_question_about_one_run_opens_none_of_the_other_runs_files(
        root: Path, compacted: bool, named: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every other run's parts are damaged and their directories watched: the question
    about run `a` sees no damage, lists none of their directories, and gets the answer
    a connection over everything gives."""
    _resumed_run(root)
    for run_id in ("a", "b"):
        with tracklake.init(project="p", run_id=run_id, root=root,
                            capture_identity=False) as run:
            for step in range(4):
                run.log({"loss": float(step)}, step=step)
    sql = "SELECT run, attempt, step, value FROM metrics WHERE run = 'a' ORDER BY step"
    with tracklake.connect(root) as con:
        everything = con.sql(sql).to_arrow_table()
    if compacted:
        tracklake.compact(root=root)
        tracklake.query("SELECT count(*) FROM runs", root=root)  # the catalog written
        for part in (root / "metrics").rglob("*.parquet"):
            if "run=a" not in str(part):
                part.write_bytes(b"not parquet")
    listed = record_listings(monkeypatch)
    problems = tracklake.ReadProblems()
    answer = tracklake.query(sql.replace("'a'", "$r"), params={"r": "a"}, root=root,
                             problems=problems) if named else \
        tracklake.query(sql, root=root, problems=problems)
    assert answer.equals(everything) and answer.num_rows == 4
    assert problems.damaged == []
    assert not [rel for rel in listed if "run=" in rel and "run=a" not in rel]
    if compacted:  # the same store over everything: the damage is there to be found
        tracklake.query("SELECT count(*) FROM metrics", root=root, problems=problems)
        assert len(problems.damaged) == 3  # r's two attempts' parts, and b's


@pytest.mark.parametrize("sql", [
    "SELECT attempt, step, text FROM texts WHERE run = 'r' ORDER BY ALL",
    "SELECT attempt, step, value FROM metrics WHERE run = 'r' ORDER BY ALL",
    "SELECT key, count, last_value FROM metric_summaries WHERE run = 'r' ORDER BY ALL",
    "SELECT status, attempts FROM runs WHERE project = 'p' AND run = 'r'",
])
def test_a_resumed_runs_answers_are_the_same_when_narrowed_to_it(root: Path,
                                                                 sql: str) -> None:
    _resumed_run(root)
    assert scope_of_sql(sql).run == "r"
    with tracklake.connect(root) as con:
        everything = con.sql(sql).to_arrow_table()
    assert tracklake.query(sql, root=root).equals(everything)
    assert everything.num_rows > 0
