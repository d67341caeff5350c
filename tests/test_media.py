"""Media: images, audio and video stored as content-addressed blobs (never twice) with a
`media` record queryable in SQL; limits per item and per run said at the call; records
that break the rules (a digest out of the blob store, a huge declared size) refused."""

from __future__ import annotations

import hashlib
import io
import wave
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from _crafted import crafted_pack

import tracklake
import tracklake.read
from tracklake._format import SCHEMAS, StreamId, blob_path
from tracklake._ops.fsck import fsck
from tracklake._ops.pack.pack import pack, unpack
from tracklake._ops.retention import Policy, apply_plan, make_plan

PIL = pytest.importorskip("PIL.Image")


def _init(root: Path, run_id: str = "r", **options: Any) -> tracklake.Run:
    return tracklake.init(project="p", run_id=run_id, root=root, capture_identity=False,
                          system_metrics=False, **{"compact": False, **options})


def _media(root: Path) -> list[dict[str, Any]]:
    return tracklake.query("SELECT * EXCLUDE (time) FROM media ORDER BY seq",
                           root=root).to_pylist()


def _blob(root: Path, digest: str) -> bytes:
    return blob_path(root, digest).read_bytes()


def test_an_image_array_is_a_png_stored_once_with_its_record_in_sql(tmp_path: Path) -> None:
    pixels = (np.arange(6 * 4 * 3) * 7 % 256).astype(np.uint8).reshape(6, 4, 3)
    with _init(tmp_path) as run:
        run.log({"loss": 1.0}, step=3)
        first = run.log_image("samples", pixels, caption="epoch 1")
        again = run.log_image("samples", pixels, step=4)
    assert first == again
    rows = _media(tmp_path)
    assert [(r["key"], r["step"], r["type"], r["media_type"], r["shape"], r["caption"])
            for r in rows] == [("samples", 3, "image", "image/png", [6, 4, 3], "epoch 1"),
                               ("samples", 4, "image", "image/png", [6, 4, 3], None)]
    data = _blob(tmp_path, first)
    assert rows[0]["size"] == len(data) and hashlib.sha256(data).hexdigest() == first
    assert np.array_equal(np.asarray(PIL.open(io.BytesIO(data))), pixels)
    assert len(list((tmp_path / "blobs" / "sha256").rglob("*/*"))) == 1  # no copy twice


def test_images_from_floats_tensors_pil_files_and_bytes(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    image = PIL.new("RGBA", (5, 3), (10, 20, 30, 40))
    png = io.BytesIO()
    image.save(png, format="PNG")
    jpeg = io.BytesIO()
    image.convert("RGB").save(jpeg, format="JPEG")
    path = tmp_path / "x.png"
    path.write_bytes(png.getvalue())
    with _init(tmp_path / "s") as run:
        gray = run.log_image("gray", np.array([[0.0, 0.5], [1.0, 2.0]]), step=0)
        chw = run.log_image("chw", torch.zeros(3, 4, 5), step=0)
        run.log_image("pil", image, step=0)
        from_file = run.log_image("file", path, step=0)
        run.log_image("jpeg", jpeg.getvalue(), step=0)
    rows = {r["key"]: r for r in _media(tmp_path / "s")}
    assert np.asarray(PIL.open(io.BytesIO(_blob(tmp_path / "s", gray)))).tolist() == [
        [0, 128], [255, 255]]  # floats 0..1, clipped
    assert rows["chw"]["shape"] == [4, 5, 3] and chw is not None
    assert rows["pil"]["shape"] == [3, 5, 4]
    assert from_file == hashlib.sha256(png.getvalue()).hexdigest()
    assert rows["file"]["shape"] == [3, 5, 4]
    assert (rows["jpeg"]["media_type"], rows["jpeg"]["shape"]) == ("image/jpeg", None)


def test_audio_arrays_become_wav_and_files_keep_their_format(tmp_path: Path) -> None:
    tone = np.sin(np.arange(4000) / 5.0)
    with _init(tmp_path) as run:
        digest = run.log_audio("voice", np.stack([tone, -tone], 1), sample_rate=16000, step=1)
        run.log_audio("flac", b"fLaC" + bytes(60), step=1)
    assert digest is not None
    with wave.open(io.BytesIO(_blob(tmp_path, digest))) as w:
        assert (w.getnchannels(), w.getframerate(), w.getnframes()) == (2, 16000, 4000)
        frames = np.frombuffer(w.readframes(4000), "<i2").reshape(4000, 2)
    assert np.array_equal(frames[:, 0], (np.clip(tone, -1, 1) * 32767).astype(np.int16))
    voice, flac = _media(tmp_path)
    assert (voice["shape"], voice["sample_rate"]) == ([4000, 2], 16000)
    assert (flac["type"], flac["media_type"], flac["sample_rate"]) == ("audio", "audio/flac",
                                                                      None)


def test_a_video_is_a_file_or_its_bytes(tmp_path: Path) -> None:
    mp4 = bytes(4) + b"ftypisom" + bytes(100)
    with _init(tmp_path) as run:
        run.log_video("rollout", mp4, fps=30, step=2, caption="episode 1")
        with pytest.raises(TypeError, match=r"video 'frames': .*encode frames to a file"):
            run.log_video("frames", np.zeros((2, 4, 4, 3)))  # type: ignore[arg-type]
    [row] = _media(tmp_path)
    assert (row["type"], row["media_type"], row["fps"], row["size"]) == (
        "video", "video/mp4", 30.0, len(mp4))


@pytest.mark.parametrize(("call", "error", "match"), [
    (lambda r: r.log_image("k", np.zeros((2, 2, 2))), ValueError, "image 'k': shape"),
    (lambda r: r.log_image("k", np.full((2, 2), 300)), ValueError, "image 'k': integer"),
    (lambda r: r.log_image("k", np.zeros((0, 2))), ValueError, "image 'k': 2x0 pixels"),
    (lambda r: r.log_image("k", b"not an image"), ValueError, "image 'k': not a PNG"),
    (lambda r: r.log_image("k", "/nonexistent.png"), FileNotFoundError, "image 'k'"),
    (lambda r: r.log_image("k", object()), TypeError, "media 'k': object is not"),
    (lambda r: r.log_audio("k", np.zeros(10)), ValueError, "audio 'k': an array needs"),
    (lambda r: r.log_audio("k", np.zeros(10), sample_rate=0), ValueError, "sample_rate"),
    (lambda r: r.log_audio("k", b"RIFF\x00\x00\x00\x00WAVEjunk"), ValueError,
     "audio 'k': a damaged WAV"),
    (lambda r: r.log_video("k", b"\x00" * 20), ValueError, "video 'k': not an MP4"),
    (lambda r: r.log_image("k", np.zeros((2, 2)), caption=3), TypeError, "caption"),
])
def test_bad_media_is_refused_at_the_call_naming_the_key(
        tmp_path: Path, call: Any, error: type[Exception], match: str) -> None:
    with _init(tmp_path) as run, pytest.raises(error, match=match):
        call(run)
    assert _media(tmp_path) == [] and not (tmp_path / "blobs" / "sha256").exists()


def test_the_limits_per_item_and_per_run_are_said_at_the_call(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    big = tmp_path / "big.png"
    big.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(5000))
    monkeypatch.setenv("TRACKLAKE_MEDIA_ITEM_LIMIT", "4KiB")
    monkeypatch.setenv("TRACKLAKE_MEDIA_RUN_LIMIT", "3000")
    with _init(tmp_path / "s") as run:
        with pytest.raises(ValueError, match=r"image 'big': 5,008 bytes, more than the "
                                             r"4,096 .*TRACKLAKE_MEDIA_ITEM_LIMIT"):
            run.log_image("big", big)
        pixels = np.random.default_rng(0).integers(0, 255, (20, 20, 3), dtype=np.uint8)
        assert run.log_image("a", pixels) is not None  # about 1.2 KB
        assert run.log_image("b", pixels + 1) is not None
        with pytest.raises(ValueError, match=r"media 'c': .*more than the 3,000 a run may "
                                             r"hold \(TRACKLAKE_MEDIA_RUN_LIMIT"):
            run.log_image("c", pixels + 2)
    assert [r["key"] for r in _media(tmp_path / "s")] == ["a", "b"]


def test_pack_unpack_carry_media_blobs_and_dropping_media_keeps_shared_blobs(
        tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    pixels = np.zeros((2, 2), np.uint8)
    with _init(a) as run:
        shared = run.log_image("img", pixels, step=0)
        run.log_artifact(_png(pixels), name="same.png")  # the same bytes, as an artifact
        only = run.log_audio("snd", np.zeros(100), sample_rate=1000, step=0)
    assert shared is not None and only is not None
    tracklake.compact(root=a)
    pack(root=a, project="p", output=tmp_path / "x.pack")
    unpack(tmp_path / "x.pack", root=b)
    assert _media(b) == _media(a) and _blob(b, only) == _blob(a, only)
    assert fsck(b).clean
    plan = make_plan(b, Policy(drop_after=0.0, drop_kinds=("media",)), 1e12, force=["r"])
    apply_plan(b, plan, 1e12)
    assert _media(b) == []
    assert not blob_path(b, only).exists()  # named only by the media dropped
    assert blob_path(b, shared).exists()  # the artifact still names it


def _png(pixels: np.ndarray) -> bytes:
    from tracklake._write.media import png

    return png(pixels[:, :, None])


# -- records that break the rules ------------------------------------------------------

def _row(seq: int, **changes: Any) -> dict[str, Any]:
    row = {"seq": seq, "time": 0, "step": 0, "key": f"m{seq}", "type": "image",
           "media_type": "image/png", "digest": "ab" * 32, "size": 10, "caption": None,
           "shape": [2, 2, 3], "sample_rate": None, "fps": None}
    return row | changes


CRAFTED = [
    (_row(1, digest="../../../../etc/passwd"), "is not a sha256 hex digest"),
    (_row(2, digest="AB" * 32), "is not a sha256 hex digest"),
    (_row(3, size=1 << 50), "a declared size of 1125899906842624 bytes"),
    (_row(4, size=-1), "a declared size of -1 bytes"),
    (_row(5, type="image", media_type="text/html"), "media type 'text/html'"),
    (_row(6, shape=[2, -1]), "shape [2, -1]"),
    (_row(7, shape=[1, 1, 1, 1, 1]), "shape"),
    (_row(8, type="audio", media_type="audio/wav", sample_rate=0), "sample rate 0"),
    (_row(9, type="video", media_type="video/mp4", fps=float("nan")), "fps nan"),
]


def test_each_crafted_media_record_is_refused_for_its_own_reason() -> None:
    from tracklake._format.records import invalid_records

    table = pa.Table.from_pylist([_row(0), *(r for r, _ in CRAFTED)],
                                 schema=SCHEMAS["media"])
    assert invalid_records("media", table.slice(0, 1)) is None
    for i, (_, reason) in enumerate(CRAFTED, 1):
        found = invalid_records("media", table.slice(i, 1))
        assert found is not None and reason in found[1], (i, found)


def test_crafted_media_records_are_skipped_by_readers_and_reported_by_fsck(
        tmp_path: Path) -> None:
    with _init(tmp_path) as run:
        run.log_image("good", np.zeros((2, 2), np.uint8), step=0)
        for row, _ in CRAFTED:
            run._writer.add_rows("media", [{k: v for k, v in row.items() if k != "seq"}])
    problems = tracklake.read.ReadProblems()
    read = [b for _, b in tracklake.read_run(tmp_path, tracklake.Cursor("p", "r"),
                                             kinds=("media",), problems=problems)]
    assert [k for b in read for k in b.column("key").to_pylist()] == ["good"]
    [(_, why)] = problems.damaged
    assert "'m1' at seq 1: digest '../../../../etc/passwd'" in why
    [problem] = [p for p in fsck(tmp_path).problems if "invalid records" in p.what]
    assert "not a sha256 hex digest" in problem.what


def test_a_pack_with_a_crafted_media_record_is_refused_and_nothing_unpacked(
        tmp_path: Path) -> None:
    out = tmp_path / "bad.pack"
    crafted_pack(out, tmp_path, StreamId("p", "bad", 0, 1, "media"),
                 pa.Table.from_pylist([_row(0, size=1 << 50)], schema=SCHEMAS["media"]))
    target = tmp_path / "target"
    with pytest.raises(tracklake.FormatError, match=r"invalid records \(media 'm0' at seq 0: "
                                                    r"a declared size"):
        unpack(out, root=target)
    assert not target.exists() or not any(p.is_file() for p in target.rglob("*"))


def test_media_file_gives_a_blob_only_of_the_declared_size(tmp_path: Path) -> None:
    with _init(tmp_path) as run:
        digest = run.log_image("img", np.zeros((2, 2), np.uint8))
    assert digest is not None
    size = len(_blob(tmp_path, digest))
    assert tracklake.read.media_file(tmp_path, digest, size) == blob_path(tmp_path, digest)
    assert tracklake.read.media_file(tmp_path, digest, size + 1) is None
    assert tracklake.read.media_file(tmp_path, digest, size, limit=size - 1) is None


def test_the_run_limit_counts_every_rank_and_attempt_of_the_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 0 and rank 1 (live at once) and a resumed attempt of rank 0 share one budget:
    each handle reads what the others stored (as of its last read) before it stores."""
    import tracklake._write.media_budget as budget
    monkeypatch.setattr(budget, "REFRESH", 0.0)  # read the others at every call
    monkeypatch.setenv("TRACKLAKE_MEDIA_RUN_LIMIT", "4000")
    pixels = np.random.default_rng(1).integers(0, 255, (20, 20, 3), dtype=np.uint8)
    zero = _init(tmp_path, rank=0)
    one = _init(tmp_path, rank=1)
    try:
        assert zero.log_image("a", pixels) is not None  # about 1.2 KB each
        zero.flush()
        assert one.log_image("b", pixels + 1) is not None
        one.flush()
        assert zero.log_image("c", pixels + 2) is not None
        zero.flush()
        with pytest.raises(ValueError, match=r"media 'd': .*run r's media \(every rank and "
                                             r"attempt\) to .*more than the 4,000"):
            one.log_image("d", pixels + 3)
    finally:
        zero.finish()
        one.finish()
    monkeypatch.setenv("TRACKLAKE_MEDIA_RUN_LIMIT", "5000")
    with _init(tmp_path, rank=0) as resumed:  # attempt 2 of rank 0
        assert resumed.attempt == 2
        with pytest.raises(ValueError, match="media 'e'"):
            resumed.log_image("e", pixels + 4)
    assert sorted(r["key"] for r in _media(tmp_path)) == ["a", "b", "c"]


def test_fsck_names_the_runs_whose_media_or_artifact_blob_is_missing(tmp_path: Path) -> None:
    with _init(tmp_path, run_id="pics") as run:
        image = run.log_image("img", np.zeros((3, 3), np.uint8), step=0)
        run.log_artifact(b"abc", name="weights", step=0)
    assert not fsck(tmp_path).problems
    blob_path(tmp_path, image).unlink()  # type: ignore[arg-type]
    [problem] = fsck(tmp_path).problems
    assert problem.what == "blob missing: named by media of p/pics"
    assert problem.path == blob_path(tmp_path, image) and not problem.repairable
    for path in (tmp_path / "blobs" / "sha256").rglob("*/*"):
        path.unlink()
    assert sorted(p.what for p in fsck(tmp_path).problems) == [
        "blob missing: named by artifacts of p/pics", "blob missing: named by media of p/pics"]
