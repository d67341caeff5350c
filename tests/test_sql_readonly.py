"""SQL over the store is read-only twice over: the DuckDB connection cannot touch a file,
and statements that could write or change state are refused before they run."""

from __future__ import annotations

import os
from pathlib import Path

import duckdb
import pytest

import tracklake


def _snapshot(root: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every file of the store but the read caches, which tracklake's readers (not the
    statement) write as files settle: run b's segments settle while the tests run."""
    out = {}
    for dirpath, _, files in os.walk(root):
        if Path(dirpath).relative_to(root).parts[:1] == (".cache",):
            continue
        for name in files:
            path = os.path.join(dirpath, name)
            st = os.stat(path)
            with open(path, "rb") as f:
                out[path] = (st.st_size, st.st_mtime_ns, f.read())
    return out


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store with a compacted run and a live one."""
    root = tmp_path_factory.mktemp("readonly") / "store"
    for run_id in ("a", "b"):
        with tracklake.init(project="p", run_id=run_id, root=root,
                            capture_identity=False) as run:
            for step in range(20):
                run.log({"loss": float(step)}, step=step)
        if run_id == "a":
            tracklake.compact(root=root)
    return root


def _part(root: Path) -> Path:
    return next(root.glob("metrics/**/*.parquet"))


WRITING = [
    "COPY metrics TO '{metrics}/stolen.parquet'",
    "COPY (SELECT 1 AS x) TO '{part}' (USE_TMP_FILE false)",
    "EXPLAIN ANALYZE COPY (SELECT 1 AS seq) TO '{part}'",
    "EXPLAIN ANALYZE COPY (SELECT 1 AS seq) TO '{part}' (FORMAT parquet)",
    "explain /* a comment */ analyze -- another\n copy (select 1) to '{metrics}/x.csv'",
    "EXPLAIN (FORMAT json) COPY (SELECT 1) TO '{metrics}/x.json'",
    "SELECT 1; EXPLAIN ANALYZE COPY (SELECT 1) TO '{metrics}/x.csv'",
    "SELECT 1; COPY metrics TO '{metrics}/x.parquet'",
    "/* SELECT */ COPY (SELECT 1) TO '{root}/x.csv'",
    "EXPORT DATABASE '{root}/export'",
    "IMPORT DATABASE '{root}'",
    "ATTACH '{root}/new.duckdb' AS db",
    "ATTACH ':memory:' AS db",
    "DETACH memory",
    "USE memory",
    "INSTALL httpfs",
    "LOAD httpfs",
    "FORCE INSTALL parquet",
    "SET enable_external_access = true",
    "SET lock_configuration = false",
    "SET allowed_directories = ['/']",
    "RESET enable_external_access",
    "SET VARIABLE v = 1",
    "PRAGMA enable_profiling",
    "PRAGMA import_database('{root}')",
    "CREATE TABLE t AS SELECT 1",
    "CREATE OR REPLACE VIEW metrics AS SELECT 1 AS x",
    "CREATE MACRO m(a) AS a",
    "CREATE SECRET s (TYPE s3)",
    "INSERT INTO metrics_all VALUES (1)",
    "UPDATE metrics SET value = 0",
    "DELETE FROM metrics",
    "DROP VIEW metrics",
    "ALTER VIEW metrics RENAME TO m",
    "CALL checkpoint()",
    "CHECKPOINT",
    "VACUUM",
    "BEGIN TRANSACTION",
    "PREPARE q AS SELECT 1",
    "SELECT * FROM read_csv('/etc/hostname')",
    "SELECT * FROM read_text('{part}')",
    "SELECT * FROM read_parquet('{part}')",
    "SELECT * FROM parquet_metadata('{part}')",
    "SELECT * FROM glob('{root}/**')",
    "SELECT * FROM sniff_csv('/etc/hostname')",
    "SELECT * FROM read_blob('/etc/hostname')",
    "SELECT * FROM '{root}/runs/project=p/run=a/rank=0/attempt=1.json'",
]


@pytest.mark.parametrize("statement", WRITING)
def test_no_statement_writes_or_changes_state(store: Path, statement: str) -> None:
    before = _snapshot(store)
    sql = statement.format(root=store, metrics=store / "metrics", part=_part(store))
    with pytest.raises(tracklake.QueryError):
        tracklake.query(sql, root=store)
    assert _snapshot(store) == before
    assert tracklake.query("SELECT count(*) AS n FROM metrics", root=store
                           ).to_pylist() == [{"n": 40}]


@pytest.mark.parametrize("statement", [
    "COPY (SELECT 1 AS seq) TO '{part}' (USE_TMP_FILE false)",
    "COPY metrics TO '{metrics}/new.parquet'",
    "EXPLAIN ANALYZE COPY (SELECT 1 AS seq) TO '{part}'",
    "EXPORT DATABASE '{root}/export'",
    "ATTACH '{metrics}/new.duckdb' AS db",
    "SELECT * FROM read_parquet('{part}')",
    "SET enable_external_access = true",
    "SET lock_configuration = false",
    "SET allowed_directories = ['{root}']",
    "RESET allowed_paths",
    "INSTALL httpfs",
])
def test_the_connection_itself_can_neither_write_nor_unlock(store: Path,
                                                            statement: str) -> None:
    """Without tracklake's statement check, straight on `connect()`'s connection."""
    before = _snapshot(store)
    con = tracklake.connect(store)
    try:
        with pytest.raises(duckdb.Error):
            con.execute(statement.format(root=store, metrics=store / "metrics",
                                         part=_part(store)))
        assert con.execute("SELECT current_setting('enable_external_access')"
                           ).fetchone() == (False,)
        assert con.execute("SELECT count(*) FROM metrics").fetchone() == (40,)
    finally:
        con.close()
    assert _snapshot(store) == before


@pytest.mark.parametrize(("statement", "named"), [
    ("INSTALL httpfs", "INSTALL"), ("LOAD httpfs", "LOAD"), ("USE memory", "USE"),
    ("/* hi */ COPY (SELECT 1) TO 'x.csv'", "COPY"),
    ("EXPLAIN ANALYZE COPY (SELECT 1) TO 'x.csv'", "COPY"),
])
def test_a_refused_statement_is_named_as_written(store: Path, statement: str,
                                                 named: str) -> None:
    with pytest.raises(tracklake.QueryError, match=rf"^{named} statements are refused"):
        tracklake.query(statement, root=store)


@pytest.mark.parametrize("statement", [
    "EXPLAIN SELECT * FROM metrics",
    "EXPLAIN ANALYZE SELECT count(*) FROM metrics",
    "EXPLAIN (FORMAT json) SELECT 1",
    "DESCRIBE metrics",
    "SUMMARIZE SELECT value FROM metrics",
    "WITH x AS (SELECT 1 AS a) SELECT * FROM x",
    "FROM metrics LIMIT 1",
    "SELECT 1; SELECT 2",
])
def test_reading_statements_still_run(store: Path, statement: str) -> None:
    before = _snapshot(store)
    assert tracklake.query(statement, root=store).num_rows >= 1
    assert _snapshot(store) == before


def test_a_statement_asked_again_with_other_parameters_gets_its_own_answer(
        store: Path) -> None:
    """A statement is parsed once and its parse run again (`parsed_statements`): asked
    with other parameters, named or positional, from threads at once, each answer is that
    of its own values."""
    from concurrent.futures import ThreadPoolExecutor

    named = "SELECT step FROM metrics WHERE run = $run AND step >= $lo ORDER BY step"
    positional = "SELECT step FROM metrics WHERE run = ? AND step >= ? ORDER BY step"

    def ask(i: int) -> bool:
        run, lo = "ab"[i % 2], i % 20
        if i % 3:
            table = tracklake.query(named, root=store, params={"run": run, "lo": lo})
        else:
            table = tracklake.query(positional, root=store, params=[run, lo])
        return table.column("step").to_pylist() == list(range(lo, 20))

    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(ask, range(60)))
    assert all(answers)
