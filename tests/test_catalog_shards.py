"""The run catalog in files of a share of the runs each: a change rewrites the file of the
runs it changed, a question about one run reads the file that holds it, and a file that
holds another file's run, or reached through a link, is not trusted."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from _crafted import age_catalog, catalog_path, catalogued_table, plant_catalog, signed_catalog
from _settled import age

import tracklake
from tracklake._read import catalog_shards
from tracklake._read.catalog import _SCHEMA
from tracklake._read.catalog_shards import CATALOG_DIR, shard_file, shard_of

QUESTIONS = (
    "SELECT run, status, attempts FROM runs ORDER BY run",
    "SELECT run, key, count, last_value FROM metric_summaries ORDER BY ALL",
    "SELECT run, count(*) AS n, sum(value) AS total FROM metrics GROUP BY run ORDER BY run",
)
RUNS = [f"r{i}" for i in range(6)]


def _store(root: Path) -> None:
    for i, run_id in enumerate(RUNS):
        with tracklake.init(project="p", run_id=run_id, root=root, capture_identity=False,
                            system_metrics=False) as run:
            for step in range(3 + i):
                run.log({"loss": float(step + i)}, step=step)
    tracklake.compact(root=root)
    age(root)
    _answers(root)  # the catalog written
    age_catalog(root)


def _age_run(root: Path, run: str) -> None:
    """Make `run`'s files look settled (and no other run's changed)."""
    for kind in ("metrics", "runs"):
        age(root / kind / "project=p" / f"run={run}")


def _answers(root: Path) -> list[list[dict[str, object]]]:
    return [tracklake.query(sql, root=root).to_pylist() for sql in QUESTIONS]


def _from_files(root: Path) -> list[list[dict[str, object]]]:
    """The answers with no cache at all (the catalog is written again after)."""
    shutil.rmtree(root / ".cache")
    answers = _answers(root)
    catalog_shards._read_before.clear()
    return answers


def _files(root: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns)
            for p in (root / CATALOG_DIR).glob("*.catalog")}


def test_each_run_is_in_the_file_of_its_shard_and_a_shard_without_runs_has_none(
        root: Path) -> None:
    _store(root)
    assert len({shard_of(r) for r in RUNS}) == len(RUNS)  # the test's runs: one a shard
    assert sorted(_files(root)) == sorted(shard_file(shard_of(r)).name for r in RUNS)
    for run in RUNS:
        body = catalog_path(root, run).read_bytes().partition(b"\n")[2]
        assert pa.ipc.open_stream(body).read_all().column("run").to_pylist() == [run]


@pytest.mark.parametrize("change", ["logged again", "deleted"])
def test_a_changed_run_rewrites_the_file_that_holds_it_and_no_other(
        root: Path, change: str) -> None:
    _store(root)
    before = _files(root)
    if change == "deleted":
        for kind in ("metrics", "runs"):
            shutil.rmtree(root / kind / "project=p" / "run=r3")
    else:
        with tracklake.init(project="p", run_id="r3", root=root, capture_identity=False,
                            system_metrics=False) as run:
            run.log({"loss": 100.0}, step=50)
        tracklake.compact(root=root)
        _age_run(root, "r3")
    answers = _answers(root)
    after = _files(root)
    changed = shard_file(shard_of("r3")).name
    assert {n: v for n, v in after.items() if n != changed} == \
        {n: v for n, v in before.items() if n != changed}
    if change == "deleted":
        assert changed not in after  # its one run gone: the file goes too
        assert "r3" not in catalogued_table(root).column("run").to_pylist()
    else:
        assert after[changed] != before[changed]
    assert answers == _from_files(root)


def test_a_question_about_one_run_reads_only_the_file_that_holds_it(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a process that keeps no catalog (a fresh one), and in one that keeps the whole
    catalog, before and after that run's file changed."""
    _store(root)
    sql = "SELECT step, value FROM metrics WHERE run = 'r4' ORDER BY step"
    expected = tracklake.query(sql, root=root).to_pylist()
    catalog_shards._read_before.clear()
    opened: list[str] = []
    real = catalog_shards.open_regular

    def recorded(path: Path) -> object:
        opened.append(path.name)
        return real(path)
    monkeypatch.setattr(catalog_shards, "open_regular", recorded)
    own = shard_file(shard_of("r4")).name
    assert tracklake.query(sql, root=root).to_pylist() == expected
    assert opened == [own]
    _answers(root)  # every file read, and kept
    opened.clear()
    assert tracklake.query(sql, root=root).to_pylist() == expected
    assert opened == []  # its file is the one kept: known the same by lstat alone
    with tracklake.init(project="p", run_id="r4", root=root, capture_identity=False,
                        system_metrics=False) as run:
        run.log({"loss": -1.0}, step=99)
    tracklake.compact(root=root)
    _age_run(root, "r4")
    opened.clear()
    assert tracklake.query(sql, root=root).to_pylist() == [*expected, {"step": 99,
                                                                       "value": -1.0}]
    assert set(opened) == {own}
    assert _answers(root) == _from_files(root)


@pytest.mark.parametrize("own_file", ["kept", "without it"])
def test_a_file_that_holds_a_run_of_another_shard_is_ignored_and_written_anew(
        root: Path, own_file: str) -> None:
    """r1's entry planted in r0's file, its values forged: were it read, r1 would be
    answered twice, once with the forged values; and with r1 taken out of its own file, a
    question over every run would answer the forged values where one about r1 (reading
    r1's own file) would not."""
    _store(root)
    expected = _from_files(root)  # and the catalog written again
    table = catalogued_table(root)
    runs = table.column("run").to_pylist()
    r0 = table.filter(pa.array([r == "r0" for r in runs]))
    r1 = table.filter(pa.array([r == "r1" for r in runs]))
    summaries = r1.column("summaries").to_pylist()
    forged = r1.set_column(5, r1.schema.field("summaries"), pa.array(
        [[{**s, "last_value": -7.0} for s in ss] for ss in summaries],
        r1.schema.field("summaries").type))
    assert shard_of("r0") != shard_of("r1")
    if own_file == "without it":
        beside = table.filter(pa.array([r != "r1" and shard_of(r) == shard_of("r1")
                                        for r in runs]))
        if beside.num_rows:
            catalog_path(root, "r1").write_bytes(signed_catalog(beside))
        else:
            catalog_path(root, "r1").unlink()
    catalog_path(root, "r0").write_bytes(signed_catalog(pa.concat_tables([r0, forged])))
    catalog_shards._read_before.clear()
    assert _answers(root) == expected
    for run in ("r0", "r1"):
        body = catalog_path(root, run).read_bytes().partition(b"\n")[2]
        assert pa.ipc.open_stream(body).read_all().column("run").to_pylist() == [run]


def test_a_catalog_directory_planted_as_a_link_is_neither_read_nor_written(
        root: Path, tmp_path: Path) -> None:
    _store(root)
    expected = _from_files(root)
    table = catalogued_table(root)
    forged = table.set_column(5, table.schema.field("summaries"), pa.array(
        [[{**s, "last_value": -7.0} for s in ss]
         for ss in table.column("summaries").to_pylist()], table.schema.field("summaries").type))
    outside = tmp_path / "outside"
    shutil.move(root / CATALOG_DIR, outside)
    plant_catalog(outside.parent / "planted", forged)
    for path in (outside.parent / "planted" / CATALOG_DIR).glob("*.catalog"):
        shutil.copy(path, outside / path.name)
    before = {p.name: p.read_bytes() for p in outside.iterdir()}
    (root / CATALOG_DIR).symlink_to(outside)
    catalog_shards._read_before.clear()
    assert _answers(root) == expected
    assert {p.name: p.read_bytes() for p in outside.iterdir()} == before
    assert (root / CATALOG_DIR).is_symlink()


def test_an_earlier_catalog_goes_once_this_one_is_written(root: Path) -> None:
    _store(root)
    earlier = root / ".cache" / "runs-v2.catalog"
    earlier.write_bytes(b"a catalog of the version before")
    shutil.rmtree(root / CATALOG_DIR)
    catalog_shards._read_before.clear()
    _answers(root)
    assert not earlier.exists()
    assert sorted(catalogued_table(root).column("run").to_pylist()) == RUNS


def test_the_files_of_one_catalog_decode_within_one_limit_in_all(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each file within the limit, all of them past it: the files read once the limit is
    reached are not decoded, their runs are read from their files, the answers are the
    same."""
    _store(root)
    expected = _from_files(root)  # and the catalog written again
    sizes = {run: pa.ipc.open_stream(catalog_path(root, run).read_bytes().partition(
        b"\n")[2]).read_all().nbytes for run in RUNS}
    limit = sum(sorted(sizes.values())[:3]) + 1
    assert max(sizes.values()) < limit < sum(sizes.values())
    monkeypatch.setenv("TRACKLAKE_PART_READ_LIMIT", str(limit))
    catalog_shards._read_before.clear()
    loaded = catalog_shards.load(root, _SCHEMA)
    assert 0 < loaded.table.num_rows < len(RUNS)
    assert sum(sizes[r] for r in loaded.table.column("run").to_pylist()) <= limit
    catalog_shards._read_before.clear()
    assert _answers(root) == expected


def test_a_question_about_one_run_that_trusts_no_entry_rewrites_only_its_file(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mtimes not to be trusted: a question about r4 answers from r4's files and writes
    its file anew from them; the other runs' files stay, even in a process that keeps
    the whole catalog (before, every other run's entry was dropped)."""
    _store(root)
    expected = _from_files(root)
    age_catalog(root)
    _answers(root)  # the whole catalog kept
    before = _files(root)
    monkeypatch.setenv("TRACKLAKE_TRUST_MTIMES", "0")
    sql = "SELECT step, value FROM metrics WHERE run = 'r4' ORDER BY step"
    assert tracklake.query(sql, root=root).to_pylist() == [
        {"step": s, "value": float(s + 4)} for s in range(7)]
    own = shard_file(shard_of("r4")).name
    after = _files(root)
    assert {n: v for n, v in after.items() if n != own} == \
        {n: v for n, v in before.items() if n != own}
    monkeypatch.delenv("TRACKLAKE_TRUST_MTIMES")
    assert _answers(root) == expected


def test_a_directory_planted_at_one_files_name_leaves_the_others_written(
        root: Path) -> None:
    """The catalog written anew with a directory where r0's file goes: the answers are the
    files', r0's entry cannot be saved, every other run's file is (the first that failed
    stopped the writing of those after it)."""
    _store(root)
    expected = _from_files(root)
    shutil.rmtree(root / CATALOG_DIR)
    catalog_path(root, "r0").mkdir(parents=True)
    catalog_shards._read_before.clear()
    assert _answers(root) == expected
    assert catalog_path(root, "r0").is_dir()
    assert sorted(catalogued_table(root).column("run").to_pylist()) == RUNS[1:]
    assert _answers(root) == expected


def test_a_file_repeating_one_run_a_hundred_thousand_times_is_refused_at_once(
        root: Path) -> None:
    """r0's entry 100,000 times in its own file: refused in one pass over the repeated
    runs (counting each against the others took time quadratic in them: a hang)."""
    _store(root)
    expected = _from_files(root)
    table = catalogued_table(root)
    r0 = table.filter(pa.array([r == "r0" for r in table.column("run").to_pylist()]))
    catalog_path(root, "r0").write_bytes(signed_catalog(r0.take(pa.array(
        np.zeros(100_000, dtype=np.int64)))))
    catalog_shards._read_before.clear()
    loaded = catalog_shards.load(root, _SCHEMA)
    assert sorted(loaded.table.column("run").to_pylist()) == RUNS[1:]
    assert _answers(root) == expected


@pytest.mark.parametrize("planted", ["fifo", "link to the file itself"])
def test_a_kept_file_replaced_by_a_fifo_or_a_link_is_neither_opened_nor_followed(
        root: Path, planted: str) -> None:
    """A process keeps every catalog file it read and knows one unchanged by `lstat`
    alone: a FIFO, or a link to that very file moved out of the store, put in a kept
    file's place is not waited on, the answers stay those of the files, and a regular
    catalog file is written in its place."""
    import os

    _store(root)
    expected = _from_files(root)
    _answers(root)  # every file read, and kept
    assert catalog_shards._read_before
    own = root / shard_file(shard_of("r4"))
    if planted == "fifo":
        own.unlink()
        os.mkfifo(own)
    else:
        outside = root.parent / "outside.catalog"
        own.rename(outside)
        os.symlink(outside, own)
    assert _answers(root) == expected
    assert own.is_file() and not own.is_symlink()
    assert tracklake.query("SELECT step, value FROM metrics WHERE run = 'r4' ORDER BY step",
                           root=root).num_rows == 7
