"""Media records to TensorBoard image and audio events (``Summary.Image``,
``Summary.Audio``, what TensorBoard's image and audio dashboards read). TensorBoard has no
video: video records are skipped (docs/exporters.md, TensorBoard)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
from tensorboard.compat.proto import (  # type: ignore[import-untyped, unused-ignore]
    event_pb2,
    summary_pb2,
)

from tracklake.read import media_file

logger = logging.getLogger(__name__)

#: Largest media item written into an event file (an event holds it whole in memory).
MAX_EVENT_MEDIA = 64 << 20


def media_events(records: pa.Table, root: Path, where: str) -> Iterator[Any]:
    """An event per image or audio record whose blob the store holds as declared; the
    others are left out with a warning naming `where` (the run)."""
    times = records.column("time").cast(pa.int64()).to_pylist()
    for row, t in zip(records.to_pylist(), times, strict=True):
        if row["type"] not in ("image", "audio"):
            continue
        path = media_file(root, row["digest"], row["size"], MAX_EVENT_MEDIA)
        if path is None:
            logger.warning("%s: %s %r at step %s left out: its blob %s is missing from the "
                           "store, not of the size its record declares, or over %d bytes",
                           where, row["type"], row["key"], row["step"], row["digest"],
                           MAX_EVENT_MEDIA)
            continue
        data = path.read_bytes()
        value = _image(row, data) if row["type"] == "image" else _audio(row, data)
        yield event_pb2.Event(wall_time=t / 1_000_000, step=row["step"] or 0,
                              summary=summary_pb2.Summary(value=[value]))


def _image(row: dict[str, Any], data: bytes) -> Any:
    shape = row["shape"] or []
    height, width = [*shape, 0, 0][:2]
    channels = shape[2] if len(shape) > 2 else (1 if len(shape) == 2 else 0)
    return summary_pb2.Summary.Value(tag=row["key"], image=summary_pb2.Summary.Image(
        height=height, width=width, colorspace=channels, encoded_image_string=data))


def _audio(row: dict[str, Any], data: bytes) -> Any:
    frames, channels = (row["shape"] or [0, 0])[:2]
    return summary_pb2.Summary.Value(tag=row["key"], audio=summary_pb2.Summary.Audio(
        sample_rate=float(row["sample_rate"] or 0), num_channels=channels,
        length_frames=frames, encoded_audio_string=data, content_type=row["media_type"]))
