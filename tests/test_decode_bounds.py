"""Resource bombs from files in the store: a small segment whose batches decompress to
gigabytes is refused per batch, before anything is decompressed, by every reader; and no
writer ever makes a batch that large (rows are cut between calls, and one text value
is bounded at the call)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from _bombs import compressible_strings, understate_footer
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



def _part_bomb(root: Path, rows: int, value_bytes: int) -> Path:
    """A compacted texts part of `rows` rows all pointing to one dictionary value of
    `value_bytes` bytes, in place of the run's honest part: a few KB that decode to
    rows * value_bytes (no footer checksum: as a part of an earlier version)."""
    import numpy as np

    text = pa.DictionaryArray.from_arrays(pa.array(np.zeros(rows, dtype=np.int32)),
                                          pa.array(["a" * value_bytes]))
    return _planted_texts_part(root, text)


def _zstd_bomb(root: Path, rows: int, value_bytes: int) -> Path:
    """A compacted texts part of `rows` distinct strings of `value_bytes` bytes, each its
    row number then one letter, in one row group and no dictionary: zstd makes each a
    few hundred bytes, and its footer says truly what they decompress to."""
    return _planted_texts_part(root, compressible_strings(rows, value_bytes),
                               use_dictionary=False)


def _planted_texts_part(root: Path, text: pa.Array, **options: Any) -> Path:
    """A texts part of run pb holding `text`, in place of its honest part."""
    import numpy as np
    import pyarrow.parquet as pq

    from tracklake._format import FORMAT_VERSION

    with tracklake.init(project="p", run_id="pb", root=root) as run:
        run.log_text("k", "honest")
    tracklake.compact(root=root)
    s = StreamId("p", "pb", 0, 1, "texts")
    [honest] = stream_dir(root, s).glob("part-*.parquet")
    honest.unlink()
    rows = len(text)
    n = np.arange(rows, dtype=np.int64)
    table = pa.table({
        "seq": n, "time": pa.array(n, pa.timestamp("us", tz="UTC")), "step": n,
        "key": pa.array(["k"] * rows), "text": text})
    path = stream_dir(root, s) / f"part-{0:012d}-{rows - 1:012d}-{0:06d}.parquet"
    with pq.ParquetWriter(path, table.schema, compression="zstd", store_schema=False,
                          **options) as writer:
        writer.write_table(table, row_group_size=rows)
        writer.add_key_value_metadata({
            "tracklake.format": FORMAT_VERSION, "tracklake.kind": "texts",
            "tracklake.project": "p", "tracklake.run": "pb", "tracklake.rank": "0",
            "tracklake.attempt": "1"})
    return path


def test_a_part_whose_pages_decompress_past_the_limit_is_refused_before_they_are_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 200 KB part of 400 distinct 1 MiB strings (400 MiB once decompressed), with the
    read limit at 64 MiB: each reader refuses it from what its footer says, before
    reading a page. Before, a question about the run decompressed it twice (1.2 GiB at
    the peak), and fsck called it clean: pyarrow decompresses a whole column chunk even
    for a batch of 16 rows, so measuring batch by batch came too late."""
    root = tmp_path / "store"
    path = _zstd_bomb(root, 400, 1 << 20)
    assert path.stat().st_size < 1 << 20
    monkeypatch.setenv("TRACKLAKE_PART_READ_LIMIT", "64MiB")
    _refused_by_every_reader(root, tmp_path)
    assert path.exists()  # refused, never removed


def test_a_footer_that_understates_what_the_pages_decompress_to_is_not_believed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same 400 MiB of pages, their footer rewritten to say every chunk decompresses
    to 1,000 bytes. pyarrow allocates each page by its own header, not by the footer, so
    the pages' headers are read first. Before, every reader believed the footer and
    decompressed the pages."""
    import pyarrow.parquet as pq

    root = tmp_path / "store"
    path = _zstd_bomb(root, 400, 1 << 20)
    understate_footer(path)
    assert pq.read_metadata(path).row_group(0).total_byte_size == 1000  # the forged sizes
    monkeypatch.setenv("TRACKLAKE_PART_READ_LIMIT", "64MiB")
    _refused_by_every_reader(root, tmp_path)
    assert path.exists()


def _refused_by_every_reader(root: Path, tmp_path: Path) -> None:
    """Each command that reads run pb's texts part, in its own process, refuses it
    within 320 MiB at its peak; those that report say why."""
    refused = "decode to more than 67108864 bytes"
    for args in (["sql", "--root", str(root), "SELECT max(length(text)) FROM texts "
                  "WHERE run = 'pb'"],
                 ["sql", "--root", str(root), "SELECT max(length(text)) FROM texts"],
                 ["show", "pb", "--root", str(root)],
                 ["fsck", "--root", str(root)],
                 ["export", "tensorboard", "--root", str(root), "--run", "pb",
                  "--logdir", str(tmp_path / "tb")],
                 ["compact", "--root", str(root)],
                 ["pack", "--root", str(root), "--run", "pb", "--output",
                  str(tmp_path / "pb.tlpack")]):
        proc, peak = peak_rss_kib(args)
        assert "Traceback" not in proc.stderr, (args, proc.stderr)
        assert peak < 320 << 10, (args, f"peak RSS {peak >> 10} MiB")
        if args[0] in ("sql", "fsck", "show"):
            assert refused in proc.stdout + proc.stderr, (args, proc.stdout, proc.stderr)


def test_a_part_that_decodes_past_the_limit_is_refused_before_it_is_decoded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 30 KB part that decodes to 1.5 GiB, with the read limit at 256 MiB: fsck, a
    query and an export refuse it as damaged, each in well under what it decodes to
    (before: every reader decoded it whole, twice its size at the peak)."""
    root = tmp_path / "store"
    path = _part_bomb(root, 1536, 1 << 20)
    assert path.stat().st_size < 64 << 10
    monkeypatch.setenv("TRACKLAKE_PART_READ_LIMIT", "256MiB")
    proc, peak = peak_rss_kib(["fsck", "--root", str(root)])
    assert proc.returncode == 1 and "decode to more than 268435456 bytes" in proc.stdout, \
        proc.stdout + proc.stderr
    assert path.name in proc.stdout and "TRACKLAKE_PART_READ_LIMIT" in proc.stdout
    assert peak < 512 << 10, f"fsck peak RSS {peak >> 10} MiB"
    proc, peak = peak_rss_kib(["export", "tensorboard", "--root", str(root), "--run", "pb",
                               "--logdir", str(tmp_path / "tb")])
    assert "decode to more than" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert peak < 512 << 10, f"export peak RSS {peak >> 10} MiB"
    proc, peak = peak_rss_kib(["sql", "--root", str(root), "SELECT count(*) FROM texts"])
    assert "Traceback" not in proc.stderr, proc.stderr
    assert peak < 512 << 10, f"sql peak RSS {peak >> 10} MiB"
    proc, peak = peak_rss_kib(["compact", "--root", str(root)])
    assert proc.returncode == 0, proc.stderr
    assert peak < 512 << 10, f"compact peak RSS {peak >> 10} MiB"
    assert path.exists()  # refused, never removed


def test_a_part_within_the_read_limit_reads_whole(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "store"
    _part_bomb(root, 200, 1 << 20)  # 200 MiB decoded
    monkeypatch.setenv("TRACKLAKE_PART_READ_LIMIT", "256MiB")
    from tracklake._format.part import read_part_table

    [part] = root.glob("texts/**/part-*.parquet")
    table = read_part_table(part)
    assert table.num_rows == 200 and table.schema.field("text").type == pa.string()
    assert table.column("text")[199].as_py() == "a" * (1 << 20)
    monkeypatch.setenv("TRACKLAKE_PART_READ_LIMIT", "lots")
    with pytest.raises(tracklake.StoreError, match="TRACKLAKE_PART_READ_LIMIT='lots'") as bad:
        read_part_table(part)
    assert not isinstance(bad.value, tracklake.FormatError)  # a setting, not damage
