"""A question over `metrics` that the summaries answer is asked of them, and gets the
answer it gets when its values are read: the same columns, types and rows, over ranks,
projects, a resumed run's hidden steps, live and compacted runs, NaN and infinities."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tracklake
from tracklake._read import snapshot
from tracklake._read.from_summaries import summaries_sql

#: A CTE keeps a question from the summaries: it is asked as written, over the values.
_AS_WRITTEN = "WITH as_written AS (SELECT 1) "

ANSWERED = [
    "SELECT run, arg_max(value, step) AS last FROM metrics WHERE key = 'k0' "
    "GROUP BY run ORDER BY run",
    "SELECT run, max(value) AS max FROM metrics WHERE key = 'k3' GROUP BY run ORDER BY run",
    "SELECT project, run, rank, key, count(*), min(value), max(value), min(step), "
    "max(step), arg_max(value, step) FROM metrics GROUP BY project, run, rank, key "
    "ORDER BY ALL",
    "SELECT m.run, max(m.value) - min(m.value) AS spread FROM metrics m "
    "WHERE m.key IN ('k0', 'k3') AND m.rank = 0 GROUP BY m.run ORDER BY spread DESC, run",
    "SELECT metrics.key, count(*) AS count FROM metrics WHERE metrics.project = 'p' "
    "GROUP BY metrics.key HAVING count(*) > 3 ORDER BY count, key",
    "SELECT count(*), max(step), min(value) FROM metrics",
    "SELECT count(*) AS n, max(value) AS max FROM metrics WHERE key = 'absent'",
    "SELECT run, max(value) AS max FROM metrics WHERE key LIKE 'k%' AND run <> 'b' "
    "GROUP BY run HAVING max > 1 ORDER BY max DESC, run LIMIT 3 OFFSET 1",
    "SELECT DISTINCT key FROM metrics GROUP BY run, key ORDER BY key",
    "SELECT run, round(abs(min(value)), 1) FROM metrics WHERE key = 'k3' GROUP BY run "
    "ORDER BY run",
    "SELECT * FROM (SELECT run, max(value) FROM metrics WHERE key = 'k3' GROUP BY run) "
    "ORDER BY run LIMIT 2",
    "SELECT run, CAST(max(step) AS DOUBLE) / count(*) AS per FROM metrics "
    "WHERE key BETWEEN 'k0' AND 'k1' AND run IS NOT NULL AND NOT (rank = 5) "
    "GROUP BY run ORDER BY run",
]

ASKED_AS_WRITTEN = [
    "SELECT run, sum(value) FROM metrics GROUP BY run",  # a sum's order of additions
    "SELECT run, avg(value) FROM metrics GROUP BY run",
    "SELECT run, max(value) FROM metrics WHERE step > 3 GROUP BY run",
    "SELECT run, max(value) FROM metrics WHERE value < 3 GROUP BY run",
    "SELECT run, max(step) FROM metrics WHERE attempt = 1 GROUP BY run",
    "SELECT step, value FROM metrics WHERE run = 'a'",
    "SELECT * FROM metrics",
    "SELECT run, count(value) FROM metrics GROUP BY run",
    "SELECT run, count(DISTINCT key) FROM metrics GROUP BY run",
    "SELECT run, max(DISTINCT value) FROM metrics GROUP BY run",
    "SELECT run, max(value) FILTER (WHERE step > 2) FROM metrics GROUP BY run",
    "SELECT run, arg_max(value, step, 2) FROM metrics GROUP BY run",
    "SELECT run, arg_max(step, value) FROM metrics GROUP BY run",
    "SELECT run, max(value) FROM metrics GROUP BY ROLLUP (run)",
    "SELECT run, max(value) FROM metrics GROUP BY ALL",
    "SELECT run, max(value) FROM metrics GROUP BY 1",
    "SELECT run, max(value) AS step FROM metrics GROUP BY run HAVING step > 1",
    "SELECT run, max(value) FROM metrics WHERE random() < 0.5 GROUP BY run",
    "SELECT run, max(value) FROM metrics WHERE key = (SELECT min(key) FROM texts) "
    "GROUP BY run",
    "SELECT run, max(value) OVER (PARTITION BY run) FROM metrics",
    "SELECT run, max(value) FROM metrics_all GROUP BY run",
    "SELECT m.run, max(value) FROM metrics m JOIN runs USING (project, run) GROUP BY m.run",
    "WITH x AS (SELECT * FROM metrics) SELECT run, max(value) FROM x GROUP BY run",
    "SELECT run, max(value) FROM metrics GROUP BY run UNION ALL SELECT 'x', 1",
    "SELECT run, max(value) FROM metrics USING SAMPLE 10 GROUP BY run",
    "SELECT run, max(value) FROM metrics GROUP BY run QUALIFY row_number() OVER () = 1",
    "SELECT run, max(value) FROM metrics GROUP BY run; SELECT 1",
    "SELECT 1",
    "not sql at all (",
]


def _store(root: Path, *, compacted: bool) -> tracklake.Run:
    """Runs a (ranks 0 and 1, project p), b (project q) and r (resumed: its second
    attempt logs steps 5 to 7 again with other values, hiding the first's), with NaN,
    infinities and a negative zero among the values; and live run `live`, left open
    (returned): its first steps compacted into a part, the others read from its tail.
    Of one key, each group of runs, ranks or projects has its last step logged once
    (last steps: a 11 and 6 by rank, b 8, r 7, live 9, late 2), so that
    `arg_max(value, step)` over one key has one answer."""
    specials = [math.nan, math.inf, -math.inf, -0.0, 1e308, -1e-300]
    for project, run_id, rank, steps in (("p", "a", 0, range(12)), ("p", "a", 1, range(7)),
                                         ("q", "b", 0, range(9))):
        with tracklake.init(project=project, run_id=run_id, rank=rank, root=root,
                            capture_identity=False) as run:
            for step in steps:
                run.log({"k0": step * 0.5 - rank, "k3": specials[(step + rank) % 6]},
                        step=step)
    for attempt, steps in ((1, range(10)), (2, range(5, 8))):
        with tracklake.init(project="p", run_id="r", root=root,
                            capture_identity=False) as run:
            for step in steps:
                run.log({"k0": float(step * attempt), "k3": -float(step) * attempt},
                        step=step)
    if compacted:
        tracklake.compact(root=root)
    # segments sealed at a few hundred bytes: the first steps' segment, sealed by the
    # next flush, goes to a part, the last steps stay in the live tail
    live = tracklake.init(project="p", run_id="live", root=root, capture_identity=False,
                          segment_bytes=256, compact=False)
    for step in range(5):
        live.log({"k0": float(-step), "k1": 2.0 ** step}, step=step)
    live.flush()
    live.log({"k0": -5.0, "k1": 32.0}, step=5)
    live.flush()
    compacted_live = tracklake.compact(root=root, project="p", run="live")
    assert compacted_live.parts_written
    for step in range(6, 10):
        live.log({"k0": float(-step), "k1": 2.0 ** step}, step=step)
    live.flush()
    return live


def _rows(table: pa.Table) -> str:
    """The rows as text: NaN equals NaN, -0.0 is not 0.0."""
    return repr([{k: repr(v) for k, v in row.items()} for row in table.to_pylist()])


@pytest.mark.parametrize("compacted", [False, True])
def test_a_summary_question_gets_the_answer_its_values_give(root: Path,
                                                            compacted: bool) -> None:
    live = _store(root, compacted=compacted)
    try:
        for sql in ANSWERED:
            assert summaries_sql(sql) is not None, sql
            assert summaries_sql(_AS_WRITTEN + sql) is None, sql
            answer = tracklake.query(sql, root=root)
            read = tracklake.query(_AS_WRITTEN + sql, root=root)
            assert answer.schema.equals(read.schema), sql
            assert _rows(answer) == _rows(read), sql
            assert read.num_rows > 0, sql
    finally:
        live.finish()


def test_what_the_summaries_cannot_answer_is_asked_as_written() -> None:
    for sql in ASKED_AS_WRITTEN:
        assert summaries_sql(sql) is None, sql


def test_the_resumed_runs_hidden_steps_stay_hidden(root: Path) -> None:
    _store(root, compacted=True).finish()
    sql = ("SELECT count(*) AS n, max(value) AS max, arg_max(value, step) AS last, "
           "min(value) AS min FROM metrics WHERE run = 'r' AND key = 'k3'")
    assert summaries_sql(sql) is not None
    # steps 0..4 of the first attempt (-0..-4), then the second's 5..7 (-10, -12, -14):
    # the first's steps from 5 on are hidden, the second attempt resumed there
    assert tracklake.query(sql, root=root).to_pylist() == [
        {"n": 8, "max": -0.0, "last": -14.0, "min": -14.0}]


def test_a_summary_question_reads_no_value(root: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Asked of the summaries, the question builds no dataset over the metric parts
    (the resumed run's alone, whose summaries are computed from its visible values)."""
    _store(root, compacted=True).finish()
    opened: list[list[str]] = []
    datasets = snapshot.parts_dataset

    def recorded(root_: Path, kind: str, parts: list[Any]) -> Any:
        if kind == "metrics":
            opened.append(sorted({str(p.path).split("run=")[1].split("/")[0]
                                  for p in parts}))
        return datasets(root_, kind, parts)

    monkeypatch.setattr("tracklake._read.query.parts_dataset", recorded)
    sql = "SELECT run, max(value) AS max FROM metrics WHERE key = 'k3' GROUP BY run"
    tracklake.query(sql, root=root)
    assert opened and all(runs in ([], ["r"]) for runs in opened)
    opened.clear()
    tracklake.query(_AS_WRITTEN + sql, root=root)
    assert any({"a", "b"} <= set(runs) for runs in opened)


def test_a_question_about_one_run_is_narrowed_to_it_from_the_summaries_too() -> None:
    from tracklake._read.query import _asked

    sql, scope = _asked("SELECT max(value) FROM metrics WHERE run = 'a' AND key = 'k0'",
                        None)
    assert "metric_summaries" in sql
    assert scope.run == "a" and not scope.metric_values


_GROUPS = ("project", "run", "rank", "key")
_AGGREGATE_TEXTS = ("max(value)", "min(value)", "max(step)", "min(step)", "count(*)",
                    "arg_max(value, step)")
_FILTERS = ("key = 'k0'", "key IN ('k0', 'k3')", "key <> 'k1'", "run LIKE 'r%'",
            "rank = 0", "project = 'p'", "NOT (run = 'a')", "key >= 'k1'")


@pytest.fixture(scope="module")
def summarised_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("summaries") / "store"
    _store(root, compacted=True).finish()
    with tracklake.init(project="p", run_id="late", root=root,
                        capture_identity=False) as run:  # a finished run not compacted
        for step in range(3):
            run.log({"k0": float(step), "k3": 1.0 / (step + 1)}, step=step)
    return root


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(groups=st.lists(st.sampled_from(_GROUPS), unique=True, max_size=3),
       aggregates=st.lists(st.sampled_from(_AGGREGATE_TEXTS), min_size=1, max_size=4),
       filters=st.lists(st.sampled_from(_FILTERS), max_size=2),
       having=st.booleans(), limit=st.sampled_from([None, 1, 3]),
       named=st.booleans())
def test_any_summary_question_gets_the_answer_its_values_give(
        summarised_store: Path, groups: list[str], aggregates: list[str],
        filters: list[str], having: bool, limit: int | None, named: bool) -> None:
    if "arg_max(value, step)" in aggregates and "key" not in groups:
        # keys are logged at the same steps: the last value of one key alone is one value
        filters = [f for f in filters if "key" not in f] + ["key = 'k0'"]
    items = [*groups, *(f"{a} AS a{i}" if named else a for i, a in enumerate(aggregates))]
    sql = f"SELECT {', '.join(items)} FROM metrics"
    if filters:
        sql += " WHERE " + " AND ".join(filters)
    if groups:
        sql += " GROUP BY " + ", ".join(groups)
    if having:
        sql += " HAVING count(*) > 2"
    sql += " ORDER BY ALL"
    if limit is not None:
        sql += f" LIMIT {limit}"
    assert summaries_sql(sql) is not None, sql
    answer = tracklake.query(sql, root=summarised_store)
    read = tracklake.query(_AS_WRITTEN + sql, root=summarised_store)
    assert answer.schema.equals(read.schema), sql
    assert _rows(answer) == _rows(read), sql


def test_a_part_whose_values_alone_are_damaged_counts_in_the_summaries_answer(
        root: Path) -> None:
    """The summaries come from the footer, which is sound: the summaries' answer holds
    the part's values as written; a question over the values leaves it out and names it,
    and fsck finds it."""
    from tracklake._ops.fsck.check import fsck

    for run_id in ("a", "b"):
        with tracklake.init(project="p", run_id=run_id, root=root,
                            capture_identity=False) as run:
            for step in range(2000):
                run.log({"k0": step * 1.25}, step=step)
    tracklake.compact(root=root)
    part = next(p for p in sorted((root / "metrics").rglob("*.parquet")) if "run=a" in str(p))
    column = next(c for c in (pq.ParquetFile(part).metadata.row_group(0).column(i)
                              for i in range(5)) if c.path_in_schema == "value")
    data = bytearray(part.read_bytes())
    data[column.data_page_offset + column.total_compressed_size - 10] ^= 0x55  # a value
    part.write_bytes(bytes(data))

    sql = "SELECT run, max(value) AS max FROM metrics GROUP BY run ORDER BY run"
    problems = tracklake.ReadProblems()
    assert tracklake.query(sql, root=root, problems=problems).to_pylist() == [
        {"run": "a", "max": 1999 * 1.25}, {"run": "b", "max": 1999 * 1.25}]
    assert problems.damaged == []
    assert tracklake.query(_AS_WRITTEN + sql, root=root, problems=problems
                           ).to_pylist() == [{"run": "b", "max": 1999 * 1.25}]
    assert [path for path, _ in problems.damaged] == [part]
    assert any(problem.path == part for problem in fsck(root).problems)


@pytest.mark.parametrize(("sql", "params"), [
    ("SELECT run, max(value) AS m FROM metrics WHERE key = $k GROUP BY run "
     "ORDER BY run LIMIT $n", {"k": "k0", "n": 2}),
    ("SELECT run, max(value) AS m FROM metrics WHERE key = ? GROUP BY run "
     "ORDER BY run LIMIT ?", ["k0", 2]),
    ("SELECT RUN, MAX(VALUE) AS M FROM METRICS WHERE \"key\" = $1 GROUP BY RUN "
     "ORDER BY RUN LIMIT $2", ["k0", 2]),
])
def test_parameters_reach_the_summaries_question(summarised_store: Path, sql: str,
                                                 params: Any) -> None:
    assert summaries_sql(sql) is not None
    answer = tracklake.query(sql, root=summarised_store, params=params)
    assert _rows(answer) == _rows(tracklake.query(_AS_WRITTEN + sql, root=summarised_store,
                                                  params=params))
    assert answer.num_rows == 2


def test_a_callers_connection_is_asked_as_written(root: Path) -> None:
    """A connection of the caller's may hold a `metrics` table and no summaries."""
    import duckdb

    con = duckdb.connect()
    con.execute("CREATE TABLE metrics AS SELECT 'x' AS run, 2.5 AS value")
    answer = tracklake.query("SELECT run, max(value) AS m FROM metrics GROUP BY run",
                             connection=con)
    assert answer.to_pylist() == [{"run": "x", "m": 2.5}]
