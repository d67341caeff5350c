"""Resource bombs from files in the store: a small segment whose batches decompress to
gigabytes is refused per batch, before anything is decompressed, by every reader; and no
writer ever makes a batch that large (rows are cut between calls, and one text value
is bounded at the call)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pyarrow as pa
import pytest
from _memory import peak_rss_kib

import tracklake
from tracklake._format import SCHEMAS, StreamId, segment_name, stream_dir
from tracklake._format.segment import MAX_BATCH_BYTES, SegmentWriter, read_segment, stream_schema
from tracklake._ops.fsck import fsck
from tracklake._write.batches import WRITE_BATCH_BYTES, cut_rows


def _bomb(root: Path, batches: int, text_bytes: int) -> Path:
    """A texts segment of one small honest batch, then `batches` batches of one row whose
    text is `text_bytes` of one letter: a few hundred KB on disk."""
    s = StreamId("p", "bomb", 0, 1, "texts")
    path = stream_dir(root, s) / segment_name(0, 0)
    writer = SegmentWriter(path, stream_schema(SCHEMAS["texts"], s))

    def batch(seq: int, text: str) -> pa.RecordBatch:
        return pa.RecordBatch.from_pylist(
            [{"seq": seq, "time": 0, "step": seq, "key": "k", "text": text}],
            schema=SCHEMAS["texts"])

    writer.append(batch(0, "fine"))
    huge = "a" * text_bytes
    for seq in range(1, batches + 1):
        writer.append(batch(seq, huge))
    writer.seal()
    with tracklake.init(project="p", run_id="bomb", root=root) as run:  # its attempt file
        run.log({"x": 1.0}, step=0)
    return path


def test_a_segment_of_zstd_bombs_is_refused_before_decoding(tmp_path: Path) -> None:
    root = tmp_path / "store"
    path = _bomb(root, 8, 300 << 20)  # 8 x 300 MiB decoded
    assert path.stat().st_size < 1 << 20
    contents = read_segment(path)
    assert [b.num_rows for b in contents.batches] == [1]  # the honest batch before it
    assert contents.damaged is not None and "would decode to" in contents.damaged
    assert any("would decode to" in p.what for p in fsck(root).problems)
    # each command in its own process: what it allocated at most is its peak RSS
    for args in (["sql", "--root", str(root), "SELECT count(*) FROM texts_all"],
                 ["show", "bomb", "--root", str(root)],
                 ["export", "tensorboard", "--root", str(root), "--run", "bomb",
                  "--logdir", str(tmp_path / "tb")],
                 ["compact", "--root", str(root)]):
        proc, peak_kib = peak_rss_kib(args)
        assert "Traceback" not in proc.stderr, (args, proc.stderr)
        assert peak_kib < (1 << 20) * 1.5, args  # KiB: under 1.5 GiB, not 2.4+ GiB
    with pytest.warns(RuntimeWarning, match="would decode to"):
        texts = tracklake.query("SELECT text FROM texts_all", root=root).to_pylist()
    assert texts == [{"text": "fine"}]  # what is readable still reads, after compaction


def test_a_batch_just_within_the_limit_reads(tmp_path: Path) -> None:
    root = tmp_path / "store"
    path = _bomb(root, 1, MAX_BATCH_BYTES - (1 << 20))
    contents = read_segment(path)
    assert contents.damaged is None and [b.num_rows for b in contents.batches] == [1, 1]


def test_writers_cut_row_batches_between_calls() -> None:
    rows = [{"seq": i // 3, "time": 0, "step": i, "key": "k", "text": "x" * (1 << 20)}
            for i in range(300)]  # 100 calls of 3 rows, 300 MiB
    batch = pa.RecordBatch.from_pylist(rows, schema=SCHEMAS["texts"])
    pieces = cut_rows(batch)
    assert sum(p.num_rows for p in pieces) == 300 and len(pieces) > 1
    assert all(p.nbytes <= WRITE_BATCH_BYTES + 4 * (1 << 20) for p in pieces)
    for a, b in itertools.pairwise(pieces):  # no call split across two
        assert a.column(0)[-1].as_py() != b.column(0)[0].as_py()


def test_a_text_value_larger_than_the_limit_is_refused_at_the_call(root: Path) -> None:
    with tracklake.init(project="p", run_id="r", root=root) as run:
        with pytest.raises(ValueError, match=r"'text' of key 'big'.*artifact"):
            run.log_text("big", "x" * (17 << 20))
        run.log_text("ok", "x" * (15 << 20))
    assert tracklake.query("SELECT key, length(text) AS n FROM texts", root=root
                           ).to_pylist() == [{"key": "ok", "n": 15 << 20}]

