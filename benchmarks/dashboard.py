#!/usr/bin/env python
"""Dashboard benchmark: `tracklake ui` beside trackio's dashboard (`trackio show`), on the
same runs, each logged through its own tool's API and served by its own server process.

Data: ``--runs`` runs (default 4) x ``--keys`` keys (default 16, ``train/metric00`` ...)
x ``--steps`` steps (default 10,000; ``--steps 100000`` for the larger case), one
``log`` of every key per step, values from ``random.Random(run)`` made before the run
starts. Each tool writes into its own folder of one temporary directory: tracklake with
``tracklake.init(project=..., run_id=..., root=..., system_metrics=False,
compact=False)``, ``run.log``, ``run.finish`` and then ``tracklake.compact`` (which
``finish()`` would otherwise start in the background); trackio with ``trackio.init(
project=..., name=..., auto_log_cpu=False, auto_log_gpu=False)``, ``trackio.log``,
``trackio.finish`` and ``TRACKIO_DIR`` set to its folder. Every row each store holds is
counted afterwards, so a tool that dropped data would fail here. trackio does, for one
run of 10 M points: its ``log`` queues, a thread writes, and ``finish`` waits 30 s for
that thread, then returns with the rest unwritten (846,932 of 10,000,000 points kept).
``--trackio-bulk`` writes its rows with the call that thread makes
(``SQLiteStorage.bulk_log``), 100,000 at a time, so its dashboard has the same data.

trackio is no dependency of tracklake: its side runs as subprocesses of another
interpreter, ``--trackio-python`` (default ``/tmp/trackio-venv/bin/python``), which this
benchmark makes when it is missing, as::

    python -m venv /tmp/trackio-venv && /tmp/trackio-venv/bin/pip install trackio==0.43.0

Measured, for each tool:

- log: the logging loops (``init`` to ``finish`` of every run, in one process);
- start: from starting the dashboard's server process (``tracklake ui --port P``;
  ``trackio show --project P`` with ``GRADIO_SERVER_PORT``) to its page answering;
- chart: the request that gives a chart its data, as the page makes it, on loopback
  HTTP: for tracklake ``GET /api/series?key=K&x=step&ranks=first&buckets=480`` with
  every run (one request per chart, the page asks as charts scroll into view; past a
  URL of 8 KiB, as with hundreds of runs, the same parameters posted as JSON); for
  trackio ``POST /api/get_logs_batch {project, runs, scalar_only: true}`` (its
  Metrics page, ``frontend/src/pages/Metrics.svelte``, asks once for every key of up to
  64 runs: every row of each run read from SQLite, cut to 3,000 rows, and every chart
  drawn from that answer; past 64 runs, one such request per 64 runs, one after the
  other, as the page does). The first request, then the best of ``--repeat`` (default 3)
  more (trackio's cache of these answers is only on in a Hugging Face Space);
- all charts: the data of every key's chart, as the page asks for a page of charts in
  view (tracklake: ``GET /api/series_batch?key=K1&key=K2...`` with every run, in batches
  of up to 16 keys and about a million points, which are the runs times the points per
  run of each key, six requests at a time; trackio: the same single request);
- all charts, one request each: tracklake's page before it asked in batches (one
  ``/api/series`` per key, six at a time as a browser's connections to one host allow);
- in a browser (``--browser``, on by default): the page opened in headless Chromium, as
  the dashboard's tests drive it: seconds to its first chart drawn with data, and the
  bytes received over the wire (page, scripts, styles, data) two seconds after;
- RSS: the server process's resident memory (with any children) after answering, and
  the most the server process itself held at any time (its ``VmHWM``);
- disk: the bytes of each store.

Printed: a table of both tools' figures and their ratio (tracklake / trackio).

Usage (from the repository root)::

    python benchmarks/dashboard.py
    python benchmarks/dashboard.py --steps 100000 --trackio-python /tmp/trackio-venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

PROJECT = "bench"
WIDTH = 480  # the tracklake page's chart width: the buckets its series requests ask for
#: the most keys, and about the most points, the tracklake page asks for in one request
BATCH, BATCH_POINTS = 16, 1_000_000
#: the most runs trackio's page asks for in one request (`MAX_BATCH_RUNS` of its
#: Metrics.svelte, one request after the other; its server refuses more)
TRACKIO_BATCH_RUNS = 64


def keys(count: int) -> list[str]:
    return [f"train/metric{k:02d}" for k in range(count)]


def values(run: int, names: list[str], steps: int) -> list[dict[str, float]]:
    rng = random.Random(run)
    return [{name: rng.random() for name in names} for _ in range(steps)]


def log_tracklake(root: Path, runs: int, names: list[str], steps: int) -> float:
    import tracklake

    took = 0.0
    for r in range(runs):
        rows = values(r, names, steps)
        start = time.perf_counter()
        run = tracklake.init(project=PROJECT, run_id=f"run{r}", root=root,
                             system_metrics=False, compact=False)
        for step, row in enumerate(rows):
            run.log(row, step=step)
        run.finish()
        took += time.perf_counter() - start
    return took


def log_trackio(runs: int, names: list[str], steps: int, bulk: bool = False) -> float:
    """trackio's logging loops; with `bulk`, each run's rows written by the call its
    sender thread makes (`SQLiteStorage.bulk_log`, 100,000 rows a call) instead of
    queued by `trackio.log`."""
    import trackio  # in trackio's own interpreter, with TRACKIO_DIR set by the caller
    from trackio.sqlite_storage import SQLiteStorage

    took = 0.0
    for r in range(runs):
        rows = values(r, names, steps)
        start = time.perf_counter()
        run = trackio.init(project=PROJECT, name=f"run{r}", auto_log_cpu=False,
                           auto_log_gpu=False)
        if bulk:
            for at in range(0, steps, 100_000):
                chunk = rows[at:at + 100_000]
                SQLiteStorage.bulk_log(project=PROJECT, run=run.name, run_id=run.id,
                                       metrics_list=chunk,
                                       steps=list(range(at, at + len(chunk))))
        else:
            for step, row in enumerate(rows):
                trackio.log(row, step=step)
        trackio.finish()
        took += time.perf_counter() - start
    return took


def logged(tool: str, python: str, folder: Path, args: argparse.Namespace) -> float:
    """Run one tool's logging loops in a process of its interpreter; their seconds."""
    env = {**os.environ, "TRACKIO_DIR": str(folder), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [python, __file__, "--log-with", tool, "--into", str(folder), "--runs",
         str(args.runs), "--keys", str(args.keys), "--steps", str(args.steps),
         *(["--trackio-bulk"] if args.trackio_bulk else [])],
        env=env, check=True, capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def request(url: str, body: object = None) -> object:
    data = None if body is None else json.dumps(body).encode()
    headers = {} if body is None else {"Content-Type": "application/json"}
    with urllib.request.urlopen(urllib.request.Request(url, data, headers),
                                timeout=300) as answer:
        return json.loads(answer.read()) if body is not None or "/api/" in url else None


def read(base: str, path: str, params: list[tuple[str, str]]) -> object:
    """A read of tracklake's API as the page makes it: a GET, or, when the URL would pass
    the server's 8 KiB (many runs named), its parameters posted as JSON."""
    url = f"{base}{path}?{urlencode(params)}"
    if len(url) - len(base) <= 8000:
        return request(url)
    query: dict[str, list[str]] = {}
    for name, value in params:
        query.setdefault(name, []).append(value)
    return request(base + path, {"query": query})


def page_batches(names: list[str], runs: int, points: int) -> list[list[str]]:
    """The keys as the tracklake page asks for them: up to `BATCH` keys a request, and
    about `BATCH_POINTS` points (runs times each key's points per run)."""
    size = max(1, min(BATCH, BATCH_POINTS // max(1, runs * points)))
    return [names[i:i + size] for i in range(0, len(names), size)]


def series_batch(base: str, keys: list[str], ids: list[tuple[str, str]]) -> dict[str, Any]:
    """The page's request for the curves of `keys` of the runs `ids` (``("run",
    "project/run")``), step axis, first rank, one bucket per pixel: the answer per key."""
    answer = read(base, "/api/series_batch", [
        *(("key", k) for k in keys), ("x", "step"), ("ranks", "first"),
        ("buckets", str(WIDTH)), *ids])
    return answer["series"]  # type: ignore[index,no-any-return]


def start_server(command: list[str], env: dict[str, str], url: str
                 ) -> tuple[subprocess.Popen[bytes], float]:
    """Start a server process; it and the seconds until `url` answered."""
    start = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                answer.read()
            return process, time.perf_counter() - start
        except OSError:
            if process.poll() is not None:
                raise RuntimeError(f"{command[0]} ended ({process.returncode}) before "
                                   f"answering {url}") from None
            time.sleep(0.02)


def rss_bytes(pid: int) -> int:
    """Resident memory of `pid` and its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue  # ended meanwhile
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(entry.name))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo.extend(children.get(p, []))
        for line in Path(f"/proc/{p}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
    return total


def peak_rss_bytes(pid: int) -> int:
    """The most resident memory `pid` held at any time (its ``VmHWM``), from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def timed(call: Callable[[], object], repeat: int) -> tuple[float, float]:
    """The first call's seconds, and the best of `repeat` more."""
    times = []
    for _ in range(repeat + 1):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return times[0], min(times[1:])


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


#: How long a page is given to draw its first chart (more is reported as infinite).
BROWSER_WAIT = 300.0
#: In the page, true once its first chart has data drawn.
TRACKLAKE_DRAWN = ("window.tracklake && [...tracklake.charts.values()].some("
                   "c => c.plot && c.plot.data[0].length > 0)")
TRACKIO_DRAWN = ("document.querySelectorAll('.vega-embed canvas, .vega-embed svg')"
                 ".length > 0")


def in_browser(url: str, drawn: str) -> dict[str, float]:
    """The page at `url` in headless Chromium (the system's, driven as the tests drive it,
    every other host unresolvable): seconds from navigating to its first chart drawn
    (`drawn` true), and the bytes it had received (over the wire) two seconds later."""
    sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
    from _cdp import Browser, until

    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
        browser = Browser(Path(profile))
        try:
            started = time.perf_counter()
            browser.open(url)
            try:
                until(lambda: browser.js(drawn), f"a chart drawn at {url}",
                      timeout=BROWSER_WAIT)
            except AssertionError:  # a page that draws nothing in time: said, not fatal
                print(f"no chart drawn at {url} within {BROWSER_WAIT:.0f} s", flush=True)
                return {"first chart drawn": math.inf}
            seconds = time.perf_counter() - started
            time.sleep(2)
            browser.js("1")  # drains the events of the last two seconds
            received = sum(e["params"].get("encodedDataLength", 0) for e in browser.events
                           if e.get("method") == "Network.loadingFinished")
        finally:
            browser.close()
    return {"first chart drawn": seconds, "page weight": received}


def disk_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def measure_tracklake(folder: Path, names: list[str], args: argparse.Namespace
                      ) -> dict[str, float]:
    import tracklake

    figures = {"log": logged("tracklake", sys.executable, folder, args)}
    start = time.perf_counter()
    tracklake.compact(root=folder)
    print(f"tracklake: compacted in {time.perf_counter() - start:.1f} s (not in the table)")
    count = tracklake.query("SELECT count(*) AS n FROM metrics", root=folder)
    assert count.column("n")[0].as_py() == args.runs * len(names) * args.steps, count
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server, figures["start"] = start_server(
        [sys.executable, "-m", "tracklake._cli.main", "ui", "--root", str(folder),
         "--port", str(port)], dict(os.environ), base + "/")
    try:
        runs = request(base + "/api/runs")["runs"]  # type: ignore[index]
        ids = [("run", f"{r['project']}/{r['run']}") for r in runs]

        def chart(key: str) -> object:
            answer = read(base, "/api/series", [("key", key), ("x", "step"), ("ranks", "first"),
                                                ("buckets", str(WIDTH)), *ids])
            curves = answer["curves"]  # type: ignore[index]
            assert len(curves) == args.runs and all(
                c["points"] == args.steps for c in curves), key
            return answer

        def batch(keys: list[str]) -> object:
            answer = series_batch(base, keys, ids)
            assert list(answer) == keys and all(
                c["points"] == args.steps for k in keys for c in answer[k]["curves"]), keys
            return answer

        batches = page_batches(names, args.runs, args.steps)
        print(f"tracklake: the page asks for the {len(names)} keys in {len(batches)} "
              f"request(s)")
        figures["chart"], figures["chart again"] = timed(lambda: chart(names[0]),
                                                         args.repeat)
        with ThreadPoolExecutor(6) as pool:
            figures["all charts"], figures["all charts again"] = timed(
                lambda: list(pool.map(batch, batches)), args.repeat)
            figures["each chart"], figures["each chart again"] = timed(
                lambda: list(pool.map(chart, names)), args.repeat)
        if args.browser:
            figures |= in_browser(base + "/", TRACKLAKE_DRAWN)
        figures["rss"] = rss_bytes(server.pid)
        figures["peak rss"] = peak_rss_bytes(server.pid)
    finally:
        stop(server)
    figures["disk"] = disk_bytes(folder)
    return figures


def measure_trackio(python: str, folder: Path, names: list[str],
                    args: argparse.Namespace) -> dict[str, float]:
    figures = {"log": logged("trackio", python, folder, args)}
    databases = list(folder.glob("*.db"))
    with sqlite3.connect(databases[0]) as db:  # one row per step, the keys as JSON
        rows = db.execute("SELECT count(*) FROM metrics").fetchone()[0]
    assert rows == args.runs * args.steps, (databases, rows)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "TRACKIO_DIR": str(folder), "GRADIO_SERVER_PORT": str(port),
           "HF_HUB_OFFLINE": "1", "BROWSER": "true"}
    server, figures["start"] = start_server(
        [str(Path(python).parent / "trackio"), "show", "--project", PROJECT], env,
        base + "/")
    try:
        runs = request(base + "/api/get_runs_for_project", {"project": PROJECT})
        wanted = [{"run": r["name"], "run_id": r["id"]}
                  for r in runs["data"]]  # type: ignore[index]

        def batch() -> object:
            data = []
            for at in range(0, len(wanted), TRACKIO_BATCH_RUNS):  # as its page asks
                answer = request(base + "/api/get_logs_batch", {
                    "project": PROJECT, "runs": wanted[at:at + TRACKIO_BATCH_RUNS],
                    "scalar_only": True})
                data += answer["data"]  # type: ignore[index]
            assert len(data) == args.runs and all(
                set(names) <= set(d["logs"][0]) for d in data), data[0]["logs"][:1]
            return data

        figures["chart"], figures["chart again"] = timed(batch, args.repeat)
        for name in ("all charts", "each chart"):
            figures[name], figures[name + " again"] = (
                figures["chart"], figures["chart again"])
        if args.browser:
            figures |= in_browser(f"{base}/?project={PROJECT}", TRACKIO_DRAWN)
        figures["rss"] = rss_bytes(server.pid)
        figures["peak rss"] = peak_rss_bytes(server.pid)
    finally:
        stop(server)
    figures["disk"] = disk_bytes(folder)
    return figures


def trackio_python(given: str) -> str:
    """`given`, made as a venv with trackio when it is missing."""
    if not Path(given).exists():
        venv = Path(given).parent.parent
        print(f"making {venv} with trackio 0.43.0 ...")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([given, "-m", "pip", "install", "--quiet", "trackio==0.43.0"],
                       check=True)
    return given


ROWS = (("log", "log", "s"), ("start", "server up", "s"),
        ("chart", "one chart, first", "s"), ("chart again", "one chart, again", "s"),
        ("all charts", "all charts, first", "s"),
        ("all charts again", "all charts, again", "s"),
        ("each chart", "each chart, first", "s"),
        ("each chart again", "each chart, again", "s"),
        ("first chart drawn", "browser: 1st chart", "s"),
        ("page weight", "browser: page", "KiB"),
        ("rss", "server RSS", "MiB"), ("peak rss", "server peak RSS", "MiB"),
        ("disk", "store on disk", "MiB"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--keys", type=int, default=16)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--trackio-python", default="/tmp/trackio-venv/bin/python")
    parser.add_argument("--browser", action=argparse.BooleanOptionalAction, default=True,
                        help="Open each dashboard in headless Chromium: time to its "
                             "first chart drawn, and the page's bytes.")
    parser.add_argument("--trackio-bulk", action="store_true",
                        help="Write trackio's rows with the call its sender thread makes "
                             "(SQLiteStorage.bulk_log) rather than trackio.log: past 30 s "
                             "of backlog, trackio.finish() gives up on what is queued.")
    # the logging loop of one tool, run in that tool's interpreter by the benchmark
    parser.add_argument("--log-with", choices=("tracklake", "trackio"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--into", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    names = keys(args.keys)
    if args.log_with == "tracklake":
        print(log_tracklake(args.into, args.runs, names, args.steps))
        return
    if args.log_with == "trackio":
        print(log_trackio(args.runs, names, args.steps, args.trackio_bulk))
        return

    python = trackio_python(args.trackio_python)
    version = subprocess.run([python, "-c", "import trackio; print(trackio.__version__)"],
                             check=True, capture_output=True, text=True).stdout.strip()
    print(f"{args.runs} runs x {args.keys} keys x {args.steps:,} steps; "
          f"trackio {version} from {python}")
    with tempfile.TemporaryDirectory() as tmp:
        ours = measure_tracklake(Path(tmp) / "tracklake", names, args)
        print(f"tracklake: {json.dumps(ours)}", flush=True)  # kept if trackio's side fails
        theirs = measure_trackio(python, Path(tmp) / "trackio", names, args)
        print(f"trackio: {json.dumps(theirs)}", flush=True)
    print(f"{'':20s} {'tracklake':>10s} {'trackio':>10s}  tracklake / trackio")
    for name, label, unit in ROWS:
        if name not in ours or name not in theirs:
            continue
        scale = {"MiB": 1 << 20, "KiB": 1 << 10}.get(unit, 1)
        a, b = ours[name] / scale, theirs[name] / scale
        print(f"{label:20s} {a:8.2f} {unit:3s} {b:8.2f} {unit:3s}  {a / b:5.2f}")


if __name__ == "__main__":
    main()
