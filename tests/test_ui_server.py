"""`tracklake ui`'s server over plain HTTP: what it refuses (traversal, a missing token on
a non-loopback bind, a foreign Host, oversized and slow requests, SQL that writes), that
it never changes the store, and that Ctrl-C ends the command cleanly."""

from __future__ import annotations

import concurrent.futures
import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _cdp import until

import tracklake
from tracklake._ui.server import MAX_BODY, MAX_URL, Dashboard


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ui") / "store"
    with tracklake.init(project="p", run_id="base", root=root, name="base",
                        config={"lr": 0.1}) as run:
        for step in range(50):
            run.log({"loss": 1.0 / (step + 1)}, step=step)
    return root


@pytest.fixture(scope="module")
def board(store: Path) -> Iterator[Dashboard]:
    dashboard = Dashboard(store, read_deadline=1.0).start()
    yield dashboard
    dashboard.close()


def request(board: Dashboard, method: str, path: str, body: bytes | None = None,
            headers: dict[str, str] | None = None, port: int | None = None
            ) -> tuple[int, dict[str, str], bytes]:
    con = http.client.HTTPConnection("127.0.0.1", port or board.port, timeout=60)
    try:
        con.request(method, path, body=body, headers=headers or {})
        answer = con.getresponse()
        return answer.status, dict(answer.getheaders()), answer.read()
    finally:
        con.close()


def sql(board: Dashboard, statement: str, params: Any = None) -> tuple[int, Any]:
    asked = {"sql": statement} if params is None else {"sql": statement, "params": params}
    status, _, body = request(board, "POST", "/api/sql", json.dumps(asked).encode(),
                              {"Content-Type": "application/json"})
    return status, json.loads(body)


def console(board: Dashboard, shown: dict[str, Any]) -> dict[str, Any]:
    """The console's answer to what a panel showed it ran: its SQL, its parameters as
    NAME=VALUE texts."""
    status, answer = sql(board, shown["sql"], [f"{k}={v}" for k, v in shown["params"].items()])
    assert status == 200, answer
    return dict(answer)


def files(root: Path) -> dict[str, tuple[int, int]]:
    """Every file of the store but the readers' derived caches, with size and mtime."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in root.rglob("*") if p.is_file() and ".cache" not in p.parts}


def test_the_page_its_files_and_the_api_answer(board: Dashboard) -> None:
    status, headers, body = request(board, "GET", "/")
    assert status == 200 and b"/static/uPlot.iife.min.js" in body
    assert "script-src 'self'" in headers["Content-Security-Policy"]
    for name in ("uPlot.iife.min.js", "uPlot.min.css", "uPlot.LICENSE", "app.js", "app.css"):
        assert request(board, "GET", f"/static/{name}")[0] == 200, name
    runs = json.loads(request(board, "GET", "/api/runs")[2])["runs"]
    assert [(r["project"], r["run"], r["config"]) for r in runs] == [("p", "base",
                                                                    {"lr": "0.1"})]
    keys = json.loads(request(board, "GET", "/api/keys")[2])
    assert keys == [{"key": "loss", "points": 50, "runs": 1}]
    series = json.loads(request(board, "GET", "/api/series?key=loss&run=p/base")[2])
    assert series["curves"][0]["x"] == list(range(50))
    assert sql(board, "SELECT count(*) AS n FROM metrics") == (
        200, {"columns": ["n"], "rows": [[50]], "truncated": False})


@pytest.mark.parametrize("path", [
    "/static/../../../../etc/passwd", "/static/..%2f..%2f..%2fetc%2fpasswd",
    "/%2e%2e/%2e%2e/etc/passwd", "/static/%2e%2e/server.py", "/../store/runs",
    "/static//etc/passwd", "/static/./app.js/../../server.py", "/server.py",
    "/static/", "/api/../static/app.js", "//etc/passwd"])
def test_no_path_reaches_the_file_system(board: Dashboard, path: str) -> None:
    status, _, body = request(board, "GET", path)
    assert status == 404 and b"root:" not in body and b"import" not in body


def test_a_foreign_host_name_is_refused_on_loopback(board: Dashboard) -> None:
    """A page elsewhere that rebinds its own name to 127.0.0.1 cannot read the store."""
    status, _, body = request(board, "GET", "/api/runs", headers={"Host": "evil.example:80"})
    assert status == 403 and b"base" not in body
    assert request(board, "GET", "/api/runs", headers={"Host": "localhost"})[0] == 200


def test_a_non_loopback_bind_needs_its_token(store: Path) -> None:
    dashboard = Dashboard(store, host="0.0.0.0").start()
    try:
        token = dashboard.token
        assert token and dashboard.url.endswith(f"/?token={token}")
        for path in ("/", "/api/runs", "/static/app.js", f"/api/runs?token={token}x",
                     "/api/runs?token=", "/api/traces?run=p/base", "/api/events?run=p/base"):
            status, _, body = request(dashboard, "GET", path)
            assert status == 403 and b"base" not in body, path
        for cookie in ("tracklake_token=wrong", "a=b; $bad", "tracklake_token"):
            assert request(dashboard, "GET", "/api/runs", headers={"Cookie": cookie}
                           )[0] == 403, cookie
        status, headers, _ = request(dashboard, "GET", f"/?token={token}")
        assert status == 200 and f"tracklake_token={token}" in headers["Set-Cookie"]
        assert "HttpOnly" in headers["Set-Cookie"]
        status, _, body = request(dashboard, "GET", "/api/runs",
                                  headers={"Cookie": f"tracklake_token={token}"})
        assert status == 200 and b"base" in body
        for path in ("/api/traces?run=p/base", "/api/events?run=p/base"):
            assert request(dashboard, "GET", path, headers={
                "Cookie": f"tracklake_token={token}"})[0] == 200, path
        assert request(dashboard, "POST", "/api/sql", b'{"sql": "SELECT 1"}',
                       {"Content-Type": "application/json"})[0] == 403
    finally:
        dashboard.close()


def test_oversized_requests_are_refused(board: Dashboard) -> None:
    assert request(board, "GET", "/api/runs?x=" + "a" * MAX_URL)[0] == 414
    big = json.dumps({"sql": "SELECT 1 -- " + "x" * MAX_BODY}).encode()
    assert request(board, "POST", "/api/sql", big,
                   {"Content-Type": "application/json"})[0] == 413
    # a claimed length the server refuses before reading any of it
    with socket.create_connection(("127.0.0.1", board.port), timeout=60) as s:
        s.sendall(b"POST /api/sql HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                  b"application/json\r\nContent-Length: 999999999\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.0 413")


def test_a_slow_request_is_cut_off_and_others_are_still_served(board: Dashboard) -> None:
    with socket.create_connection(("127.0.0.1", board.port), timeout=60) as slow:
        slow.sendall(b"GET /api/runs HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never finished
        slow.settimeout(0.3)

        def trickle_until_closed() -> bool:
            """One more header line, well within any per-read timeout: only a deadline
            on the whole request ends this connection."""
            try:
                slow.sendall(b"X-Slow: 1\r\n")
            except OSError:
                return True  # reset or broken pipe: closed by the server
            try:
                return slow.recv(1024) == b""
            except TimeoutError:
                return False  # still open: trickle on
            except ConnectionResetError:
                return True
        assert request(board, "GET", "/api/keys")[0] == 200
        until(trickle_until_closed, "the server to close the slow connection")


def test_sql_that_would_write_is_refused_and_the_store_is_unchanged(
        board: Dashboard, store: Path) -> None:
    before = files(store)
    for statement in ("DELETE FROM metrics", "DROP VIEW metrics",
                      "CREATE TABLE t AS SELECT 1", "INSERT INTO metrics SELECT * FROM metrics",
                      f"COPY (SELECT 1) TO '{store}/x.csv'", f"ATTACH '{store}/x.db'",
                      "SELECT 1; DELETE FROM metrics", "SET lock_configuration = false",
                      "INSTALL httpfs", "PRAGMA enable_external_access"):
        status, answer = sql(board, statement)
        # DuckDB before 2.0 has no such PRAGMA, and says so before anything runs it
        unknown = statement.startswith("PRAGMA") and "does not exist" in answer["error"]
        assert status == 400 and ("refused" in answer["error"] or unknown), statement
    status, answer = sql(board, f"SELECT * FROM read_csv('{store}/../../etc/passwd')")
    assert status == 400
    for path in ("/api/runs", "/api/keys", "/api/series?key=loss&run=p/base&ranks=all"):
        assert request(board, "GET", path)[0] == 200
    assert files(store) == before


def test_methods_and_bodies_it_does_not_take(board: Dashboard) -> None:
    for method in ("PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"):
        assert request(board, method, "/api/sql")[0] == 405, method
    assert request(board, "POST", "/api/sql", b"sql=SELECT+1",
                   {"Content-Type": "application/x-www-form-urlencoded"})[0] == 415
    assert request(board, "POST", "/api/sql", b"[1]",
                   {"Content-Type": "application/json"})[0] == 400
    assert request(board, "GET", "/api/series?key=loss&run=nope")[0] == 400
    assert request(board, "GET", "/api/series?key=loss&x=bogus")[0] == 400
    assert request(board, "GET", "/api/generations?run=bad")[0] == 400
    assert json.loads(request(board, "GET", "/api/generations?run=p/base")[2])["rows"] == []


def _command_serving(store: Path, program: str | None = None, *args: str
                     ) -> tuple[subprocess.Popen[str], int]:
    """`tracklake ui --port 0` on `store` in a process of its own (or the Python
    `program`, given the store and `args` as its arguments), and the port it took (from
    the URL it printed)."""
    argv = ["-m", "tracklake._cli", "ui", "--root", str(store), "--port", "0"] \
        if program is None else ["-c", program, str(store), *args]
    process = subprocess.Popen(
        [sys.executable, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert process.stdout is not None
    lines = [process.stdout.readline() for _ in range(2)]
    url = lines[1].strip()
    if not url.startswith("http://127.0.0.1:"):
        process.kill()
        raise AssertionError(f"no URL printed: {lines} {process.communicate()}")
    return process, int(url.rsplit(":", 1)[1].strip("/"))


def _killed_if_running(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.kill()
        process.wait()


def _assert_ended_cleanly(process: subprocess.Popen[str], out: str, err: str) -> None:
    assert process.returncode == 0, err
    assert "stopped" in out and "Traceback" not in err


def test_the_command_gives_freed_memory_back_and_a_library_caller_keeps_defaults(
        store: Path) -> None:
    """`tracklake ui`, a process of its own that answers in bursts, has DuckDB give what
    it freed back to the system (a page of a thousand runs' charts left it at about
    1 GiB); a program asking questions through the library keeps DuckDB's defaults."""
    asked = "SELECT current_setting('allocator_background_threads') AS background, " \
            "current_setting('allocator_flush_threshold') AS threshold"
    process, port = _command_serving(store)
    try:
        status, _, body = request(None, "POST", "/api/sql",  # type: ignore[arg-type]
                                  json.dumps({"sql": asked}).encode(),
                                  {"Content-Type": "application/json"}, port=port)
    finally:
        process.terminate()
        process.communicate(timeout=60)
    assert status == 200, body
    eight = ("8MiB", "8.0 MiB")  # as DuckDB 2.0 and DuckDB 1.5 write it
    [[background, threshold]] = json.loads(body)["rows"]
    assert background is True and threshold in eight, body
    here = tracklake.query(asked, root=store).to_pylist()[0]
    assert here["background"] is False and here["threshold"] not in eight, here


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_ends_the_command_cleanly(store: Path, stop: signal.Signals) -> None:
    """Ctrl-C, or SIGTERM as a service manager or `kill` sends it: the server stops
    taking requests, cuts the one still arriving, frees its port and exits 0."""
    process, port = _command_serving(store)
    try:
        assert request(None, "GET", "/api/runs", port=port)[0] == 200  # type: ignore[arg-type]
        with socket.create_connection(("127.0.0.1", port), timeout=60) as held:
            held.sendall(b"GET /api/runs HTTP/1.1\r\n")  # a request still arriving
            process.send_signal(stop)
            out, err = process.communicate(timeout=60)
            try:
                left = held.recv(100)
            except ConnectionResetError:
                left = b""
            assert left == b""  # cut (closed or reset), not left hanging
    finally:
        _killed_if_running(process)
    _assert_ended_cleanly(process, out, err)
    # the port is free again: another server can take it
    Dashboard(store, port=port).close()


def test_a_stop_answers_the_requests_that_arrived_whole_and_cuts_the_one_arriving(
        store: Path) -> None:
    """A stop while a slow question is answered waits for that answer (it used to cut
    every open connection, so a question asked just before Ctrl-C got no answer at
    all); a request still arriving is cut at once, and a question that arrived whole
    but waits for its turn is told that the dashboard is stopping."""
    slow = "SELECT count(*) AS n FROM range(100000000) t(i) WHERE i % 7 = 3"
    board = Dashboard(store, read_deadline=0.5).start()
    server = board._server
    answers: dict[str, tuple[int, Any]] = {}

    def ask(name: str) -> None:
        answers[name] = sql(board, slow)

    askers = [threading.Thread(target=ask, args=(f"q{i}",)) for i in range(3)]
    try:
        for asker in askers:
            asker.start()
        until(lambda: len(server.answering) == 3, "three questions to arrive whole")
        with socket.create_connection(("127.0.0.1", board.port), timeout=60) as held:
            held.sendall(b"POST /api/sql HTTP/1.1\r\n")  # still arriving
            until(lambda: len(server.arriving) == 1, "the fourth connection to be taken")
            board.close()  # MAX_QUERIES (2) answer; the third waits for its turn
            try:
                left = held.recv(100)
            except ConnectionResetError:
                left = b""
            assert left == b""  # cut (closed or reset), not answered nor left hanging
    finally:
        board.close()
        for asker in askers:
            asker.join(60)
    statuses = sorted(status for status, _ in answers.values())
    assert statuses == [200, 200, 503], answers
    for status, answer in answers.values():
        if status == 200:
            assert answer["rows"] == [[14285714]], answer
        else:
            assert answer == {"error": "the dashboard is stopping"}


def test_a_stop_cuts_an_answer_its_client_never_reads_once_the_answers_had_their_time(
        store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that asks for a large answer and reads none of it holds its answering
    thread in a send: the stop waits the queries' limit for it, then cuts it, and no
    answering thread is left once `close()` returns."""
    from tracklake._ui import answers
    from tracklake._ui.server import MAX_CONNECTIONS

    monkeypatch.setattr(answers, "QUERY_TIMEOUT", 1.0)
    board = Dashboard(store).start()
    server = board._server
    large = json.dumps({"sql": "SELECT repeat('x', 20000) AS x FROM range(1000)"}).encode()
    try:
        with socket.socket() as silent:
            silent.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            silent.connect(("127.0.0.1", board.port))
            silent.sendall(b"POST /api/sql HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                           b"Content-Type: application/json\r\n"
                           b"Content-Length: " + str(len(large)).encode() + b"\r\n\r\n"
                           + large)
            until(lambda: len(server.answering) == 1, "the request to arrive whole")
            until(lambda: _no_query_running(server), "the query to end")
            assert len(server.answering) == 1  # held in its send: 20 MB, none read
            board.close()
            answering = [t for t in threading.enumerate()
                         if getattr(t, "_target", None) == server.process_request_thread]
            assert answering == [] and not server.answering
            for _ in range(MAX_CONNECTIONS):  # every connection's slot is free again
                assert server.slots.acquire(blocking=False)
            silent.settimeout(10)
            with contextlib.suppress(ConnectionResetError):
                while silent.recv(1 << 20):
                    pass  # what was sent before the cut, then the end of the stream
    finally:
        board.close()


def _no_query_running(server: Any) -> bool:
    from tracklake._ui.server import MAX_QUERIES

    taken = [server.queries.acquire(blocking=False) for _ in range(MAX_QUERIES)]
    for _ in range(sum(taken)):
        server.queries.release()
    return all(taken)


#: `tracklake ui` on argv[1], sent SIGTERM by itself the moment a connection has been handed
#: to the thread that answers it (the stop arriving exactly then, as it can under load).
STOPPED_AT_HANDOVER = """
import signal, sys, threading
handing_over = threading.Thread.start
def start(thread):
    handing_over(thread)
    if getattr(getattr(thread, "_target", None), "__name__", "") == "process_request_thread":
        signal.raise_signal(signal.SIGTERM)
threading.Thread.start = start
from tracklake._cli.main import main
main(["ui", "--root", sys.argv[1], "--port", "0"])
"""


def test_a_stop_as_a_connection_is_handed_over_still_ends_cleanly(store: Path) -> None:
    """The signal is raised in the main thread: when that thread itself handed connections
    over, a stop between the answering thread's start and the hand-over's end gave the
    connection's slot back twice, `close()` no longer waited for that answer, and the
    process was aborted (SIGABRT, "FATAL: exception not rethrown") as it exited with the
    thread inside DuckDB. The request that arrived whole is answered; the command exits 0."""
    process, port = _command_serving(store, STOPPED_AT_HANDOVER)
    try:
        try:
            status, _, body = request(None, "GET", "/api/runs",  # type: ignore[arg-type]
                                      port=port)
        except ConnectionError:  # the stop came before the request was read: it was cut
            status, body = 0, b""
        out, err = process.communicate(timeout=60)
    finally:
        _killed_if_running(process)
    _assert_ended_cleanly(process, out, err)
    if status != 0:  # read before the stop began: answered, never interrupted
        assert status == 200 and [r["run"] for r in json.loads(body)["runs"]] == ["base"], body


#: `tracklake ui` on argv[1], sent SIGTERM argv[2] times, half a second apart, once a
#: request has arrived whole.
STOPPED_AS_ANSWERED = """
import os, signal, sys, threading, time
from tracklake._ui import server
arrived = server._Server.arrived
def stop(times):
    for _ in range(times):
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGTERM)
def arrived_then_stopped(self, connection):
    arrived(self, connection)
    threading.Thread(target=stop, args=(int(sys.argv[2]),), daemon=True).start()
server._Server.arrived = arrived_then_stopped
from tracklake._cli.main import main
main(["ui", "--root", sys.argv[1], "--port", "0"])
"""


@pytest.mark.parametrize(("stops", "rows", "expected"), [
    (1, 2 * 10**8, (200, {"columns": ["n"], "rows": [[28571429]]})),
    (2, 10**13, (503, {"error": "the dashboard is stopping"})),
], ids=["once", "twice"])
def test_the_command_answers_the_question_in_progress_and_a_second_stop_interrupts_it(
        store: Path, stops: int, rows: int, expected: tuple[int, Any]) -> None:
    """One stop waits for the question in progress (it was interrupted, and its asker
    told "query interrupted" as if the question were wrong); a second stop interrupts it
    (rather than making its asker wait out the 30 s limit) and tells its asker that the
    dashboard is stopping. Either way the command exits 0."""
    process, port = _command_serving(store, STOPPED_AS_ANSWERED, str(stops))
    slow = f"SELECT count(*) AS n FROM range({rows}) t(i) WHERE i % 7 = 3"
    try:
        status, _, body = request(None, "POST", "/api/sql",  # type: ignore[arg-type]
                                  json.dumps({"sql": slow}).encode(),
                                  {"Content-Type": "application/json"}, port=port)
        out, err = process.communicate(timeout=60)
    finally:
        _killed_if_running(process)
    _assert_ended_cleanly(process, out, err)
    assert "answering 1 question(s) in progress (Ctrl-C again interrupts them)" in out, out
    assert ("interrupting the questions in progress" in out) == (stops == 2), out
    answer = json.loads(body)
    assert (status, {k: answer.get(k) for k in expected[1]}) == expected, body


def test_a_taken_port_or_a_url_root_is_an_error_at_once(store: Path) -> None:
    from click.testing import CliRunner

    from tracklake._cli.main import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(main, ["ui", "--root", str(store), "--port", str(port)])
    assert result.exit_code == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr and "--port" in result.stderr
    result = CliRunner().invoke(main, ["ui", "--root", "s3://bucket/store"])
    assert result.exit_code == 1 and "URL" in result.stderr


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dashboard]:
    """A run with a chain of spans one deeper than the dashboard sends, a span with long
    inputs, and more alerts than the events view shows."""
    import contextlib

    from tracklake._report.sections import MAX_SPANS
    from tracklake._ui.traces import MAX_EVENTS, MAX_FIELD

    root = tmp_path_factory.mktemp("ui") / "traced"
    with tracklake.init(project="p", run_id="t", root=root) as run:
        with run.span("long", step=0, inputs="x" * (MAX_FIELD + 10)):
            pass
        with contextlib.ExitStack() as chain:
            for depth in range(MAX_SPANS + 1):
                chain.enter_context(run.span(f"level {depth}", step=1))
        for i in range(MAX_EVENTS + 1):
            run.alert(f"alert {i}", level="error" if i % 2 else "info", step=i)
    dashboard = Dashboard(root).start()
    yield dashboard
    dashboard.close()


def get(board: Dashboard, path: str) -> tuple[int, Any]:
    status, _, body = request(board, "GET", path)
    return status, json.loads(body)


def test_traces_are_sent_flat_within_the_span_limit_with_long_fields_clipped(
        traced: Dashboard) -> None:
    from tracklake._report.sections import MAX_SPANS
    from tracklake._ui.traces import MAX_FIELD

    status, answer = get(traced, "/api/traces?run=p/t")
    assert status == 200
    (run,) = answer["runs"]
    assert run["more"] is True and len(run["spans"]) == MAX_SPANS
    long = run["spans"][0]
    assert long["name"] == "long" and long["clipped"] == ["inputs"]
    assert len(long["inputs"]) == MAX_FIELD
    chain = run["spans"][1:]  # a chain deeper than JSON nests: depth and parent instead
    assert [s["depth"] for s in chain] == list(range(len(chain)))
    assert [s["parent"] for s in chain] == [None, *range(1, len(chain))]
    assert answer["queries"][0]["params"] == {"p": "p", "r": "t"}
    status, answer = get(traced, "/api/traces?run=p/t&q=LEVEL%205")
    assert status == 200 and answer["runs"][0]["spans"][0]["name"] == "level 0"  # its trace
    assert answer["queries"][0]["params"] == {"p": "p", "r": "t", "q": "LEVEL 5"}
    assert get(traced, "/api/traces?run=p/t&q=nowhere")[1]["runs"][0]["spans"] == []


def test_events_are_the_latest_within_the_limit_and_filter_by_level_and_kind(
        traced: Dashboard) -> None:
    from tracklake._ui.traces import MAX_EVENTS

    status, answer = get(traced, "/api/events?run=p/t")
    assert status == 200 and answer["more"] is True and len(answer["events"]) == MAX_EVENTS
    assert answer["events"][0]["title"] == f"alert {MAX_EVENTS}"  # the newest first
    assert answer["levels"] == ["error", "info"] and answer["kinds"] == ["alert"]
    errors = get(traced, "/api/events?run=p/t&level=error")[1]["events"]
    assert errors and {e["level"] for e in errors} == {"error"}
    assert get(traced, "/api/events?run=p/t&kind=write_error")[1]["events"] == []
    assert get(traced, "/api/events?run=p/other")[1]["events"] == []


def test_traces_and_events_refuse_bad_runs_and_too_many(traced: Dashboard) -> None:
    from tracklake._ui.traces import MAX_RUNS

    many = "&".join(f"run=p/r{i}" for i in range(MAX_RUNS + 1))
    for path in ("/api/traces", "/api/events"):
        assert request(traced, "GET", f"{path}?run=bad")[0] == 400
        assert request(traced, "GET", f"{path}?{many}")[0] == 400
        assert request(traced, "GET", f"{path}?run=p/t&run=p/u")[0] == 200


def test_a_panels_sql_run_in_the_console_with_its_parameters_as_text_answers_the_same(
        board: Dashboard, traced: Dashboard) -> None:
    """What each panel says it ran is what it ran: the console, given the same SQL and
    the parameters as text (as `tracklake sql --param` takes them), answers its rows."""
    status, series = get(board, "/api/series?key=loss&run=p/base&buckets=10&lo=5&hi=40")
    assert status == 200 and [q["params"]["buckets"] for q in series["queries"][:1]] == ["10"]
    answer = console(board, series["queries"][0])
    assert [row[:4] for row in answer["rows"]] == [
        ["p", "base", c["series"], c["x"]] for c in series["curves"]]
    assert series["curves"][0]["points"] == 36 and len(series["curves"][0]["x"]) < 36
    assert console(board, series["queries"][1])["rows"] == series["attempts"] == []
    runs = get(board, "/api/runs")[1]
    assert [row[1] for row in console(board, runs["queries"][0])["rows"]] == ["base"]
    summary = get(board, "/api/summary?key=loss")[1]
    assert console(board, summary["queries"][0])["rows"] == [
        [r["project"], r["run"], r["last"], r["min"], r["max"]] for r in summary["rows"]]
    traces = get(traced, "/api/traces?run=p/t&q=long")[1]
    names = [row[3] for row in console(traced, traces["queries"][0])["rows"]]
    assert names == [s["name"] for s in traces["runs"][0]["spans"]] == ["long"]
    events = get(traced, "/api/events?run=p/t&level=error")[1]
    answer = console(traced, events["queries"][0])
    assert [row[7] for row in answer["rows"]] == [e["title"] for e in events["events"]]


def test_the_consoles_parameters_are_text_and_refused_when_malformed_or_missing(
        board: Dashboard) -> None:
    assert sql(board, "SELECT $a AS a, $b AS b", ["a=007", "b=x' OR '1'='1", "unused=1"]) == (
        200, {"columns": ["a", "b"], "rows": [["007", "x' OR '1'='1"]], "truncated": False})
    for params, says in ((["a=1"], "$b"), (["a=1", "a=2"], "twice"), (["1a=2"], "1a=2"),
                         ("a=1", "list"), ([1], "list")):
        status, answer = sql(board, "SELECT $a, $b", params)
        assert status == 400 and says in answer["error"], params


def test_at_most_max_queries_are_answered_at_once_and_the_rest_wait_their_turn(
        store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tracklake._ui import answers
    from tracklake._ui.server import MAX_QUERIES

    real, lock = answers.keys, threading.Lock()
    running, peak = [0], [0]

    def slow_keys(root: Path) -> Any:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        try:
            time.sleep(1.0)
            return real(root)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(answers, "keys", slow_keys)
    board = Dashboard(store).start()
    try:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            answered = list(pool.map(lambda _: request(board, "GET", "/api/keys"), range(8)))
    finally:
        board.close()
    assert [status for status, _, _ in answered] == [200] * 8
    assert all(json.loads(body) == json.loads(answered[0][2]) for _, _, body in answered)
    assert "loss" in answered[0][2].decode()
    assert 1 < peak[0] <= MAX_QUERIES


def test_a_question_waiting_its_turn_when_the_server_closes_is_never_asked(
        store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tracklake._ui import answers
    from tracklake._ui.server import MAX_QUERIES

    release, asked = threading.Event(), []

    def held(root: Path) -> Any:
        asked.append("held")
        release.wait(60)
        return []

    def waiting(root: Path) -> Any:
        asked.append("waiting")
        return []

    monkeypatch.setattr(answers, "keys", held)
    monkeypatch.setattr(answers, "runs", waiting)
    board = Dashboard(store).start()
    pool = concurrent.futures.ThreadPoolExecutor(MAX_QUERIES + 1)
    try:
        holders = [pool.submit(request, board, "GET", "/api/keys") for _ in range(MAX_QUERIES)]
        until(lambda: len(asked) == MAX_QUERIES, "both held questions asked", 30)
        waiter = pool.submit(request, board, "GET", "/api/runs")
        time.sleep(0.5)  # its request is in, its question waits for a turn
        closing = threading.Thread(target=board.close)
        closing.start()
        time.sleep(0.5)
        release.set()
        closing.join(60)
        assert not closing.is_alive()
        with contextlib.suppress(OSError, http.client.HTTPException):
            waiter.result(60)  # its connection was cut: no answer, or an error
        for holder in holders:
            with contextlib.suppress(OSError, http.client.HTTPException):
                holder.result(60)
    finally:
        release.set()
        pool.shutdown()
    assert asked == ["held"] * MAX_QUERIES
