"""Media records as W&B media: `wandb.Image`, `wandb.Audio`, `wandb.Video` made from the
store's blobs (a W&B media object is made from a file whose name gives its format: each
blob is linked, else copied, under a temporary name with its extension)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import wandb

from tracklake.exporters._shared.media import EXTENSIONS, named_copy, undecodable_image
from tracklake.read import media_file

logger = logging.getLogger(__name__)

#: The JSON form a media record takes while it waits for its step's row (in the state too).
MEDIA_TYPE_TAG = "tracklake-media"
_FIELDS = ("type", "media_type", "digest", "size", "caption", "sample_rate", "fps", "step")


def media_values(records: pa.Table) -> list[tuple[int, str | None, dict[str, Any]]]:
    """(step, key, JSON form) of each media record, in the records' order."""
    return [(row["step"] or 0, row["key"], {"_type": MEDIA_TYPE_TAG,
                                            **{k: row[k] for k in _FIELDS}})
            for row in records.to_pylist()]


class MediaFiles:
    """Makes W&B media objects of media values, from files named in `directory`."""

    def __init__(self, root: Path, directory: Path, where: str) -> None:
        self.root, self.directory, self.where = root, directory, where

    def __call__(self, value: Mapping[str, Any]) -> Any:
        """The W&B object of `value`, None (with a warning) if the store lacks its blob."""
        blob = media_file(self.root, value["digest"], value["size"])
        extension = EXTENSIONS.get(value["media_type"])
        if blob is None or extension is None:
            logger.warning("%s: %s at step %s left out: its blob %s is missing from the "
                           "store or not of the size its record declares", self.where,
                           value["type"], value["step"], value["digest"])
            return None
        path = named_copy(blob, self.directory / f"{value['digest']}.{extension}")
        caption = value.get("caption")
        if value["type"] == "image":
            why = undecodable_image(path)
            if why is not None:
                logger.warning("%s: image at step %s left out: its blob %s is not decoded "
                               "(%s)", self.where, value["step"], value["digest"], why)
                return None
            return wandb.Image(str(path), caption=caption)
        if value["type"] == "audio":
            return wandb.Audio(str(path), caption=caption)
        return wandb.Video(str(path), caption=caption,
                           format=extension)  # type: ignore[arg-type]  # mp4, webm, gif
