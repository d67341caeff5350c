"""The dashboard's HTTP server: the standard library's ThreadingHTTPServer, read-only.

What it refuses, and why:
- on a loopback bind, a Host header that names another host (a web page elsewhere cannot
  reach the store through DNS rebinding);
- on any other bind, every request without the token printed in the URL (query
  ``?token=``, then a cookie the page keeps), compared in constant time;
- any path but the page, its listed static files and the API: no path from a request ever
  reaches the file system, so no traversal can; a media blob is found by a digest that a
  media record names (media.py), sent only within `max_blob` bytes, and as an attachment
  unless its type is an image, audio or video type that the format allows;
- a URL over 8 KiB, a body over 64 KiB (1 MiB for the parameters of a read that a URL
  cannot hold: `QUERY_PATHS` take their query as JSON in a POST too, as the page sends
  one that names many runs), a series request of more than `MAX_SERIES_KEYS`
  keys (or of a key named twice, or empty), a request (line, headers and body) not received
  within `read_deadline` seconds, more than `MAX_CONNECTIONS` at once;
- more than `MAX_QUERIES` questions at once: the others wait their turn;
- SQL that is not read-only (`tracklake.query`'s check, and a connection that cannot write);
  its parameters are texts, as `tracklake sql --param NAME=VALUE` takes them.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hmac
import ipaddress
import json
import secrets
import shutil
import socket
import sys
import threading
import time
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tracklake._errors import TracklakeError
from tracklake._read.sql_params import ParamError, sql_params
from tracklake._ui import answers, media, traces
from tracklake._ui.json_bytes import json_bytes
from tracklake._ui.series import SeriesQuery

MAX_URL = 8 << 10
MAX_BODY = 64 << 10
MAX_QUERY_BODY = 1 << 20
MAX_CONNECTIONS = 32
#: Questions answered at once. Each may use DuckDB's memory limit and holds its answer
#: (Python values, then JSON) until it is sent, so the server's memory is bounded by
#: this many answers, not by the requests in flight (a page asks six at a time); on a
#: machine of few cores more at once would not answer sooner.
MAX_QUERIES = 2
#: After an answer of at least this many bytes, the C allocator is asked to give the
#: freed memory back to the system (glibc's `malloc_trim`): it otherwise keeps what the
#: answer's Python objects and DuckDB's query held, and the server stays at its peak.
TRIM_AFTER_BYTES = 1 << 20
READ_DEADLINE = 10.0
#: Seconds a stop waits for the threads of answers it cut (their sends fail at once).
_CUT_WAIT = 5.0
#: Seconds between two interruptions of the queries, once a second stop asked for them.
_INTERRUPT_EVERY = 0.05
COOKIE = "tracklake_token"

_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8", ".LICENSE": "text/plain; charset=utf-8"}
_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; media-src 'self'; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'")
#: A blob opened on its own (a new tab) is a document of no origin that runs no script.
_BLOB_CSP = _CSP + "; sandbox"
BLOB_PATH = "/api/blob/"
#: The curves of several keys (the charts in view) in one request, read by one query.
SERIES_BATCH = "/api/series_batch"
#: Reads whose parameters may also come as JSON in a POST (`_posted_query`): those that
#: name runs, which a URL of 8 KiB holds only a few hundred of.
QUERY_PATHS = frozenset({"/api/series", SERIES_BATCH, "/api/generations", "/api/histograms",
                         "/api/media", "/api/traces", "/api/events"})
#: The most keys one request to `SERIES_BATCH` may name.
MAX_SERIES_KEYS = 16


def _static_files() -> dict[str, tuple[bytes, str]]:
    """The page's files, read once from the package: URL path → (content, type)."""
    folder = resources.files("tracklake._ui") / "static"
    files = {}
    for item in folder.iterdir():
        suffix = "." + item.name.rsplit(".", 1)[-1]
        if item.is_file() and suffix in _TYPES:
            files[f"/static/{item.name}"] = (item.read_bytes(), _TYPES[suffix])
    files["/"] = files.pop("/static/index.html")
    return files


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: whatever it resolves to, it is not only this machine


def _shut(connection: socket.socket) -> None:
    """Cut `connection` both ways; one its client closed meanwhile (OSError) is left."""
    with contextlib.suppress(OSError):
        connection.shutdown(socket.SHUT_RDWR)


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a stuck client never keeps the process from ending

    def __init__(self, address: tuple[str, int], store: Path, token: str | None,
                 read_deadline: float, max_blob: int) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.store = store
        self.token = token
        self.read_deadline = read_deadline
        self.max_blob = max_blob
        self.files = _static_files()
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.queries = threading.BoundedSemaphore(MAX_QUERIES)
        self.closing = threading.Event()
        self.interrupting = threading.Event()  # the stop interrupts the running queries
        #: connections whose request is still arriving, and those whose request arrived
        #: whole (being answered)
        self.arriving: set[socket.socket] = set()
        self.answering: set[socket.socket] = set()
        self.open_lock = threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)  # too many at once: this one is dropped
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-answer (a closed tab) is not an error of ours."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        with self.open_lock:
            self.arriving.add(request)
            if self.closing.is_set():  # handed over as a stop began: cut, as it would be
                _shut(request)
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.open_lock:
                self.arriving.discard(request)
                self.answering.discard(request)
            self.slots.release()

    def arrived(self, connection: socket.socket) -> None:
        """The request on `connection` arrived whole: a stop waits for its answer."""
        with self.open_lock:
            self.arriving.discard(connection)
            self.answering.add(connection)

    def drain(self, timeout: float) -> None:
        """Cut the connections whose request is still arriving and wait (up to `timeout`
        seconds) for the threads answering the others: a query running in one ends by
        its own timeout or interruption, and none waiting for its turn begins. Answers
        still being sent then (to a client that reads nothing) are cut too, and waited
        for `_CUT_WAIT` seconds more."""
        self.closing.set()
        self._cut(self.arriving)
        taken = 0
        try:  # a second Ctrl-C ends the wait: the slots taken are given back for the next
            taken = self._take_slots(time.monotonic() + timeout)
            if taken < MAX_CONNECTIONS:
                self._cut(self.answering)
                taken += self._take_slots(time.monotonic() + _CUT_WAIT,
                                          MAX_CONNECTIONS - taken)
        finally:
            for _ in range(taken):
                self.slots.release()

    def _cut(self, connections: set[socket.socket]) -> None:
        with self.open_lock:
            for connection in connections:
                _shut(connection)

    def _take_slots(self, deadline: float, most: int = MAX_CONNECTIONS) -> int:
        """How many connection slots were taken (at most `most`) by `deadline`: each is
        one thread that ended or none that was running."""
        taken = 0
        try:
            while taken < most and self.slots.acquire(
                    timeout=max(0.0, deadline - time.monotonic())):
                taken += 1
        except BaseException:  # interrupted: what was taken is given back
            for _ in range(taken):
                self.slots.release()
            raise
        return taken


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "tracklake"
    sys_version = ""
    timeout = READ_DEADLINE  # no single read waits longer than the whole request may

    def handle(self) -> None:
        """One request, which must arrive whole within the read deadline: a client that
        trickles bytes has its connection shut."""
        self._deadline = threading.Timer(self.server.read_deadline, self._too_slow)
        self._deadline.daemon = True
        self._deadline.start()
        try:
            super().handle()
        finally:
            self._deadline.cancel()

    def _arrived(self) -> None:
        """The request arrived whole, within the read deadline: it is answered, and a
        stop waits for that answer rather than cutting it."""
        self._deadline.cancel()
        self.server.arrived(self.connection)

    def _too_slow(self) -> None:
        _shut(self.connection)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: a dashboard polled every second would flood the terminal."""

    # -- admission ------------------------------------------------------------------

    def _admitted(self) -> bool:
        if len(self.path) > MAX_URL:
            self._error(HTTPStatus.REQUEST_URI_TOO_LONG, "URL too long")
            return False
        if self.server.token is None:
            host = (self.headers.get("Host") or "").rsplit(":", 1)[0]
            if not is_loopback(host):
                self._error(HTTPStatus.FORBIDDEN, f"Host {host!r} is not this machine")
                return False
            return True
        given = parse_qs(urlsplit(self.path).query).get("token", [""])[0]
        if not given:
            try:
                cookie = SimpleCookie(self.headers.get("Cookie") or "")
            except CookieError:
                cookie = SimpleCookie()  # a header it cannot parse carries no token
            given = cookie[COOKIE].value if COOKIE in cookie else ""
        if not hmac.compare_digest(given.encode(), self.server.token.encode()):
            self._error(HTTPStatus.FORBIDDEN, "this dashboard needs its token: open the "
                        "URL that `tracklake ui` printed")
            return False
        return True

    # -- methods --------------------------------------------------------------------

    def do_GET(self) -> None:
        self._arrived()  # a GET has no body: the request is in
        if not self._admitted():
            return
        url = urlsplit(self.path)
        if url.path in self.server.files:
            body, kind = self.server.files[url.path]
            extra = {}
            if url.path == "/" and self.server.token is not None:
                extra["Set-Cookie"] = (f"{COOKIE}={self.server.token}; HttpOnly; "
                                       "SameSite=Strict; Path=/")
            self._send(HTTPStatus.OK, body, kind, extra)
            return
        self._read(url.path, parse_qs(url.query))

    def _read(self, path: str, query: dict[str, list[str]]) -> None:
        """Answer a read of the API at `path` with the parameters `query`."""
        if path == "/api/runs":
            self._answer(lambda: answers.runs(self.server.store))
        elif path == "/api/keys":
            self._answer(lambda: answers.keys(self.server.store))
        elif path == "/api/summary":
            key = query.get("key", [""])[0]
            self._answer(lambda: answers.summary(self.server.store, key))
        elif path == "/api/generations":
            if (runs := self._asked_runs(query)) is None:
                return
            search = query.get("q", [""])[0]
            self._answer(lambda: answers.generations(self.server.store, runs, search))
        elif path in ("/api/histograms", "/api/media"):
            if (runs := self._asked_runs(query)) is None:
                return
            store, limit = self.server.store, self.server.max_blob
            self._answer(lambda: media.histograms(store, runs, answers.QUERY_TIMEOUT)
                         if path == "/api/histograms"
                         else media.media(store, runs, answers.QUERY_TIMEOUT, limit))
        elif path in ("/api/traces", "/api/events"):
            if (runs := self._asked_runs(query, traces.MAX_RUNS)) is None:
                return
            store, (search, level, kind) = self.server.store, (
                query.get(name, [""])[0] for name in ("q", "level", "kind"))
            self._answer(lambda: traces.traces(store, runs, search, answers.QUERY_TIMEOUT)
                         if path == "/api/traces" else
                         traces.events(store, runs, level, kind, answers.QUERY_TIMEOUT))
        elif path.startswith(BLOB_PATH):
            self._blob(path[len(BLOB_PATH):])
        elif path in ("/api/series", SERIES_BATCH):
            batch = path == SERIES_BATCH
            try:
                keys = _series_keys(query, MAX_SERIES_KEYS if batch else 1)
                q = _series_query(query, keys[0])
            except ValueError as exc:
                self._error(HTTPStatus.BAD_REQUEST, str(exc))
                return
            store = self.server.store
            self._answer(lambda: {"series": answers.series_of_keys(store, q, keys)} if batch
                         else answers.series(store, q))
        else:
            self._error(HTTPStatus.NOT_FOUND, "no such page")

    def _asked_runs(self, query: dict[str, list[str]], most: int | None = None
                    ) -> tuple[tuple[str, str], ...] | None:
        """The request's runs (`_runs`, at most `most`); None once a 400 said what is
        wrong with them."""
        try:
            runs = _runs(query)
            if most is not None and len(runs) > most:
                raise ValueError(f"at most {most} runs at once")
        except ValueError as exc:
            self._error(HTTPStatus.BAD_REQUEST, str(exc))
            return None
        return runs

    def do_POST(self) -> None:
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self._deadline.cancel()
            self._error(HTTPStatus.LENGTH_REQUIRED, "a body needs its Content-Length")
            return
        path = urlsplit(self.path).path
        most = MAX_QUERY_BODY if path in QUERY_PATHS else MAX_BODY
        if length > most or length < 0:
            self._deadline.cancel()
            self._error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body over {most} bytes")
            return
        body = self.rfile.read(length)
        if len(body) < length:
            self._deadline.cancel()
            return
        self._arrived()
        if not self._admitted():
            return
        if path != "/api/sql" and path not in QUERY_PATHS:
            self._error(HTTPStatus.NOT_FOUND, "no such page")
            return
        # JSON only: a form on another site cannot post it without the browser asking first
        if (self.headers.get("Content-Type") or "").split(";")[0] != "application/json":
            self._error(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "send the request as JSON")
            return
        if path in QUERY_PATHS:
            if (query := self._posted_query(body)) is not None:
                self._read(path, query)
            return
        try:
            asked = json.loads(body)
            statement, given = asked["sql"], asked.get("params", [])
            if not isinstance(statement, str):
                raise TypeError("sql is not text")
            if not isinstance(given, list) or not all(isinstance(g, str) for g in given):
                raise TypeError("params is not a list of NAME=VALUE texts")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            self._error(HTTPStatus.BAD_REQUEST,
                        f'send {{"sql": "...", "params": ["NAME=VALUE", ...]}}: {exc}')
            return
        try:
            values = sql_params(statement, given)
        except ParamError as exc:  # what is wrong with a parameter, named
            self._error(HTTPStatus.BAD_REQUEST, str(exc))
            return
        self._answer(lambda: answers.sql(self.server.store, statement, values))

    def _posted_query(self, body: bytes) -> dict[str, list[str]] | None:
        """The parameters of a read posted as ``{"query": {NAME: [VALUE, ...]}}``, as a URL's
        query would give them; None once a 400 said what is wrong."""
        try:
            query = json.loads(body)["query"]
            if not isinstance(query, dict) or not all(
                    isinstance(values, list) and all(isinstance(v, str) for v in values)
                    for values in query.values()):
                raise TypeError("query is not an object of lists of texts")
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            self._error(HTTPStatus.BAD_REQUEST,
                        f'send {{"query": {{"NAME": ["VALUE", ...]}}}}: {exc}')
            return None
        return query

    def _refuse_method(self) -> None:
        self._arrived()
        self._error(HTTPStatus.METHOD_NOT_ALLOWED, "the dashboard only reads")

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_HEAD = _refuse_method

    # -- answers ----------------------------------------------------------------------

    def _answer(self, work: Any) -> None:
        refused: str | None = None
        with self.server.queries:  # MAX_QUERIES: what bounds the server's memory
            if self.server.closing.is_set():
                self._error(HTTPStatus.SERVICE_UNAVAILABLE, "the dashboard is stopping")
                return
            try:
                value = work()
            except TracklakeError as exc:  # a refused or failed query, a damaged store
                refused = str(exc)
            else:
                body = json_bytes(value)
                del value  # only its JSON is sent
        if refused is not None and self.server.interrupting.is_set():
            self._error(HTTPStatus.SERVICE_UNAVAILABLE, "the dashboard is stopping")
            return
        if refused is not None:
            self._error(HTTPStatus.BAD_REQUEST, refused)
            return
        self._send(HTTPStatus.OK, body, "application/json")
        if len(body) >= TRIM_AFTER_BYTES:
            del body
            _give_memory_back()

    def _blob(self, digest: str) -> None:
        """A media blob, by its digest (media.py says what is refused)."""
        try:
            with self.server.queries:
                found = media.blob(self.server.store, digest, answers.QUERY_TIMEOUT,
                                   self.server.max_blob)
        except TracklakeError as exc:  # a failed query, a damaged store
            self._error(HTTPStatus.BAD_REQUEST, str(exc))
            return
        if isinstance(found, media.Refusal):
            self._error(HTTPStatus(found.status), found.why)
            return
        handle = media.open_checked(self.server.store, found)
        if handle is None:
            self._error(HTTPStatus.NOT_FOUND, "the store does not hold this blob as its "
                        "record declares it (missing, a link, or of another size)")
            return
        with handle:
            extra = {"Cache-Control": "private, max-age=86400, immutable"}  # by content
            if found.attachment:
                extra["Content-Disposition"] = f'attachment; filename="{found.digest}"'
            self._headers(HTTPStatus.OK, found.size, found.content_type, _BLOB_CSP, extra)
            shutil.copyfileobj(_Limited(handle, found.size), self.wfile)

    def _error(self, status: HTTPStatus, message: str) -> None:
        self._send(status, json.dumps({"error": message}).encode(), "application/json")

    def _send(self, status: HTTPStatus, body: bytes, kind: str,
              extra: dict[str, str] | None = None) -> None:
        self._headers(status, len(body), kind, _CSP, extra or {})
        self.wfile.write(body)

    def _headers(self, status: HTTPStatus, length: int, kind: str, csp: str,
                 extra: dict[str, str]) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(length))
        self.send_header("Content-Security-Policy", csp)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Connection", "close")
        for name, value in {"Cache-Control": "no-store", **extra}.items():
            self.send_header(name, value)
        self.end_headers()


def _give_memory_back() -> None:
    """Have glibc return freed heap memory to the system; nothing elsewhere (musl,
    macOS), where there is no `malloc_trim`."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Any:
    """glibc's `malloc_trim`, or None where the C library has none."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


class _Limited:
    """A file read up to `left` bytes and no further (the size its record declared)."""

    def __init__(self, handle: Any, left: int) -> None:
        self.handle, self.left = handle, left

    def read(self, size: int = -1) -> bytes:
        want = self.left if size < 0 else min(size, self.left)
        data: bytes = self.handle.read(want)
        self.left -= len(data)
        return data


def _runs(query: dict[str, list[str]]) -> tuple[tuple[str, str], ...]:
    """The `run=project/run` parameters."""
    runs = []
    for item in query.get("run", []):
        project, sep, run = item.partition("/")
        if not sep or not project or not run:
            raise ValueError(f"run {item!r} is not project/run")
        runs.append((project, run))
    return tuple(runs)


def _series_keys(query: dict[str, list[str]], most: int) -> tuple[str, ...]:
    """The `key` parameters of a series request, at most `most`, each once; ValueError
    names the key that is wrong."""
    keys = query.get("key", [])
    if not keys:
        raise ValueError("series needs a key")
    if len(keys) > most:
        raise ValueError(f"at most {most} key{'s' if most > 1 else ''} in one request to "
                         f"this path: {len(keys)} asked, from key {keys[most]!r} on"
                         + ("" if most > 1 else f" (ask {SERIES_BATCH} for several)"))
    seen: set[str] = set()
    for key in keys:
        if not key or "\x00" in key:
            raise ValueError(f"key {key!r} is empty or holds NUL: no metric has it")
        if key in seen:
            raise ValueError(f"key {key!r} is asked twice")
        seen.add(key)
    return tuple(keys)


def _series_query(query: dict[str, list[str]], key: str) -> SeriesQuery:
    """The charts a series request asks for (`key`'s, or each of its keys'); ValueError
    says what is wrong with it."""
    runs = _runs(query)
    x = query.get("x", ["step"])[0]
    ranks = query.get("ranks", ["first"])[0]
    if x not in ("step", "time", "relative") or ranks not in ("first", "mean", "all"):
        raise ValueError("x is step, time or relative; ranks is first, mean or all")
    buckets = int(query.get("buckets", ["1000"])[0])
    if not 2 <= buckets <= 10000:
        raise ValueError("buckets is between 2 and 10000")

    def bound(name: str) -> float | None:
        given = query.get(name, [""])[0]
        return float(given) if given else None

    group = query.get("group", [""])[0] or None
    return SeriesQuery(key=key, runs=runs, x=x, ranks=ranks,  # type: ignore[arg-type]
                       lo=bound("lo"), hi=bound("hi"), buckets=buckets, group=group)


class Dashboard:
    """A dashboard bound to `host`:`port` (0: any free port), serving `store`; with a
    token unless the address is this machine's loopback; media blobs of at most
    `max_blob` bytes."""

    def __init__(self, store: Path, *, host: str = "127.0.0.1", port: int = 0,
                 read_deadline: float = READ_DEADLINE, max_blob: int = media.MAX_BLOB
                 ) -> None:
        self.token = None if is_loopback(host) else secrets.token_urlsafe(24)
        self._server = _Server((host, port), store, self.token, read_deadline, max_blob)
        self.host, self.port = host, self._server.server_address[1]
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        shown = f"[{self.host}]" if ":" in self.host else self.host
        base = f"http://{shown}:{self.port}/"
        return base if self.token is None else f"{base}?token={self.token}"

    def serve_forever(self) -> None:
        """Serve until `close()` (from another thread)."""
        self._server.serve_forever(poll_interval=0.2)

    def start(self) -> Dashboard:
        """Serve from a background thread (the command, tests, notebooks)."""
        self._thread = threading.Thread(target=self.serve_forever, daemon=True,
                                        name="tracklake-ui")
        self._thread.start()
        return self

    def wait(self) -> None:
        """Block until the server started by `start()` stops. Ctrl-C (a KeyboardInterrupt,
        which Python raises in the main thread only) ends the wait, never the serving
        thread halfway through handing a connection to the thread that answers it: that
        left the connection's slot given back twice, so `close()` stopped waiting for an
        answer in progress, and the process was aborted as it exited with that thread
        still inside DuckDB."""
        assert self._thread is not None, "start() the dashboard first"
        while self._thread.is_alive():
            self._thread.join(0.5)

    def answering(self) -> int:
        """How many questions arrived whole and are being answered."""
        with self._server.open_lock:
            return len(self._server.answering)

    def interrupt(self) -> None:
        """Interrupt the queries running in this process (a second Ctrl-C while `close()`
        waits for them): their questions are told that the dashboard is stopping."""
        from tracklake._read.query import interrupt_queries

        server = self._server
        server.closing.set()
        server.interrupting.set()
        interrupt_queries()

        def keep_interrupting() -> None:
            """A question whose query had not begun (still connecting, as under load) is
            interrupted as soon as it does, not left to run to its limit."""
            deadline = time.monotonic() + answers.QUERY_TIMEOUT
            while time.monotonic() < deadline:
                with server.open_lock:
                    if not server.answering:
                        return
                interrupt_queries()
                time.sleep(_INTERRUPT_EVERY)

        threading.Thread(target=keep_interrupting, daemon=True,
                         name="tracklake-ui-interrupt").start()

    def close(self) -> None:
        """Stop listening, cut open connections and wait for the answers in progress, so
        that no thread is left reading the store when the process ends. Idempotent."""
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()
        self._server.drain(answers.QUERY_TIMEOUT)

