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
    """200 M rows (1.6 GB as Arrow) to print 100: the table format asks for 101."""
    proc, peak_kib = peak_rss_kib(["sql", "--root", str(store),
                                    "SELECT i FROM range(200000000) t(i) ORDER BY i DESC"])
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
