"""A question about one small run reads its parts whole into a table (`run_table`): the
same answer, column types and damage reports as the verifying dataset that reads every
other question's parts, and the dataset again for a run too large to read whole."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

import tracklake
from tracklake._format.part import read_small_part
from tracklake._read import query as query_module
from tracklake._read import run_table as run_table_module

KINDS_SQL = {
    "metrics": "SELECT * FROM metrics WHERE run = 'a' ORDER BY ALL",
    "texts": "SELECT * FROM texts WHERE run = 'a' ORDER BY ALL",
    "configs": "SELECT * FROM configs WHERE run = 'a' ORDER BY ALL",
    "metrics_all": "SELECT rank, step, key, value FROM metrics_all WHERE run = 'a' ORDER BY ALL",
}


def _write(root: Path, run_id: str, ranks: int = 2, steps: int = 30) -> None:
    for rank in range(ranks):
        with tracklake.init(project="p", run_id=run_id, root=root, rank=rank,
                            config={"lr": 0.1, "rank_note": f"rank {rank}"},
                            capture_identity=False) as run:
            for step in range(steps):
                run.log({"loss": step * 0.5 + rank, "acc": step / 7}, step=step)
                run.log_text("note", f"rank {rank} step {step}", step=step)


@pytest.fixture
def store(root: Path) -> Path:
    _write(root, "a")
    _write(root, "b", ranks=1)
    tracklake.compact(root=root)
    return root


@pytest.fixture
def whole_reads(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """What each question's `run_table` call gave: a table, or None (the dataset)."""
    given: list[Any] = []
    real = run_table_module.run_table

    def spy(*args: Any) -> Any:
        given.append(real(*args))
        return given[-1]

    monkeypatch.setattr(query_module, "run_table", spy)
    return given


@pytest.mark.parametrize("name", sorted(KINDS_SQL))
def test_one_small_runs_answer_and_column_types_are_the_datasets(
        store: Path, whole_reads: list[Any], name: str) -> None:
    sql = KINDS_SQL[name]
    with tracklake.connect(store) as con:  # a caller's connection: the dataset
        everything = con.sql(sql).to_arrow_table()
        types = con.sql(f"DESCRIBE {name}").fetchall()
        star = con.sql(f"SELECT * FROM {name} WHERE run = 'a' LIMIT 0").to_arrow_table()
    assert everything.num_rows > 0
    answer = tracklake.query(sql, root=store)
    assert answer.equals(everything)  # rows, names and types
    assert tracklake.query(f"DESCRIBE {name}", root=store).num_rows == len(types)
    assert whole_reads and all(t is not None for t in whole_reads)  # read whole
    # the DESCRIBE above was asked over everything; types again through one run's table
    described = tracklake.query(f"SELECT * FROM {name} WHERE run = 'a' LIMIT 0", root=store)
    assert described.schema == star.schema


def test_a_run_past_the_small_size_is_read_through_the_dataset(
        store: Path, whole_reads: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    sql = KINDS_SQL["metrics"]
    small = tracklake.query(sql, root=store)
    assert whole_reads[-1] is not None
    parts = list(store.glob("metrics/project=p/run=a/**/*.parquet"))
    assert len(parts) == 2  # one per rank
    monkeypatch.setattr(run_table_module, "SMALL_RUN_BYTES",
                        sum(p.stat().st_size for p in parts) - 1)
    assert tracklake.query(sql, root=store).equals(small)
    assert whole_reads[-1] is None


def test_a_part_decoding_past_the_limit_is_left_to_the_dataset(
        store: Path, whole_reads: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    part = next(store.glob("metrics/project=p/run=a/**/*.parquet"))
    whole = read_small_part(part, 1 << 20)
    assert whole is not None and whole.equals(pq.read_table(part))
    assert read_small_part(part, whole.nbytes // 2) is None
    sql = KINDS_SQL["metrics"]
    small = tracklake.query(sql, root=store)
    monkeypatch.setattr(run_table_module, "SMALL_RUN_DECODED", whole.nbytes // 2)
    assert tracklake.query(sql, root=store).equals(small)
    assert whole_reads[-1] is None


def _value_page_byte(part: Path) -> int:
    meta = pq.ParquetFile(part).metadata
    names = [meta.schema.column(i).name for i in range(meta.num_columns)]
    chunk = meta.row_group(0).column(names.index("value"))
    return int(chunk.data_page_offset + chunk.total_compressed_size - 2)


def test_a_damaged_page_is_named_and_the_runs_other_part_answers(
        store: Path, whole_reads: list[Any]) -> None:
    sql = "SELECT rank, step, key, value FROM metrics WHERE run = 'a' ORDER BY ALL"
    good = tracklake.query(sql, root=store).to_pylist()
    damaged = next(store.glob("metrics/project=p/run=a/rank=1/**/*.parquet"))
    data = bytearray(damaged.read_bytes())
    data[_value_page_byte(damaged)] ^= 0x01
    damaged.write_bytes(data)
    problems = tracklake.ReadProblems()
    rows = tracklake.query(sql, root=store, problems=problems).to_pylist()
    assert [path for path, _ in problems.damaged] == [damaged]
    assert "damaged Parquet part" in problems.damaged[0][1]
    assert rows == [r for r in good if r["rank"] == 0] and rows
    assert whole_reads[-1] is not None  # the table path found it, not a retry


def test_no_question_leaves_what_was_behind_its_connection(store: Path) -> None:
    tracklake.query(KINDS_SQL["metrics"], root=store)
    tracklake.query("SELECT count(*) FROM metrics", root=store)
    with pytest.raises(tracklake.QueryError):
        tracklake.query("SELECT no_such_column FROM metrics WHERE run = 'a'", root=store)
    with pytest.raises(tracklake.QueryError):
        tracklake.query("SELECT no_such_column FROM metrics", root=store)
    assert query_module._BEHIND == {}


def test_questions_from_many_threads_each_get_their_runs_rows(store: Path) -> None:
    """Eight threads ask about runs a and b (read whole) and over everything (the
    dataset), some with an error in the SQL: each answer is its own, and nothing is left
    behind once they are done."""
    from concurrent.futures import ThreadPoolExecutor

    sqls = {f"{run}-{n}": f"SELECT rank, step, key, value FROM metrics WHERE run = '{run}' "
            f"ORDER BY ALL" for run in ("a", "b") for n in range(2)}
    sqls["all"] = "SELECT run, rank, step, key, value FROM metrics ORDER BY ALL"
    expected = {name: tracklake.query(sql, root=store) for name, sql in sqls.items()}
    assert expected["a-0"].num_rows == 2 * expected["b-0"].num_rows > 0

    def ask(i: int) -> bool:
        name = sorted(sqls)[i % len(sqls)]
        if i % 7 == 3:
            with pytest.raises(tracklake.QueryError):
                tracklake.query("SELECT nothing FROM metrics WHERE run = 'a'", root=store)
        return tracklake.query(sqls[name], root=store).equals(expected[name])

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(ask, range(80)))
    assert query_module._BEHIND == {}


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The parts `run_table` read from disk."""
    read: list[Path] = []
    real = run_table_module.read_small_part

    def spy(path: Path, limit: int) -> Any:
        read.append(path)
        return real(path, limit)

    monkeypatch.setattr(run_table_module, "read_small_part", spy)
    return read


def test_a_run_asked_again_is_not_read_again_while_its_parts_stay(
        store: Path, reads: list[Path]) -> None:
    """A settled part read whole is kept by the process while it is the file read (its
    device, inode, size and mtime): the same question again reads nothing; the part
    replaced by a copy of itself with the same mtime (a new inode), or touched (a new
    mtime), is read again."""
    import os
    import shutil

    from _settled import age

    age(store)
    sql = "SELECT rank, step, key, value FROM metrics WHERE run = 'a' ORDER BY ALL"
    first = tracklake.query(sql, root=store)
    assert len(reads) == 2  # one part per rank
    assert tracklake.query(sql, root=store).equals(first)
    assert len(reads) == 2  # kept
    part = next(store.glob("metrics/project=p/run=a/rank=1/**/*.parquet"))
    copy = part.with_name(".copy.tmp")
    shutil.copy2(part, copy)  # same bytes and mtime
    os.replace(copy, part)
    assert tracklake.query(sql, root=store).equals(first)
    assert reads[2:] == [part]
    was = part.stat()
    os.utime(part, ns=(was.st_atime_ns, was.st_mtime_ns - 10**9))
    assert tracklake.query(sql, root=store).equals(first)
    assert reads[3:] == [part]


def test_parts_just_written_are_not_kept(store: Path, reads: list[Path]) -> None:
    """Within the racy window a change could keep the mtime: such a part is read each
    time."""
    from _settled import age

    age(store, -120)  # within the window, however slow the questions start
    # over the values (`count(*)` alone the summaries answer, from no part's pages)
    sql = "SELECT count(value) FROM metrics WHERE run = 'b'"
    for _ in range(2):
        tracklake.query(sql, root=store)
    assert len(reads) == 2


def test_what_is_kept_stays_within_its_bytes(tmp_path: Path) -> None:
    """The oldest values go first once the next would pass `most_bytes`; a value larger
    than all of it is not kept."""
    import os

    from tracklake._read.kept import Kept

    kept: Kept[str] = Kept(100, most_bytes=10)
    settled = tmp_path / "settled"
    settled.write_bytes(b"")
    os.utime(settled, ns=(0, 0))  # long before the racy window
    old = os.stat(settled)
    for name, size in (("a", 4), ("b", 4), ("c", 4)):
        kept.keep(tmp_path, name, old, (1,), name, size)
    assert [kept.get(n, (1,)) for n in "abc"] == [None, "b", "c"]
    kept.keep(tmp_path, "huge", old, (1,), "huge", 11)
    assert kept.get("huge", (1,)) is None and kept.get("c", (1,)) == "c"
    kept.keep(tmp_path, "c", old, (1,), "c again", 6)  # replaced: its bytes counted once
    assert kept.get("c", (1,)) == "c again" and kept.get("b", (1,)) == "b"


def test_a_runs_table_is_made_once_and_again_when_a_part_changes(
        store: Path, whole_reads: list[Any]) -> None:
    """Asked again, a run's table is the one made before (its parts and its partition
    columns are not made again); once one of its parts is another file (here: another
    mtime, as a part restored with `cp` has), it is made again."""
    import os
    import time

    sql = KINDS_SQL["metrics"]
    old = time.time() - 3600  # older than the window in which a change may go unseen
    parts = sorted((store / "metrics" / "project=p" / "run=a").rglob("*.parquet"))
    for part in parts:
        os.utime(part, (old, old))
    first = tracklake.query(sql, root=store)
    again = tracklake.query(sql, root=store)
    assert again.equals(first)
    assert whole_reads[-1] is whole_reads[-2]  # the same table, made once
    os.utime(parts[0], (old + 1, old + 1))
    third = tracklake.query(sql, root=store)
    assert third.equals(first)
    assert whole_reads[-1] is not whole_reads[-2]  # made again from the part's new identity
