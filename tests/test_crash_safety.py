"""SIGKILL at random moments: every flushed step survives, and resumed attempts supersede.

A child process logs steps forever (small flush interval and segments, so segments roll
and background flushes race the kill). After each `run.flush()` that reports success it
appends "attempt step" to a side file and fsyncs it. The test kills it with SIGKILL after
a random delay, checks the store, and starts the same run id again (a new attempt) from
the step after the last one recorded as flushed. Every third kill is also made to look
like a power cut mid-append: half a batch message is appended to the newest segment.
"""

from __future__ import annotations

import json
import os
import random
import selectors
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pytest
from _env import child_env

import tracklake

pytestmark = pytest.mark.slow

PROJECT = "crash"
RUN = "killed-often"
KEYS = 8
TEXT_EVERY = 10
KILLS = 20
SEED = 20240601
FINAL_STEPS = 300  # the last attempt logs this many steps and finishes cleanly

WRITER = textwrap.dedent(f"""
    import json, os, sys, time
    cfg = json.loads(sys.argv[1])
    import tracklake

    run = tracklake.init(project={PROJECT!r}, run_id={RUN!r}, root=cfg["root"],
                         flush_interval=0.05, segment_bytes=8 << 10, capture_identity=False)
    side = os.open(cfg["side"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    print("ready", run.attempt, flush=True)
    step, stop = cfg["start"], cfg["stop"]
    while stop is None or step <= stop:
        run.log({{f"k{{k}}": step * 10 + k for k in range({KEYS})}}, step=step)
        if step % {TEXT_EVERY} == 0:
            run.log_text("note", f"step {{step}}", step=step)
        if step % 7 == 6 and run.flush():
            os.write(side, f"{{run.attempt}} {{step}}\\n".encode())
            os.fsync(side)
        step += 1
        time.sleep(0.0005)
    report = run.finish()
    print("finished", json.dumps(report.__dict__), flush=True)
""")


def read_side_file(path: Path) -> dict[int, int]:
    """attempt -> last step recorded as flushed (a line torn by the kill is ignored)."""
    flushed: dict[int, int] = {}
    if not path.exists():
        return flushed
    for line in path.read_text().splitlines(keepends=True):
        if not line.endswith("\n"):
            continue
        attempt, step = map(int, line.split())
        flushed[attempt] = max(step, flushed.get(attempt, -1))
    return flushed


def _read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            proc.kill()
            raise AssertionError(f"writer said nothing within {timeout} s")
    return proc.stdout.readline()


@dataclass
class AttemptFacts:
    start: int
    flushed: int = -1  # last step recorded in the side file (-1: none)
    count: int | None = None  # metric rows of this attempt seen right after its kill


@dataclass
class History:
    attempts: dict[int, AttemptFacts] = field(default_factory=dict)
    torn_compacted: list[Path] = field(default_factory=list)  # torn tails compaction met


def tear_last_segment(root: Path, attempt: int) -> Path | None:
    """Append half of a batch message to the attempt's newest metrics segment, as a power
    cut in the middle of an append leaves it. Returns the segment (None if it has none)."""
    directory = (root / "metrics" / f"project={PROJECT}" / f"run={RUN}" / "rank=0"
                 / f"attempt={attempt}")
    segments = sorted(directory.glob("*seg-*.arrows"))
    if not segments:
        return None
    data = segments[0].read_bytes() if len(segments) == 1 else segments[-2].read_bytes()
    source = pa.BufferReader(data)
    pa.ipc.read_message(source)  # the schema message
    start = source.tell()
    try:
        pa.ipc.read_message(source)  # the first batch message
    except (pa.ArrowInvalid, OSError, StopIteration):
        return None
    end = source.tell()
    with open(segments[-1], "ab") as f:
        f.write(data[start : start + (end - start) // 2])
    return segments[-1]


def _metrics_all_by_attempt(root: Path) -> dict[int, dict[str, int]]:
    rows = tracklake.query(f"""
        SELECT attempt, count(*) AS n, count(DISTINCT (step, key)) AS distinct_n,
               count(DISTINCT step) AS steps, min(step) AS lo, max(step) AS hi,
               count(*) FILTER (WHERE value <> step * 10 + CAST(substr(key, 2) AS INTEGER))
                 AS wrong
        FROM metrics_all WHERE project = '{PROJECT}' AND run = '{RUN}'
        GROUP BY attempt ORDER BY attempt""", root=root).to_pylist()
    return {r.pop("attempt"): r for r in rows}


def _read_run_by_attempt(root: Path) -> dict[int, dict[int, set[str]]]:
    """attempt -> step -> keys, through the reader API (no record may come twice)."""
    problems = tracklake.ReadProblems()
    seen: dict[int, dict[int, set[str]]] = {}
    for stream, batch in tracklake.read_run(root, tracklake.Cursor(PROJECT, RUN),
                                            kinds=("metrics",), problems=problems):
        cols = batch.to_pydict()
        per_step = seen.setdefault(stream.attempt, {})
        for step, key, value in zip(cols["step"], cols["key"], cols["value"], strict=True):
            assert value == step * 10 + int(key[1:])
            keys = per_step.setdefault(step, set())
            assert key not in keys, f"attempt {stream.attempt} step {step} {key} read twice"
            keys.add(key)
    assert problems.damaged == [], problems.damaged
    return seen


def _check_store(root: Path, history: History) -> dict[int, int]:
    """Every recorded flush is readable (SQL and reader API), each attempt holds a gapless
    run of whole steps, and compaction changes no count. Returns rows per attempt."""
    by_sql = _metrics_all_by_attempt(root)
    by_reader = _read_run_by_attempt(root)
    for attempt, facts in history.attempts.items():
        if facts.flushed >= facts.start:
            assert attempt in by_sql, f"attempt {attempt} flushed {facts.flushed} but is gone"
        row = by_sql.get(attempt)
        if row is None:
            assert attempt not in by_reader
            continue
        assert row["n"] == row["distinct_n"] == row["steps"] * KEYS, (attempt, row)
        assert row["wrong"] == 0
        assert row["lo"] == facts.start, (attempt, row, facts)
        assert row["hi"] - row["lo"] + 1 == row["steps"], f"gap in attempt {attempt}: {row}"
        assert row["hi"] >= facts.flushed, f"attempt {attempt} lost flushed steps: {row}"
        reader = by_reader[attempt]
        assert sorted(reader) == list(range(row["lo"], row["hi"] + 1))
        assert all(len(keys) == KEYS for keys in reader.values())
    counts = {a: r["n"] for a, r in by_sql.items()}

    report = tracklake.compact(root=root)
    assert report.skipped == [], report.skipped
    history.torn_compacted.extend(path for path, _ in report.torn)
    after = _metrics_all_by_attempt(root)
    assert {a: r["n"] for a, r in after.items()} == counts, "compaction changed the counts"
    return counts


def test_sigkill_loses_nothing_flushed_and_resumed_attempts_supersede(tmp_path: Path,
                                                                       root: Path) -> None:
    """>= 20 SIGKILLs at random moments: after each, every step recorded as flushed is in
    `metrics_all` and `read_run` under its attempt, the store reads without error, and
    compaction keeps every count. At the end `metrics` has each step once per key (the
    later attempt wins from its first step on) while `metrics_all` keeps every attempt."""
    rng = random.Random(SEED)
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    side = tmp_path / "flushed.txt"
    env = child_env()
    history = History()

    def spawn(start: int, stop: int | None) -> tuple[subprocess.Popen[str], int]:
        proc = subprocess.Popen(
            [sys.executable, str(script),
             json.dumps({"root": str(root), "side": str(side), "start": start, "stop": stop})],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        line = _read_line(proc, 60)
        assert line.startswith("ready "), (line, proc.communicate()[1])
        attempt = int(line.split()[1])
        assert attempt not in history.attempts
        history.attempts[attempt] = AttemptFacts(start=start)
        return proc, attempt

    def next_start() -> int:
        return max(read_side_file(side).values(), default=-1) + 1

    torn = []
    for i in range(KILLS):
        proc, attempt = spawn(next_start(), None)
        time.sleep(rng.uniform(0.05, 0.5))
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
        assert proc.returncode == -signal.SIGKILL
        if i % 3 == 2:  # and sometimes the kill also tore the append in progress
            torn.append(tear_last_segment(root, attempt))
        flushed = read_side_file(side)
        history.attempts[attempt].flushed = flushed.get(attempt, -1)
        counts = _check_store(root, history)
        history.attempts[attempt].count = counts.get(attempt, 0)

    assert len(history.attempts) == KILLS
    assert any(torn), "no torn tail was simulated"
    assert sum(f.flushed >= f.start for f in history.attempts.values()) >= KILLS // 2, (
        "most attempts should have flushed something before being killed")

    start = next_start()
    final_step = start + FINAL_STEPS - 1
    proc, final_attempt = spawn(start, final_step)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    report = json.loads(out.split("finished", 1)[1])
    assert report["complete"] is True and report["failed_writes"] == 0
    _check_store(root, history)
    # every simulated torn tail was met (and reported, not read as data) by compaction
    assert {p for p in torn if p is not None} <= set(history.torn_compacted)

    # the default view: every step 0..final_step exactly once per key, with its value
    rows = tracklake.query(f"""
        SELECT count(*) AS n, count(DISTINCT (step, key)) AS d, min(step) AS lo,
               max(step) AS hi,
               count(*) FILTER (WHERE value <> step * 10 + CAST(substr(key, 2) AS INTEGER))
                 AS wrong
        FROM metrics WHERE run = '{RUN}'""", root=root).to_pylist()
    assert rows == [{"n": (final_step + 1) * KEYS, "d": (final_step + 1) * KEYS, "lo": 0,
                     "hi": final_step, "wrong": 0}]
    # each visible step comes from the latest attempt that logged it
    owners = tracklake.query(
        "SELECT step, any_value(attempt) AS attempt, count(DISTINCT attempt) AS attempts "
        "FROM metrics GROUP BY step", root=root).to_pylist()
    assert all(r["attempts"] == 1 for r in owners)
    later_starts = sorted((f.start, a) for a, f in history.attempts.items())
    for r in owners:
        expected = max(a for s, a in later_starts if s <= r["step"]
                       and (history.attempts[a].count or a == final_attempt))
        assert r["attempt"] == expected, r
    texts = tracklake.query(
        "SELECT count(*) AS n, count(DISTINCT step) AS d FROM texts", root=root).to_pylist()
    n_texts = len(range(0, final_step + 1, TEXT_EVERY))
    assert texts == [{"n": n_texts, "d": n_texts}]
    summaries = tracklake.query(
        "SELECT key, count, first_step, last_step, last_value FROM metric_summaries "
        "ORDER BY key", root=root).to_pylist()
    assert summaries == [{"key": f"k{k}", "count": final_step + 1, "first_step": 0,
                          "last_step": final_step, "last_value": float(final_step * 10 + k)}
                         for k in range(KEYS)]

    # `metrics_all` keeps every attempt, exactly as it was right after that attempt's kill
    kept = {a: r["n"] for a, r in _metrics_all_by_attempt(root).items()}
    for attempt, facts in history.attempts.items():
        if attempt != final_attempt:
            assert kept.get(attempt, 0) == facts.count, attempt
    assert kept[final_attempt] == FINAL_STEPS * KEYS

    attempts = tracklake.query("SELECT attempt, status FROM run_attempts ORDER BY attempt",
                               root=root).to_pylist()
    assert [a["attempt"] for a in attempts] == sorted(history.attempts)
    assert attempts[-1]["status"] == "finished"
    assert all(a["status"] != "finished" for a in attempts[:-1])  # killed, never finished
    runs = tracklake.query("SELECT run, status, attempts FROM runs", root=root).to_pylist()
    assert runs == [{"run": RUN, "status": "finished", "attempts": final_attempt}]
    assert sum(kept.values()) >= (final_step + 1) * KEYS
