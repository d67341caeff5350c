"""The cache of decoded attempt records and part summaries is derived: answers with it
equal answers without it, a changed, damaged or recent file is read again, and a store
the reader cannot write is read all the same."""

from __future__ import annotations

import json
import os
import shutil
import time
import zlib
from pathlib import Path

import pytest

import tracklake
from tracklake._read import decoded
from tracklake._read.catalog_shards import CATALOG_DIR
from tracklake._read.decoded import CACHE_FILE

RUNS_SQL = "SELECT run, status, attempts, ranks FROM runs ORDER BY run"
SUMMARY_SQL = ("SELECT run, key, count, min, max, last_value FROM metric_summaries "
               "ORDER BY ALL")


def _age(root: Path, seconds: float = 60.0) -> None:
    """Make every file look written `seconds` ago (older than the racy window)."""
    past = time.time() - seconds
    for dirpath, _, names in os.walk(root):
        for name in names:
            os.utime(os.path.join(dirpath, name), (past, past))


def _store(root: Path, runs: int = 3) -> None:
    for i in range(runs):
        with tracklake.init(project="p", run_id=f"r{i}", root=root,
                            capture_identity=False) as run:
            for step in range(5):
                run.log({"loss": float(step * (i + 1))}, step=step)
    tracklake.compact(root=root)
    _age(root)


def _entries(root: Path) -> dict[str, list[object]]:
    header, _, body = (root / CACHE_FILE).read_bytes().partition(b"\n")
    assert json.loads(header)["version"] == decoded._VERSION
    files: dict[str, list[object]] = json.loads(body)
    return files


def test_answers_with_the_cache_equal_answers_read_from_the_files(root: Path) -> None:
    _store(root)
    first = [tracklake.query(sql, root=root) for sql in (RUNS_SQL, SUMMARY_SQL)]
    cached = _entries(root)
    assert sum(k.startswith("runs/") for k in cached) == 3
    assert sum(k.startswith("metrics/") for k in cached) == 3
    again = [tracklake.query(sql, root=root) for sql in (RUNS_SQL, SUMMARY_SQL)]
    (root / CACHE_FILE).unlink()
    fresh = [tracklake.query(sql, root=root) for sql in (RUNS_SQL, SUMMARY_SQL)]
    for a, b, c in zip(first, again, fresh, strict=True):
        assert a.equals(b) and a.equals(c)
    assert first[0].num_rows == 3 and first[1].num_rows == 3


def test_a_rewritten_attempt_file_is_read_again(root: Path) -> None:
    _store(root, runs=1)
    assert tracklake.query(RUNS_SQL, root=root).to_pylist()[0]["status"] == "finished"
    attempt = next((root / "runs").rglob("attempt=*.json"))
    data = attempt.read_bytes()
    same_size = data.replace(b'"finished"', b'"killed"  ')  # only the mtime tells
    assert len(same_size) == len(data) and same_size != data
    attempt.write_bytes(same_size)
    _age(root, 30.0)
    assert tracklake.query(RUNS_SQL, root=root).to_pylist()[0]["status"] == "killed"


def test_files_written_just_now_are_not_cached(root: Path) -> None:
    with tracklake.init(project="p", run_id="live", root=root, capture_identity=False) as run:
        run.log({"x": 1.0}, step=0)
    tracklake.compact(root=root)
    tracklake.query(RUNS_SQL, root=root)
    assert not (root / CACHE_FILE).exists() or _entries(root) == {}


@pytest.mark.parametrize("damage", ["garbage", "flipped", "wrong crc", "other version"])
def test_a_damaged_cache_is_ignored_and_rebuilt(root: Path, damage: str) -> None:
    _store(root)
    expected = tracklake.query(RUNS_SQL, root=root)
    path = root / CACHE_FILE
    header, _, body = path.read_bytes().partition(b"\n")
    forged = body.replace(b'"finished"', b'"crashed!"')
    assert forged != body
    path.write_bytes({
        "garbage": b"\x00not json",
        "flipped": header + b"\n" + forged,
        "wrong crc": json.dumps({"version": decoded._VERSION, "crc32": 1}).encode() + b"\n" + body,
        "other version": json.dumps({"version": 99, "crc32": zlib.crc32(body)}).encode()
        + b"\n" + body,
    }[damage])
    assert tracklake.query(RUNS_SQL, root=root).equals(expected)
    assert _entries(root)  # written again, whole


def test_a_store_the_reader_cannot_write_is_read_without_a_cache(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _store(root)

    def refuse(root: Path, rel: str, data: bytes, **options: object) -> None:
        raise PermissionError(13, "Permission denied", str(root / rel))

    monkeypatch.setattr(decoded, "write_state", refuse)  # a read-only mount
    rows = tracklake.query(RUNS_SQL, root=root).to_pylist()
    assert [r["run"] for r in rows] == ["r0", "r1", "r2"]
    assert not (root / CACHE_FILE).exists()


def test_entries_of_removed_files_go_when_everything_is_read(root: Path) -> None:
    _store(root)
    with tracklake.connect(root):
        pass
    removed = next(k for k in _entries(root) if "run=r1" in k and k.startswith("metrics/"))
    (root / removed).unlink()
    with tracklake.connect(root):
        pass
    assert removed not in _entries(root)
    assert any("run=r0" in k for k in _entries(root))


def test_the_cache_is_not_in_the_way_of_plain_engines(root: Path) -> None:
    import pyarrow.dataset as ds

    _store(root)
    tracklake.query(RUNS_SQL, root=root)
    assert (root / CACHE_FILE).exists()
    table = ds.dataset(root / "metrics", format="parquet", partitioning="hive").to_table()
    assert table.num_rows == 3 * 5


def test_the_cache_holds_only_what_the_run_catalog_does_not(root: Path) -> None:
    """What the catalog keeps of a run (its attempts, its parts' summaries) is not kept
    twice: the files of catalogued runs leave the cache, the others' stay in it."""
    from _settled import age

    from tracklake._read.catalog import RunCatalog

    _store(root)
    age(root)  # directories too: every run can be catalogued
    recent = root / "metrics" / "project=p" / "run=r2" / "rank=0"
    os.utime(recent)  # ... but r2, whose directory changed just now
    first = [tracklake.query(sql, root=root) for sql in (RUNS_SQL, SUMMARY_SQL)]
    assert RunCatalog(root).settled(None, None) == {("p", "r0"), ("p", "r1")}
    cached = _entries(root)
    assert cached and all("/run=r2/" in k for k in cached), sorted(cached)
    age(root)  # r2 settles: catalogued by the next question, and gone from the cache
    again = [tracklake.query(sql, root=root) for sql in (RUNS_SQL, SUMMARY_SQL)]
    assert RunCatalog(root).settled(None, None) == {("p", f"r{i}") for i in range(3)}
    assert _entries(root) == {}
    shutil.rmtree(root / CATALOG_DIR)  # the decoded values come from the files
    fresh = [tracklake.query(sql, root=root) for sql in (RUNS_SQL, SUMMARY_SQL)]
    for a, b, c in zip(first, again, fresh, strict=True):
        assert a.equals(b) and a.equals(c)


@pytest.mark.parametrize("planted", [
    {"key": [5], "count": ["x"]},
    [{"key": "loss", "count": 5}],  # an entry as the cache held it before columns
    {"key": ["loss", "acc"], "count": [1]},
    {"count": [1]},
    "loss"])
def test_a_planted_summary_entry_is_read_from_its_part_instead(root: Path,
                                                              planted: object) -> None:
    """A cache file whose checksum matches (a forger computes it) but whose summary
    entries do not convert: each such part's summary is read from the part itself, and
    the answers are those of the files."""
    _store(root)
    expected = tracklake.query(SUMMARY_SQL, root=root)
    files = _entries(root)
    summaries = [k for k in files if k.startswith("metrics/")]
    assert summaries
    for key in summaries:
        files[key][2] = planted
    body = json.dumps(files).encode()
    (root / CACHE_FILE).write_bytes(json.dumps({"version": decoded._VERSION,
                                                "crc32": zlib.crc32(body)}).encode()
                                    + b"\n" + body)
    shutil.rmtree(root / CATALOG_DIR, ignore_errors=True)  # so that the cache answers
    assert tracklake.query(SUMMARY_SQL, root=root).equals(expected)
