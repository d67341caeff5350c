"""`tracklake ui`'s histograms, media listings and blobs over plain HTTP: a blob leaves the
store only by a digest a media record names, within the size limit, of the size its record
declares, with a Content-Type from the format's list (anything else an attachment), inert
under nosniff and the CSP; behind the token on a non-loopback bind; never writing."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_ui_server import console, files, request

import tracklake
from tracklake._format import blob_path
from tracklake._ui.server import Dashboard

SVG = (b'<svg xmlns="http://www.w3.org/2000/svg"><script>fetch("/api/runs?pwned")'
       b"</script></svg>")
HTML = b'<html><script>fetch("/api/runs?pwned")</script></html>'


def plant(root: Path, data: bytes) -> str:
    """`data` as a blob of the store (as a restored backup or another user could)."""
    digest = hashlib.sha256(data).hexdigest()
    path = blob_path(root, digest)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return digest


def plant_records(root: Path, changes: dict[str, dict[str, Any]]) -> None:
    """Rewrite the compacted media part so that the records of the keys in `changes` hold
    the values given, as a part written by other software (or crafted) could."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    [part] = (root / "media").rglob("*.parquet")
    original = pq.ParquetFile(part)
    metadata = {k.decode(): v.decode() for k, v in original.metadata.metadata.items()
                if k != b"tracklake.footer_crc32"}
    rows = [row | changes.get(row["key"], {}) for row in original.read().to_pylist()]
    table = pa.Table.from_pylist(rows, schema=original.schema_arrow)
    with pq.ParquetWriter(part, table.schema, compression="zstd", write_page_checksum=True,
                          store_schema=False) as writer:
        writer.write_table(table)
        writer.add_key_value_metadata(metadata)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("ui-media") / "store"
    found: dict[str, Any] = {"root": root}
    with tracklake.init(project="p", run_id="r", root=root, capture_identity=False,
                        system_metrics=False, compact=False) as run:
        for step in range(3):
            run.log_histogram("grad/w", np.arange(10.0) + step, step=step, bins=5)
            found["image"] = run.log_image("samples", np.full((4, 6, 3), 40 * step, np.uint8),
                                           step=step, caption=f"<b>epoch {step}</b>")
        found["audio"] = run.log_audio("sound", np.zeros(800), sample_rate=8000, step=2)
        found["artifact"] = run.log_artifact(b"not media", name="notes.txt")
        for key in ("planted/svg", "planted/html", "planted/png"):
            run.log_image(key, np.zeros((1, 1), np.uint8), step=0)
    tracklake.compact(root=root)
    # what a crafted part may hold: records naming an SVG and an HTML page as media, and
    # SVG bytes under a PNG record (a type the format allows over bytes that are not one)
    svg, html, svg_as_png = plant(root, SVG), plant(root, HTML), plant(root, SVG + b" ")
    plant_records(root, {
        "planted/svg": {"digest": svg, "size": len(SVG), "media_type": "image/svg+xml"},
        "planted/html": {"digest": html, "size": len(HTML), "media_type": "text/html"},
        "planted/png": {"digest": svg_as_png, "size": len(SVG) + 1}})
    found.update(svg=svg, html=html, svg_as_png=svg_as_png)
    return found


@pytest.fixture(scope="module")
def board(store: dict[str, Any]) -> Iterator[Dashboard]:
    dashboard = Dashboard(store["root"], read_deadline=1.0).start()
    yield dashboard
    dashboard.close()


def get_json(board: Dashboard, path: str) -> Any:
    status, _, body = request(board, "GET", path)
    assert status == 200, body
    return json.loads(body)


def test_histograms_are_listed_per_run_and_key_with_their_steps(board: Dashboard) -> None:
    [hist] = get_json(board, "/api/histograms?run=p/r")
    assert (hist["project"], hist["run"], hist["key"]) == ("p", "r", "grad/w")
    assert [s["step"] for s in hist["steps"]] == [0, 1, 2]
    assert [len(s["counts"]) for s in hist["steps"]] == [5, 5, 5]
    assert hist["steps"][2]["edges"][0] == 2.0 and sum(hist["steps"][2]["counts"]) == 10
    assert get_json(board, "/api/histograms?run=p/nope") == []
    assert request(board, "GET", "/api/histograms?run=bad")[0] == 400
    # the query the card shows, run in the SQL console with its parameters as text
    assert [row[1] for row in console(board, hist["query"])["rows"]] == [0, 1, 2]


def test_media_are_listed_with_what_is_served(board: Dashboard, store: dict[str, Any]) -> None:
    answer = get_json(board, "/api/media?run=p/r")
    listed = {m["key"]: m["items"] for m in answer}
    assert [i["step"] for i in listed["samples"]] == [0, 1, 2]
    rows = console(board, answer[0]["query"])["rows"]  # what the cards were read with
    assert sorted((r[0], r[1], r[6]) for r in rows) == sorted(
        (m["key"], i["step"], i["digest"]) for m in answer for i in m["items"])
    assert listed["samples"][2]["caption"] == "<b>epoch 2</b>"  # text: the page shows it so
    assert listed["samples"][2]["digest"] == store["image"]
    assert [(i["type"], i["media_type"], i["served"]) for i in listed["sound"]] == [
        ("audio", "audio/wav", True)]
    assert listed["planted/svg"][0]["served"] is False
    assert listed["planted/html"][0]["served"] is False


def test_a_blob_is_served_with_its_type_and_inert_headers(board: Dashboard,
                                                          store: dict[str, Any]) -> None:
    status, headers, body = request(board, "GET", f"/api/blob/{store['image']}")
    assert status == 200 and body == blob_path(store["root"], store["image"]).read_bytes()
    assert headers["Content-Type"] == "image/png"
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    assert headers["Content-Security-Policy"].endswith("; sandbox")
    assert "Content-Disposition" not in headers
    status, headers, _ = request(board, "GET", f"/api/blob/{store['audio']}")
    assert status == 200 and headers["Content-Type"] == "audio/wav"


def test_a_planted_svg_or_html_blob_is_sent_inert(board: Dashboard,
                                                  store: dict[str, Any]) -> None:
    for name in ("svg", "html"):
        status, headers, body = request(board, "GET", f"/api/blob/{store[name]}")
        assert status == 200 and b"<script>" in body, name
        assert headers["Content-Type"] == "application/octet-stream", name
        assert headers["Content-Disposition"].startswith("attachment"), name
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert "sandbox" in headers["Content-Security-Policy"]
    # SVG bytes under a PNG record: sent as image/png, which nosniff keeps from being read
    # as anything else
    status, headers, _ = request(board, "GET", f"/api/blob/{store['svg_as_png']}")
    assert status == 200 and headers["Content-Type"] == "image/png"
    assert headers["X-Content-Type-Options"] == "nosniff"


@pytest.mark.parametrize("tail", [
    "", "x", "AB" * 32, "ab" * 31, "ab" * 33, "ab" * 32 + "/", "ab" * 32 + "%00",
    "../../../../etc/passwd", "..%2f..%2f..%2fetc%2fpasswd", "%2e%2e/%2e%2e/etc/passwd",
    "ab/" + "ab" * 32, "../blobs/sha256/ab/" + "ab" * 32, "ab" * 32 + "/../../runs"])
def test_a_path_that_is_not_a_digest_reaches_no_file(board: Dashboard, tail: str) -> None:
    status, _, body = request(board, "GET", f"/api/blob/{tail}")
    assert status == 404 and b"root:" not in body


def test_a_digest_no_media_record_names_is_refused(board: Dashboard,
                                                   store: dict[str, Any]) -> None:
    """An artifact's blob is in the same blob store: still not a media item to serve."""
    assert blob_path(store["root"], store["artifact"]).exists()
    for digest in (store["artifact"], hashlib.sha256(b"never stored").hexdigest()):
        status, _, body = request(board, "GET", f"/api/blob/{digest}")
        assert status == 404 and b"not media" not in body


def test_a_blob_over_the_limit_is_refused(store: dict[str, Any]) -> None:
    size = blob_path(store["root"], store["image"]).stat().st_size
    dashboard = Dashboard(store["root"], max_blob=size - 1).start()
    try:
        status, _, body = request(dashboard, "GET", f"/api/blob/{store['image']}")
        assert status == 413 and b"more than" in body
        listed = {m["key"]: m["items"] for m in get_json(dashboard, "/api/media?run=p/r")}
        assert [i["served"] for i in listed["samples"] if i["digest"] == store["image"]
                ] == [False]
    finally:
        dashboard.close()
    dashboard = Dashboard(store["root"], max_blob=size).start()
    try:
        assert request(dashboard, "GET", f"/api/blob/{store['image']}")[0] == 200
    finally:
        dashboard.close()


def test_a_blob_not_as_its_record_declares_is_not_sent(tmp_path: Path) -> None:
    root = tmp_path / "s"
    with tracklake.init(project="p", run_id="r", root=root, capture_identity=False,
                        system_metrics=False, compact=False) as run:
        grown = run.log_image("a", np.zeros((2, 2), np.uint8), step=0)
        linked = run.log_image("b", np.ones((2, 2), np.uint8), step=0)
    assert grown is not None and linked is not None
    with blob_path(root, grown).open("ab") as f:
        f.write(b"more than declared")
    target = tmp_path / "secret"
    target.write_bytes(blob_path(root, linked).read_bytes())
    blob_path(root, linked).unlink()
    blob_path(root, linked).symlink_to(target)
    dashboard = Dashboard(root).start()
    try:
        for digest in (grown, linked):
            assert request(dashboard, "GET", f"/api/blob/{digest}")[0] == 404
    finally:
        dashboard.close()


def test_blobs_need_the_token_on_a_non_loopback_bind(store: dict[str, Any]) -> None:
    dashboard = Dashboard(store["root"], host="0.0.0.0").start()
    try:
        for path in (f"/api/blob/{store['image']}", "/api/media?run=p/r",
                     "/api/histograms?run=p/r"):
            status, _, body = request(dashboard, "GET", path)
            assert status == 403 and b"PNG" not in body and b"grad" not in body, path
        status, _, body = request(dashboard, "GET", f"/api/blob/{store['image']}",
                                  headers={"Cookie": f"tracklake_token={dashboard.token}"})
        assert status == 200 and body.startswith(b"\x89PNG")
    finally:
        dashboard.close()


def test_reading_media_writes_nothing_into_the_store(board: Dashboard,
                                                     store: dict[str, Any]) -> None:
    before = files(store["root"])
    for path in ("/api/histograms?run=p/r", "/api/media?run=p/r",
                 f"/api/blob/{store['image']}", f"/api/blob/{store['svg']}"):
        assert request(board, "GET", path)[0] == 200
    assert files(store["root"]) == before


def test_a_planted_blob_runs_no_script_in_chromium(
        board: Dashboard, store: dict[str, Any], tmp_path: Path) -> None:
    """Opened as a page of the dashboard's origin, as an image and as a script: the
    planted SVG and HTML never run (their script would fetch /api/runs?pwned)."""
    from _cdp import Browser

    browser = Browser(tmp_path / "chromium")
    try:
        for name in ("svg_as_png", "svg", "html"):
            browser.open(f"{board.url}api/blob/{store[name]}")
            browser.wait("document.readyState === 'complete'", "the blob opened")
        browser.open(board.url)
        browser.wait("document.readyState === 'complete' && !!window.tracklake", "the page")
        for name in ("svg_as_png", "svg", "html"):
            browser.js(f"""(() => {{ const s = document.createElement('script');
                s.src = '/api/blob/{store[name]}'; document.body.append(s);
                const i = document.createElement('img'); i.src = s.src;
                document.body.append(i); }})()""")
        browser.wait(f"performance.getEntriesByType('resource').filter(e => "
                     f"e.name.includes('{store['html']}')).length >= 1", "the blobs fetched")
        requested = browser.requested()
        assert any(store["svg"] in url for url in requested)
        assert not [url for url in requested if "pwned" in url]
    finally:
        browser.close()
