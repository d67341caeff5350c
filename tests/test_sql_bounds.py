"""SQL has time and memory bounds: a default memory limit no statement can raise, an
optional timeout (`--timeout`, `query(timeout=)`), and Ctrl-C stops a query at once."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _memory import peak_rss_kib

import tracklake
from tracklake import QueryError

ENDLESS = "SELECT sum(i * i) FROM range(10000000000000) t(i)"


@pytest.fixture
def store(root: Path) -> Path:
    with tracklake.init(project="p", run_id="r", root=root) as run:
        run.log({"loss": 1.0}, step=0)
    return root


def test_a_query_past_its_timeout_is_stopped(store: Path) -> None:
    started = time.monotonic()
    with pytest.raises(QueryError, match=r"stopped after 0\.5 s"):
        tracklake.query(ENDLESS, root=store, timeout=0.5)
    assert time.monotonic() - started < 60  # not the hours the query would take
    assert tracklake.query("SELECT count(*) AS n FROM metrics", root=store,
                           timeout=30).to_pylist() == [{"n": 1}]


def test_a_query_past_the_memory_limit_fails_by_name(
        store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACKLAKE_SQL_MEMORY_LIMIT", "64MiB")
    with pytest.raises(QueryError, match="TRACKLAKE_SQL_MEMORY_LIMIT"):
        tracklake.query("SELECT list(i) FROM range(500000000) t(i)", root=store)
    with pytest.raises(QueryError):  # and a statement cannot raise it
        tracklake.query("SET memory_limit = '100GB'", root=store)
    monkeypatch.setenv("TRACKLAKE_SQL_MEMORY_LIMIT", "lots")
    with pytest.raises(QueryError, match="TRACKLAKE_SQL_MEMORY_LIMIT='lots'"):
        tracklake.query("SELECT 1", root=store)


def _cli(store: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tracklake._cli", "sql", "--root",
                             str(store), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_the_cli_timeout_and_ctrl_c_stop_a_query(store: Path) -> None:
    proc = _cli(store, "--timeout", "0.5", ENDLESS)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "stopped after 0.5 s" in err, err
    proc = _cli(store, ENDLESS)
    time.sleep(3)  # connected and running
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted" in err, err
    assert "Traceback" not in err


def test_a_table_of_a_huge_answer_builds_only_the_rows_it_shows(store: Path) -> None:
    """200 M rows (1.6 GB as Arrow) to print 100: the table format asks for 101. (The
    rows come newest first without a sort: sorting them cost DuckDB 45 s of CPU.)"""
    proc, peak_kib = peak_rss_kib(["sql", "--root", str(store),
                                    "SELECT 199999999 - i AS i FROM range(200000000) t(i)"])
    assert proc.returncode == 0, proc.stderr
    assert "199999999" in proc.stdout and "(more rows; raise --max-rows" in proc.stdout
    assert peak_kib < 1 << 20  # under 1 GiB
    proc = subprocess.run([sys.executable, "-m", "tracklake._cli", "sql", "--root",
                           str(store), "SELECT 1 AS one; SELECT 2 AS two"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "two" in proc.stdout, proc.stderr  # as before



def test_a_long_query_draws_no_progress_bar_into_the_callers_output(store: Path) -> None:
    """DuckDB draws a progress bar on stdout for a query that runs over two seconds (in a
    plain `python` process; pytest's own capture hides it); tracklake turns it off, so
    nothing but the answer is written (a CSV stays a CSV)."""
    code = ("import sys, tracklake; print(tracklake.query(\"SELECT current_setting("
            "'enable_progress_bar') AS bar\", root=sys.argv[1]).to_pylist())")
    done = subprocess.run([sys.executable, "-c", code, str(store)], capture_output=True,
                          text=True, check=True)
    assert done.stdout.strip() == "[{'bar': False}]", done.stdout


@pytest.mark.parametrize(("fmt", "rows"), [("csv", 4_000_000), ("json", 1_000_000),
                                           ("parquet", 4_000_000)])
def test_csv_json_and_parquet_answers_are_written_batch_by_batch(
        store: Path, tmp_path: Path, fmt: str, rows: int) -> None:
    """An answer of 4 M rows of 100 characters (400 MB as Arrow) is written as DuckDB
    makes it: the process holds one batch, not the answer and its text (before: the
    whole answer, then its whole CSV or JSON text, well over 1 GiB)."""
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / f"answer.{fmt}"
    proc, peak_kib = peak_rss_kib([
        "sql", "--root", str(store), "--format", fmt, "-o", str(out),
        f"SELECT i, repeat('x', 100) AS s FROM range({rows}) t(i)"])
    assert proc.returncode == 0, proc.stderr
    assert peak_kib < 400 << 10, f"peak RSS {peak_kib >> 10} MiB"
    if fmt == "parquet":
        import pyarrow.parquet as pq

        assert pq.ParquetFile(out).metadata.num_rows == rows
    else:
        with out.open() as f:
            lines = sum(1 for _ in f)
        assert lines == rows + (fmt == "csv")  # and its header
    assert [p.name for p in out.parent.iterdir()] == [out.name]  # no temporary left


def test_a_query_stopped_midway_leaves_the_previous_output_file_whole(
        store: Path, tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / "answer.csv"
    out.write_text("the answer of yesterday\n")
    proc = _cli(store, "--timeout", "2", "--format", "csv", "-o", str(out),
                "SELECT i FROM range(1000000000000) t(i)")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "stopped after 2 s" in err, err
    assert out.read_text() == "the answer of yesterday\n"
    assert [p.name for p in out.parent.iterdir()] == [out.name]


def test_an_answer_piped_to_a_reader_that_stops_early_ends_quietly(store: Path) -> None:
    proc = subprocess.run(
        f"{sys.executable} -m tracklake._cli sql --root {store} --format csv "
        "'SELECT i FROM range(100000000) t(i)' | head -3", shell=True,
        capture_output=True, text=True, timeout=300)
    assert proc.stdout.splitlines() == ["\"i\"", "0", "1"]
    assert proc.stderr == "", proc.stderr


def test_an_empty_answer_still_has_its_columns(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "none.csv"
    proc = subprocess.run([sys.executable, "-m", "tracklake._cli", "sql", "--root",
                           str(store), "--format", "csv", "-o", str(out),
                           "SELECT key, value FROM metrics WHERE false"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert out.read_text() == "\"key\",\"value\"\n"
