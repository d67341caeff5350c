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
