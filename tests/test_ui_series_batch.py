"""The charts in view asked for in one request (`/api/series_batch`): each key's answer is
the one-key request's (curves, attempt lines, the SQL shown), in every ranks mode, axis,
zoom and grouping, read on one connection; and a request naming too many keys, a key
twice or an empty key is refused with a 400 that names it."""

from __future__ import annotations

import http.client
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

import tracklake
from tracklake._read import query as read_query
from tracklake._ui.answers import series_of_keys
from tracklake._ui.series import SeriesQuery
from tracklake._ui.server import MAX_SERIES_KEYS, SERIES_BATCH, Dashboard

KEYS = ("loss", "acc/train", "odd")
RUNS = (("p", "a"), ("p", "b"))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Run a (ranks 0 and 1, resumed at step 30) and run b, 60 steps of three keys; `odd`
    holds NaN, +inf and -inf among its values."""
    root = tmp_path_factory.mktemp("batch") / "store"
    for run, rank, lr, steps in (("a", 0, 0.1, range(40)), ("a", 1, 0.1, range(60)),
                                 ("a", 0, 0.1, range(30, 60)), ("b", 0, 0.3, range(60))):
        with tracklake.init(project="p", run_id=run, rank=rank, root=root,
                            config={"lr": lr}) as writer:
            for step in steps:
                odd = {7: math.nan, 8: math.inf, 9: -math.inf}.get(step, step % 5 - rank)
                writer.log({"loss": 1 / (step + 1) + rank, "acc/train": step / 60,
                            "odd": odd}, step=step)
    return root


@pytest.fixture(scope="module")
def board(store: Path) -> Iterator[Dashboard]:
    dashboard = Dashboard(store).start()
    yield dashboard
    dashboard.close()


def get(board: Dashboard, path: str, params: list[tuple[str, str]]) -> tuple[int, Any]:
    con = http.client.HTTPConnection("127.0.0.1", board.port, timeout=60)
    try:
        con.request("GET", f"{path}?{urlencode(params)}")
        answer = con.getresponse()
        return answer.status, json.loads(answer.read())
    finally:
        con.close()


ASKED = [  # what a page asks besides its keys and runs
    {"ranks": "first"}, {"ranks": "all"}, {"ranks": "mean"},
    {"ranks": "all", "lo": "5", "hi": "12"},  # a zoomed range, the marks in it
    {"ranks": "mean", "x": "relative"}, {"ranks": "first", "group": "lr"},
]


@pytest.mark.parametrize("asked", ASKED, ids=lambda a: "-".join(a.values()))
def test_each_keys_answer_in_a_batch_is_its_one_key_answer(board: Dashboard,
                                                           asked: dict[str, str]) -> None:
    common = [("buckets", "8"), *asked.items(), *(("run", f"{p}/{r}") for p, r in RUNS)]
    status, batch = get(board, SERIES_BATCH, [*(("key", k) for k in KEYS), *common])
    assert status == 200, batch
    assert list(batch["series"]) == list(KEYS)
    for key in KEYS:
        status, alone = get(board, "/api/series", [("key", key), *common])
        assert status == 200 and batch["series"][key] == alone
        assert alone["curves"]  # an answer with curves in it, not two empty ones
    marks = {kind for c in batch["series"]["odd"]["curves"] for _, kind in c["marks"]}
    assert marks == {"NaN", "inf", "-inf"}
    if "group" not in asked:  # a group's curve is over runs: no run's attempt lines
        assert [a["step"] for a in batch["series"]["loss"]["attempts"]] == [30]


def test_a_batch_is_read_by_one_connection(store: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    made = []
    connect = read_query._connect
    monkeypatch.setattr(read_query, "_connect",
                        lambda *a, **k: made.append(1) or connect(*a, **k))
    answers = series_of_keys(store, SeriesQuery(key="", runs=RUNS, ranks="all"), KEYS)
    assert len(made) == 1 and all(answers[k]["curves"] for k in KEYS)


@pytest.mark.parametrize(("path", "keys", "named"), [
    (SERIES_BATCH, [f"k{i}" for i in range(MAX_SERIES_KEYS + 1)], f"'k{MAX_SERIES_KEYS}'"),
    (SERIES_BATCH, ["loss", "acc/train", "loss"], "key 'loss' is asked twice"),
    (SERIES_BATCH, ["loss", "a\x00b"], "key 'a\\x00b'"),
    (SERIES_BATCH, [], "series needs a key"),
    ("/api/series", ["loss", "odd"], "key 'odd'"),
])
def test_a_request_of_too_many_keys_a_repeated_or_empty_key_is_refused(
        board: Dashboard, path: str, keys: list[str], named: str) -> None:
    status, answer = get(board, path, [*(("key", k) for k in keys), ("run", "p/a")])
    assert status == 400 and named in answer["error"]


def post(board: Dashboard, path: str, body: bytes,
         kind: str = "application/json") -> tuple[int, Any]:
    con = http.client.HTTPConnection("127.0.0.1", board.port, timeout=60)
    try:
        con.request("POST", path, body=body, headers={"Content-Type": kind})
        answer = con.getresponse()
        return answer.status, json.loads(answer.read())
    finally:
        con.close()


def test_a_read_naming_more_runs_than_a_url_holds_is_posted_and_answered_alike(
        board: Dashboard) -> None:
    """A page showing thousands of runs names them all: past the URL's 8 KiB (refused
    with 414) it posts the same parameters as JSON, and the answer is the GET's, the runs
    the store does not hold changing nothing."""
    absent = [("run", f"p/absent-run-number-{i:05d}") for i in range(2000)]
    params = [*(("key", k) for k in KEYS), ("buckets", "8"), ("ranks", "all"),
              *(("run", f"{p}/{r}") for p, r in RUNS)]
    status, small = get(board, SERIES_BATCH, params)
    assert status == 200 and small["series"]["loss"]["curves"]
    con = http.client.HTTPConnection("127.0.0.1", board.port, timeout=60)
    try:
        con.request("GET", f"{SERIES_BATCH}?{urlencode(params + absent)}")
        assert con.getresponse().status == 414
    finally:
        con.close()
    query: dict[str, list[str]] = {}
    for name, value in params + absent:
        query.setdefault(name, []).append(value)
    body = json.dumps({"query": query}).encode()
    assert len(body) > 8 << 10
    status, posted = post(board, SERIES_BATCH, body)
    assert status == 200
    for key in KEYS:  # the same curves; only the SQL shown names the other runs
        differ = {f for f in small["series"][key] if posted["series"][key][f] !=
                  small["series"][key][f]}
        assert differ <= {"queries"}, differ
    for path, most in (("/api/generations", None), ("/api/histograms", None),
                       ("/api/media", None), ("/api/events", 20), ("/api/traces", 20)):
        status, answer = post(board, path, json.dumps(
            {"query": {"run": [v for _, v in absent[:most]]}}).encode())
        assert status == 200 and isinstance(answer, (list, dict)), (path, answer)


@pytest.mark.parametrize(("body", "kind", "status", "said"), [
    (b'{"query": {"key": "loss"}}', "application/json", 400, "lists of texts"),
    (b'{"query": {"key": [1]}}', "application/json", 400, "lists of texts"),
    (b'{"key": ["loss"]}', "application/json", 400, "'query'"),
    (b"[" * 100_000, "application/json", 400, "send"),
    (b"key=loss&run=p%2Fa", "application/x-www-form-urlencoded", 415, "as JSON"),
])
def test_a_posted_read_that_is_not_a_query_is_refused(
        board: Dashboard, body: bytes, kind: str, status: int, said: str) -> None:
    got, answer = post(board, SERIES_BATCH, body, kind)
    assert got == status and said in answer["error"], answer


def test_a_posted_read_over_a_mebibyte_is_refused_before_its_body_is_read(
        board: Dashboard) -> None:
    """The length is refused from the header: no body is sent (a client still sending one
    would meet a closed connection)."""
    con = http.client.HTTPConnection("127.0.0.1", board.port, timeout=60)
    try:
        con.putrequest("POST", SERIES_BATCH)
        con.putheader("Content-Type", "application/json")
        con.putheader("Content-Length", str((1 << 20) + 1))
        con.endheaders()
        answer = con.getresponse()
        assert answer.status == 413 and "body over" in json.loads(answer.read())["error"]
    finally:
        con.close()
