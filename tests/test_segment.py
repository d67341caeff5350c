"""Segment framing: checksummed Arrow IPC stream files, torn tails and damage."""

from __future__ import annotations

import datetime as dt
import math
import multiprocessing
import struct
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from _crafted import endianness_slot, message_spans
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracklake import FormatError, NewerFormatError, StreamId
from tracklake._format import FORMAT_VERSION, SCHEMAS
from tracklake._format.ipc_size import declares_other_than_little_endian
from tracklake._format.segment import EOS, SegmentWriter, read_segment, stream_schema

METRICS = SCHEMAS["metrics"]
STREAM = StreamId("proj", "run-1", 0, 1, "metrics")
EPOCH = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)


def _batch(seq: int, rows: list[tuple[int, str, float]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [{"seq": seq, "time": EPOCH + dt.timedelta(microseconds=seq), "step": step, "key": key,
          "value": value} for step, key, value in rows], schema=METRICS)


def _canon(batch: pa.RecordBatch) -> list[tuple[Any, ...]]:
    """Row contents with floats compared bit for bit (NaN included), metadata ignored."""
    out = []
    for row in batch.to_pylist():
        value = row["value"]
        out.append((row["seq"], row["time"], row["step"], row["key"],
                    None if value is None else struct.pack("<d", value)))
    return out


def _same_batches(got: list[pa.RecordBatch], expected: list[pa.RecordBatch]) -> bool:
    return len(got) == len(expected) and all(
        _canon(a) == _canon(b) and a.schema.remove_metadata().equals(b.schema)
        for a, b in zip(got, expected, strict=True))


def _write(path: Path, batches: list[pa.RecordBatch], *, seal: bool = True,
           schema: pa.Schema | None = None) -> SegmentWriter:
    writer = SegmentWriter(path, schema or stream_schema(METRICS, STREAM), fsync=False)
    for b in batches:
        writer.append(b)
    if seal:
        writer.seal()
    else:
        writer.close()
    return writer


class _BytesPath(type(Path())):  # type: ignore[misc]
    """A path whose read_bytes() returns given bytes: lets the loops below feed read_segment
    thousands of damaged variants without a file-system round trip each."""

    _data = b""

    @classmethod
    def holding(cls, data: bytes) -> _BytesPath:
        path = cls("/in-memory/seg-000000-000000000000.arrows")
        path._data = data
        return path

    #: read whole through read_bytes(), as a segment in an object store is (a local one
    #: is read a slice at a time, from the file)
    fs_path = "/in-memory/seg-000000-000000000000.arrows"

    def read_bytes(self) -> bytes:
        return self._data


def _sample_batches() -> list[pa.RecordBatch]:
    return [_batch(i, [(i, "loss", 1234.5678 + i), (i, "grad/norm", float(i)),
                       (i, "nan", math.nan)]) for i in range(3)]


# -- round trip ---------------------------------------------------------------------------

_rows = st.lists(
    st.tuples(st.integers(-(2**63), 2**63 - 1),
              st.text(max_size=12),
              st.floats(allow_nan=True, allow_infinity=True)),
    min_size=1, max_size=20)


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches_rows=st.lists(_rows, min_size=0, max_size=6), seal=st.booleans())
def test_appended_batches_read_back_exactly(batches_rows: list[list[tuple[int, str, float]]],
                                           seal: bool) -> None:
    """Every appended batch comes back, verified and in order; `sealed` is set exactly when
    seal() was called, and the file is a plain Arrow IPC stream."""
    batches = [_batch(seq, rows) for seq, rows in enumerate(batches_rows)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "seg.arrows"
        writer = _write(path, batches, seal=seal)
        assert writer.batches == len(batches)
        assert writer.size == path.stat().st_size
        contents = read_segment(path)
        with pa.ipc.open_stream(path.read_bytes()) as plain:
            plain_batches = list(plain)
            plain_meta = plain.schema.metadata
    assert _same_batches(contents.batches, batches)
    assert contents.sealed is seal
    assert contents.damaged is None and contents.torn_bytes == 0
    assert contents.schema_metadata["tracklake.format"] == FORMAT_VERSION
    assert contents.schema_metadata["tracklake.run"] == "run-1"
    assert contents.schema_metadata["tracklake.kind"] == "metrics"
    assert _same_batches(plain_batches, batches)
    assert plain_meta[b"tracklake.attempt"] == b"1"


def test_sealed_segment_ends_with_end_of_stream_marker(tmp_path: Path) -> None:
    path = tmp_path / "seg.arrows"
    _write(path, _sample_batches(), seal=True)
    assert path.read_bytes().endswith(EOS)
    live = tmp_path / "live.arrows"
    _write(live, _sample_batches(), seal=False)
    assert not live.read_bytes().endswith(EOS)
    assert not read_segment(live).sealed and read_segment(path).sealed


def test_each_batch_carries_crc_and_seq_range_metadata(tmp_path: Path) -> None:
    path = tmp_path / "seg.arrows"
    batches = [_batch(4, [(0, "a", 1.0)]), _batch(5, [(1, "a", 2.0), (1, "b", 3.0)])]
    _write(path, batches)
    with pa.ipc.open_stream(path.read_bytes()) as reader:
        metas = []
        while True:
            try:
                _, md = reader.read_next_batch_with_custom_metadata()
            except StopIteration:
                break
            metas.append({k.decode(): v.decode() for k, v in md.items()})
    assert [(m["seq_first"], m["seq_last"]) for m in metas] == [("4", "4"), ("5", "5")]
    assert all(m["crc32"].isdigit() for m in metas)


def test_segment_writer_refuses_to_overwrite_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "seg.arrows"
    _write(path, _sample_batches())
    before = path.read_bytes()
    with pytest.raises(FileExistsError):
        SegmentWriter(path, stream_schema(METRICS, STREAM), fsync=False)
    assert path.read_bytes() == before


# -- torn tails ---------------------------------------------------------------------------

def test_a_suspended_segment_is_reopened_by_the_next_append_unless_it_changed(
        tmp_path: Path) -> None:
    """A writer closes its file between appends (`suspend`) and appends again to the same
    file; once the file was replaced or grew meanwhile, the next append refuses it."""
    path = tmp_path / "seg.arrows"
    writer = SegmentWriter(path, stream_schema(METRICS, STREAM), fsync=False)
    batches = [_batch(0, [(0, "a", 1.0)]), _batch(1, [(1, "a", 2.0)])]
    writer.append(batches[0])
    writer.suspend()
    writer.append(batches[1])
    writer.suspend()
    writer.seal()
    contents = read_segment(path)
    assert contents.sealed and _same_batches(contents.batches, batches)
    for change in ("replaced", "grew"):
        other = tmp_path / f"{change}.arrows"
        writer = SegmentWriter(other, stream_schema(METRICS, STREAM), fsync=False)
        writer.append(batches[0])
        writer.suspend()
        if change == "replaced":  # by a copy renamed over it (as a restore would)
            copy = tmp_path / "copy"
            copy.write_bytes(other.read_bytes())
            copy.replace(other)
        else:
            with other.open("ab") as f:
                f.write(b"x")
        with pytest.raises(OSError, match="replaced or changed"):
            writer.append(batches[1])
        writer.abandon()


def test_every_truncation_point_yields_a_verified_prefix(tmp_path: Path) -> None:
    """A segment cut at any byte (0 to its full length) reads as the batches that are
    complete before the cut, never raising, never reporting damage; the rest of the file
    is counted in `torn_bytes`."""
    full = tmp_path / "full.arrows"
    batches = [_batch(i, [(i, "loss", 0.5 * i), (i, "lr", 1e-3)]) for i in range(3)]
    _write(full, batches)
    data = full.read_bytes()
    spans = message_spans(data)
    assert len(spans) == 1 + len(batches)
    ends = [end for _, _, end in spans[1:]]
    for length in range(len(data) + 1):
        contents = read_segment(_BytesPath.holding(data[:length]))
        complete = sum(1 for e in ends if e <= length)
        assert len(contents.batches) == complete, length
        assert all(a.equals(b, check_metadata=False)  # no NaN here: equals() is exact
                   for a, b in zip(contents.batches, batches, strict=False)), length
        assert contents.damaged is None, length
        assert contents.sealed is (length == len(data)), length
        if length < spans[0][2]:  # inside the schema message: a torn header
            assert contents.torn_bytes == length, length
        elif not contents.sealed:
            last_end = ends[complete - 1] if complete else spans[0][2]
            assert contents.torn_bytes == length - last_end, length
        else:
            assert contents.torn_bytes == 0


def test_empty_segment_file_is_a_torn_header_not_an_error(tmp_path: Path) -> None:
    path = tmp_path / "seg.arrows"
    path.write_bytes(b"")
    contents = read_segment(path)
    assert contents.batches == [] and contents.torn_bytes == 0 and not contents.sealed


@pytest.mark.parametrize("length", [1, 2, 3])
def test_segment_torn_within_first_four_bytes_is_not_an_error(tmp_path: Path,
                                                              length: int) -> None:
    """A header write torn after 1-3 bytes is a torn header (nothing to read), not a
    FormatError."""
    full = tmp_path / "full.arrows"
    _write(full, _sample_batches())
    cut = tmp_path / "cut.arrows"
    cut.write_bytes(full.read_bytes()[:length])
    contents = read_segment(cut)
    assert contents.batches == [] and contents.torn_bytes == length


# -- damage -------------------------------------------------------------------------------

@pytest.mark.parametrize("damaged_batch", [0, 1, 2])
def test_flipped_byte_in_a_batch_body_is_reported_as_damage(tmp_path: Path,
                                                            damaged_batch: int) -> None:
    """Flipping the first byte of a batch's body (always data, compressed or not) is
    detected: reading stops there and reports `damaged` at that batch's offset, the file is
    not sealed, and the batches before it are still returned."""
    path = tmp_path / "seg.arrows"
    batches = _sample_batches()
    _write(path, batches)
    data = bytearray(path.read_bytes())
    start, body, end = message_spans(bytes(data))[1 + damaged_batch]
    assert start < body < end
    data[body] ^= 0x10
    path.write_bytes(bytes(data))
    contents = read_segment(path)
    assert _same_batches(contents.batches, batches[:damaged_batch])
    assert contents.damaged is not None and str(start) in contents.damaged
    assert contents.torn_bytes == len(data) - start
    assert not contents.sealed


@pytest.mark.parametrize("damaged_batch", [0, 2])
def test_every_flipped_body_byte_is_reported_as_damage(damaged_batch: int) -> None:
    """Whatever body byte of a batch is flipped, reading never raises, returns exactly the
    batches before it unchanged and reports `damaged` (the CRC covers the stored body)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "seg.arrows"
        batches = _sample_batches()
        _write(path, batches)
        data = path.read_bytes()
    start, body, end = message_spans(data)[1 + damaged_batch]
    for pos in range(body, end):
        flipped = bytearray(data)
        flipped[pos] ^= 0xFF
        contents = read_segment(_BytesPath.holding(bytes(flipped)))
        assert _same_batches(contents.batches, batches[:damaged_batch]), pos
        assert contents.damaged and str(start) in contents.damaged, pos


def test_flipped_byte_in_an_uncompressed_body_is_a_checksum_mismatch() -> None:
    """Without compression every body byte decodes whatever its value, so it is the CRC
    that catches the flip: `damaged` says checksum mismatch."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "seg.arrows"
        batches = _sample_batches()
        writer = SegmentWriter(path, stream_schema(METRICS, STREAM), fsync=False,
                               compression=None)
        for b in batches:
            writer.append(b)
        writer.seal()
        data = path.read_bytes()
    assert struct.pack("<d", 1234.5678 + 1) in data  # really stored uncompressed
    start, body, end = message_spans(data)[2]
    for pos in range(body, end):
        flipped = bytearray(data)
        flipped[pos] ^= 0x01
        contents = read_segment(_BytesPath.holding(bytes(flipped)))
        assert _same_batches(contents.batches, batches[:1]), pos
        assert contents.damaged == f"checksum mismatch in batch at byte {start}", pos


def test_any_flipped_byte_in_the_last_batch_message_is_detected(tmp_path: Path) -> None:
    """A flipped byte anywhere in the last batch's message (length prefix, flatbuffer
    metadata, custom metadata or body) never raises and never yields a batch whose data
    differs from what was written: the two earlier batches come back, the last one either
    unchanged or reported as damaged/torn."""
    path = tmp_path / "seg.arrows"
    batches = _sample_batches()
    _write(path, batches)
    data = path.read_bytes()
    start, _, end = message_spans(data)[-1]
    for pos in range(start, end):
        flipped = bytearray(data)
        flipped[pos] ^= 0xFF
        contents = read_segment(_BytesPath.holding(bytes(flipped)))
        assert _same_batches(contents.batches, batches[:len(contents.batches)]), pos
        assert len(contents.batches) >= 2, pos
        if len(contents.batches) == 2:
            assert contents.damaged or contents.torn_bytes, pos


def _misread_header_flips(data: bytes) -> tuple[list[str], int]:
    """Flip each bit of the schema message of `data` in turn and read the segment: the
    flips after which it read other values without saying so, and how many were refused.
    Runs in a child process, so that a flip that crashes the reader fails one test."""
    _, _, header_end = message_spans(data)[0]
    batches = _sample_batches()
    misread, refused = [], 0
    for pos in range(header_end):
        for bit in range(8):
            flipped = bytearray(data)
            flipped[pos] ^= 1 << bit
            try:
                contents = read_segment(_BytesPath.holding(bytes(flipped)))
            except FormatError:
                refused += 1
                continue
            # what still reads is what was written, or is reported as damaged
            if not (_same_batches(contents.batches, batches[:len(contents.batches)]) and (
                    len(contents.batches) == len(batches) or contents.damaged
                    or contents.torn_bytes)):
                misread.append(f"byte {pos} bit {bit}")
    return misread, refused


def test_any_flipped_bit_in_the_header_raises_format_error_or_reads_the_same(
        tmp_path: Path) -> None:
    """The schema message has no checksum. A flipped bit anywhere in it either still reads
    as written or raises FormatError - never UnicodeDecodeError, a crash, or values read
    as others (one bit turns the header's byte order to big-endian, and pyarrow swaps the
    bytes of every value: numbers change and strings' offsets point out of their data)."""
    path = tmp_path / "seg.arrows"
    _write(path, _sample_batches())
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        misread, refused = pool.submit(_misread_header_flips, path.read_bytes()).result()
    assert not misread
    assert refused > 0  # e.g. the version digits or the message length


def test_a_header_declaring_big_endian_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "seg.arrows"
    _write(path, _sample_batches())
    data = bytearray(path.read_bytes())
    data[endianness_slot(bytes(data))] = 4  # the field read from the table's 4th byte
    assert declares_other_than_little_endian(memoryview(data))
    path.write_bytes(bytes(data))
    with pytest.raises(FormatError, match=f"{path}: its schema header declares big-endian"):
        read_segment(path)


def test_a_batch_with_a_right_checksum_and_offsets_out_of_its_data_is_damage(
        tmp_path: Path) -> None:
    """A checksum is no proof against a crafted file: a batch whose strings' offsets
    point past their data, written with its checksum right, is reported as damage and
    never handed to a reader (reading its strings would crash the process)."""
    good = _batch(0, [(0, "loss", 1.0), (0, "acc", 2.0)])
    key = good.column("key")
    offsets = pa.py_buffer(struct.pack("<3i", 0, 1 << 20, len(b"lossacc")))
    bad_key = pa.Array.from_buffers(pa.string(), len(key), [None, offsets, key.buffers()[2]])
    crafted = pa.RecordBatch.from_arrays(
        [good.column(i) if name != "key" else bad_key for i, name in
         enumerate(good.schema.names)], schema=METRICS)
    path = tmp_path / "seg.arrows"
    _write(path, [_batch(0, [(0, "x", 0.5)]), crafted])
    contents = read_segment(path)
    assert len(contents.batches) == 1 and _canon(contents.batches[0])[0][3] == "x"
    assert contents.damaged is not None and contents.damaged.startswith("invalid batch at")
    assert "offset" in contents.damaged


# -- not a segment / newer format -------------------------------------------------------

@pytest.mark.parametrize("content", [b"hello, this is not arrow at all\n" * 4,
                                     b"PAR1" + bytes(range(256)) * 20,
                                     b"\x00" * 5000])
def test_file_that_is_not_arrow_raises_format_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "seg.arrows"
    path.write_bytes(content)
    with pytest.raises(FormatError, match="Arrow IPC stream"):
        read_segment(path)


def test_arrow_stream_without_tracklake_version_raises_format_error(tmp_path: Path) -> None:
    path = tmp_path / "seg.arrows"
    _write(path, _sample_batches(), schema=METRICS)  # no tracklake metadata
    with pytest.raises(FormatError, match="format version"):
        read_segment(path)


def test_segment_of_a_newer_major_format_raises_newer_format_error(tmp_path: Path) -> None:
    path = tmp_path / "seg.arrows"
    schema = stream_schema(METRICS, STREAM)
    schema = schema.with_metadata({**{k.decode(): v.decode()
                                      for k, v in schema.metadata.items()},
                                   "tracklake.format": "2.0"})
    _write(path, _sample_batches(), schema=schema)
    with pytest.raises(NewerFormatError, match=r"format 2\.0"):
        read_segment(path)
    assert issubclass(NewerFormatError, FormatError)


def test_segment_of_a_newer_minor_format_is_read(tmp_path: Path) -> None:
    path = tmp_path / "seg.arrows"
    schema = stream_schema(METRICS, STREAM)
    schema = schema.with_metadata({**{k.decode(): v.decode()
                                      for k, v in schema.metadata.items()},
                                   "tracklake.format": "1.7"})
    batches = _sample_batches()
    _write(path, batches, schema=schema)
    assert _same_batches(read_segment(path).batches, batches)


def test_segments_written_by_a_run_are_plain_arrow_streams(root: Path) -> None:
    """The segment files a run leaves behind open with pyarrow.ipc.open_stream alone."""
    import tracklake

    run = tracklake.init(project="p", run_id="r", root=root, capture_identity=False)
    run.log({"a": 1.0, "b": 2.0}, step=0)
    run.log({"a": 3.0}, step=1)
    run.log_text("t", "hello")
    run.finish()
    segs = sorted(root.glob("*/project=p/run=r/rank=0/attempt=1/*seg-*.arrows"))
    assert {p.parts[-6] for p in segs} == {"metrics", "texts"}
    for seg in segs:
        with pa.ipc.open_stream(seg.read_bytes()) as reader:
            table = reader.read_all()
        assert reader.schema.metadata[b"tracklake.kind"].decode() == seg.parts[-6]
        assert table.schema.remove_metadata().equals(SCHEMAS[seg.parts[-6]])
        assert read_segment(seg).sealed
    metrics = next(p for p in segs if p.parts[-6] == "metrics")
    with pa.ipc.open_stream(metrics.read_bytes()) as reader:
        rows = reader.read_all().to_pylist()
    assert [(r["seq"], r["step"], r["key"], r["value"]) for r in rows] == [
        (0, 0, "a", 1.0), (0, 0, "b", 2.0), (1, 1, "a", 3.0)]
