"""What every destination needs of a media record's blob: the file extension of its media
type, the blob under a name with that extension (SDKs tell formats by names), and for
the SDKs that decode an image (W&B, SwanLab), whether it may be handed to them."""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

EXTENSIONS = {"image/png": "png", "image/jpeg": "jpg", "image/gif": "gif",
              "image/webp": "webp", "audio/wav": "wav", "audio/flac": "flac",
              "audio/ogg": "ogg", "audio/mpeg": "mp3", "video/mp4": "mp4",
              "video/webm": "webm"}


def named_copy(blob: Path, path: Path) -> Path:
    """`blob` reachable as `path`: a symbolic link to it, else (no links here) a copy."""
    if not path.exists():
        try:
            os.symlink(blob, path)
        except OSError:
            shutil.copyfile(blob, path)
    return path


def undecodable_image(path: Path) -> str | None:
    """Why the image at `path` is not handed to an SDK that decodes it whole (W&B's and
    SwanLab's `Image` do): more pixels than Pillow's own decompression-bomb limit
    (`PIL.Image.MAX_IMAGE_PIXELS`; a few hundred kilobytes of PNG may stand for
    gigabytes), or a header Pillow does not read; None if it may be. Only the header is
    read. Pillow raises past twice its limit, which failed the run's whole export."""
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                width, height = image.size
    except Image.DecompressionBombError as exc:
        return str(exc)
    except (OSError, ValueError, SyntaxError) as exc:  # Pillow's errors for bad headers
        return f"Pillow does not read it ({exc})"
    limit = Image.MAX_IMAGE_PIXELS  # None where the caller turned Pillow's check off
    if limit is not None and width * height > limit:
        return (f"{width}x{height} = {width * height:,} pixels, more than the {limit:,} "
                "Pillow decodes without warning of a decompression bomb")
    return None


#: The most an audio file handed to SwanLab may decode to: SwanLab reads it whole as
#: float64 samples. 256 MiB is what the largest WAV a run may log by default (64 MiB of
#: 16-bit samples) decodes to; 110 KB of FLAC silence stands for 439 MiB (10 minutes of
#: 48 kHz stereo).
MAX_DECODED_AUDIO = 256 << 20


def undecodable_audio(path: Path) -> str | None:
    """Why the audio at `path` is not handed to SwanLab, which decodes it whole: more
    than `MAX_DECODED_AUDIO` as its header counts frames and channels, a length its
    header does not give, or a header soundfile does not read; None if it may be."""
    import soundfile  # type: ignore[import-untyped, unused-ignore]  # no type information

    try:
        info = soundfile.info(str(path))
    except (RuntimeError, OSError, ValueError) as exc:  # soundfile's LibsndfileError
        return f"soundfile does not read it ({exc})"
    samples = info.frames * info.channels
    if info.frames <= 0 or info.channels <= 0:
        return "its header gives no length"
    if samples * 8 > MAX_DECODED_AUDIO:
        return (f"{info.frames:,} frames x {info.channels} channels decode to "
                f"{samples * 8:,} bytes, more than the {MAX_DECODED_AUDIO:,} it may")
    return None
