"""Media reach every destination and read back with the destination's own reader, the
bytes as stored: TensorBoard's EventAccumulator, W&B's offline files, MLflow's client
against a real `mlflow server`, SwanLab's offline reader."""

from __future__ import annotations

import importlib.util
import io
import json
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _optional import optional
from _records import mlflow_run_id

import tracklake
from tracklake._format import blob_path
from tracklake.exporters import Destination, Selection, export

pytestmark = [pytest.mark.filterwarnings(
    "ignore:The ``noload`` loader strategy is deprecated")]  # MLflow's SQL store, as there

PROJECT = "media"
GIF = (b"GIF89a\x01\x00\x01\x00\x80\x00\x00\x00\x00\x00\xff\xff\xff!\xf9\x04\x00\x00\x00"
       b"\x00\x00,\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02\x02D\x01\x00;")


def _pixels(step: int) -> np.ndarray:
    return ((np.arange(8 * 6 * 3).reshape(8, 6, 3) * (step + 3)) % 256).astype(np.uint8)


@pytest.fixture
def stored(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """A finished run: an image at steps 0 and 1, audio at 0, a GIF video at 1; and the
    bytes the store holds for each (key, step)."""
    root = tmp_path / "store"
    digests: dict[tuple[str, int], str] = {}
    with tracklake.init(project=PROJECT, run_id="r1", root=root, capture_identity=False,
                        system_metrics=False, compact=False) as run:
        for step in (0, 1):
            run.log({"loss": 1.0 / (step + 1)}, step=step)
            digests[("img", step)] = run.log_image("img", _pixels(step), step=step,
                                                   caption=f"step {step}")  # type: ignore
        digests[("snd", 0)] = run.log_audio("snd", np.sin(np.arange(800) / 3.0),  # type: ignore
                                            sample_rate=8000, step=0)
        digests[("vid", 1)] = run.log_video("vid", GIF, step=1)  # type: ignore[assignment]
    return root, {k: blob_path(root, d).read_bytes() for k, d in digests.items()}


def _export(dest: Destination, root: Path) -> None:
    export(dest, root=root, selection=Selection(runs=("r1",)), log=lambda _: None)


def test_tensorboard_images_and_audio_read_back_with_the_event_accumulator(
        stored: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    optional("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tracklake.exporters.tensorboard.destination import TensorBoardDestination

    root, blobs = stored
    logdir = tmp_path / "tb"
    _export(TensorBoardDestination(logdir=logdir), root)
    [events] = [p.parent for p in logdir.rglob("events.out.tfevents.*")]
    acc = EventAccumulator(str(events), size_guidance={"images": 0, "audio": 0})
    acc.Reload()
    images = {e.step: (e.encoded_image_string, e.height, e.width) for e in acc.Images("img")}
    assert images == {s: (blobs[("img", s)], 8, 6) for s in (0, 1)}
    [audio] = acc.Audio("snd")
    assert (audio.step, audio.encoded_audio_string, audio.content_type, audio.sample_rate,
            audio.length_frames) == (0, blobs[("snd", 0)], "audio/wav", 8000.0, 800)
    assert "vid" not in acc.Tags()["images"]  # TensorBoard has no video


def test_wandb_gets_image_audio_and_video_files_in_its_offline_run(
        stored: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    optional("wandb")
    import _wandb_log as wlog

    from tracklake.exporters.wandb.destination import WandbDestination

    root, blobs = stored
    _export(WandbDestination(dir=str(tmp_path / "out")), root)
    files = sorted((tmp_path / "out" / "wandb").glob("offline-run-*/*.wandb"))
    history = dict(wlog.history(files))
    run_dir = files[0].parent / "files"
    for (key, step), data in blobs.items():
        value = history[step][key]
        expected = {"img": "image-file", "snd": "audio-file", "vid": "video-file"}[key]
        assert value["_type"] == expected
        assert (run_dir / value["path"]).read_bytes() == data, (key, step)
    assert history[0]["img"]["caption"] == "step 0"


def test_mlflow_gets_each_item_as_an_artifact_with_its_record(
        stored: tuple[Path, dict[str, Any]], mlflow_server: str) -> None:
    optional("mlflow")
    from mlflow.tracking import MlflowClient

    from tracklake.exporters.mlflow.destination import MlflowDestination

    root, blobs = stored
    _export(MlflowDestination(tracking_uri=mlflow_server), root)
    client = MlflowClient(mlflow_server)
    run_id = mlflow_run_id(client, PROJECT, "r1")
    extensions = {"img": "png", "snd": "wav", "vid": "gif"}
    for (key, step), data in blobs.items():
        name = f"media/{key}/step_{step:08d}"
        assert Path(client.download_artifacts(
            run_id, f"{name}.{extensions[key]}")).read_bytes() == data
        record = json.loads(Path(client.download_artifacts(run_id, f"{name}.json")).read_text())
        assert (record["key"], record["step"], record["size"]) == (key, step, len(data))
    assert json.loads(Path(client.download_artifacts(
        run_id, "media/img/step_00000001.json")).read_text())["caption"] == "step 1"


def test_swanlab_gets_images_and_gif_video_as_media(
        stored: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    optional("swanlab")
    import _swanlab_log as slog
    from PIL import Image

    from tracklake.exporters.swanlab.destination import SwanlabDestination

    root, blobs = stored
    logdir = tmp_path / "swanlab"
    _export(SwanlabDestination(logdir=str(logdir)), root)
    found: dict[tuple[str, int], Any] = {}
    for run_file in logdir.glob("run-*/run-*.swanlab"):
        for r in slog.records(run_file):
            if r.WhichOneof("record_type") == "media":
                [item] = r.media.value.items
                [path] = run_file.parent.glob(f"media/*/{item.filename}")
                found[(r.media.key, r.media.step)] = (path.read_bytes(), item.caption)
    for step in (0, 1):
        data, caption = found[("img", step)]
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(data))), _pixels(step))
        assert caption.startswith(f"step {step} · rank 0")
    assert found[("vid", 1)][0] == blobs[("vid", 1)]
    if importlib.util.find_spec("soundfile") is None:  # SwanLab cannot read audio: a text
        text, _ = found[("snd", 0)]
        assert b"audio `audio/wav` in the tracklake store" in text
    else:  # SwanLab writes the audio again as WAV
        assert found[("snd", 0)][0][:4] == b"RIFF"


def test_a_resumed_attempts_images_replace_the_earlier_ones_in_the_views_and_exports(
        tmp_path: Path) -> None:
    """Attempt 1 logs an image at steps 0-4, attempt 2 resumes at step 3: the `media` view
    and TensorBoard show attempt 1's images of steps 0-2 and attempt 2's of steps 3-5,
    once each; `media_all` keeps all eight."""
    optional("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tracklake.exporters.tensorboard.destination import TensorBoardDestination

    root = tmp_path / "store"
    stored: dict[int, bytes] = {}
    for attempt, steps in ((1, range(5)), (2, range(3, 6))):
        with tracklake.init(project=PROJECT, run_id="r1", root=root, capture_identity=False,
                            system_metrics=False, compact=False) as run:
            for step in steps:
                run.log({"loss": attempt * 10.0 + step}, step=step)
                digest = run.log_image("img", _pixels(attempt * 10 + step), step=step)
                stored[step] = blob_path(root, digest).read_bytes()  # type: ignore[arg-type]
    shown = tracklake.query("SELECT step, attempt FROM media ORDER BY step", root=root)
    assert shown.to_pylist() == [{"step": s, "attempt": 1 if s < 3 else 2} for s in range(6)]
    assert tracklake.query("SELECT count(*) AS n FROM media_all", root=root
                           ).column("n")[0].as_py() == 8
    logdir = tmp_path / "tb"
    _export(TensorBoardDestination(logdir=logdir), root)
    [events] = [p.parent for p in logdir.rglob("events.out.tfevents.*")]
    acc = EventAccumulator(str(events), size_guidance={"images": 0})
    acc.Reload()
    assert [(e.step, e.encoded_image_string) for e in acc.Images("img")] == sorted(
        stored.items())


def _png_of_pixels(width: int, height: int) -> bytes:
    """A 1-bit PNG of `width` x `height` zeros: a few kilobytes, however many pixels."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(
            ">I", zlib.crc32(kind + data))
    row = b"\0" * (1 + (width + 7) // 8)
    packer = zlib.compressobj(9)
    body = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()
    return (b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0))
            + chunk(b"IDAT", body) + chunk(b"IEND", b""))


@pytest.fixture
def too_many_pixels(tmp_path: Path) -> Path:
    """A run with an image of 8x6 pixels, one past Pillow's decompression-bomb warning
    (10,000 x 10,000) and one past its error (14,000 x 14,000), each a few kilobytes."""
    root = tmp_path / "store"
    with tracklake.init(project=PROJECT, run_id="r1", root=root, capture_identity=False,
                        system_metrics=False, compact=False) as run:
        run.log({"loss": 1.0}, step=0)
        run.log_image("small", _pixels(0), step=0)
        run.log_image("warned", _png_of_pixels(10_000, 10_000), step=0)
        run.log_image("refused", _png_of_pixels(14_000, 14_000), step=0)
    return root


def test_images_past_pillows_bomb_limit_are_left_out_of_wandb_and_the_rest_exported(
        too_many_pixels: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """W&B decodes an image whole: one past twice Pillow's limit failed the run's whole
    export, one past it took 4 bytes a pixel (two images of one 389 KB PNG of 10,000 x
    10,000: a 528 MiB peak). They are left out, named, and the rest of the run is
    exported."""
    optional("wandb")
    import _wandb_log as wlog

    from tracklake.exporters.wandb.destination import WandbDestination

    _export(WandbDestination(dir=str(tmp_path / "out")), too_many_pixels)
    files = sorted((tmp_path / "out" / "wandb").glob("offline-run-*/*.wandb"))
    history = dict(wlog.history(files))
    assert history[0]["small"]["_type"] == "image-file"
    assert history[0]["loss"] == 1.0
    assert "warned" not in history[0] and "refused" not in history[0]
    left_out = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert len(left_out) == 2
    assert any("10000x10000 = 100,000,000 pixels" in m for m in left_out)
    assert any("exceeds limit" in m for m in left_out)


def test_images_past_pillows_bomb_limit_reach_swanlab_as_texts_naming_them(
        too_many_pixels: Path, tmp_path: Path) -> None:
    optional("swanlab")

    from tracklake.exporters.swanlab.destination import SwanlabDestination

    logdir = tmp_path / "swanlab"
    _export(SwanlabDestination(logdir=str(logdir)), too_many_pixels)
    found = _swanlab_media(logdir)
    assert found["small"][0] == ".png"
    assert b"not decoded (10000x10000" in found["warned"][1]
    assert b"not decoded (Image size (196000000 pixels)" in found["refused"][1]


def _swanlab_media(logdir: Path) -> dict[str, tuple[str, bytes]]:
    """Key -> (file suffix, bytes) of each media item in SwanLab's offline files."""
    import _swanlab_log as slog

    found = {}
    for run_file in logdir.glob("run-*/run-*.swanlab"):
        for r in slog.records(run_file):
            if r.WhichOneof("record_type") == "media":
                [item] = r.media.value.items
                [path] = run_file.parent.glob(f"media/*/{item.filename}")
                found[r.media.key] = (path.suffix, path.read_bytes())
    return found


def _flac_of_silence(minutes: int) -> bytes:
    """`minutes` of 48 kHz stereo silence as FLAC: about 11 KB a minute, 44 MiB a minute
    as the float64 samples SwanLab decodes it to."""
    import soundfile

    out = io.BytesIO()
    with soundfile.SoundFile(out, "w", samplerate=48_000, channels=2, format="FLAC",
                             subtype="PCM_16") as f:
        minute = np.zeros((48_000 * 60, 2), dtype=np.int16)
        for _ in range(minutes):
            f.write(minute)
    return out.getvalue()


def test_audio_that_decodes_past_the_bound_reaches_swanlab_as_a_text_naming_it(
        tmp_path: Path) -> None:
    """SwanLab reads audio whole as float64 samples: 110 KB of FLAC silence took 439 MiB.
    Past `MAX_DECODED_AUDIO`, as the file's header counts it, the audio is a text naming
    the file; shorter audio is SwanLab's audio as before."""
    optional("swanlab")
    if importlib.util.find_spec("soundfile") is None:
        pytest.skip("SwanLab exports audio only with soundfile")

    from tracklake.exporters._shared.media import MAX_DECODED_AUDIO
    from tracklake.exporters.swanlab.destination import SwanlabDestination

    bomb = _flac_of_silence(10)
    assert len(bomb) < 1 << 20 and MAX_DECODED_AUDIO < 48_000 * 600 * 2 * 8
    root = tmp_path / "store"
    with tracklake.init(project=PROJECT, run_id="r1", root=root, capture_identity=False,
                        system_metrics=False, compact=False) as run:
        run.log({"loss": 1.0}, step=0)
        run.log_audio("short", np.sin(np.arange(800) / 3.0), sample_rate=8000, step=0)
        run.log_audio("long", bomb, step=0)
    logdir = tmp_path / "swanlab"
    _export(SwanlabDestination(logdir=str(logdir)), root)
    found = _swanlab_media(logdir)
    assert found["short"][1][:4] == b"RIFF"
    assert b"not decoded (28,800,000 frames x 2 channels" in found["long"][1]


def _tiny(fmt: str, **options: Any) -> bytearray:
    from PIL import Image

    out = io.BytesIO()
    Image.new("L" if fmt == "TIFF" else "RGB", (1, 1)).save(out, fmt, **options)
    return bytearray(out.getvalue())


def _jpeg_bomb() -> bytes:
    data = _tiny("JPEG")
    at = data.find(b"\xff\xc0")  # start of frame: height, width
    data[at + 5 : at + 9] = struct.pack(">HH", 65_000, 65_000)
    return bytes(data)


def _gif_bomb() -> bytes:
    data = _tiny("GIF")
    data[6:10] = struct.pack("<HH", 65_000, 65_000)  # the logical screen
    at = data.find(b"\x2c")  # the image descriptor
    data[at + 5 : at + 9] = struct.pack("<HH", 65_000, 65_000)
    return bytes(data)


def _bmp_bomb() -> bytes:
    data = _tiny("BMP")
    data[18:26] = struct.pack("<ii", 60_000, 60_000)
    return bytes(data)


def _webp_bomb(lossless: bool) -> bytes:
    data = _tiny("WEBP", lossless=lossless)
    if not lossless:
        at = data.find(b"\x9d\x01\x2a") + 3  # a VP8 key frame: 14-bit width, height
        data[at : at + 4] = struct.pack("<HH", 16_383, 16_383)
        return bytes(data)
    at = data.find(b"VP8L") + 9  # after the chunk's size and signature: 14 + 14 bits
    bits = struct.unpack("<I", bytes(data[at : at + 4]))[0] & ~((1 << 28) - 1)
    data[at : at + 4] = struct.pack("<I", bits | 16_382 | (16_382 << 14))
    return bytes(data)


def _tiff_bomb() -> bytes:
    data = _tiny("TIFF")
    ifd = struct.unpack("<I", data[4:8])[0]
    for k in range(struct.unpack("<H", data[ifd : ifd + 2])[0]):
        entry = ifd + 2 + 12 * k
        tag, kind = struct.unpack("<HH", data[entry : entry + 4])
        if tag in (256, 257):  # ImageWidth, ImageLength
            data[entry + 8 : entry + 12] = struct.pack("<I" if kind == 4 else "<HH",
                                                       *((60_000,) if kind == 4 else
                                                         (60_000, 0)))
    return bytes(data)


@pytest.mark.parametrize("bomb", [_jpeg_bomb, _gif_bomb, _bmp_bomb, _tiff_bomb,
                                  lambda: _webp_bomb(False), lambda: _webp_bomb(True)],
                         ids=["jpeg", "gif", "bmp", "tiff", "webp", "webp-lossless"])
def test_a_few_bytes_declaring_billions_of_pixels_are_refused_from_the_header(
        tmp_path: Path, bomb: Any) -> None:
    """Each format Pillow reads declares its size in its header: a file of a few dozen
    bytes may claim 65,000 x 65,000 pixels (17 GB decoded). The check reads that header
    alone and refuses the file, whatever its format."""
    from tracklake.exporters._shared.media import undecodable_image

    path = tmp_path / "bomb"
    path.write_bytes(bomb())
    assert path.stat().st_size < 1024
    why = undecodable_image(path)
    assert why is not None and "exceeds limit" in why, why
