"""Compaction tells a sealed segment from one a writer still appends to by walking its
message framing only (nothing decoded): exactly as a full read would, for every length a
torn or growing segment can have, and never taking a batch that ends in the bytes of the
end-of-stream marker for the marker."""

from __future__ import annotations

import struct
from pathlib import Path

import pyarrow as pa

from tracklake._format import SCHEMAS, StreamId, segment_name
from tracklake._format.segment import EOS, SegmentWriter, read_segment, stream_schema
from tracklake._ops.compact import _sealed
from tracklake._read.reader import Segment

_STREAM = StreamId("p", "r", 0, 1, "metrics")
_SCHEMA = stream_schema(SCHEMAS["metrics"], _STREAM)


def _batch(seq: int, value: float) -> pa.RecordBatch:
    return pa.record_batch({"seq": [seq], "time": pa.array([seq], pa.timestamp("us", tz="UTC")),
                            "step": [seq], "key": ["k"], "value": [value]}, schema=_SCHEMA)


def _segment(tmp_path: Path, values: list[float], seal: bool) -> Path:
    path = tmp_path / f"{len(values)}-{seal}" / segment_name(0, 0)
    path.parent.mkdir()
    writer = SegmentWriter(path, _SCHEMA, fsync=False)
    for i, v in enumerate(values):
        writer.append(_batch(i, v))
    if seal:
        writer.seal()
    else:
        writer.close()
    return path


def _is_sealed(path: Path) -> bool:
    return _sealed(Segment(0, 0, path))


def test_sealed_and_live_segments(tmp_path: Path) -> None:
    assert _is_sealed(_segment(tmp_path, [1.0, 2.0], seal=True))
    assert not _is_sealed(_segment(tmp_path, [1.0, 2.0], seal=False))
    assert _is_sealed(_segment(tmp_path, [], seal=True))  # a header, then the marker


def test_every_prefix_of_a_segment_is_judged_as_a_full_read_judges_it(tmp_path: Path
                                                                      ) -> None:
    whole = _segment(tmp_path, [1.0, -2.5, 3.0], seal=True).read_bytes()
    prefix = tmp_path / "prefix" / segment_name(0, 0)
    prefix.parent.mkdir()
    verdicts = []
    for n in range(len(whole) + 1):
        prefix.write_bytes(whole[:n])
        verdicts.append(_is_sealed(prefix))
        assert verdicts[-1] == read_segment(prefix).sealed, n
    assert verdicts.count(True) == 1  # only the whole file


def test_a_live_segment_whose_last_bytes_spell_the_marker_is_not_sealed(tmp_path: Path
                                                                        ) -> None:
    (spelled,) = struct.unpack("<d", EOS)  # a value stored as the marker's eight bytes
    path = tmp_path / segment_name(0, 0)
    with path.open("wb") as f:  # uncompressed: the batch's body ends with the value
        writer = pa.ipc.new_stream(f, _SCHEMA)
        writer.write_batch(_batch(0, spelled))
    assert path.read_bytes().endswith(EOS)
    assert not _is_sealed(path)
