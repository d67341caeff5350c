"""W&B's data types as `tracklake.wandb` takes them: `Table`, `Histogram`, the media
(`Image`, `Video`, `Audio`) and `Html`. They hold what was given; `values.py` decides
which record each one becomes when it is logged."""

from __future__ import annotations

import io
import math
import mimetypes
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: W&B's table log modes (`Table(log_mode=...)`): each `log()` of a table stores the rows
#: it holds then, except INCREMENTAL, which stores the rows added since its last `log()`
#: (as W&B uploads them; verl's DAPO reward table is one).
LOG_MODES = ("IMMUTABLE", "MUTABLE", "INCREMENTAL")


class Table:
    """``wandb.Table(columns, data, rows, dataframe, ...)``: rows of named columns."""

    def __init__(self, columns: Sequence[Any] | None = None, data: Any = None,
                 rows: Any = None, dataframe: Any = None, dtype: Any = None,
                 optional: Any = True, allow_mixed_types: bool = False,
                 log_mode: str | None = "IMMUTABLE") -> None:
        if log_mode is not None and log_mode not in LOG_MODES:
            raise ValueError(f"Table log_mode must be one of {LOG_MODES}, not {log_mode!r}")
        self.log_mode = log_mode or "IMMUTABLE"
        self.logged_rows = 0  # rows an INCREMENTAL table stored already
        if dataframe is not None:
            self.columns = [str(c) for c in dataframe.columns]
            self.data = [list(r) for r in dataframe.itertuples(index=False, name=None)]
            return
        rows = data if data is not None else rows
        if hasattr(rows, "tolist"):
            rows = rows.tolist()
        self.data = [list(r) for r in rows or ()]
        if columns is None:
            width = len(self.data[0]) if self.data else 0
            columns = [f"c{i}" for i in range(width)]  # W&B's default names are c0, c1...
        self.columns = [str(c) for c in columns]
        for i, row in enumerate(self.data):
            if len(row) != len(self.columns):
                raise ValueError(f"Table row {i} has {len(row)} values for "
                                 f"{len(self.columns)} columns {self.columns}")

    def add_data(self, *values: Any) -> None:
        """Append one row."""
        if len(values) != len(self.columns):
            raise ValueError(f"add_data() got {len(values)} values for {len(self.columns)} "
                             f"columns {self.columns}")
        self.data.append(list(values))

    def add_column(self, name: str, data: Sequence[Any], optional: bool = False) -> None:
        """Append a column (one value per row)."""
        if self.data and len(data) != len(self.data):
            raise ValueError(f"add_column({name!r}) got {len(data)} values for "
                             f"{len(self.data)} rows")
        if not self.data:
            self.data = [[] for _ in data]
        self.columns.append(str(name))
        for row, value in zip(self.data, data, strict=True):
            row.append(value)

    def get_column(self, name: str, convert_to: str | None = None) -> list[Any]:
        index = self.columns.index(name)
        return [row[index] for row in self.data]

    def rows_to_store(self) -> list[list[Any]]:
        """The rows a `log()` of this table stores now (see `LOG_MODES`)."""
        if self.log_mode != "INCREMENTAL":
            return self.data
        new, self.logged_rows = self.data[self.logged_rows:], len(self.data)
        return new

    def records(self) -> list[dict[str, Any]]:
        """The rows as mappings of column name to value."""
        return [dict(zip(self.columns, row, strict=True)) for row in self.data]


class Histogram:
    """``wandb.Histogram(sequence, np_histogram, num_bins)``: stored as a histogram record
    (`values.log_histogram`)."""

    def __init__(self, sequence: Sequence[Any] | None = None,
                 np_histogram: tuple[Any, Any] | None = None, num_bins: int = 64) -> None:
        if (sequence is None) == (np_histogram is None):
            raise ValueError("Histogram takes a sequence or an np_histogram (counts, bins)")
        self.sequence = None if sequence is None else [float(v) for v in _flat(sequence)]
        if np_histogram is not None:
            counts, bins = np_histogram
            self.histogram = [float(c) for c in _flat(counts)]
            self.bins = [float(b) for b in _flat(bins)]
            if len(self.bins) != len(self.histogram) + 1:
                raise ValueError("np_histogram: bins must have one more value than counts")
        self.num_bins = num_bins

    def summary(self) -> dict[str, float]:
        """count, min, max, mean and std (population) of the values, or of the bin
        midpoints weighted by the counts for an `np_histogram`; NaN when empty."""
        if self.sequence is not None:
            values = [v for v in self.sequence if not math.isnan(v)]
            weights = [1.0] * len(values)
            low = min(values, default=math.nan)
            high = max(values, default=math.nan)
        else:
            values = [(a + b) / 2 for a, b in zip(self.bins, self.bins[1:], strict=False)]
            weights = self.histogram
            low, high = self.bins[0], self.bins[-1]
        count = sum(weights)
        if not count:
            return {"count": 0.0, "min": math.nan, "max": math.nan, "mean": math.nan,
                    "std": math.nan}
        mean = sum(v * w for v, w in zip(values, weights, strict=True)) / count
        var = sum(w * (v - mean) ** 2 for v, w in zip(values, weights, strict=True)) / count
        return {"count": count, "min": low, "max": high, "mean": mean, "std": math.sqrt(var)}


def _flat(values: Any) -> list[Any]:
    if hasattr(values, "detach"):  # a torch tensor
        values = values.detach().cpu()
    if hasattr(values, "ravel"):
        return list(values.ravel().tolist())
    out: list[Any] = []
    for v in values:
        if isinstance(v, (list, tuple)):
            out.extend(_flat(v))
        else:
            out.append(v)
    return out


class Media:
    """A W&B media object: a file (path) or in-memory data, and its caption."""

    #: the media type of in-memory data stored as it is (no encoder for it here)
    kind = "application/octet-stream"
    suffix = ".bin"

    def __init__(self, data_or_path: Any, caption: str | None = None, **options: Any) -> None:
        self.data = data_or_path
        self.caption = caption
        self.options = {k: v for k, v in options.items() if v is not None}

    def encoded(self) -> tuple[bytes | Path, str, str]:
        """(bytes or file, media type, file suffix) to store."""
        if isinstance(self.data, (str, os.PathLike)):
            path = Path(self.data)
            guessed = mimetypes.guess_type(path.name)[0]
            return path, guessed or self.kind, path.suffix
        if isinstance(self.data, (bytes, bytearray)):
            return bytes(self.data), self.kind, self.suffix
        if hasattr(self.data, "read"):  # a file object
            raw = self.data.read()
            return (raw.encode() if isinstance(raw, str) else bytes(raw)), self.kind, self.suffix
        return _npy(self.data), "application/x-npy", ".npy"


class Image(Media):
    """``wandb.Image``: a file, a PIL image, or an array (PNG when pillow is installed)."""

    kind = "image/png"
    suffix = ".png"

    def __init__(self, data_or_path: Any, mode: str | None = None, caption: str | None = None,
                 grouping: int | None = None, classes: Any = None, boxes: Any = None,
                 masks: Any = None, file_type: str | None = None) -> None:
        super().__init__(data_or_path, caption, mode=mode, grouping=grouping)

    def encoded(self) -> tuple[bytes | Path, str, str]:
        if isinstance(self.data, (str, os.PathLike, bytes, bytearray)):
            return super().encoded()
        pil = sys.modules.get("PIL.Image")
        if pil is None and not hasattr(self.data, "save"):
            try:
                import PIL.Image as pil
            except ImportError:
                return super().encoded()  # the array as .npy
        image = self.data if hasattr(self.data, "save") else _pil_image(pil, self.data,
                                                                        self.options.get("mode"))
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        return buffer.getvalue(), "image/png", ".png"


class Video(Media):
    """``wandb.Video``: a file, or frames (stored as .npy)."""

    kind = "video/mp4"
    suffix = ".mp4"

    def __init__(self, data_or_path: Any, caption: str | None = None, fps: int | None = None,
                 format: str | None = None) -> None:
        super().__init__(data_or_path, caption, fps=fps, format=format)


class Audio(Media):
    """``wandb.Audio``: a file, or samples (stored as .npy with their sample rate)."""

    kind = "audio/wav"
    suffix = ".wav"

    def __init__(self, data_or_path: Any, sample_rate: int | None = None,
                 caption: str | None = None) -> None:
        super().__init__(data_or_path, caption, sample_rate=sample_rate)


class Html:
    """``wandb.Html``: HTML text (or a file or file object holding it), stored as text."""

    def __init__(self, data: Any, inject: bool = True, data_is_not_path: bool = False) -> None:
        if hasattr(data, "read"):
            self.html = str(data.read())
        elif (isinstance(data, (str, os.PathLike)) and not data_is_not_path
              and os.path.isfile(data) and os.path.splitext(data)[1] == ".html"):
            self.html = Path(data).read_text(encoding="utf-8")  # W&B's rule for a path
        else:
            self.html = str(data)


def _pil_image(pil: Any, data: Any, mode: str | None) -> Any:
    """An array as a PIL image, as W&B converts it: floats in [0, 1] scaled to 0-255,
    channels-first (C, H, W) moved last."""
    import numpy as np

    if hasattr(data, "detach"):
        data = data.detach().cpu().numpy()
    array = np.asarray(data)
    if array.ndim == 3 and array.shape[0] in (1, 3, 4) and array.shape[-1] not in (1, 3, 4):
        array = np.moveaxis(array, 0, -1)
    if array.ndim == 3 and array.shape[-1] == 1:
        array = array[..., 0]
    if array.dtype.kind == "f":
        array = np.clip(array * 255 if array.max(initial=0) <= 1 else array, 0, 255)
    return pil.fromarray(array.astype(np.uint8), mode=mode)


def _npy(data: Any) -> bytes:
    import numpy as np

    if hasattr(data, "detach"):
        data = data.detach().cpu().numpy()
    buffer = io.BytesIO()
    np.save(buffer, np.asarray(data), allow_pickle=False)
    return buffer.getvalue()
