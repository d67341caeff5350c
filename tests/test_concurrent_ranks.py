"""Eight rank processes write one run at once while compaction and readers run alongside.

Every value encodes (rank, step, key) deterministically, so counts, sums and each single
value can be checked exactly: through the SQL views, through the reader API with a
cursor, after compaction, and through plain pyarrow / DuckDB Parquet readers.
"""

from __future__ import annotations

import json
import random
import shutil
import struct
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from _env import child_env

import tracklake

# one pytest worker: the 8 writers, compactor and readers run once (module fixture)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("concurrent_ranks")]

PROJECT = "conc"
RUN = "eight-ranks"
RANKS = 8
STEPS = 3000
KEYS = 8
TEXT_EVERY = 100  # one text row every 100 steps
GEN_EVERY = 500  # one log_generations() of GEN_SAMPLES rows every 500 steps
GEN_SAMPLES = 3

VALUES_PER_RANK = STEPS * KEYS
TEXTS_PER_RANK = len(range(0, STEPS, TEXT_EVERY))
GENERATIONS_PER_RANK = len(range(0, STEPS, GEN_EVERY)) * GEN_SAMPLES


def value_of(rank: int, step: int, k: int) -> float:
    """The value rank `rank` logs for key k{k} at `step` (exact in float64)."""
    return float(rank * 1_000_000 + step * 10 + k)


def expected_sum(rank: int) -> int:
    """Closed form of sum(value_of(rank, step, k)) over all steps and keys."""
    return (rank * 1_000_000 * STEPS * KEYS + 10 * KEYS * (STEPS - 1) * STEPS // 2
            + STEPS * (KEYS - 1) * KEYS // 2)


# SQL expression recomputing a row's expected value from its rank, step and key ('k3' -> 3)
EXPECTED_VALUE_SQL = "rank * 1000000 + step * 10 + CAST(substr(key, 2) AS INTEGER)"

WRITER = textwrap.dedent(f"""
    import json, os, sys, time
    cfg = json.loads(sys.argv[1])
    import tracklake

    rank = cfg["rank"]
    run = tracklake.init(project={PROJECT!r}, run_id={RUN!r}, rank=rank, root=cfg["root"],
                         flush_interval=0.02, segment_bytes=24 << 10,
                         capture_identity=False)
    open(os.path.join(cfg["sync"], f"ready-{{rank}}"), "w").close()
    go = os.path.join(cfg["sync"], "go")
    while not os.path.exists(go):
        time.sleep(0.005)
    keys = [f"k{{k}}" for k in range({KEYS})]
    for step in range({STEPS}):
        run.log({{key: float(rank * 1_000_000 + step * 10 + k) for k, key in enumerate(keys)}},
                step=step)
        if step % {TEXT_EVERY} == 0:
            run.log_text("sample", f"rank={{rank}} step={{step}}", step=step)
        if step % {GEN_EVERY} == 0:
            run.log_generations([{{"input": f"q{{rank}}-{{step}}-{{i}}", "output": f"a{{i}}",
                                   "score": float(rank * 100 + i)}}
                                  for i in range({GEN_SAMPLES})], step=step)
        if step % 25 == 0:
            time.sleep(0.03)  # ~4 s of writing: the compactor and readers interleave
        if step == {STEPS} // 2:
            # halfway, until the compactor has written a part: however loaded the machine,
            # compaction then runs while every rank writes
            compacted = os.path.join(cfg["sync"], "compacted")
            waited = time.monotonic() + 120
            while not os.path.exists(compacted) and time.monotonic() < waited:
                time.sleep(0.01)
            saw_compaction = os.path.exists(compacted)
    report = run.finish()
    print(json.dumps({{**report.__dict__, "saw_compaction": saw_compaction}}))
""")

COMPACTOR = textwrap.dedent("""
    import json, os, sys, time, traceback
    root, sync = sys.argv[1], sys.argv[2]
    stop = os.path.join(sync, "stop")
    import duckdb  # noqa: F401  (imported up front so the first round is not late)
    import tracklake

    rounds = parts = removed = 0
    try:
        while True:
            if rounds == 1:
                open(os.path.join(sync, "compactor-ready"), "w").close()
            stopping = os.path.exists(stop)
            report = tracklake.compact(root=root)
            rounds += 1
            parts += len(report.parts_written)
            removed += len(report.segments_removed)
            if parts:
                open(os.path.join(sync, "compacted"), "a").close()
            if stopping:
                break
            time.sleep(0.05)
    except BaseException:
        traceback.print_exc()
        sys.exit(1)
    print(json.dumps({"rounds": rounds, "parts": parts, "removed": removed}))
""")


@dataclass
class Observation:
    """What the readers saw while writers and the compactor were running."""

    query_counts: list[dict[int, tuple[int, int]]] = field(default_factory=list)
    cursor_values: dict[tuple[int, int, str], float] = field(default_factory=dict)
    cursor_rows: int = 0
    cursor_duplicates: int = 0
    cursor_rounds: int = 0
    problems: list[Any] = field(default_factory=list)


@dataclass
class Written:
    root: Path
    reports: list[dict[str, Any]]
    compactor: dict[str, int]
    seen: Observation


def _drain(root: Path, cursor: tracklake.Cursor, seen: Observation) -> None:
    """Read the run's metrics after `cursor`, adding them to `seen`."""
    problems = tracklake.ReadProblems()
    for stream, batch in tracklake.read_run(root, cursor, kinds=("metrics",),
                                            problems=problems):
        cols = batch.to_pydict()
        for step, key, value in zip(cols["step"], cols["key"], cols["value"], strict=True):
            ident = (stream.rank, step, key)
            if ident in seen.cursor_values:
                seen.cursor_duplicates += 1
            seen.cursor_values[ident] = value
            seen.cursor_rows += 1
    seen.problems.extend(problems.damaged)


def _observe_counts(root: Path) -> dict[int, tuple[int, int]]:
    table = tracklake.query(
        "SELECT rank, count(*) AS n, count(DISTINCT (step, key)) AS d FROM metrics_all "
        "GROUP BY rank", root=root)
    return {r: (n, d) for r, n, d in zip(*table.to_pydict().values(), strict=True)}


def _parts(root: Path) -> list[Path]:
    return sorted(root.glob("*/project=*/run=*/rank=*/attempt=*/part-*.parquet"))


def _segments(root: Path) -> list[Path]:
    return sorted(root.glob("*/project=*/run=*/rank=*/attempt=*/*seg-*.arrows"))


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Written]:
    """Run the 8 writers, a compactor looping throughout, and readers polling meanwhile."""
    base = tmp_path_factory.mktemp("ranks")
    root, sync = base / "store", base / "sync"
    root.mkdir()
    sync.mkdir()
    (base / "writer.py").write_text(WRITER)
    (base / "compactor.py").write_text(COMPACTOR)
    env = child_env()
    writers = [subprocess.Popen(
        [sys.executable, str(base / "writer.py"),
         json.dumps({"rank": rank, "root": str(root), "sync": str(sync)})],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for rank in range(RANKS)]
    compactor = None
    try:
        deadline = time.monotonic() + 60
        while len(list(sync.glob("ready-*"))) < RANKS:
            assert all(w.poll() is None for w in writers), "a writer died during init"
            assert time.monotonic() < deadline, "writers did not start"
            time.sleep(0.01)
        compactor = subprocess.Popen(
            [sys.executable, str(base / "compactor.py"), str(root), str(sync)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        while not (sync / "compactor-ready").exists():
            assert compactor.poll() is None, compactor.communicate()[1]
            assert time.monotonic() < deadline, "the compactor did not start"
            time.sleep(0.01)
        (sync / "go").touch()
        seen = Observation()
        cursor = tracklake.Cursor(PROJECT, RUN)
        while any(w.poll() is None for w in writers):
            assert time.monotonic() < deadline + 120, "writers did not finish"
            seen.query_counts.append(_observe_counts(root))
            _drain(root, cursor, seen)
            seen.cursor_rounds += 1
        (sync / "stop").touch()
        c_out, c_err = compactor.communicate(timeout=120)
        assert compactor.returncode == 0, c_err
        # whatever the cursor had not yet delivered, read it now (after the last compaction)
        _drain(root, cursor, seen)
        reports = []
        for w in writers:
            out, err = w.communicate(timeout=60)
            assert w.returncode == 0, err
            assert "Traceback" not in err, err
            reports.append(json.loads(out.strip().splitlines()[-1]))
        yield Written(root, reports, json.loads(c_out.strip().splitlines()[-1]), seen)
    finally:
        for p in [*writers, compactor]:
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


def _fresh_copy(written: Written, tmp_path: Path) -> Path:
    """A private copy of the written store, for tests that compact or change it."""
    copy = tmp_path / "store"
    shutil.copytree(written.root, copy)
    return copy


def _assert_metrics_exact(root: Path, view: str = "metrics") -> None:
    table = tracklake.query(f"""
        SELECT rank, attempt, count(*) AS n, count(DISTINCT (step, key)) AS distinct_n,
               CAST(sum(value) AS HUGEINT) AS total, min(step) AS lo, max(step) AS hi,
               count(*) FILTER (WHERE value <> {EXPECTED_VALUE_SQL}) AS wrong
        FROM {view} WHERE project = '{PROJECT}' AND run = '{RUN}'
        GROUP BY ALL ORDER BY rank""", root=root).to_pylist()
    assert [row["rank"] for row in table] == list(range(RANKS))
    for row in table:
        rank = row["rank"]
        assert row["attempt"] == 1
        assert row["n"] == VALUES_PER_RANK, row
        assert row["distinct_n"] == VALUES_PER_RANK, row
        assert row["total"] == expected_sum(rank), row
        assert (row["lo"], row["hi"]) == (0, STEPS - 1)
        assert row["wrong"] == 0, row
    keys = tracklake.query(f"SELECT DISTINCT key FROM {view} ORDER BY key", root=root)
    assert keys.column("key").to_pylist() == [f"k{k}" for k in range(KEYS)]


def _assert_texts_and_generations(root: Path) -> None:
    texts = tracklake.query(
        "SELECT rank, count(*) AS n, count(DISTINCT step) AS steps, "
        "count(*) FILTER (WHERE text <> 'rank=' || rank || ' step=' || step) AS wrong "
        "FROM texts GROUP BY rank ORDER BY rank", root=root).to_pylist()
    assert texts == [{"rank": r, "n": TEXTS_PER_RANK, "steps": TEXTS_PER_RANK, "wrong": 0}
                     for r in range(RANKS)]
    gens = tracklake.query(
        "SELECT rank, count(*) AS n, count(DISTINCT (step, sample)) AS d, "
        "sum(score) AS score FROM generations GROUP BY rank ORDER BY rank",
        root=root).to_pylist()
    per_call = GEN_SAMPLES * (GEN_SAMPLES - 1) // 2
    calls = GENERATIONS_PER_RANK // GEN_SAMPLES
    assert gens == [{"rank": r, "n": GENERATIONS_PER_RANK, "d": GENERATIONS_PER_RANK,
                     "score": float(calls * (r * 100 * GEN_SAMPLES + per_call))}
                    for r in range(RANKS)]


def _read_run_exact(root: Path) -> tracklake.Cursor:
    """Read the whole run with the reader API and check every value; returns the cursor."""
    cursor = tracklake.Cursor(PROJECT, RUN)
    problems = tracklake.ReadProblems()
    metrics: dict[int, dict[tuple[int, str], float]] = {r: {} for r in range(RANKS)}
    rows = {"texts": 0, "generations": 0}
    seqs: dict[tuple[int, str], list[int]] = {}
    for stream, batch in tracklake.read_run(root, cursor, problems=problems):
        assert (stream.project, stream.run, stream.attempt) == (PROJECT, RUN, 1)
        seqs.setdefault((stream.rank, stream.kind), []).extend(
            pc.unique(batch.column("seq")).to_pylist())
        if stream.kind == "metrics":
            cols = batch.to_pydict()
            per_rank = metrics[stream.rank]
            for step, key, value in zip(cols["step"], cols["key"], cols["value"], strict=True):
                assert (step, key) not in per_rank, (stream.rank, step, key)
                per_rank[(step, key)] = value
        elif stream.kind in rows:
            rows[stream.kind] += batch.num_rows
    assert problems.damaged == []
    for rank, values in metrics.items():
        assert len(values) == VALUES_PER_RANK, rank
        assert values == {(step, f"k{k}"): value_of(rank, step, k)
                          for step in range(STEPS) for k in range(KEYS)}
    assert rows == {"texts": TEXTS_PER_RANK * RANKS,
                    "generations": GENERATIONS_PER_RANK * RANKS}
    for (rank, kind), got in seqs.items():
        # every record group was delivered once, in seq order, with no gap
        assert got == list(range(len(got))), (rank, kind)
    # the cursor now sits on the last seq of each of the 8 ranks' metrics streams
    positions = {k: v for k, v in cursor.positions.items() if k.endswith("/metrics")}
    assert positions == {f"{r}/1/metrics": STEPS - 1 for r in range(RANKS)}
    return cursor


def test_every_writer_finished_completely_and_compaction_ran_during_writing(
        written: Written) -> None:
    """All 8 ranks report a complete finish; the concurrent compactor really compacted."""
    for report in written.reports:
        assert report["complete"] is True, report
        assert report["failed_writes"] == 0
        assert report["dropped_values"] == 0 and report["unwritten_records"] == 0
    assert written.compactor["rounds"] >= 2
    # each rank waited halfway for a part the compactor wrote
    assert all(r["saw_compaction"] for r in written.reports), "no part while writing"
    assert written.compactor["removed"] > 0
    attempts = tracklake.query("SELECT rank, attempt, status FROM run_attempts ORDER BY rank",
                               root=written.root).to_pylist()
    assert attempts == [{"rank": r, "attempt": 1, "status": "finished"} for r in range(RANKS)]


def test_readers_during_writing_and_compaction_never_saw_a_duplicate_or_lost_row(
        written: Written) -> None:
    """While writers and the compactor ran, SQL counts only grew and never held a duplicate;
    an incremental cursor delivered every value exactly once across all the compactions."""
    seen = written.seen
    assert len(seen.query_counts) >= 1 and seen.cursor_rounds >= 1, "no reads overlapped writing"
    previous: dict[int, int] = {}
    for counts in seen.query_counts:
        for rank, (n, distinct) in counts.items():
            assert n == distinct, f"duplicate rows visible for rank {rank}: {n} vs {distinct}"
            assert n <= VALUES_PER_RANK
            assert n >= previous.get(rank, 0), "rows visible earlier disappeared"
            previous[rank] = n
    assert seen.cursor_duplicates == 0
    assert seen.problems == []
    assert seen.cursor_rows == RANKS * VALUES_PER_RANK
    assert seen.cursor_values == {(r, s, f"k{k}"): value_of(r, s, k)
                                  for r in range(RANKS) for s in range(STEPS)
                                  for k in range(KEYS)}


def test_metrics_view_has_exact_counts_and_closed_form_sums(written: Written) -> None:
    """(a) DuckDB `metrics`: per rank 3000*8 rows, each value exact, sums match the formula,
    over the mix of Parquet parts and live segments the concurrent compactor left."""
    _assert_metrics_exact(written.root, "metrics")
    _assert_metrics_exact(written.root, "metrics_all")
    _assert_texts_and_generations(written.root)
    summaries = tracklake.query(
        "SELECT rank, key, count, first_step, last_step, last_value FROM metric_summaries "
        "ORDER BY rank, key", root=written.root).to_pylist()
    assert summaries == [{"rank": r, "key": f"k{k}", "count": STEPS, "first_step": 0,
                          "last_step": STEPS - 1, "last_value": value_of(r, STEPS - 1, k)}
                         for r in range(RANKS) for k in range(KEYS)]


def test_read_run_returns_every_value_once(written: Written) -> None:
    """(b) `read_run` with a fresh cursor yields each (rank, step, key) once with its value,
    and reading again from the advanced cursor yields nothing."""
    cursor = _read_run_exact(written.root)
    assert list(tracklake.read_run(written.root, cursor)) == []


def test_final_compaction_keeps_counts_and_values(written: Written, tmp_path: Path) -> None:
    """(c) After `compact()` only Parquet parts remain; SQL and read_run give the same exact
    data, a cursor taken before compaction stays valid, and compacting again is a no-op."""
    root = _fresh_copy(written, tmp_path)
    before = _read_run_exact(root)
    report = tracklake.compact(root=root)
    assert report.skipped == []
    assert _segments(root) == [], "finished writers' segments must all be compacted"
    assert _parts(root)
    _assert_metrics_exact(root, "metrics")
    _assert_texts_and_generations(root)
    _read_run_exact(root)
    # the cursor from before compaction resumes at the end: nothing is delivered twice
    assert list(tracklake.read_run(root, before)) == []
    again = tracklake.compact(root=root)
    assert again.parts_written == [] and again.segments_removed == []


def test_plain_parquet_readers_agree_after_compaction(
        written: Written, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compacted parts are ordinary hive-partitioned Parquet: pyarrow.parquet,
    pyarrow.dataset and duckdb.read_parquet all count exactly what tracklake counts, once
    the parts merges replaced are gone (here at once: TRACKLAKE_PART_GRACE=0; within a
    grace period, docs/format.md's listing rule leaves them out, test_replaced_parts.py)."""
    monkeypatch.setenv("TRACKLAKE_PART_GRACE", "0")
    root = _fresh_copy(written, tmp_path)
    tracklake.compact(root=root)
    assert _segments(root) == []
    metrics_dir = root / "metrics"

    dataset = ds.dataset(metrics_dir, format="parquet", partitioning="hive")
    table = dataset.to_table()
    assert table.num_rows == RANKS * VALUES_PER_RANK
    by_rank = table.group_by("rank").aggregate([("value", "count"), ("value", "sum")])
    got = {r: (n, s) for r, n, s in zip(by_rank.column("rank").to_pylist(),
                                        by_rank.column("value_count").to_pylist(),
                                        by_rank.column("value_sum").to_pylist(),
                                        strict=True)}
    assert got == {r: (VALUES_PER_RANK, float(expected_sum(r))) for r in range(RANKS)}
    assert set(table.column("run").to_pylist()) == {RUN}
    assert set(table.column("project").to_pylist()) == {PROJECT}

    rank3 = pq.read_table(metrics_dir, partitioning="hive", filters=[("rank", "=", 3)])
    assert rank3.num_rows == VALUES_PER_RANK
    assert sorted(rank3.column("value").to_pylist()) == sorted(
        value_of(3, s, k) for s in range(STEPS) for k in range(KEYS))

    for part in _parts(root):
        meta = pq.read_schema(part).metadata
        assert meta[b"tracklake.format"] == tracklake.FORMAT_VERSION.encode()

    con = duckdb.connect()
    try:
        rows = con.execute(f"""
            SELECT rank, count(*), CAST(sum(value) AS HUGEINT), count(DISTINCT (step, key))
            FROM read_parquet('{metrics_dir}/**/*.parquet', hive_partitioning = true)
            GROUP BY rank ORDER BY rank""").fetchall()
        assert rows == [(r, VALUES_PER_RANK, expected_sum(r), VALUES_PER_RANK)
                        for r in range(RANKS)]
        texts = con.execute(f"""
            SELECT count(*), count(DISTINCT (rank, step))
            FROM read_parquet('{root / "texts"}/**/*.parquet', hive_partitioning = true)
            """).fetchone()
        assert texts == (RANKS * TEXTS_PER_RANK, RANKS * TEXTS_PER_RANK)
        gens = con.execute(f"""
            SELECT count(*) FROM read_parquet('{root / "generations"}/**/*.parquet',
                                              hive_partitioning = true)""").fetchone()
        assert gens == (RANKS * GENERATIONS_PER_RANK,)
    finally:
        con.close()


# -- targeted interleavings --------------------------------------------------------------

EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # the Arrow IPC end-of-stream marker


def _eos_tail_candidates() -> list[list[dict[str, float]]]:
    """Metric logs (one dict per step) after which a live segment ends in the EOS bytes.

    - uncompressed batches end with the last float64: make it the subnormal whose bytes
      are ff ff ff ff 00 00 00 00;
    - zstd-compressed batches: an incompressible value buffer of 8224..16383 doubles is
      stored as one raw zstd block (12-byte frame header, 8-byte length prefix), so the
      8-byte-padded buffer ends with the last double's high 4 bytes and 4 zero bytes:
      make those ff ff ff ff (a NaN with a payload).
    """
    subnormal = struct.unpack("<d", EOS)[0]
    plain = [{"a": float(step), "b": subnormal} for step in range(10)]
    rng = random.Random(7)
    noise = [{f"k{k}": struct.unpack("<d", rng.randbytes(8))[0] for k in range(8)}
             for _ in range(1250)]
    noise[-1]["k7"] = struct.unpack("<d", b"\x00\x00\x00\x00\xff\xff\xff\xff")[0]
    return [plain, noise]


def _run_with_eos_looking_live_segment(root: Path) -> tuple[tracklake.Run, int]:
    """A running Run whose live metrics segment ends in the EOS bytes, and its step count."""
    for i, steps in enumerate(_eos_tail_candidates()):
        run = tracklake.init(project="p", run_id=f"eos-{i}", root=root, flush_interval=3600,
                             capture_identity=False)
        for step, values in enumerate(steps):
            run.log(values, step=step)
        assert run.flush()
        (segment,) = (root / "metrics" / "project=p" / f"run=eos-{i}").rglob("*seg-*.arrows")
        if segment.read_bytes()[-8:] == EOS:
            return run, len(steps)
        run.finish()
    pytest.skip("could not craft a live segment ending in the end-of-stream bytes")


def test_live_segment_whose_tail_looks_like_eos_is_not_compacted(root: Path) -> None:
    """Compacting while a writer runs must not touch the segment it still appends to, even
    when the bytes written last happen to equal the end-of-stream marker."""
    run, steps = _run_with_eos_looking_live_segment(root)
    values_before = tracklake.query(f"SELECT count(*) AS n FROM metrics WHERE run = '{run.id}'",
                                    root=root).column("n").to_pylist()[0]
    tracklake.compact(root=root)
    for step in range(steps, steps + 10):
        run.log({"after": float(step)}, step=step)
    assert run.flush()
    report = run.finish()
    assert report.complete
    count = tracklake.query(f"SELECT count(*) AS n FROM metrics WHERE run = '{run.id}'",
                            root=root)
    assert count.column("n").to_pylist() == [values_before + 10]


def test_overlapping_compactions_neither_crash_nor_duplicate(root: Path,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    """A second compaction that completes while the first is between reading segments and
    writing its part (simulated deterministically) must not lead to double counting."""
    import tracklake._ops.compact as compact_mod

    run = tracklake.init(project="p", run_id="cc", root=root, flush_interval=3600,
                         segment_bytes=1, capture_identity=False)  # every flush rolls
    step = 0
    for _ in range(3):
        run.log({"x": float(step)}, step=step)
        step += 1
        assert run.flush()
    real_write_part = compact_mod.write_sorted_part
    nested = {"done": False}

    def write_part_after_another_compaction(*args: Any, **kwargs: Any) -> Path | None:
        if not nested["done"]:
            nested["done"] = True
            nonlocal step
            run.log({"x": float(step)}, step=step)  # the writer moves on meanwhile
            step += 1
            assert run.flush()
            compact_mod.compact(root=root)  # the other compactor, start to finish
        return real_write_part(*args, **kwargs)

    monkeypatch.setattr(compact_mod, "write_sorted_part", write_part_after_another_compaction)
    problem: BaseException | None = None
    try:
        compact_mod.compact(root=root)
    except FileNotFoundError as exc:
        problem = exc
    monkeypatch.undo()
    assert nested["done"]
    run.finish()
    n = tracklake.query("SELECT count(*) AS n, count(DISTINCT step) AS d FROM metrics",
                        root=root).to_pylist()
    assert n == [{"n": step, "d": step}], "records counted twice after overlapping parts"
    assert problem is None, f"the overlapping compaction crashed: {problem!r}"
