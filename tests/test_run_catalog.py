"""The run catalog is derived: answers with it equal answers read from the files, any run
added, removed, resumed or changed after it was written is read again, a damaged or forged
catalog is ignored and rebuilt, a store the reader cannot write is read without it, and
readers writing it at once leave one whole catalog."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import struct
import time
import zlib
from pathlib import Path

import pyarrow as pa
import pytest
from _crafted import age_catalog, catalog_path, catalogued_table, plant_catalog
from _listings import record_listings
from _settled import age

import tracklake
from tracklake._format.ipc_size import declares_other_than_little_endian
from tracklake._read import catalog, catalog_shards, run_index
from tracklake._read.catalog_shards import CATALOG_DIR, CATALOG_VERSION
from tracklake._read.snapshot import Snapshot

QUESTIONS = (
    "SELECT run, status, attempts, ranks FROM runs ORDER BY run",
    "SELECT run, rank, key, count, min, max, first_step, last_step, last_value "
    "FROM metric_summaries ORDER BY ALL",
    "SELECT run, count(*) AS n, max(step) AS last FROM metrics GROUP BY run ORDER BY run",
    "SELECT run, arg_max(value, step) AS last FROM metrics WHERE key = 'loss' "
    "GROUP BY run ORDER BY run",
)


def _write(root: Path, run_id: str, steps: int = 5, start: int = 0) -> None:
    with tracklake.init(project="p", run_id=run_id, root=root,
                        capture_identity=False) as run:
        for step in range(start, start + steps):
            run.log({"loss": float(step), "acc": step / 10}, step=step)


def _store(root: Path, runs: int = 3) -> None:
    for i in range(runs):
        _write(root, f"r{i}", steps=5 + i)
    tracklake.compact(root=root)
    age(root)


def _answers(root: Path) -> list[pa.Table]:
    return [tracklake.query(sql, root=root) for sql in QUESTIONS]


def _catalogued(root: Path) -> list[str]:
    return sorted(catalogued_table(root).column("run").to_pylist())


def _from_files(root: Path) -> list[pa.Table]:
    """The answers with no catalog (nor decoded-file cache) at all."""
    shutil.rmtree(root / ".cache", ignore_errors=True)
    return _answers(root)


def _assert_same(got: list[pa.Table], expected: list[pa.Table]) -> None:
    for a, b in zip(got, expected, strict=True):
        assert a.equals(b), (a.to_pylist(), b.to_pylist())


def test_answers_with_the_catalog_equal_answers_from_the_files(root: Path) -> None:
    _store(root)
    first = _answers(root)
    assert _catalogued(root) == ["r0", "r1", "r2"]
    again = _answers(root)  # now from the catalog
    _assert_same(again, first)
    _assert_same(_from_files(root), first)
    assert [r["n"] for r in first[2].to_pylist()] == [10, 12, 14]


def test_the_catalog_answers_without_listing_settled_runs(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _store(root)
    expected = _answers(root)
    from tracklake._read import listing

    listed: list[str] = []
    real = listing.listdir_at
    monkeypatch.setattr(listing, "listdir_at",
                        lambda r, rel: listed.append(rel) or real(r, rel))
    _assert_same(_answers(root), expected)
    assert not [d for d in listed if "run=" in d], listed


def test_a_run_added_after_the_catalog_is_seen(root: Path) -> None:
    _store(root)
    _answers(root)
    _write(root, "late", steps=3)  # live, not compacted, not aged
    got = _answers(root)
    assert "late" in [r["run"] for r in got[0].to_pylist()]
    _assert_same(got, _from_files(root))
    assert "late" not in _catalogued(root)  # a live segment: never catalogued


def test_a_removed_run_is_gone(root: Path) -> None:
    _store(root)
    _answers(root)
    for kind in ("metrics", "runs"):
        shutil.rmtree(root / kind / "project=p" / "run=r1")
    got = _answers(root)
    assert [r["run"] for r in got[0].to_pylist()] == ["r0", "r2"]
    assert _catalogued(root) == ["r0", "r2"]
    _assert_same(got, _from_files(root))


def _drop_r1_while_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make run r1 vanish (as retention drops it) after a reader listed its files and
    before it takes the mtimes of its directories."""
    from tracklake._read import fresh

    real = fresh.watched_paths

    def dropped_meanwhile(at: Path, project: str, run: str) -> list[tuple[str, int]]:
        if run == "r1":
            for kind in ("metrics", "runs"):
                shutil.rmtree(at / kind / f"project={project}" / f"run={run}")
        return real(at, project, run)

    monkeypatch.setattr(fresh, "watched_paths", dropped_meanwhile)


def test_a_run_removed_while_a_reader_reads_it_is_not_catalogued_as_it_was(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Retention drops run r1 after a reader listed its files and before it took the
    mtimes of its directories: they are gone, and an entry recording them as absent would
    stay valid, its parts missing, for every later reader."""
    _store(root)
    _drop_r1_while_read(monkeypatch)
    Snapshot(root)  # this reader read r1 whole, then r1 went; it writes the catalog
    monkeypatch.undo()
    assert _catalogued(root) == ["r0", "r2"]
    got = _answers(root)
    assert [r["run"] for r in got[0].to_pylist()] == ["r0", "r2"]
    _assert_same(got, _from_files(root))


def test_a_catalog_naming_a_missing_part_makes_the_reader_list_the_files(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """However a catalog came to name a part that is gone (here: one written without the
    check above), readers do not fail on it: they list the files and write it anew."""
    _store(root)
    _drop_r1_while_read(monkeypatch)
    monkeypatch.setattr(catalog, "_consistent", lambda entry: True)
    Snapshot(root)
    monkeypatch.undo()
    assert _catalogued(root) == ["r0", "r1", "r2"]  # r1's parts are gone
    got = _answers(root)
    assert [r["run"] for r in got[0].to_pylist()] == ["r0", "r2"]
    assert _catalogued(root) == ["r0", "r2"]
    _assert_same(got, _from_files(root))


def test_a_resumed_run_hides_what_its_later_attempt_logged_again(root: Path) -> None:
    _store(root)
    _answers(root)
    _write(root, "r2", steps=4, start=5)  # attempt 2 logs steps 5..8 again (r2 had 0..6)
    tracklake.compact(root=root)
    age(root)
    got = _answers(root)
    assert got[0].to_pylist()[2] == {"run": "r2", "status": "finished", "attempts": 2,
                                     "ranks": 1}
    assert "r2" in _catalogued(root)
    again = _answers(root)  # the resumed run from the catalog
    _assert_same(again, got)
    _assert_same(again, _from_files(root))
    assert again[2].to_pylist()[2] == {"run": "r2", "n": 18, "last": 8}


def test_a_finished_run_and_an_edited_attempt_file_are_read_again(root: Path) -> None:
    _store(root, runs=1)
    _answers(root)
    attempt = next((root / "runs").rglob("attempt=*.json"))
    data = attempt.read_bytes()
    same_size = data.replace(b'"finished"', b'"killed"  ')
    attempt.write_bytes(same_size)  # in place: no directory changes
    os.utime(attempt, (time.time() - 30, time.time() - 30))
    assert _answers(root)[0].to_pylist()[0]["status"] == "killed"


@pytest.mark.parametrize("damage", ["garbage", "truncated", "wrong crc", "other version",
                                    "other schema", "forged mtimes", "a part outside",
                                    "a part through ..", "a watched path outside",
                                    "a null mtime", "a null list of parts", "a null run"])
def test_a_damaged_or_forged_catalog_is_ignored_and_rebuilt(root: Path, damage: str) -> None:
    """A part outside the store (absolute, or through ``..``) was read as one of r0's:
    r0's values were gone from the answers and a row of no run took their place."""
    _store(root)
    expected = _answers(root)
    path = catalog_path(root, "r0")
    header, _, body = path.read_bytes().partition(b"\n")
    table = catalogued_table(root)

    watched = table.column("watched").to_pylist()
    forged = table.set_column(2, table.schema.field("watched"), pa.array(
        [[{**w, "mtime_ns": w["mtime_ns"] + 1} for w in ws] for ws in watched],
        table.schema.field("watched").type))
    forged = forged.set_column(5, table.schema.field("summaries"), pa.array(
        [[{**s, "last_value": -1.0} for s in ss] for ss in table.column("summaries").to_pylist()],
        table.schema.field("summaries").type))
    outside = root.parent / "outside"
    outside.mkdir()
    [r2_part] = root.glob("metrics/project=p/run=r2/**/part-*.parquet")
    shutil.copy(r2_part, outside / r2_part.name)
    r0 = table.column("run").to_pylist().index("r0")

    def moved(column: str, path: str) -> pa.Table:
        """`table` with r0's first path of `column` replaced by `path` (a watched one
        with the mtime it has, so that the entry would pass as valid)."""
        values = table.column(column).to_pylist()
        values[r0][0] = {**values[r0][0], "path": path}
        if column == "watched":
            values[r0][0]["mtime_ns"] = os.stat(root / path).st_mtime_ns
        field = table.schema.field(column)
        return table.set_column(table.schema.get_field_index(column), field,
                                pa.array(values, field.type))

    def nulled(column: str, field: str | None = None) -> pa.Table:
        """`table` with r0's `column` (or the `field` of its first item) null."""
        values = table.column(column).to_pylist()
        if field is None:
            values[r0] = None
        else:
            values[r0][0] = {**values[r0][0], field: None}
        index = table.schema.get_field_index(column)
        return table.set_column(index, table.schema.field(column),
                                pa.array(values, table.schema.field(column).type))

    r0_dir = "metrics/project=p/run=r0/rank=0/attempt=1"
    planted = {
        "a null mtime": lambda: nulled("watched", "mtime_ns"),
        "a null list of parts": lambda: nulled("parts"),
        "a null run": lambda: nulled("run"),
        "a part outside": lambda: moved("parts", str(outside / r2_part.name)),
        "a part through ..": lambda: moved("parts", f"{r0_dir}/../../../../../outside/"
                                                    f"{r2_part.name}"),
        "a watched path outside": lambda: moved("watched", os.path.relpath(
            outside / r2_part.name, root)),
        "other schema": lambda: pa.table({"run": ["r0"], "status": ["crashed"]}),
        "forged mtimes": lambda: forged,
    }
    if damage in planted:
        plant_catalog(root, planted[damage]())
    else:  # r0's file damaged, the others as written
        path.write_bytes({
            "garbage": b"\x00not a catalog",
            "truncated": header + b"\n" + body[: len(body) // 2],
            "wrong crc": json.dumps({"version": CATALOG_VERSION, "crc32": 1}).encode()
            + b"\n" + body,
            "other version": header.replace(b'"version": %d' % CATALOG_VERSION,
                                            b'"version": 99') + b"\n" + body,
        }[damage])
    _assert_same(_answers(root), expected)
    assert _catalogued(root) == ["r0", "r1", "r2"]  # written again, whole
    _assert_same(_answers(root), expected)
    rebuilt = catalogued_table(root)
    for column in ("parts", "watched"):
        paths = rebuilt.column(column).combine_chunks().flatten().field("path").to_pylist()
        assert paths and all(p.startswith(("metrics/project=p/", "runs/project=p/"))
                             and "/." not in p for p in paths), paths


def test_a_store_the_reader_cannot_write_is_read_without_a_catalog(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _store(root)
    expected = _from_files(root)
    shutil.rmtree(root / ".cache")

    def refuse(root: Path, rel: str, data: bytes, **options: object) -> None:
        raise PermissionError(13, "Permission denied", str(root / rel))

    monkeypatch.setattr(catalog_shards, "write_state", refuse)  # a read-only mount
    _assert_same(_answers(root), expected)
    assert not list((root / CATALOG_DIR).glob("*.catalog"))


def _read_all(root: str) -> list[list[dict[str, object]]]:
    return [t.to_pylist() for t in _answers(Path(root))]


def test_readers_writing_the_catalog_at_once_leave_one_whole_catalog(root: Path) -> None:
    _store(root, runs=6)
    expected = [t.to_pylist() for t in _from_files(root)]
    shutil.rmtree(root / ".cache")
    with mp.get_context("spawn").Pool(4) as pool:
        results = pool.map(_read_all, [str(root)] * 8)
    assert all(r == expected for r in results)
    assert _catalogued(root) == [f"r{i}" for i in range(6)]
    assert not [p for p in (root / ".cache").iterdir() if p.name.startswith(".")]
    assert [t.to_pylist() for t in _answers(root)] == expected


def test_show_and_runs_print_the_same_from_the_catalog(root: Path) -> None:
    from click.testing import CliRunner

    from tracklake._cli.main import main

    _store(root)

    commands = (["runs", "--metric", "loss"], ["show", "r1"],
                ["runs", "--format", "json", "--metric", "*"])

    def printed(args: list[str]) -> str:
        return CliRunner().invoke(main, [*args, "--root", str(root)],
                                  catch_exceptions=False).output

    from_files = []
    for args in commands:
        shutil.rmtree(root / ".cache", ignore_errors=True)
        from_files.append(printed(args))
    assert _catalogued(root) == ["r0", "r1", "r2"]
    assert [printed(args) for args in commands] == from_files
    assert "r1" in from_files[1] and "loss" in from_files[1]


def test_a_catalogued_run_shows_the_status_of_its_attempts_as_of_the_question(
        root: Path) -> None:
    """The catalog keeps statuses as recorded; what the runs view shows is decided when it
    is asked: a "running" attempt whose heartbeat stopped shows as crashed, from the
    catalog as from the files; one that a later attempt of its rank followed, with a
    heartbeat as fresh, still shows as running (it may still write)."""
    from tracklake._format import attempt_file
    from tracklake._format.attempt import write_attempt

    _store(root)
    stopped = {"project": "p", "run": "r1", "rank": 0, "attempt": 1, "status": "running",
               "started_at": "2026-01-01T00:00:00+00:00",
               "heartbeat_at": "2026-01-01T00:01:00+00:00"}
    write_attempt(attempt_file(root, "p", "r1", 0, 1), stopped)
    recent = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(time.time() - 60))
    for attempt in (1, 2):  # attempts 1 and 2, both with a heartbeat a minute old
        write_attempt(attempt_file(root, "p", "r2", 0, attempt), {
            **stopped, "run": "r2", "attempt": attempt, "heartbeat_at": recent})
    age(root)
    expected = [{"run": "r0", "status": "finished"}, {"run": "r1", "status": "crashed"},
                {"run": "r2", "status": "running"}]
    sql = "SELECT run, status FROM runs ORDER BY run"
    attempts = "SELECT run, attempt, status FROM run_attempts WHERE run = 'r2' ORDER BY ALL"
    first = (tracklake.query(sql, root=root).to_pylist(),
             tracklake.query(attempts, root=root).to_pylist())
    _answers(root)  # questions on metrics and runs together catalogue the runs
    assert _catalogued(root) == ["r0", "r1", "r2"]
    again = (tracklake.query(sql, root=root).to_pylist(),
             tracklake.query(attempts, root=root).to_pylist())
    assert first == again
    assert first[0] == expected
    assert first[1] == [{"run": "r2", "attempt": 1, "status": "running"},
                        {"run": "r2", "attempt": 2, "status": "running"}]


def test_a_catalog_read_before_is_read_again_once_it_is_replaced(root: Path) -> None:
    """A settled catalog is kept in memory after its first read, and read again from the
    file once that is another file (a reader's rename), even with the same mtime."""
    _store(root)
    expected = _answers(root)
    path = catalog_path(root, "r1")
    age_catalog(root)
    _assert_same(_answers(root), expected)
    assert catalog_shards._read_before[str(root)].whole is not None
    stat = path.stat()
    replacement = path.with_name("replacement")
    replacement.write_bytes(b"\x00not a catalog")
    os.utime(replacement, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    os.replace(replacement, path)  # as readers replace it: a new inode, here a damaged one
    _assert_same(_answers(root), expected)
    assert _catalogued(root) == ["r0", "r1", "r2"]  # found damaged, and written again


@pytest.mark.parametrize("change", ["removed", "attempt edited", "added"])
def test_a_catalog_kept_in_memory_answers_as_the_files_after_a_change(
        root: Path, change: str) -> None:
    """A reading process keeps a settled catalog and what it derived from it (parts,
    summaries, attempts) across questions; a run changed since is read again all the
    same."""
    _store(root)
    _answers(root)
    age_catalog(root)
    before = _answers(root)
    whole = catalog_shards._read_before[str(root)].whole
    assert whole is not None
    kept = whole.table
    assert catalog._watched_before[id(kept)][1].derived  # the derived rows were kept
    if change == "removed":
        for kind in ("metrics", "runs"):
            shutil.rmtree(root / kind / "project=p" / "run=r1")
    elif change == "attempt edited":
        attempt = next((root / "runs" / "project=p" / "run=r1").rglob("attempt=*.json"))
        mtime = attempt.stat().st_mtime_ns
        attempt.write_bytes(attempt.read_bytes().replace(b'"finished"', b'"killed"  '))
        os.utime(attempt, ns=(mtime + 1000, mtime + 1000))  # in place, and not racy
    else:
        _write(root, "r9", steps=4)
        tracklake.compact(root=root)
        age(root)
    got = _answers(root)
    assert not got[0].equals(before[0])  # the runs view: a run gone, killed or added
    _assert_same(got, _from_files(root))


def test_mtimes_taken_in_a_batch_are_those_of_os_stat(tmp_path: Path) -> None:
    """The catalog's batched `stat`s (pyarrow, two threads) give what `os.stat` gives:
    files, directories, links followed, and `ABSENT` for a path that is missing, goes
    through a file or through a dangling link."""
    from tracklake._read.mtimes import ABSENT, mtimes_of

    (tmp_path / "d").mkdir()
    (tmp_path / "f").write_bytes(b"x")
    (tmp_path / "link").symlink_to(tmp_path / "d")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    os.utime(tmp_path / "f", ns=(0, 10**18 + 2999))  # nanoseconds kept
    names = ["d", "f", "link", "dangling", "missing", "f/under", "d/missing"] * 400
    paths = [str(tmp_path / n) for n in names]

    def one(path: str) -> int:
        try:
            return os.stat(path).st_mtime_ns
        except (FileNotFoundError, NotADirectoryError):
            return ABSENT

    expected = [one(p) for p in paths]
    assert mtimes_of(paths).tolist() == expected  # batched: 2,800 paths
    assert mtimes_of(paths[:7]).tolist() == expected[:7]  # looped
    assert expected[:7].count(ABSENT) == 4 and 10**18 + 2999 in expected


def test_a_kept_listing_of_a_project_follows_runs_added_and_removed(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reading process keeps the listing of a directory (a project's runs) while its
    mtime stays as it was; a run added or removed changes it, old or not."""
    from tracklake._read import location
    from tracklake._read.kept import Kept

    monkeypatch.setattr(location, "_kept_listings", Kept(16))
    _store(root)
    _answers(root)
    assert any(p.endswith("project=p") for p in location._kept_listings.values)
    _write(root, "late", steps=3)
    age(root)
    assert "late" in [r["run"] for r in _answers(root)[0].to_pylist()]
    for kind in ("metrics", "runs"):
        shutil.rmtree(root / kind / "project=p" / "run=r1")
    age(root, seconds=90)
    got = _answers(root)
    assert [r["run"] for r in got[0].to_pylist()] == ["late", "r0", "r2"]
    _assert_same(got, _from_files(root))


def test_a_copy_of_the_catalog_left_by_a_killed_reader_is_removed_by_the_next(
        tmp_path: Path) -> None:
    """A reader killed while it saved the catalog (or the decoded cache) leaves its copy
    under a temporary name in `.cache` (20 MB at 10,000 runs), which nothing read: the
    next reader that saves one removes it once it is stale and its process is gone, and
    leaves a recent one, or a live process's, alone."""
    import subprocess

    from tracklake._format.files import scratch

    root = tmp_path / "store"
    with tracklake.init(project="p", run_id="r", root=root, capture_identity=False) as run:
        run.log({"loss": 1.0}, step=0)
    tracklake.compact(root=root)
    gone = subprocess.Popen(["true"])
    gone.wait()

    def temporary(pid: int) -> str:  # as `write_atomic` names it, in process `pid`
        return scratch(path).name.replace(f".{os.getpid()}.tmp", f".{pid}.tmp")

    path = catalog_path(root, "r")
    stale, young, live = temporary(gone.pid), temporary(gone.pid), temporary(os.getpid())
    cache = path.parent
    cache.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    age(root)  # settled, so that the question saves a catalog
    now = time.time()
    for name, seconds in ((stale, 3600), (young, 0), (live, 3600)):
        (cache / name).write_bytes(b"x" * 1000)
        os.utime(cache / name, (now - seconds, now - seconds))
    tracklake.query("SELECT count(*) FROM metrics", root=root)
    assert path.exists()
    assert sorted(p.name for p in cache.iterdir() if p.name.endswith(".tmp")) == sorted(
        [young, live])


def test_a_catalog_that_decompresses_past_the_limit_is_not_decoded(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A catalog of a few kilobytes whose one batch is 384 MiB of zstd-compressed text,
    its checksum right: judged by what its batch headers say, it is ignored unread and
    rebuilt. Before, a question decompressed it whole (the peak past 500 MiB)."""
    from _memory import peak_rss_kib

    _store(root)
    expected = [t.to_pylist() for t in _answers(root)]
    big = pa.table({"run": pa.array(["a" * (384 << 20)])})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, big.schema,
                           options=pa.ipc.IpcWriteOptions(compression="zstd")) as writer:
        writer.write_table(big)
    del big
    body = sink.getvalue().to_pybytes()
    assert len(body) < 1 << 20
    catalog_path(root, "r0").write_bytes(json.dumps(
        {"version": CATALOG_VERSION, "crc32": zlib.crc32(body)}).encode() + b"\n" + body)
    monkeypatch.setenv("TRACKLAKE_PART_READ_LIMIT", "64MiB")
    proc, peak = peak_rss_kib(["sql", "--root", str(root), "--format", "json", QUESTIONS[2]])
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line) for line in proc.stdout.splitlines()] == expected[2]
    assert peak < 320 << 10, f"peak RSS {peak >> 10} MiB"
    assert _catalogued(root) == ["r0", "r1", "r2"]  # written again, whole


def _with_offsets_out_of_the_data(table: pa.Table) -> bytes:
    """`table` as a catalog body whose `run` strings' offsets point past their data, which
    pyarrow's stream reader does not look at (reading those strings crashes the process)."""
    runs = table.column("run").combine_chunks()
    data = runs.buffers()[2]
    offsets = [0, 1 << 30, *(len(data) for _ in range(len(runs) - 1))]
    crafted = pa.Array.from_buffers(pa.string(), len(runs), [
        None, pa.py_buffer(struct.pack(f"<{len(offsets)}i", *offsets)), data])
    table = table.set_column(table.schema.get_field_index("run"), "run", crafted)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _declaring_big_endian(body: bytes) -> bytes:
    """`body` with its schema message's byte order read from a non-zero byte: one flipped
    bit of a vtable slot, which sets pyarrow to swap the bytes of every buffer."""
    data = bytearray(body)
    for at in range(8, 8 + int.from_bytes(data[4:8], "little")):
        for bit in range(8):
            data[at] ^= 1 << bit
            if declares_other_than_little_endian(memoryview(data)):
                try:  # one that pyarrow still reads as the catalog's schema
                    if pa.ipc.open_stream(bytes(data)).schema.equals(catalog._SCHEMA):
                        return bytes(data)
                except (OSError, pa.ArrowException):
                    pass
            data[at] ^= 1 << bit
    raise AssertionError("no single flipped bit sets the byte order")


@pytest.mark.parametrize("craft", ["offsets out of the data", "big-endian"])
def test_a_catalog_crafted_to_be_read_as_other_bytes_is_rebuilt(root: Path,
                                                                craft: str) -> None:
    """A catalog with its checksum right whose batch pyarrow would read as other bytes:
    strings' offsets past their data, or every buffer byte-swapped by a header declaring
    big-endian. Each question, in its own process (one of the code before crashed), gets
    the answers the files give, and the catalog is rebuilt."""
    import subprocess
    import sys

    _store(root)
    expected = [t.to_pylist() for t in _answers(root)]
    path = catalog_path(root, "r0")
    _, _, body = path.read_bytes().partition(b"\n")
    table = pa.ipc.open_stream(body).read_all()  # r0's row: twice, for offsets that end
    # where the data does, as pyarrow's stream reader checks
    body = _with_offsets_out_of_the_data(pa.concat_tables([table, table])) \
        if craft == "offsets out of the data" \
        else _declaring_big_endian(body)
    path.write_bytes(json.dumps(
        {"version": CATALOG_VERSION, "crc32": zlib.crc32(body)}).encode() + b"\n" + body)
    for question, answer in zip(QUESTIONS, expected, strict=True):
        proc = subprocess.run(
            [sys.executable, "-c", "from tracklake._cli.main import main; main()", "sql",
             "--root", str(root), "--format", "json", question],
            capture_output=True, text=True, timeout=300, check=False)
        assert proc.returncode == 0, proc.stderr
        assert [json.loads(line) for line in proc.stdout.splitlines()] == answer
    assert _catalogued(root) == ["r0", "r1", "r2"]


def test_a_question_on_the_runs_view_alone_looks_only_at_the_runs_attempt_paths(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runs view reads the attempt files only: the catalog checks the paths under
    runs/ for it (3 of a run's 7), and a run whose metrics changed since is still read
    again by the next question on the metrics."""
    monkeypatch.setenv("TRACKLAKE_WATCH_DIRS", "0")  # with a watch: tests/test_dir_watch.py
    _store(root)
    expected = _answers(root)
    looked: list[str] = []
    real = catalog.mtimes_of
    # (a process's first question on the runs view alone reads the catalog's files one
    # at a time, `run_index`; a later one, the catalog it keeps)
    for module in (catalog, run_index):
        monkeypatch.setattr(module, "mtimes_of", lambda paths: looked.extend(paths) or
                            real(paths))
    runs_sql = QUESTIONS[0]
    assert tracklake.query(runs_sql, root=root).equals(expected[0])
    assert looked and all(p.startswith(str(root / "runs") + os.sep) for p in looked), looked
    one = "SELECT count(*) AS n FROM runs WHERE run = 'r1'"
    looked.clear()
    assert tracklake.query(one, root=root).to_pylist() == [{"n": 1}]
    assert looked and all(f"{os.sep}run=r1" in p and p.startswith(str(root / "runs"))
                          for p in looked), looked
    # r1's metrics directory changes and its attempt files do not: the runs view alone
    # takes r1 from the catalog still, and the next question on the metrics lists r1
    metrics_dir = root / "metrics" / "project=p" / "run=r1"
    moved = metrics_dir.stat().st_mtime_ns + 1_000_000_000
    os.utime(metrics_dir, ns=(moved, moved))
    for module in (catalog, run_index):
        monkeypatch.setattr(module, "mtimes_of", real)
    listed = record_listings(monkeypatch)
    assert tracklake.query(runs_sql, root=root).equals(expected[0])
    assert not [d for d in listed if "run=" in d], listed
    _assert_same(_answers(root), expected)
    assert [d for d in listed if "run=r1" in d and d.startswith("metrics")], listed
    assert not [d for d in listed if "run=r0" in d or "run=r2" in d], listed
