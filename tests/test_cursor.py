"""Exporter cursors: JSON round trip, malformed input, and exactly-once resumable reads that
stay valid across compaction."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tracklake
from tracklake import KINDS, Cursor, CursorError, StreamId

_positions = st.dictionaries(
    st.builds(lambda r, a, k: f"{r}/{a}/{k}", st.integers(0, 10**6), st.integers(0, 10**4),
              st.sampled_from(KINDS)),
    st.integers(-1, 2**63 - 1), max_size=12)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(project=st.text(), run=st.text(), positions=_positions)
def test_cursor_json_round_trip(project: str, run: str, positions: dict[str, int]) -> None:
    """from_json(to_json(c)) == c for any project/run text and any valid positions, and the
    JSON form is canonical (sorted positions)."""
    cursor = Cursor(project, run, dict(positions))
    text = cursor.to_json()
    back = Cursor.from_json(text)
    assert back == cursor
    assert back.to_json() == text
    assert Cursor.from_json(text.encode()) == cursor
    assert list(json.loads(text)["positions"]) == sorted(positions)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(positions=_positions)
def test_cursor_streams_and_after_agree_with_positions(positions: dict[str, int]) -> None:
    cursor = Cursor("p", "r", dict(positions))
    for rank, attempt, kind, seq in cursor.streams():
        stream = StreamId("p", "r", rank, attempt, kind)
        assert stream.key() in positions
        assert cursor.after(stream) == seq == positions[stream.key()]
    assert cursor.after(StreamId("p", "r", 10**7, 0, "metrics")) == -1


@pytest.mark.parametrize(("text", "message"), [
    ("", "not valid JSON"),
    ("{", "not valid JSON"),
    ("cursor", "not valid JSON"),
    (b"\xff\xfe\x00garbage", "not valid JSON"),
    ("[]", "must be an object"),
    ("null", "must be an object"),
    ('{"project": "p", "run": "r"}', "must be an object"),
    ('{"project": "p", "run": "r", "positions": []}', "must be an object"),
    ('{"project": 1, "run": "r", "positions": {}}', "project and run must be strings"),
    ('{"project": "p", "run": null, "positions": {}}', "project and run must be strings"),
    ('{"run": "r", "positions": {}}', "project and run must be strings"),
    ('{"project": "p", "run": "r", "positions": {"0/1/nokind": 3}}', "not rank/attempt/kind"),
    ('{"project": "p", "run": "r", "positions": {"a/b/metrics": 3}}', "not rank/attempt/kind"),
    ('{"project": "p", "run": "r", "positions": {"0/metrics": 3}}', "not rank/attempt/kind"),
    ('{"project": "p", "run": "r", "positions": {"-1/1/metrics": 3}}', "not rank/attempt/kind"),
    ('{"project": "p", "run": "r", "positions": {"0/1/METRICS": 3}}', "not rank/attempt/kind"),
    ('{"project": "p", "run": "r", "positions": {"0/1/metrics": -2}}', "int >= -1"),
    ('{"project": "p", "run": "r", "positions": {"0/1/metrics": 1.5}}', "int >= -1"),
    ('{"project": "p", "run": "r", "positions": {"0/1/metrics": "3"}}', "int >= -1"),
    ('{"project": "p", "run": "r", "positions": {"0/1/metrics": true}}', "int >= -1"),
    ('{"project": "p", "run": "r", "positions": {"0/1/metrics": null}}', "int >= -1"),
    ('{"project": "p", "run": "r", "positions": {"0/1/metrics": NaN}}', "int >= -1"),
])
def test_malformed_cursor_json_raises_cursor_error(text: str | bytes, message: str) -> None:
    """Every malformed cursor raises CursorError (a ValueError) with a message saying what is
    wrong, never KeyError/TypeError/AttributeError."""
    with pytest.raises(CursorError, match=message):
        Cursor.from_json(text)
    assert issubclass(CursorError, ValueError)


@pytest.mark.parametrize("key", ["0/1/metrics\n", "\u0663/1/metrics", "00/1/metrics"],
                         ids=["trailing-newline", "arabic-indic-digit", "leading-zero"])
def test_cursor_keys_that_no_stream_has_are_refused(key: str) -> None:
    with pytest.raises(CursorError):
        Cursor.from_json(json.dumps({"project": "p", "run": "r", "positions": {key: 3}}))


def test_cursor_cannot_move_back() -> None:
    stream = StreamId("p", "r", 0, 1, "metrics")
    cursor = Cursor("p", "r")
    assert cursor.after(stream) == -1
    cursor.advance(stream, 5)
    cursor.advance(stream, 5)  # staying put is fine
    with pytest.raises(CursorError, match="cannot move back from 5 to 3"):
        cursor.advance(stream, 3)
    assert cursor.after(stream) == 5


# -- resumable reads --------------------------------------------------------------------

def _write_run(root: Path, run_id: str, groups: int, *, rank: int = 0) -> None:
    """A finished run whose metrics and texts are spread over one segment per flush."""
    run = tracklake.init(project="p", run_id=run_id, rank=rank, root=root,
                         capture_identity=False, flush_interval=60.0, segment_bytes=1)
    for i in range(groups):
        run.log({"loss": float(i), "acc": i / 10}, step=i)
        run.log_text("sample", f"text {i}", step=i)
        run.flush()
    run.finish()


def _ids(stream: StreamId, batch: object) -> list[tuple[int, int, str, int, str]]:
    table = batch  # a RecordBatch
    keys = table.column("key").to_pylist()  # type: ignore[attr-defined]
    seqs = table.column("seq").to_pylist()  # type: ignore[attr-defined]
    return [(stream.rank, stream.attempt, stream.kind, s, k)
            for s, k in zip(seqs, keys, strict=True)]


def _all_records(root: Path, run_id: str) -> Counter[tuple[int, int, str, int, str]]:
    got: Counter[tuple[int, int, str, int, str]] = Counter()
    for stream, batch in tracklake.read_run(root, Cursor("p", run_id)):
        got.update(_ids(stream, batch))
    return got


def _read_in_pieces(root: Path, run_id: str, piece: int, *, compact_after_first: bool,
                    advance_explicitly: bool) -> Counter[tuple[int, int, str, int, str]]:
    got: Counter[tuple[int, int, str, int, str]] = Counter()
    text = Cursor("p", run_id).to_json()
    for n in range(1000):
        cursor = Cursor.from_json(text)
        taken = 0
        for stream, batch in tracklake.read_run(root, cursor):
            got.update(_ids(stream, batch))
            if advance_explicitly:
                cursor.advance(stream, batch.column("seq")[-1].as_py())
            taken += 1
            if taken == piece:
                break
        text = cursor.to_json()
        if n == 0 and compact_after_first:
            report = tracklake.compact(root=root)
            assert report.parts_written and not list(root.glob("**/*seg-*.arrows"))
        if taken < piece:
            return got
    raise AssertionError("reading in pieces never finished")


@pytest.mark.parametrize("compact_between", [False, True])
@pytest.mark.parametrize("piece", [1, 3])
def test_reading_in_pieces_with_explicit_advance_yields_every_record_once(
        root: Path, piece: int, compact_between: bool) -> None:
    """A consumer that records each batch in the cursor, stops after `piece` batches,
    serialises the cursor and resumes from a deserialised copy sees every record exactly
    once - also when the run is compacted between two pieces (cursors count seq, so they
    stay valid when segments become Parquet parts)."""
    _write_run(root, "r", groups=6)
    expected = _all_records(root, "r")
    assert sum(expected.values()) == 6 * 2 + 6
    got = _read_in_pieces(root, "r", piece, compact_after_first=compact_between,
                          advance_explicitly=True)
    assert got == expected
    assert max(got.values()) == 1


@pytest.mark.parametrize("compact_between", [False, True])
def test_reading_in_pieces_yields_every_record_exactly_once(root: Path,
                                                           compact_between: bool) -> None:
    """Stop after k batches, serialise the cursor, resume from a deserialised copy: every
    record exactly once, before and after compaction."""
    _write_run(root, "r", groups=6)
    expected = _all_records(root, "r")
    got = _read_in_pieces(root, "r", 2, compact_after_first=compact_between,
                          advance_explicitly=False)
    assert got == expected


def test_cursor_from_a_full_read_stays_valid_after_compaction(root: Path) -> None:
    """Read everything, compact, and read again from the saved cursor: nothing is
    delivered twice. Records written by a later attempt after that are delivered once."""
    _write_run(root, "r", groups=4)
    cursor = Cursor("p", "r")
    first: Counter[tuple[int, int, str, int, str]] = Counter()
    for stream, batch in tracklake.read_run(root, cursor):
        first.update(_ids(stream, batch))
    saved = cursor.to_json()
    assert json.loads(saved)["positions"] == {"0/1/metrics": 3, "0/1/texts": 3}

    assert tracklake.compact(root=root).parts_written
    again = Cursor.from_json(saved)
    assert list(tracklake.read_run(root, again)) == []

    _write_run(root, "r", groups=2)  # attempt 2 of the same rank
    resumed = Cursor.from_json(saved)
    later: Counter[tuple[int, int, str, int, str]] = Counter()
    for stream, batch in tracklake.read_run(root, resumed):
        later.update(_ids(stream, batch))
    assert {k[1] for k in later} == {2}
    assert sum(later.values()) == 2 * 2 + 2
    assert max(later.values()) == 1
    assert not set(later) & set(first)


def test_cursor_positions_select_records_strictly_after_them(root: Path) -> None:
    """A hand-made cursor at seq k delivers exactly the records with seq > k, from segments
    and, identically, from compacted parts."""
    _write_run(root, "r", groups=5)
    cursor_json = json.dumps({"project": "p", "run": "r",
                              "positions": {"0/1/metrics": 2, "0/1/texts": -1}})

    def after() -> list[tuple[int, int, str, int, str]]:
        got: list[tuple[int, int, str, int, str]] = []
        for stream, batch in tracklake.read_run(root, Cursor.from_json(cursor_json)):
            got.extend(_ids(stream, batch))
        return sorted(got)

    before = after()
    assert {(k, s) for _, _, k, s, _ in before} == (
        {("metrics", 3), ("metrics", 4)} | {("texts", s) for s in range(5)})
    tracklake.compact(root=root)
    assert after() == before


def test_read_run_covers_every_rank_and_filters_by_rank(root: Path) -> None:
    _write_run(root, "r", groups=2, rank=0)
    _write_run(root, "r", groups=3, rank=1)
    cursor = Cursor("p", "r")
    ranks = Counter(stream.rank for stream, _ in tracklake.read_run(root, cursor,
                                                                    kinds=("metrics",)))
    assert ranks == {0: 2, 1: 3}
    assert json.loads(cursor.to_json())["positions"] == {"0/1/metrics": 1, "1/1/metrics": 2}
    only1 = [s.rank for s, _ in tracklake.read_run(root, Cursor("p", "r"), ranks=(1,))]
    assert set(only1) == {1}
