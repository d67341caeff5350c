"""Checks of the values of records whose kind holds structure a reader must trust before
using it (a histogram's bins): a record that breaks them is never handed out
(docs/format.md, "Histograms")."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from tracklake._format.checks import is_digest

#: The kinds whose records `invalid_records` checks.
CHECKED_KINDS = frozenset({"histograms", "media"})
#: Most bins a histogram record may hold (the writer's limit, `tracklake.log_histogram`).
MAX_BINS = 512


def invalid_records(kind: str, table: pa.Table | pa.RecordBatch) -> tuple[np.ndarray, str] | None:
    """A mask of the records of `table` that break their kind's rules and what the first
    one breaks, or None when all hold (or the kind has no such rules)."""
    if kind == "histograms":
        return _invalid_histograms(table)
    if kind == "media":
        return _invalid_media(table)
    return None


def _invalid_histograms(table: pa.Table | pa.RecordBatch) -> tuple[np.ndarray, str] | None:
    bad = np.zeros(table.num_rows, np.bool_)
    first: str | None = None
    edges_col = _chunks(table.column("edges"))
    counts_col = _chunks(table.column("counts"))
    keys = table.column("key").to_pylist()
    seqs = table.column("seq").to_pylist()
    totals = table.column("count").to_pylist()
    row = 0
    for edges, counts in zip(edges_col, counts_col, strict=True):
        e_off, c_off = edges.offsets.to_numpy(), counts.offsets.to_numpy()
        e_val = edges.values.to_numpy(zero_copy_only=False)  # a null edge reads as NaN
        c_null = counts.values.is_null().to_numpy(zero_copy_only=False)
        c_val = counts.values.fill_null(-1).to_numpy(zero_copy_only=False)
        present = (edges.is_valid().to_numpy(zero_copy_only=False)
                   & counts.is_valid().to_numpy(zero_copy_only=False))
        for i in range(len(edges)):
            why = None
            ne, nc = int(e_off[i + 1] - e_off[i]), int(c_off[i + 1] - c_off[i])
            if not present[i]:
                why = "no edges or counts"
            elif nc > MAX_BINS:
                why = f"{nc} bins, more than {MAX_BINS}"
            elif ne != nc + 1 and (ne or nc):
                why = f"{ne} edges for {nc} counts"
            else:
                e = e_val[e_off[i]:e_off[i + 1]]
                c = c_val[c_off[i]:c_off[i + 1]]
                if not (np.all(np.isfinite(e)) and np.all(np.diff(e) > 0)):
                    why = "bin edges that are not finite and increasing"
                elif c_null[c_off[i]:c_off[i + 1]].any() or np.any(c < 0):
                    why = "a negative or missing count"
                elif totals[row + i] is None or totals[row + i] < 0:
                    why = "a negative or missing count of values"
            if why is not None:
                bad[row + i] = True
                first = first or f"histogram {keys[row + i]!r} at seq {seqs[row + i]}: {why}"
        row += len(edges)
    return None if first is None else (bad, first)


#: The largest media item a record may declare (what a reader would fetch for it).
MAX_MEDIA_BYTES = 1 << 40
MEDIA_TYPES = {
    "image": {"image/png", "image/jpeg", "image/gif", "image/webp"},
    "audio": {"audio/wav", "audio/flac", "audio/ogg", "audio/mpeg"},
    "video": {"video/mp4", "video/webm", "image/gif"},
}


def _invalid_media(table: pa.Table | pa.RecordBatch) -> tuple[np.ndarray, str] | None:
    bad = np.zeros(table.num_rows, np.bool_)
    first: str | None = None
    for i, row in enumerate(table.to_pylist()):
        why = _media_problem(row)
        if why is not None:
            bad[i] = True
            first = first or f"media {row.get('key')!r} at seq {row.get('seq')}: {why}"
    return None if first is None else (bad, first)


def _media_problem(row: dict[str, object]) -> str | None:
    digest, size, shape = row.get("digest"), row.get("size"), row.get("shape")
    if row.get("key") is None:
        return "no key"
    if not is_digest(digest):
        return f"digest {str(digest)[:80]!r} is not a sha256 hex digest"
    if not isinstance(size, int) or not 0 <= size <= MAX_MEDIA_BYTES:
        return f"a declared size of {size} bytes (at most {MAX_MEDIA_BYTES})"
    if row.get("media_type") not in MEDIA_TYPES.get(str(row.get("type")), set()):
        return f"type {row.get('type')!r} with media type {str(row.get('media_type'))[:80]!r}"
    if shape is not None and (not isinstance(shape, list) or len(shape) > 4 or any(
            not isinstance(d, int) or not 0 <= d < 1 << 31 for d in shape)):
        return f"shape {str(shape)[:80]}"
    rate, fps = row.get("sample_rate"), row.get("fps")
    if rate is not None and not (isinstance(rate, int) and 1 <= rate <= 10_000_000):
        return f"sample rate {rate}"
    if fps is not None and not (isinstance(fps, float) and math.isfinite(fps)
                                and 0 < fps <= 1000):
        return f"fps {fps}"
    return None


def _chunks(column: pa.Array | pa.ChunkedArray) -> list[pa.ListArray]:
    return list(column.chunks) if isinstance(column, pa.ChunkedArray) else [column]
