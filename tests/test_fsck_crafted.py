"""A crafted part whose footer makes pyarrow's statistics reader abort the process
(pyarrow 25 lets a C++ exception escape: ``std::terminate``), with a footer checksum
that matches, is reported by fsck as damaged; fsck itself goes on and checks the rest,
and --repair rewrites the part from its records, which all verify."""

from __future__ import annotations

import re
import zlib
from pathlib import Path

import pytest

import tracklake
from tracklake._format.part import FOOTER_CRC_KEY
from tracklake._ops.fsck import fsck
from tracklake._ops.fsck.footer_stats import stats_mismatch_isolated


def _footer_span(data: bytes) -> tuple[int, int]:
    length = int.from_bytes(data[-8:-4], "little")
    return len(data) - 8 - length, length


def _restamped(data: bytearray) -> bytes:
    """`data` with its footer checksum recomputed, as a forger would."""
    offset, length = _footer_span(bytes(data))
    footer = bytearray(data[offset:offset + length])
    match = re.search(re.escape(FOOTER_CRC_KEY.encode()) + rb"\x18\x0a(\d{10})", footer)
    assert match is not None
    footer[match.start(1):match.end(1)] = b"#" * 10
    footer[match.start(1):match.end(1)] = b"%010d" % zlib.crc32(footer)
    data[offset:offset + length] = footer
    return bytes(data)


def _killing_flip(part: Path) -> bytes | None:
    """The part with one bit of its footer flipped so that reading its statistics kills
    the reader, found by trying every byte in the child fsck uses; None if none does."""
    original = part.read_bytes()
    offset, length = _footer_span(original)
    try:
        for at in range(offset, offset + length):
            data = bytearray(original)
            data[at] ^= 0x01
            part.write_bytes(bytes(data))
            why = stats_mismatch_isolated(part)
            if why is not None and "kills the reader" in why:
                return _restamped(data)
    finally:
        part.write_bytes(original)
    return None


def test_a_part_that_kills_the_statistics_reader_is_reported_and_fsck_goes_on(
        tmp_path: Path) -> None:
    root = tmp_path / "s"
    for run_id in ("a", "b"):
        with tracklake.init(project="p", run_id=run_id, root=root,
                            capture_identity=False) as run:
            for step in range(30):
                run.log({"loss": 1 / (step + 1), "acc": step / 30}, step=step)
        tracklake.compact(root=root, run=run_id)
    part = next((root / "metrics" / "project=p" / "run=a").rglob("*.parquet"))
    crafted = _killing_flip(part)
    if crafted is None:
        pytest.skip("no single flipped bit makes this pyarrow's statistics reader abort")
    part.write_bytes(crafted)

    report = fsck(root)  # in this process: it would die with the reader
    [problem] = report.problems
    assert problem.path == part
    assert "kills the reader" in problem.what
    assert report.checked["parts"] >= 2  # run b's part was checked after it
    before = tracklake.query("SELECT * FROM metrics ORDER BY ALL", root=root)
    assert before.num_rows == 120  # tracklake's readers do not touch those statistics

    repaired = fsck(root, repair=True).problems[0].repaired
    assert repaired is not None and "rebuilt from its 60 records" in repaired
    assert fsck(root).clean
    assert tracklake.query("SELECT * FROM metrics ORDER BY ALL", root=root) == before
