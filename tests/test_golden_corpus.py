"""Stores written by every released format version stay readable (tests/golden/<version>)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import tracklake
from golden.make_corpus import IMAGE, expected_value, histogram_values

VERSIONS = sorted(p.name for p in (Path(__file__).parent / "golden").iterdir() if p.is_dir()
                  and p.name[0].isdigit())


@pytest.fixture(params=VERSIONS)
def golden(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    copy = tmp_path / request.param
    shutil.copytree(Path(__file__).parent / "golden" / request.param, copy)
    return copy


def test_the_corpus_of_this_version_exists() -> None:
    assert tracklake.FORMAT_VERSION in VERSIONS


def test_runs_and_their_status_are_read(golden: Path) -> None:
    runs = {r["run"]: r for r in tracklake.query("SELECT * FROM runs", root=golden).to_pylist()}
    assert set(runs) == {"done", "resumed", "torn"}
    assert runs["done"]["ranks"] == 2 and runs["done"]["status"] == "finished"
    assert runs["resumed"]["attempts"] == 2


def test_every_metric_value_is_read_back_exactly(golden: Path) -> None:
    rows = tracklake.query("SELECT run, rank, attempt, step, key, value FROM metrics "
                           "WHERE key NOT LIKE 'h/%'", root=golden).to_pylist()
    done = [r for r in rows if r["run"] == "done"]
    assert sorted(r["step"] for r in rows if r["run"] == "torn") == list(range(9))
    assert len(done) == 2 * 20 * 3
    resumed = sorted((r["step"], r["key"], r["attempt"], r["value"]) for r in rows
                     if r["run"] == "resumed")
    assert len(resumed) == 20 * 3
    for r in rows:
        assert r["value"] == expected_value(r["step"], int(r["key"][1:]), r["attempt"])
    assert {a for s, _, a, _ in resumed if s >= 10} == {2}


def test_other_record_kinds_are_read(golden: Path) -> None:
    counts = tracklake.query(
        "SELECT (SELECT count(*) FROM texts) AS texts, (SELECT count(*) FROM generations) AS g,"
        " (SELECT count(*) FROM traces) AS traces, (SELECT count(*) FROM artifacts) AS a,"
        " (SELECT count(*) FROM events WHERE kind = 'alert') AS alerts,"
        " (SELECT count(*) FROM configs) AS configs", root=golden).to_pylist()[0]
    assert counts == {"texts": 2, "g": 4, "traces": 4, "a": 2, "alerts": 2, "configs": 4}
    blob = tracklake.query("SELECT DISTINCT digest FROM artifacts", root=golden).to_pylist()
    digest = blob[0]["digest"]
    assert (golden / "blobs" / "sha256" / digest[:2] / digest).read_bytes() == b"artifact-bytes"


def _version(golden: Path) -> tuple[int, ...]:
    return tuple(int(n) for n in golden.name.split("."))


def test_histograms_and_their_statistics_are_read_back_exactly(golden: Path) -> None:
    """Format 1.2 added histograms: each one's edges and counts, and its statistics as
    metrics; older stores have none, and their `histograms` view is empty."""
    rows = tracklake.query("SELECT rank, step, key, count, nonfinite, min, max, edges, counts "
                           "FROM histograms ORDER BY rank, step", root=golden).to_pylist()
    if _version(golden) < (1, 2):
        assert rows == []
        return
    assert [(r["rank"], r["step"]) for r in rows] == [(0, 10), (0, 19), (1, 10), (1, 19)]
    for r in rows:
        values = histogram_values(r["step"])
        assert (r["key"], r["count"], r["nonfinite"]) == ("h", 8, 0)
        assert (r["min"], r["max"]) == (min(values), max(values))
        assert r["edges"] == [min(values) + i * 1.75 for i in range(5)]
        assert r["counts"] == [2, 2, 2, 2]
    stats = tracklake.query("SELECT rank, step, key, value FROM metrics WHERE key LIKE 'h/%' "
                            "AND key IN ('h/count', 'h/min')", root=golden).to_pylist()
    assert sorted((r["rank"], r["step"], r["key"], r["value"]) for r in stats) == sorted(
        (rank, step, key, value) for rank in (0, 1) for step in (10, 19)
        for key, value in (("h/count", 8.0), ("h/min", float(step))))
    cursor = tracklake.Cursor("golden", "done")
    read = [b for _, b in tracklake.read_run(golden, cursor, kinds=("histograms",))]
    assert sum(b.num_rows for b in read) == 4


def test_media_records_and_their_blobs_are_read_back(golden: Path) -> None:
    """Format 1.2 added media: an image and an audio clip per rank of run 'done', the same
    bytes on both ranks, so one blob each."""
    rows = tracklake.query("SELECT rank, step, key, type, media_type, digest, size, caption, "
                           "shape, sample_rate FROM media ORDER BY rank, key",
                           root=golden).to_pylist()
    if _version(golden) < (1, 2):
        assert rows == []
        return
    assert [(r["rank"], r["key"], r["type"], r["media_type"], r["shape"], r["sample_rate"])
            for r in rows] == [
        (rank, key, *rest) for rank in (0, 1) for key, *rest in (
            ("img", "image", "image/png", [2, 2, 1], None),
            ("snd", "audio", "audio/wav", [4, 1], 8000))]
    import io

    import numpy as np
    from PIL import Image

    image = next(r for r in rows if r["key"] == "img")
    data = (golden / "blobs" / "sha256" / image["digest"][:2] / image["digest"]).read_bytes()
    assert len(data) == image["size"] and image["caption"] == "golden"
    assert np.asarray(Image.open(io.BytesIO(data))).tolist() == IMAGE.tolist()
    assert len({r["digest"] for r in rows}) == 2


def test_the_reader_api_reads_every_record_once(golden: Path) -> None:
    stats = 2 * 2 * 5 if _version(golden) >= (1, 2) else 0  # of the histograms
    for run_id, expected in (("done", 2 * 60 + stats), ("resumed", 15 * 3 + 10 * 3), ("torn", 9)):
        cursor = tracklake.Cursor("golden", run_id)
        n = sum(b.num_rows for s, b in tracklake.read_run(golden, cursor, kinds=("metrics",)))
        assert n == expected
        assert sum(b.num_rows for _ in [0] for s, b in tracklake.read_run(
            golden, cursor, kinds=("metrics",))) == 0


def test_a_torn_tail_is_reported_and_compaction_keeps_the_complete_batches(golden: Path
                                                                           ) -> None:
    cursor = tracklake.Cursor("golden", "torn")
    read = [b for _, b in tracklake.read_run(golden, cursor, kinds=("metrics",))]
    assert [b.num_rows for b in read] == [1] * 9  # nine complete batches; the tenth was cut
    report = tracklake.compact(root=golden, run="torn")
    assert len(report.torn) == 1 and 0 < report.torn[0][1] < 1024
    assert tracklake.query("SELECT count(*) AS n FROM metrics WHERE run = 'torn'",
                           root=golden).to_pylist() == [{"n": 9}]
