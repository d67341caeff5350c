"""What every destination needs of a media record's blob: the file extension of its media
type, and the blob under a name with that extension (SDKs tell formats by names)."""

from __future__ import annotations

import os
import shutil
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
