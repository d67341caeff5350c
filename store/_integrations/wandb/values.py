"""What each value of a W&B history row becomes in the store (docs/integrations.md):

- numbers (Python, NumPy, torch scalars, bools) → metrics; str → texts;
- `Table` → generations: with prompt- and response-like columns, ``input``/``output``/
  ``score`` are those columns and ``extra`` the others; without, every column is in
  ``extra``. Either way ``extra[LAYOUT]`` keeps the columns and their roles, so that the
  W&B exporter logs the table W&B would have shown;
- `Histogram`, and a NumPy array or torch tensor of more than 32 numbers (which W&B logs
  as a histogram of 32 bins) → histogram records, with ``key/count``, ``key/min``,
  ``key/max``, ``key/mean``, ``key/std`` as metrics (`log_histogram`);
- `Image`/`Audio`/`Video` → media records (`log_media`); a video given as frames, which
  nothing here can encode, → an artifact of its array;
- `Html` → texts;
- anything else W&B accepts (None, lists, small arrays, objects) is skipped and counted per key,
  said once: W&B would have taken it, so training must not fail on it.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from tracklake._integrations.tables import column_roles, score_of
from tracklake._integrations.wandb.data_types import Audio, Histogram, Html, Image, Media, Table
from tracklake._write.coerce import jsonable, to_float
from tracklake._write.run import Run, _plain_numbers
from tracklake._write.skips import Skips

#: The key in a generation's ``extra`` that keeps its W&B table's columns and roles.
LAYOUT = "_wandb_table"


def flat_row(row: Mapping[str, Any], skip: Callable[[str, Any], None],
             prefix: str = "") -> dict[str, Any]:
    """A history row with nested dicts joined by ``/``; a nested key that cannot name a
    record (not a str, empty, NUL) is skipped."""
    out: dict[str, Any] = {}
    for key, value in row.items():
        if not isinstance(key, str) or not key or "\x00" in key:
            skip(f"{prefix}{key!r}", value)
            continue
        if isinstance(value, Mapping):
            out.update(flat_row(value, skip, f"{prefix}{key}/"))
        else:
            out[prefix + key] = value
    return out


def frozen(data: Mapping[str, Any]) -> dict[str, Any]:
    """`data` as `log()` got it: each table's rows taken now, as W&B serialises a table at
    the call (a table changed before its row is committed must not change what it logged)."""
    if _plain_numbers(list(data.values())):
        return dict(data)
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Table):
            value = Table(columns=list(value.columns), data=value.rows_to_store())
        elif isinstance(value, Mapping):
            value = frozen(value)
        out[key] = value
    return out


def log_histogram(run: Run, key: str, histogram: Histogram, step: int) -> None:
    """A W&B histogram as a histogram record (and its statistics as metrics): of its values
    in its number of bins, or its ``np_histogram`` counts and edges as given."""
    if histogram.sequence is not None:
        run.log_histogram(key, histogram.sequence, step=step, bins=histogram.num_bins)
    else:
        run.log_histogram(key, counts=histogram.histogram, bins=histogram.bins, step=step)


def log_media(run: Run, key: str, media: Media, step: int, index: int | None = None) -> None:
    """An image, audio clip or video as a media record; a video given as frames (which
    tracklake has no encoder for) as an artifact of its array, named after key and step."""
    caption = media.caption
    if isinstance(media, Image):
        data = media.data
        if not isinstance(data, (str, os.PathLike, bytes, bytearray)) and not hasattr(
                data, "save"):
            data, _, _ = media.encoded()  # an array: PNG as W&B makes it (mode, scaling)
        run.log_image(key, data, step=step, caption=caption)
    elif isinstance(media, Audio):
        run.log_audio(key, media.data, sample_rate=media.options.get("sample_rate"),
                      step=step, caption=caption)
    elif isinstance(media.data, (str, os.PathLike, bytes, bytearray)):
        video = bytes(media.data) if isinstance(media.data, bytearray) else media.data
        run.log_video(key, video, fps=media.options.get("fps"), step=step, caption=caption)
    else:
        data, media_type, suffix = media.encoded()
        name = f"{key}_{step}" + ("" if index is None else f"_{index}") + suffix
        metadata = {"wandb_key": key, "wandb_type": type(media).__name__,
                    "caption": caption, **media.options}
        run.log_artifact(data, name=name.replace("/", "_"), media_type=media_type,
                         metadata=jsonable(metadata), step=step)


#: W&B logs a NumPy array (or torch tensor) of more values than this as a histogram.
HISTOGRAM_ABOVE = 32


def _big_array(value: Any) -> bool:
    """A real NumPy array or torch tensor W&B would log as a histogram."""
    np = sys.modules.get("numpy")
    if np is not None and isinstance(value, np.ndarray):
        return bool(value.size > HISTOGRAM_ABOVE and value.dtype.kind in "biuf")
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return bool(value.numel() > HISTOGRAM_ABOVE and not value.is_complex()
                    and value.dtype != torch.bool)
    return False


def table_samples(table: Table) -> list[dict[str, Any]]:
    """A table's rows as generations: roles by column name (the module docstring)."""
    roles = column_roles(table.columns)
    layout = {"columns": table.columns, **roles}
    role_of = {column: role for role, column in roles.items() if column is not None}
    samples = []
    for row in table.rows_to_store():
        sample: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for column, value in zip(table.columns, row, strict=True):
            role = role_of.get(column)
            cell = _cell(value)
            if role == "score":
                number = score_of(column, value)
                if number is not None:
                    sample["score"] = number
                    continue
                role = None  # not a number: kept as it is in extra
            if role is None:
                extra[column] = cell
            else:
                sample[role] = cell
        samples.append(sample | extra | {LAYOUT: layout})
    return samples


def _cell(value: Any) -> Any:
    if isinstance(value, Media):
        return f"<{type(value).__name__}>"
    if isinstance(value, Html):
        return value.html
    return jsonable(value)


class RowWriter:
    """Writes committed rows to a tracklake `Run`, skipping and counting what is not
    storable (said once per key on stderr)."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.skips = Skips(f"tracklake.wandb: run {run.id!r}",
                           "which the store does not hold; skipped (W&B would have logged it)",
                           "skipped values the store does not hold")

        self._plain_keys: set[tuple[str, ...]] = set()  # key sets known to name records

    def skip(self, key: str, value: Any) -> None:
        self.skips.add(key, value)

    def plain(self, row: Mapping[str, Any]) -> bool:
        """True if `row` is flat, of plain numbers, under keys that can name records:
        the common row, stored as it is (the fast path of `Run.log` does the rest)."""
        if not _plain_numbers(list(row.values())):
            return False
        keys = tuple(row)
        if keys in self._plain_keys:
            return True
        if all(isinstance(k, str) and k and "\x00" not in k for k in keys):
            self._plain_keys.add(keys)
            return True
        return False

    def write(self, step: int, values: Mapping[str, Any]) -> Mapping[str, float]:
        """Store `values` at `step`; returns the metrics written (for the summary)."""
        if self.plain(values):
            self.run.log(values, step=step)
            return values  # ints and floats
        metrics: dict[str, float] = {}
        for key, value in values.items():
            if isinstance(value, Table):
                samples = table_samples(value)
                if samples:
                    self.run.log_generations(samples, step=step, key=key)
            elif isinstance(value, Histogram):
                self._histogram(key, value, step)
            elif isinstance(value, Media):
                self._media(key, value, step)
            elif isinstance(value, Html):
                self.run.log_text(key, value.html, step=step)
            elif isinstance(value, (list, tuple)) and value and all(
                    isinstance(v, Media) for v in value):
                for i, media in enumerate(value):
                    self._media(key, media, step, i)
            elif _big_array(value):  # W&B logs it as a histogram of 32 bins
                self._histogram(key, Histogram(value, num_bins=32), step)
            else:
                try:
                    number = to_float(key, value)
                except (TypeError, ValueError):
                    self.skip(key, value)
                    continue
                if isinstance(number, str):
                    self.run.log_text(key, number, step=step)
                else:
                    metrics[key] = number
        if metrics:
            self.run.log(metrics, step=step)
        return metrics

    def _media(self, key: str, media: Media, step: int, index: int | None = None) -> None:
        """An image, video or audio, or skipped (counted) if it cannot be encoded: a
        missing file, an array pillow cannot make an image of."""
        try:
            log_media(self.run, key, media, step, index)
        except (TypeError, ValueError, OSError):
            self.skip(key, media)

    def _histogram(self, key: str, histogram: Histogram, step: int) -> None:
        """A histogram, or skipped (counted) when the store cannot hold it (more bins than
        it takes, a range wider than float64)."""
        try:
            log_histogram(self.run, key, histogram, step)
        except (TypeError, ValueError):
            self.skip(key, histogram)

    def report(self) -> str | None:
        return self.skips.report()


def summary_text(values: Mapping[str, Any]) -> str:
    """Explicit summary values as the JSON text of their event."""
    return json.dumps(jsonable(dict(values)), allow_nan=True, sort_keys=True)
