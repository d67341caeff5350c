"""Images, audio and video as media items: encoded (arrays to PNG or WAV) or taken as they
are (files, bytes), checked against the media limits, in the caller's process
(docs/concepts.md, "Media"). Nothing here imports torch or PIL."""

from __future__ import annotations

import io
import os
import struct
import sys
import wave
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tracklake._format.part_bounds import env_size

#: Environment variables of the media limits, and their defaults.
ITEM_LIMIT_ENV = "TRACKLAKE_MEDIA_ITEM_LIMIT"
RUN_LIMIT_ENV = "TRACKLAKE_MEDIA_RUN_LIMIT"
DEFAULT_ITEM_LIMIT = 64 << 20
DEFAULT_RUN_LIMIT = 4 << 30
#: Longest side of an image array, and most audio frames of an array.
MAX_SIDE = 1 << 15
_HEAD = 64  # bytes read of a file to tell its format and shape


@dataclass(frozen=True)
class MediaItem:
    """One item to store: its bytes (or the file holding them) and what they are."""

    type: str  # image, audio, video
    media_type: str  # MIME type
    data: bytes | Path
    size: int
    shape: tuple[int, ...] | None = None
    sample_rate: int | None = None
    fps: float | None = None


def limits() -> tuple[int, int]:
    """(bytes per item, bytes per run) of media: the settings, else the defaults."""
    item = env_size(ITEM_LIMIT_ENV)
    run = env_size(RUN_LIMIT_ENV)
    return (DEFAULT_ITEM_LIMIT if item is None else item,
            DEFAULT_RUN_LIMIT if run is None else run)


def check_item_size(what: str, key: str, size: int, item_limit: int) -> None:
    if size > item_limit:
        raise ValueError(f"{what} {key!r}: {size:,} bytes, more than the {item_limit:,} one "
                         f"media item may hold ({ITEM_LIMIT_ENV} sets another limit); "
                         "nothing was stored")


# -- images -----------------------------------------------------------------------------

def image_item(key: str, image: Any, item_limit: int) -> MediaItem:
    """An image from a NumPy array (HW or HWC), a torch tensor (CHW or HWC), a PIL image,
    a file or bytes (PNG, JPEG, GIF, WebP)."""
    given = _given_bytes("image", key, image, item_limit)
    if given is not None:
        head, size = given
        media_type, shape = _image_format(head)
        if media_type is None:
            raise ValueError(f"image {key!r}: not a PNG, JPEG, GIF or WebP file")
        return MediaItem("image", media_type, _data(image), size, shape)
    if type(image).__module__.startswith("PIL."):
        out = io.BytesIO()
        image.save(out, format="PNG")
        data = out.getvalue()
        check_item_size("image", key, len(data), item_limit)
        width, height = image.size
        return MediaItem("image", "image/png", data, len(data),
                         (height, width, len(image.getbands())))
    pixels = _pixels(key, _to_numpy(key, image, channels_first=True))
    data = png(pixels)
    check_item_size("image", key, len(data), item_limit)
    return MediaItem("image", "image/png", data, len(data), tuple(pixels.shape))


def _pixels(key: str, array: Any) -> Any:
    """`array` as uint8 HWC with 1, 3 or 4 channels (floats: 0..1, clipped)."""
    if array.ndim == 2:
        array = array[:, :, None]
    if array.ndim != 3 or array.shape[2] not in (1, 3, 4):
        raise ValueError(f"image {key!r}: shape {array.shape} is not HW or HWC with 1, 3 "
                         "or 4 channels (a torch tensor may be CHW)")
    if not (0 < array.shape[0] <= MAX_SIDE and 0 < array.shape[1] <= MAX_SIDE):
        raise ValueError(f"image {key!r}: {array.shape[1]}x{array.shape[0]} pixels; each "
                         f"side must be 1 to {MAX_SIDE}")
    if array.dtype == np.uint8:
        return array
    if array.dtype.kind == "b":
        return array.astype(np.uint8) * 255
    if array.dtype.kind == "f":
        scaled = np.nan_to_num(array.astype(np.float64), nan=0.0)
        return (np.clip(scaled, 0.0, 1.0) * 255).round().astype(np.uint8)
    if array.dtype.kind in "iu":
        if array.size and (array.min() < 0 or array.max() > 255):
            raise ValueError(f"image {key!r}: integer pixels must be 0 to 255")
        return array.astype(np.uint8)
    raise TypeError(f"image {key!r}: pixels of dtype {array.dtype} are not numbers")


def png(pixels: Any) -> bytes:
    """A PNG of uint8 HWC `pixels` (1 channel: grey, 3: RGB, 4: RGBA), each row with the
    filter that leaves it smallest (as libpng's heuristic: least sum of absolute values)."""
    height, width, channels = pixels.shape
    data = np.ascontiguousarray(pixels).reshape(height, width * channels).astype(np.int16)
    parts = []
    for start in range(0, height, _PNG_ROWS):  # bounded memory: five filtered copies
        rows = data[start:start + _PNG_ROWS]
        previous = data[start - 1:start] if start else np.zeros((1, rows.shape[1]), np.int16)
        parts.append(_filtered(rows, previous, channels))
    raw = np.concatenate(parts)

    def chunk(tag: bytes, body: bytes) -> bytes:
        return (struct.pack(">I", len(body)) + tag + body
                + struct.pack(">I", zlib.crc32(tag + body)))

    color = {1: 0, 3: 2, 4: 6}[channels]
    return (b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, color, 0, 0, 0))
            + chunk(b"IDAT", _deflate(raw.tobytes())) + chunk(b"IEND", b""))


def _deflate(data: bytes) -> bytes:
    """zlib with the strategy libpng uses for filtered rows (Z_FILTERED: 15% smaller here)."""
    z = zlib.compressobj(6, zlib.DEFLATED, 15, 9, zlib.Z_FILTERED)
    return z.compress(data) + z.flush()


_PNG_ROWS = 256


def _filtered(x: Any, previous: Any, bpp: int) -> Any:
    """Rows `x` (int16) under PNG filters None, Sub, Up, Average and Paeth, each row with
    the one of least sum of absolute (signed byte) values, its filter byte first."""
    a = np.zeros_like(x)
    a[:, bpp:] = x[:, :-bpp]  # left
    b = np.concatenate([previous, x[:-1]])  # up
    c = np.zeros_like(x)
    c[:, bpp:] = b[:, :-bpp]  # up-left
    p = a + b - c
    pa, pb, pc = np.abs(p - a), np.abs(p - b), np.abs(p - c)
    paeth = np.where((pa <= pb) & (pa <= pc), a, np.where(pb <= pc, b, c))
    candidates = np.stack([x, x - a, x - b, x - ((a + b) >> 1), x - paeth]) & 0xFF
    signed = np.where(candidates > 127, 256 - candidates, candidates)
    choice = np.argmin(signed.sum(axis=2), axis=0)
    rows = candidates[choice, np.arange(len(x))].astype(np.uint8)
    return np.concatenate([choice[:, None].astype(np.uint8), rows], 1)


def _image_format(head: bytes) -> tuple[str | None, tuple[int, ...] | None]:
    if head.startswith(b"\x89PNG\r\n\x1a\n") and len(head) >= 26:
        width, height = struct.unpack(">II", head[16:24])
        channels = {0: 1, 2: 3, 3: 3, 4: 2, 6: 4}.get(head[25])
        return "image/png", (height, width, channels) if channels else (height, width)
    if head.startswith(b"\xff\xd8\xff"):
        return "image/jpeg", None
    if head[:6] in (b"GIF87a", b"GIF89a") and len(head) >= 10:
        width, height = struct.unpack("<HH", head[6:10])
        return "image/gif", (height, width)
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp", None
    return None, None


# -- audio ------------------------------------------------------------------------------

def audio_item(key: str, audio: Any, sample_rate: int | None, item_limit: int) -> MediaItem:
    """Audio from an array (frames, or frames x channels; floats -1..1, or int16) at
    `sample_rate`, or a file or bytes (WAV, FLAC, OGG, MP3)."""
    if sample_rate is not None and (isinstance(sample_rate, bool) or not isinstance(
            sample_rate, int) or not 1 <= sample_rate <= 10_000_000):
        raise ValueError(f"audio {key!r}: sample_rate must be an int from 1 to 10,000,000")
    given = _given_bytes("audio", key, audio, item_limit)
    if given is not None:
        head, size = given
        media_type = _audio_format(head)
        if media_type is None:
            raise ValueError(f"audio {key!r}: not a WAV, FLAC, OGG or MP3 file")
        shape = None
        if media_type == "audio/wav":
            try:
                with wave.open(io.BytesIO(head) if isinstance(audio, bytes | bytearray)
                               else str(audio), "rb") as w:
                    shape, sample_rate = (w.getnframes(), w.getnchannels()), w.getframerate()
            except (wave.Error, EOFError, struct.error) as exc:
                raise ValueError(f"audio {key!r}: a damaged WAV file ({exc})") from exc
        return MediaItem("audio", media_type, _data(audio), size, shape, sample_rate)
    if sample_rate is None:
        raise ValueError(f"audio {key!r}: an array needs its sample_rate")
    array = _to_numpy(key, audio, channels_first=False)
    if array.ndim == 1:
        array = array[:, None]
    if array.ndim != 2 or not 1 <= array.shape[1] <= 8 or array.shape[0] == 0:
        raise ValueError(f"audio {key!r}: shape {array.shape} is not (frames,) or (frames, "
                         "channels) with 1 to 8 channels")
    if array.dtype == np.int16:
        samples = array
    elif array.dtype.kind == "f":
        samples = (np.clip(np.nan_to_num(array, nan=0.0), -1.0, 1.0) * 32767).astype(np.int16)
    else:
        raise TypeError(f"audio {key!r}: samples of dtype {array.dtype}; give floats from -1 "
                        "to 1 or int16")
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(samples.shape[1])
        w.setsampwidth(2)
        w.setframerate(sample_rate)
        w.writeframes(np.ascontiguousarray(samples).astype("<i2").tobytes())
    data = out.getvalue()
    check_item_size("audio", key, len(data), item_limit)
    return MediaItem("audio", "audio/wav", data, len(data), tuple(samples.shape), sample_rate)


def _audio_format(head: bytes) -> str | None:
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return "audio/wav"
    if head[:4] == b"fLaC":
        return "audio/flac"
    if head[:4] == b"OggS":
        return "audio/ogg"
    if head[:3] == b"ID3" or (len(head) > 1 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0):
        return "audio/mpeg"
    return None


# -- video ------------------------------------------------------------------------------

def video_item(key: str, video: Any, fps: float | None, item_limit: int) -> MediaItem:
    """A video file or its bytes (MP4, WebM, GIF); frames are not encoded here."""
    if fps is not None and (isinstance(fps, bool) or not isinstance(fps, int | float)
                            or not 0 < fps <= 1000):
        raise ValueError(f"video {key!r}: fps must be a number above 0, at most 1000")
    given = _given_bytes("video", key, video, item_limit)
    if given is None:
        raise TypeError(f"video {key!r}: log_video takes a file or bytes (MP4, WebM, GIF), "
                        f"not {type(video).__qualname__}; encode frames to a file first "
                        "(imageio, ffmpeg)")
    head, size = given
    if head[4:8] == b"ftyp":
        media_type = "video/mp4"
    elif head[:4] == b"\x1a\x45\xdf\xa3":
        media_type = "video/webm"
    elif head[:6] in (b"GIF87a", b"GIF89a"):
        media_type = "image/gif"
    else:
        raise ValueError(f"video {key!r}: not an MP4, WebM or GIF file")
    return MediaItem("video", media_type, _data(video), size, None, None,
                     None if fps is None else float(fps))


# -- inputs -----------------------------------------------------------------------------

def _given_bytes(what: str, key: str, value: Any, item_limit: int
                 ) -> tuple[bytes, int] | None:
    """(first bytes, size) of a file or bytes given as they are (the size checked before
    the file is read), None for anything else."""
    if isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value)
        check_item_size(what, key, len(data), item_limit)
        return data if what == "audio" else data[:_HEAD], len(data)
    if isinstance(value, str | os.PathLike):
        path = Path(value)
        if not path.is_file():
            raise FileNotFoundError(f"{what} {key!r}: {str(path)!r} is not a file")
        size = path.stat().st_size
        check_item_size(what, key, size, item_limit)
        with open(path, "rb") as f:
            return f.read(_HEAD), size
    return None


def _data(value: Any) -> bytes | Path:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    return Path(value).resolve()


def _to_numpy(key: str, value: Any, *, channels_first: bool) -> Any:
    """A NumPy array of `value` (a torch tensor, on any device, as CHW -> HWC when
    `channels_first` and it looks so; anything with ``.numpy()`` or ``__array__``)."""
    torch = sys.modules.get("torch")  # never imported here: without it, no tensor exists
    if torch is not None and isinstance(value, torch.Tensor):
        tensor: Any = value.detach().cpu()
        if tensor.dtype == torch.bfloat16 or tensor.dtype == torch.float16:
            tensor = tensor.float()
        array = tensor.numpy()
        if channels_first and array.ndim == 3 and array.shape[0] in (1, 3, 4) and \
                array.shape[2] not in (1, 3, 4):
            array = array.transpose(1, 2, 0)
        return array
    if not isinstance(value, np.ndarray) and callable(getattr(value, "numpy", None)):
        value = value.numpy()
    if isinstance(value, np.ndarray) or hasattr(value, "__array__"):
        return np.asarray(value)
    raise TypeError(f"media {key!r}: {type(value).__qualname__} is not an array, a tensor, "
                    "an image, a file path or bytes")
