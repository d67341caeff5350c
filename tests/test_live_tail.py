"""Following a live segment reads only what was appended since the last read, a bounded
slice at a time, and still sees every record once, torn tails and replaced files
included."""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from tracklake import StreamId
from tracklake._format import SCHEMAS
from tracklake._format.layout import segment_name, stream_dir
from tracklake._format.segment import SegmentWriter, read_segment, stream_schema
from tracklake._read import tails
from tracklake._read.reader import ReadProblems, read_stream

STREAM = StreamId("proj", "run-1", 0, 1, "metrics")
EPOCH = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)


@pytest.fixture(autouse=True)
def _no_marks() -> Iterator[None]:
    tails.forget()
    yield
    tails.forget()


def _batch(first_seq: int, rows: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [{"seq": first_seq + i, "time": EPOCH + dt.timedelta(seconds=first_seq + i),
          "step": first_seq + i, "key": f"k{i % 3}", "value": float(first_seq + i)}
         for i in range(rows)], schema=SCHEMAS["metrics"])


def _segment(root: Path) -> tuple[Path, SegmentWriter]:
    path = stream_dir(root, STREAM) / segment_name(0, 0)
    return path, SegmentWriter(path, stream_schema(SCHEMAS["metrics"], STREAM), fsync=False)


def _seqs(root: Path, after: int, problems: ReadProblems | None = None) -> list[int]:
    return [s for b in read_stream(root, STREAM, after, problems)
            for s in b.column("seq").to_pylist()]


def test_a_follower_reads_each_appended_batch_once(tmp_path: Path) -> None:
    _path, writer = _segment(tmp_path)
    delivered: list[int] = []
    last = -1
    for n in range(20):
        writer.append(_batch(n * 10, 10))
        new = _seqs(tmp_path, last)
        assert new == list(range(n * 10, n * 10 + 10))
        delivered += new
        last = new[-1]
    writer.seal()
    assert _seqs(tmp_path, last) == []
    assert delivered == list(range(200))
    assert _seqs(tmp_path, -1) == list(range(200))  # another reader, from the start


def test_a_follower_does_not_read_again_what_it_has_read(tmp_path: Path) -> None:
    """Damage to bytes before the follower's mark is not seen by the follower (it does
    not read them again), while a reader from the start finds it: the proof that a poll
    costs what was appended, not the whole segment."""
    path, writer = _segment(tmp_path)
    writer.append(_batch(0, 50))
    assert _seqs(tmp_path, -1)[-1] == 49
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside the first batch; same file, same inode
    with open(path, "r+b") as f:
        f.write(data)
    writer.append(_batch(50, 50))
    assert _seqs(tmp_path, 49) == list(range(50, 100))
    assert read_segment(path).damaged is not None
    problems = ReadProblems()
    tails.forget()
    assert _seqs(tmp_path, -1, problems) == []
    assert [p for p, _ in problems.damaged] == [path]
    writer.close()


def test_a_segment_larger_than_a_slice_is_read_whole_in_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tails, "READ_BYTES", 1)  # every batch is larger than a slice
    _path, writer = _segment(tmp_path)
    for n in range(12):
        writer.append(_batch(n * 7, 7))
    problems = ReadProblems()
    assert _seqs(tmp_path, -1, problems) == list(range(84))
    assert problems.torn == [] and problems.damaged == []
    writer.append(_batch(84, 7))
    writer.seal()
    assert _seqs(tmp_path, 83, problems) == list(range(84, 91))
    assert problems.torn == [] and problems.damaged == []


def test_a_torn_tail_is_still_found_behind_the_mark(tmp_path: Path) -> None:
    path, writer = _segment(tmp_path)
    writer.append(_batch(0, 5))
    assert _seqs(tmp_path, -1) == list(range(5))
    writer.append(_batch(5, 5))
    writer.close()
    whole = path.read_bytes()
    with open(path, "r+b") as f:
        f.truncate(len(whole) - 3)  # the second batch is cut: a writer killed mid-batch
    assert _seqs(tmp_path, 4) == []
    tail = tails.read_live_segment(path, 4)
    assert tail.batches == [] and tail.torn_bytes > 0 and tail.damaged is None
    # the writer's next segment carries on after the last complete batch
    later = stream_dir(tmp_path, STREAM) / segment_name(1, 5)
    second = SegmentWriter(later, stream_schema(SCHEMAS["metrics"], STREAM), fsync=False)
    second.append(_batch(5, 5))
    second.seal()
    assert _seqs(tmp_path, 4) == list(range(5, 10))


def test_a_replaced_file_is_read_from_its_start(tmp_path: Path) -> None:
    """A segment rewritten under the same name (a salvage by `fsck --repair`) is another
    inode: the mark of the old file is not used on it."""
    path, writer = _segment(tmp_path)
    for n in range(3):
        writer.append(_batch(n * 4, 4))
    writer.seal()
    assert _seqs(tmp_path, -1) == list(range(12))
    replacement = path.with_name(".new")
    other = SegmentWriter(replacement, stream_schema(SCHEMAS["metrics"], STREAM),
                          fsync=False)
    other.append(_batch(0, 20))
    other.seal()
    os.replace(replacement, path)
    assert _seqs(tmp_path, 11) == list(range(12, 20))


def test_readers_at_different_places_each_get_their_own_records(tmp_path: Path) -> None:
    """Two followers of one segment in one process (say two exporters), one far behind
    the other: the one behind never skips what the one ahead has read."""
    _path, writer = _segment(tmp_path)
    ahead = behind = -1
    got_ahead: list[int] = []
    got_behind: list[int] = []
    for n in range(10):
        writer.append(_batch(n * 5, 5))
        new = _seqs(tmp_path, ahead)
        got_ahead += new
        ahead = new[-1]
        if n % 3 == 2:  # the other one polls less often
            new = _seqs(tmp_path, behind)
            got_behind += new
            behind = new[-1]
    got_behind += _seqs(tmp_path, behind)
    writer.seal()
    assert got_ahead == got_behind == list(range(50))
