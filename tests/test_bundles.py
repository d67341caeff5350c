"""Bundles are derived: a store read through them answers exactly as its parts do (resumed
runs, a key logged twice at one step, numeric-looking run ids, two projects), a bundle
holds its sources' rows as plain pyarrow reads them, a run dropped or written again after
bundling is read from its own files, a damaged bundle is deleted and never noted as
lost data, one builder works at a time, and a reader starts one by itself."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from _settled import age

import tracklake
from tracklake._format.part import open_part, write_part_stream
from tracklake._ops import bundle
from tracklake._ops.bundle import build_bundles
from tracklake._ops.claims import hold_claim
from tracklake._read import bundles
from tracklake._read.bundles import BUNDLE_DIR, bundle_paths, read_bundle
from tracklake._read.query import connect
from tracklake._read.reader import ReadProblems

QUESTIONS = (
    "SELECT project, run, rank, key, arg_max(value, (step, seq)) AS last FROM metrics "
    "GROUP BY ALL ORDER BY ALL",
    "SELECT project, run, max(value) AS top FROM metrics WHERE key = 'loss' "
    "GROUP BY ALL ORDER BY ALL",
    "SELECT project, run, count(*) AS points FROM metrics GROUP BY ALL ORDER BY ALL",
    "SELECT count(*) FROM metrics_all",
    "SELECT project, run, key, count, min, max, last_value FROM metric_summaries "
    "ORDER BY ALL",
)


def _write(root: Path, project: str, run_id: str, steps: range, scale: float = 1.0) -> None:
    with tracklake.init(project=project, run_id=run_id, root=root, compact=False,
                        capture_identity=False) as run:
        for step in steps:
            run.log({"loss": scale * step, "acc": step / 10}, step=step)
        run.log({"loss": -scale}, step=steps[-1])  # the same key twice at one step


def _store(root: Path, runs: int = 6) -> None:
    for project in ("a", "b"):
        for i in range(runs):
            _write(root, project, f"{i:04d}", range(5 + i), scale=i + 1)
    _write(root, "a", "0000", range(3, 9), scale=7)  # resumed: steps 3.. again
    tracklake.compact(root=root)
    age(root)


def _answers(root: Path) -> list[pa.Table]:
    return [tracklake.query(sql, root=root) for sql in QUESTIONS]


def _unbundled(root: Path, tmp_path: Path) -> list[pa.Table]:
    """The answers of a copy of the store without bundles or catalog."""
    copy = tmp_path / "copy"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns(".cache"))
    return _answers(copy)


def _read_through(root: Path) -> tuple[int, int]:
    """(bundles, parts) a connection over everything reads."""
    con = connect(root)
    try:
        return (con.execute("SELECT count(*) FROM _tracklake_bundles").fetchall()[0][0],
                con.execute("SELECT count(*) FROM _tracklake_parts WHERE path LIKE "
                            "'%/metrics/%'").fetchall()[0][0])
    finally:
        con.close()


@pytest.fixture
def few(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bundle groups of a few runs, and no builder started by readers."""
    monkeypatch.setattr(bundle, "BUNDLE_MIN_RUNS", 3)
    monkeypatch.setattr(bundles, "BUILD_MIN_RUNS", 10**9)


def test_a_bundled_store_answers_as_its_parts(tmp_path: Path, few: None) -> None:
    root = tmp_path / "store"
    _store(root)
    expected = _unbundled(root, tmp_path)
    assert _answers(root) == expected  # catalogued, not yet bundled
    report = tracklake.compact(root=root).bundles
    assert report is not None and len(report.written) == 2  # one per project
    assert report.runs == 12 and not report.busy
    assert {read_bundle(p).project for p in bundle_paths(root)} == {"a", "b"}
    used, parts = _read_through(root)
    assert used == 2 and parts == 0
    assert _answers(root) == expected
    # one project's question reads that project's bundle only
    answer = tracklake.query("SELECT DISTINCT project FROM metrics WHERE project = 'b'",
                             root=root)
    assert answer.column("project").to_pylist() == ["b"]


def _pages(path: Path, column: str) -> list[int]:
    """How many pages each row group's chunk of `column` holds, by walking their headers
    from where plain pyarrow's metadata says the chunk starts."""
    from tracklake._format.page_headers import page_header

    meta, data = pq.ParquetFile(path).metadata, path.read_bytes()
    counts = []
    for g in range(meta.num_row_groups):
        chunk = meta.row_group(g).column(meta.schema.names.index(column))
        start = chunk.dictionary_page_offset or chunk.data_page_offset
        pos, end, pages = start, start + chunk.total_compressed_size, 0
        while pos < end:
            _, compressed, length = page_header(memoryview(data)[pos:end])
            pos, pages = pos + length + compressed, pages + 1
        counts.append(pages)
    return counts


def test_a_bundle_holds_a_row_group_in_as_few_pages_as_their_size_allows(
        tmp_path: Path, few: None) -> None:
    """A bundle is scanned whole, and its pages' headers are walked by each process that
    opens it: pages cut every 20,000 rows (pyarrow's default) made 2,032 headers of a
    4 M-row bundle, 448 without."""
    from tracklake._format.part import _few_pages

    root = tmp_path / "store"
    for i in range(3):  # 3 runs x 7,000 steps of one key: one row group of 21,000 rows
        with tracklake.init(project="a", run_id=f"r{i}", root=root, compact=False,
                            capture_identity=False, system_metrics=False) as run:
            for step in range(7000):
                run.log({"loss": step + i}, step=step)
    tracklake.compact(root=root)
    age(root)
    expected = _unbundled(root, tmp_path)
    report = tracklake.compact(root=root).bundles
    assert report is not None and len(report.written) == 1
    [path] = bundle_paths(root)
    assert pq.ParquetFile(path).metadata.num_rows == 21_000
    pages = _pages(path, "step")  # 21,000 int64 deltas: far under the page size
    assert pages == ([1] if _few_pages(pq) else [2])
    assert _answers(root) == expected


def test_projects_of_too_few_runs_are_bundled_together(tmp_path: Path, few: None) -> None:
    """Bundles were made per project: a store of many small projects (a sweep in a
    project each) had none, and every question read every run's parts."""
    from tracklake._ops.retention import Policy, apply_plan, make_plan

    root = tmp_path / "store"
    for i in range(4):  # "a" makes a group of its own; five projects of one run do not
        _write(root, "a", f"{i:04d}", range(5 + i), scale=i + 1)
    for j in range(5):
        _write(root, f"solo{j}", "0000", range(3 + j), scale=10 + j)
    tracklake.compact(root=root)
    age(root)
    expected = _unbundled(root, tmp_path)
    report = tracklake.compact(root=root).bundles
    assert report is not None and report.runs == 9
    held = {read_bundle(p).project: read_bundle(p) for p in bundle_paths(root)}
    assert set(held) == {"a", bundle.POOLED}
    pooled = pq.read_table(held[bundle.POOLED].path)
    assert set(pooled.column("project").to_pylist()) == {f"solo{j}" for j in range(5)}
    assert _read_through(root) == (2, 0)  # every run read from the two bundles
    assert _answers(root) == expected
    for j in range(5):  # a question about one project reads its own parts, not the pool
        sql = ("SELECT run, step, value FROM metrics WHERE project = $p ORDER BY ALL")
        got = tracklake.query(sql, root=root, params={"p": f"solo{j}"}).to_pylist()
        assert got == tracklake.query(sql, root=tmp_path / "copy",
                                      params={"p": f"solo{j}"}).to_pylist()
        assert len(got) == 2 * (3 + j) + 1  # loss and acc a step, loss twice at the last
    # retention dropping one pooled run deletes the pool, and the others read on
    plan = make_plan(root, Policy(max_age=0.0), time.time())
    plan.actions = [a for a in plan.actions if (a.project, a.run) == ("solo2", "0000")]
    assert plan.actions
    apply_plan(root, plan, time.time())
    assert not held[bundle.POOLED].path.exists() and held["a"].path.exists()
    assert _answers(root) == _unbundled(root, tmp_path)


def test_a_bundle_holds_its_sources_rows(tmp_path: Path, few: None) -> None:
    root = tmp_path / "store"
    _store(root)
    tracklake.compact(root=root)
    for path in bundle_paths(root):
        b = read_bundle(path)
        table = pq.read_table(path)  # plain pyarrow: the partition columns are stored
        assert set(table.column("project").to_pylist()) == {b.project}
        for source, _ in b.sources:
            rank, attempt = (int(x.split("=")[1]) for x in source.split("/")[3:5])
            run = source.split("/")[2].removeprefix("run=")
            mine = table.filter(pc.and_(pc.equal(table["run"], run), pc.and_(
                pc.equal(table["rank"], rank), pc.equal(table["attempt"], attempt))))
            own = pq.read_table(root / source).sort_by([("seq", "ascending")])
            assert mine.sort_by([("seq", "ascending")]).select(own.column_names) \
                .cast(own.schema) == own
        assert pq.ParquetFile(path).metadata.row_group(0).sorting_columns


def test_a_bundle_naming_a_directory_as_its_source_is_not_used(
        tmp_path: Path, few: None) -> None:
    """A bundle planted with its values forged, whose source is a run's directory with
    the mtime it has: it covers no part, so had it been used its rows would have been
    read beside the run's own parts. A bundle's sources are compared with the catalog's
    parts alone."""
    import json

    from tracklake._read.bundles import BUNDLE_ORDER

    root = tmp_path / "store"
    _store(root)
    expected = _unbundled(root, tmp_path)
    tracklake.compact(root=root)
    [b] = [read_bundle(p) for p in bundle_paths(root) if read_bundle(p).project == "b"]
    table = pq.read_table(b.path)
    table = table.set_column(table.schema.get_field_index("value"), "value",
                             pc.multiply(table["value"], 1000.0))
    directory = "metrics/project=b/run=0000"
    manifest = json.dumps({"project": "b", "sources": [
        [directory, (root / directory).stat().st_mtime_ns]]})
    table = table.replace_schema_metadata({**table.schema.metadata,
                                           bundle.BUNDLE_KEY.encode(): manifest.encode()})
    b.path.unlink()
    write_part_stream(b.path.with_name("bundle-planted.parquet"), table.schema, [table],
                      "metrics", order=BUNDLE_ORDER)
    assert read_bundle(b.path.with_name("bundle-planted.parquet")).sources[0][0] == directory
    assert _answers(root) == expected
    assert _read_through(root)[0] == 1  # project a's bundle, not the planted one


def test_a_run_dropped_or_written_again_is_read_from_its_files(
        tmp_path: Path, few: None) -> None:
    root = tmp_path / "store"
    _store(root)
    tracklake.compact(root=root)
    shutil.rmtree(root / "metrics" / "project=b" / "run=0002")
    shutil.rmtree(root / "runs" / "project=b" / "run=0002")
    for what in ("metrics", "runs"):
        shutil.rmtree(root / what / "project=a" / "run=0003")
    _write(root, "a", "0003", range(4), scale=100)  # same id, other values
    tracklake.compact(root=root, project="a")
    age(root)
    expected = _unbundled(root, tmp_path)
    assert _answers(root) == expected
    assert tracklake.query("SELECT max(value) FROM metrics WHERE run = '0003' AND "
                           "project = 'a' AND key = 'loss'", root=root)[0][0].as_py() == 300
    assert _read_through(root)[0] == 0  # neither bundle is vouched for any more
    report = build_bundles(root)  # the next builder replaces them
    assert len(report.removed) == 2 and len(report.written) == 2
    assert _read_through(root) == (2, 0)
    assert _answers(root) == expected


def test_a_damaged_bundle_is_deleted_and_the_parts_answer(tmp_path: Path, few: None) -> None:
    root = tmp_path / "store"
    _store(root)
    tracklake.compact(root=root)
    expected = _unbundled(root, tmp_path)
    path = bundle_paths(root)[0]
    chunk = pq.ParquetFile(path).metadata.row_group(0).column(
        pq.ParquetFile(path).schema_arrow.names.index("value"))
    data = bytearray(path.read_bytes())
    # the last byte of the value column's last page of the first row group
    data[chunk.data_page_offset + chunk.total_compressed_size - 1] ^= 0xFF
    path.write_bytes(bytes(data))
    assert _read_through(root)[0] == 2
    problems = ReadProblems()
    answers = [tracklake.query(sql, root=root, problems=problems) for sql in QUESTIONS]
    assert answers == expected
    assert not problems.damaged  # a derived copy: nothing was lost
    assert not path.exists()


def test_one_builder_at_a_time(tmp_path: Path, few: None) -> None:
    root = tmp_path / "store"
    _store(root)
    (root / BUNDLE_DIR).mkdir(parents=True, exist_ok=True)
    with hold_claim(root / BUNDLE_DIR) as claim:
        assert claim is not None
        report = build_bundles(root)
    assert report.busy and not report.written and not bundle_paths(root)
    assert len(build_bundles(root).written) == 2


def test_compacting_an_idle_stream_leaves_its_directory_as_it_was(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _write(root, "a", "0000", range(5))
    tracklake.compact(root=root)
    age(root)
    stream = next((root / "metrics").glob("*/*/*/*"))
    before = stream.stat().st_mtime_ns
    report = tracklake.compact(root=root, project="a")
    assert not report.parts_written and stream.stat().st_mtime_ns == before


def test_a_reader_starts_a_builder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "store"
    runs = bundle.BUNDLE_MIN_RUNS  # the builder process keeps its own threshold
    for i in range(runs):
        _write(root, "p", f"r{i:03d}", range(3))
    tracklake.compact(root=root, project="p")
    age(root)
    monkeypatch.setattr(bundles, "BUILD_MIN_RUNS", runs)
    # questions over the values (`count(*)` alone the summaries answer, which no bundle
    # holds): the first catalogues the runs, the second starts the builder
    values = "SELECT count(value) FROM metrics"
    tracklake.query(values, root=root)
    assert not bundle_paths(root)
    expected = tracklake.query(values, root=root)
    deadline = time.monotonic() + 60
    while not (root / BUNDLE_DIR / bundles.CHECKED).exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(bundle_paths(root)) == 1
    assert _read_through(root) == (1, 0)
    assert tracklake.query(values, root=root) == expected
    # it looked less than BUILD_EVERY_SECONDS ago: no other builder starts
    assert not bundles.start_builder(root, 10**6)


def test_retention_deletes_the_bundles_holding_a_run_it_drops(
        tmp_path: Path, few: None) -> None:
    """A bundle is a copy: a run deleted by retention must not live on in one."""
    from tracklake._ops.retention import Policy, apply_plan, make_plan

    root = tmp_path / "store"
    _store(root)
    tracklake.compact(root=root)
    held = {read_bundle(p).project: p for p in bundle_paths(root)}
    plan = make_plan(root, Policy(max_age=0.0), time.time())
    doomed = {(a.project, a.run) for a in plan.actions if a.verb == "delete"}
    assert ("b", "0001") in doomed
    plan.actions = [a for a in plan.actions if (a.project, a.run) == ("b", "0001")]
    apply_plan(root, plan, time.time())
    assert not held["b"].exists() and held["a"].exists()
    for path in bundle_paths(root):
        assert not any("project=b/run=0001/" in p for p in read_bundle(path).paths)
    expected = _unbundled(root, tmp_path)
    assert _answers(root) == expected
    assert "0001" not in tracklake.query(
        "SELECT DISTINCT run FROM metrics WHERE project = 'b'", root=root
    ).column("run").to_pylist()


def test_a_group_whose_part_changes_while_it_is_copied_is_not_kept(
        tmp_path: Path, few: None, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "store"
    _store(root)
    real = bundle.read_part_table
    touched: list[Path] = []

    def read_then_touch(path: Path) -> pa.Table:
        table = real(path)
        if not touched and "project=b" in str(path):
            os.utime(path)  # as a downsampling rename or a retention drop would change it
            touched.append(path)
        return table

    monkeypatch.setattr(bundle, "read_part_table", read_then_touch)
    report = build_bundles(root)
    assert report.changed == 1 and len(report.written) == 1
    assert {read_bundle(p).project for p in bundle_paths(root)} == {"a"}
    assert not [n for n in os.listdir(root / BUNDLE_DIR) if n.endswith(".tmp")]


def test_bundles_can_be_turned_off(tmp_path: Path, few: None,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "store"
    _store(root)
    monkeypatch.setenv("TRACKLAKE_BUNDLES", "off")
    report = tracklake.compact(root=root).bundles
    assert report is not None and report.disabled and not bundle_paths(root)
    assert not bundles.start_builder(root, 10**6)


def _flip_a_value_page_byte(path: Path) -> None:
    meta = pq.ParquetFile(path).metadata
    chunk = meta.row_group(0).column(pq.ParquetFile(path).schema_arrow.names.index("value"))
    data = bytearray(path.read_bytes())
    data[chunk.data_page_offset + chunk.total_compressed_size - 1] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_damaged_part_keeps_only_its_run_out_of_a_bundle(tmp_path: Path, few: None) -> None:
    """Damage the catalog cannot see (a part whose footer carries its summary, so readers
    listing the store never read its pages) is met by the builder: that run stays out."""
    import numpy as np

    root = tmp_path / "store"
    values = np.random.default_rng(7).random(4000).tolist()  # incompressible: a summary
    for i in range(4):
        with tracklake.init(project="c", run_id=f"r{i}", root=root, compact=False,
                            capture_identity=False) as run:
            for step, value in enumerate(values):
                run.log({"loss": value + i}, step=step)
    tracklake.compact(root=root, project="c")
    age(root)
    broken = next((root / "metrics" / "project=c" / "run=r2").rglob("*.parquet"))
    assert open_part(broken).metadata.metadata.get(b"tracklake.summary") is not None
    mtime = broken.stat().st_mtime_ns
    _flip_a_value_page_byte(broken)
    os.utime(broken, ns=(mtime, mtime))  # as bit rot leaves it: the catalog still vouches
    report = build_bundles(root)
    assert report.damaged == [str(broken.relative_to(root))]
    assert len(report.written) == 1 and report.runs == 3
    (b,) = [read_bundle(p) for p in bundle_paths(root)]
    assert not any("run=r2/" in p for p in b.paths) and len(b.paths) == 3


def test_the_compact_command_says_what_it_bundled(tmp_path: Path, few: None) -> None:
    from click.testing import CliRunner

    from tracklake._cli.main import main

    root = tmp_path / "store"
    for project in ("a", "b"):
        for i in range(4):
            _write(root, project, f"{i:04d}", range(5))
    tracklake.compact(root=root, project="a")  # settled only after the compaction
    tracklake.compact(root=root, project="b")
    age(root)
    result = CliRunner().invoke(main, ["compact", "--root", str(root)])
    assert result.exit_code == 0, result.output
    assert "bundled 8 small runs, 88 values, into 2 bundles" in result.output
    again = CliRunner().invoke(main, ["compact", "--root", str(root)])
    assert again.exit_code == 0 and "bundled" not in again.output  # nothing new


def test_a_damaged_bundle_the_reader_cannot_delete_is_passed_over(
        tmp_path: Path, few: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store this reader may not change (a read-only mount): the answer still comes
    from the parts, and the bundle stays where it is."""
    from tracklake._read import query as query_module

    root = tmp_path / "store"
    _store(root)
    tracklake.compact(root=root)
    expected = _unbundled(root, tmp_path)
    path = bundle_paths(root)[0]
    _flip_a_value_page_byte(path)
    real_unlink = os.unlink

    def refuse_bundles(target: str | os.PathLike[str], *args: object, **kw: object) -> None:
        if str(BUNDLE_DIR) in str(target):
            raise PermissionError(13, "Read-only file system", str(target))
        real_unlink(target, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(query_module.os, "unlink", refuse_bundles)
    problems = ReadProblems()
    assert [tracklake.query(q, root=root, problems=problems) for q in QUESTIONS] == expected
    assert not problems.damaged and path.exists()


def test_a_bundle_removed_while_a_question_runs_is_asked_again_without_it(
        tmp_path: Path, few: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from tracklake._read import query as query_module

    root = tmp_path / "store"
    _store(root)
    tracklake.compact(root=root)
    assert bundle_paths(root)
    expected = _unbundled(root, tmp_path)
    real_connect = query_module._connect
    calls: list[int] = []

    def connect_then_remove(*args: object, **kw: object) -> object:
        con = real_connect(*args, **kw)  # type: ignore[arg-type]
        if not calls:  # as a builder replacing it would, after the reader listed it
            for path in bundle_paths(root):
                path.unlink()
        calls.append(1)
        return con

    monkeypatch.setattr(query_module, "_connect", connect_then_remove)
    assert tracklake.query(QUESTIONS[0], root=root) == expected[0]
    assert len(calls) == 2


def test_runs_a_builder_left_out_start_no_new_builder(
        tmp_path: Path, few: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store of runs too large to bundle is not looked at again every ten minutes."""
    root = tmp_path / "store"
    _store(root)
    monkeypatch.setattr(bundle, "RUN_MAX_VALUES", 0)  # nothing is small enough
    report = build_bundles(root)
    assert not report.written
    checked = root / BUNDLE_DIR / bundles.CHECKED
    long_ago = time.time() - bundles.BUILD_EVERY_SECONDS - 60
    os.utime(checked, (long_ago, long_ago))
    started: list[list[str]] = []
    monkeypatch.setattr(bundles.subprocess, "Popen",
                        lambda argv, **kw: started.append(argv))
    monkeypatch.setattr(bundles, "BUILD_MIN_RUNS", 3)
    assert not bundles.start_builder(root, 12)  # the 12 runs it left out
    assert bundles.start_builder(root, 15) and len(started) == 1  # three new ones


def test_an_outdated_bundle_the_builder_may_not_delete_stays_unused(
        tmp_path: Path, few: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store shared by several users: another user's bundle cannot be deleted here."""
    root = tmp_path / "store"
    _store(root)
    tracklake.compact(root=root)
    theirs = {read_bundle(p).project: p for p in bundle_paths(root)}["b"]
    for what in ("metrics", "runs"):
        shutil.rmtree(root / what / "project=b" / "run=0002")
    real_unlink = Path.unlink

    def refuse(self: Path, missing_ok: bool = False) -> None:
        if self == theirs:
            raise PermissionError(13, "Permission denied", str(self))
        real_unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", refuse)
    report = build_bundles(root)
    assert theirs.exists() and theirs not in report.removed
    assert len(report.written) == 1  # project b again, without run 0002
    assert _answers(root) == _unbundled(root, tmp_path)


_RESUMER = """
import sys, tracklake
root, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    run_id = f"{(i * 7) % 12:04d}"
    with tracklake.init(project="a", run_id=run_id, root=root, compact=False,
                        capture_identity=False) as run:
        for step in range(3):
            run.log({"loss": 1000.0 + i, "acc": float(step)}, step=100 + step)
"""


def test_bundling_and_asking_while_runs_are_resumed_never_fails_and_ends_exact(
        tmp_path: Path, few: None) -> None:
    """A writer resumes runs (new attempts) while compaction merges their parts, a builder
    bundles and readers ask: no question fails, and once all is quiet a bundled answer
    equals the parts' answer."""
    import subprocess
    import sys

    root = tmp_path / "store"
    for i in range(12):
        _write(root, "a", f"{i:04d}", range(5 + i))
    tracklake.compact(root=root)
    age(root)
    build_bundles(root)
    writer = subprocess.Popen([sys.executable, "-c", _RESUMER, str(root), "24"])
    asked = 0
    try:
        while writer.poll() is None:
            tracklake.compact(root=root, project="a")  # merges the resumed runs' parts
            build_bundles(root)
            for sql in QUESTIONS:
                tracklake.query(sql, root=root)  # raises if anything goes wrong
                asked += 1
    finally:
        writer.wait(timeout=120)
    assert writer.returncode == 0 and asked
    tracklake.compact(root=root)
    age(root)
    build_bundles(root)
    assert _read_through(root)[0] >= 1  # bundles are in use again
    assert _answers(root) == _unbundled(root, tmp_path)


def test_a_file_in_the_bundle_directory_with_other_columns_is_never_read(
        tmp_path: Path, few: None) -> None:
    """A crafted or foreign file with a bundle's name and a real bundle's manifest, but
    other columns, would fail every question that read it: it is not taken for one."""
    root = tmp_path / "store"
    _store(root)
    tracklake.compact(root=root)
    expected = _unbundled(root, tmp_path)
    real = bundle_paths(root)[0]
    table = pq.read_table(real)  # its metadata: format version, kind and manifest
    crafted = table.drop_columns(["attempt"]).replace_schema_metadata(table.schema.metadata)
    real.unlink()
    forged = real.with_name("bundle-crafted.parquet")
    # checksums and all, as a forger would write it
    write_part_stream(forged, crafted.schema, [crafted], "metrics",
                      order=("key", "project", "run", "rank"))
    assert open_part(forged).metadata.metadata[bundles.BUNDLE_KEY.encode()]
    with pytest.raises(tracklake.FormatError, match="not a bundle: its columns"):
        read_bundle(forged)
    assert _answers(root) == expected
    assert _read_through(root)[0] == 1  # the other project's bundle only


def test_a_builder_killed_at_random_points_leaves_a_store_the_next_one_bundles(
        tmp_path: Path) -> None:
    """SIGKILL of the builder process (as a reader starts it) at random moments: no
    half-written bundle is ever read, the next builder breaks the dead one's claim, and
    the answers stay exact."""
    import random
    import signal
    import subprocess
    import sys

    root = tmp_path / "store"
    for i in range(bundle.BUNDLE_MIN_RUNS + 4):
        _write(root, "p", f"{i:04d}", range(4 + i % 5))
    tracklake.compact(root=root, project="p")
    age(root)
    expected = _unbundled(root, tmp_path)
    rng = random.Random(20261202)
    for _ in range(6):  # a builder here takes about 0.6 s, imports included
        builder = subprocess.Popen([sys.executable, "-m", bundles.BUILD_MODULE, str(root)])
        time.sleep(rng.uniform(0.1, 0.8))
        builder.send_signal(signal.SIGKILL)
        builder.wait()
        assert _answers(root) == expected  # whatever it left, readers answer exactly
        for path in bundle_paths(root):
            read_bundle(path)  # a bundle in place is whole
    report = build_bundles(root)  # past a dead builder's claim, if one was left
    assert not report.busy
    assert _read_through(root) == (1, 0)
    assert _answers(root) == expected


def test_where_mtimes_lie_a_setting_reads_every_run_from_its_files(
        tmp_path: Path, few: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file system that keeps a directory's modification time when a run changes (as
    one that lies, or a cache that never expires, shows it): the catalog and bundles
    vouch for the run as it was; with TRACKLAKE_TRUST_MTIMES=0 every answer comes from
    the files, and is the new one."""
    root = tmp_path / "store"
    _store(root)
    tracklake.compact(root=root)
    assert _read_through(root)[0] == 2
    run_dir = root / "metrics" / "project=b" / "run=0001" / "rank=0"
    dirs = [run_dir, root / "runs" / "project=b" / "run=0001" / "rank=0"]
    times = [(d.stat().st_atime_ns, d.stat().st_mtime_ns) for d in dirs]
    _write(root, "b", "0001", range(2), scale=1000)  # attempt 2: steps 0 and 1 again
    tracklake.compact(root=root, project="b", run="0001")
    for d, (atime, mtime) in zip(dirs, times, strict=True):
        os.utime(d, ns=(atime, mtime))  # the lie
    question = ("SELECT value FROM metrics WHERE project = 'b' AND run = '0001' AND "
                "key = 'loss' AND step = 1")
    assert tracklake.query(question, root=root).column("value").to_pylist() == [2.0]
    monkeypatch.setenv("TRACKLAKE_TRUST_MTIMES", "0")
    assert tracklake.query(question, root=root).column("value").to_pylist() == [
        1000.0, -1000.0]  # attempt 2 logged loss twice at its last step
    assert _read_through(root)[0] == 0
    assert _answers(root) == _unbundled(root, tmp_path)
    monkeypatch.setenv("TRACKLAKE_TRUST_MTIMES", "perhaps")
    with pytest.raises(ValueError, match="TRACKLAKE_TRUST_MTIMES='perhaps'"):
        tracklake.query(question, root=root)


@pytest.mark.parametrize("source", [
    "metrics/project=a/run=0000/rank=x/attempt=1/{name}",  # a rank no writer names
    "metrics/project=b/run=0000/rank=0/attempt=1/{name}",  # another project's part
    "metrics/project=a/run=0000/rank=0/attempt=1/../../../../../../outside/{name}",
    # directories named as a part's are, reached through ".."
    "metrics/project=a/run=0000/rank=0/attempt=1/../../../../../../outside/"
    "project=a/run=0000/rank=0/attempt=1/{name}",
    "metrics/project=a/run=0000/rank=0/attempt=1/..",  # no part's name
])
def test_a_source_no_listing_gives_is_refused_unread(
        tmp_path: Path, few: None, monkeypatch: pytest.MonkeyPatch, source: str) -> None:
    """The sources of a bundle come from the run catalog, a file in ROOT/.cache anyone
    may plant: a path that is not where a part of the project lies is refused before it
    is opened (before, a rank that was not a number stopped the builder with a
    ValueError, and a path leading out of the store was read)."""
    root = tmp_path / "store"
    _store(root)
    part = sorted((root / "metrics" / "project=a" / "run=0000").rglob("part-*.parquet"))[0]
    for directory in (tmp_path / "outside",
                      tmp_path / "outside/project=a/run=0000/rank=0/attempt=1"):
        directory.mkdir(parents=True, exist_ok=True)
        shutil.copy(part, directory / part.name)
    opened: list[Path] = []
    real = bundle.read_part_table

    def spy(path: Path) -> pa.Table:
        opened.append(path)
        return real(path)

    monkeypatch.setattr(bundle, "read_part_table", spy)
    path = source.format(name=part.name)
    with pytest.raises(bundle._Damaged, match="not where a part of a lies"):
        bundle._write_bundle(root, "a", [(path, part.stat().st_mtime_ns)])
    assert opened == []


def test_a_bundle_a_dead_builder_left_aside_is_removed_by_the_next(
        tmp_path: Path, few: None) -> None:
    """A builder killed while it wrote a bundle aside left `.part-bundle-...tmp` behind.
    Only the holder of the bundle directory's claim writes one, so the next holder
    removes it at once, however young, whichever host's process wrote it; other
    temporaries there are left as before."""
    import os

    root = tmp_path / "store"
    _store(root)
    directory = root / BUNDLE_DIR
    directory.mkdir(parents=True, exist_ok=True)
    left = directory / f".part-bundle-{'c' * 24}.parquet.0123456789ab.{os.getpid()}.tmp"
    left.write_bytes(b"half a bundle")
    other = directory / ".other-file.0123456789ab.1.tmp"
    other.write_bytes(b"not a bundle's")
    report = build_bundles(root)
    assert len(report.written) == 2
    assert not left.exists()
    assert other.exists()
    assert sorted(bundle_paths(root)) == sorted(report.written)
