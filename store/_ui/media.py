"""The dashboard's histograms and media: read with the report's code
(`tracklake._report.sections`), and the one way a media blob leaves the store, by a digest
that a media record names.

A blob is served only if the digest is 64 hex digits, a row of the `media` view names it,
the store holds it as a regular file (reached through no link) of the size that row
declares, and that size is within the dashboard's limit. Its Content-Type is the row's
media type only if it is one the format allows (passive image, audio and video formats,
which a browser decodes and never runs); any other is sent as an attachment of type
application/octet-stream, so that a crafted record naming an SVG or HTML blob cannot put
a page that runs script in the dashboard's origin.
"""

from __future__ import annotations

import base64
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from tracklake._format.records import MEDIA_TYPES
from tracklake._read.query import query, with_connection
from tracklake._read.reader import ReadProblems
from tracklake._read.scope import scope_of_views
from tracklake._report.sections import (
    HISTOGRAMS_SQL,
    media_files,
    media_sql,
    read_histograms,
    read_media,
)
from tracklake._report.svg_histogram import drawable
from tracklake._ui.series import run_ids
from tracklake._ui.shown import shown
from tracklake.read import open_blob

#: The largest blob served: the largest media item `log_image` and the like store by
#: default (`TRACKLAKE_MEDIA_ITEM_LIMIT`).
MAX_BLOB = 64 << 20
#: The media types a blob is served as; any other is an attachment.
SERVED_TYPES = frozenset(t for types in MEDIA_TYPES.values() for t in types)

_DIGEST = re.compile(r"[0-9a-f]{64}")
_MEDIA_SQL = media_sql(("image", "audio", "video"))
_RANKS_SQL = """SELECT project, run, min(rank) AS rank FROM run_attempts
WHERE list_contains($runs, project || chr(31) || run) GROUP BY ALL ORDER BY ALL"""
_BLOB_SQL = "SELECT DISTINCT media_type, size FROM media WHERE digest = $digest LIMIT 16"

Runs = tuple[tuple[str, str], ...]


def histograms(store: Path, runs: Runs, timeout: float,
               problems: ReadProblems | None = None) -> list[dict[str, Any]]:
    """Per run and histogram key, the latest histograms of the run's lowest rank (the
    report's), those that keep the format's rules: [{project, run, key, steps: [{step,
    edges, counts}], query}], `query` what the steps were read with."""
    def read(con: Any) -> list[dict[str, Any]]:
        ranks = query(_RANKS_SQL, params={"runs": run_ids(runs)}, connection=con,
                      timeout=timeout).to_pylist()
        out = []
        for row in ranks:
            by_key = read_histograms(con, row["project"], row["run"], row["rank"], timeout)
            for key, rows in by_key.items():
                steps = [{"step": r["step"], "edges": r["edges"], "counts": r["counts"]}
                         for r in rows if drawable(r)]
                out.append({"project": row["project"], "run": row["run"], "key": key,
                            "steps": steps, "query": shown(HISTOGRAMS_SQL, {
                                "p": row["project"], "r": row["run"], "rank": row["rank"]})})
        return out
    return with_connection(store, ReadProblems() if problems is None else problems, read,
                           scope_of_views({"histograms", "run_attempts"}))


def media(store: Path, runs: Runs, timeout: float, limit: int = MAX_BLOB,
          inline: bool = False, problems: ReadProblems | None = None
          ) -> list[dict[str, Any]]:
    """Per run and media key, its latest items (the report's choice), each with
    ``served``: whether `blob` serves its bytes (with `inline`, as ``src``, a data: URI,
    for a page that reaches no server); and `query`, what they were read with."""
    def read(con: Any) -> list[dict[str, Any]]:
        out = []
        for project, run in runs:
            by_key = read_media(con, project, run, _MEDIA_SQL, timeout)
            for key, rows in media_files(store, by_key, SERVED_TYPES, limit):
                items = [{"step": r["step"], "rank": r["rank"], "type": r["type"],
                          "caption": r["caption"], "media_type": r["media_type"],
                          "digest": r["digest"], "size": r["size"],
                          "served": r["blob"] is not None,
                          **({"src": _data_uri(r["media_type"], r["blob"])}
                             if inline and r["blob"] is not None else {})} for r in rows]
                out.append({"project": project, "run": run, "key": key, "items": items,
                            "query": shown(_MEDIA_SQL, {"p": project, "r": run})})
        return out
    return with_connection(store, ReadProblems() if problems is None else problems, read,
                           scope_of_views({"media"}))


def _data_uri(media_type: str, path: Path) -> str:
    return f"data:{media_type};base64," + base64.b64encode(path.read_bytes()).decode()


@dataclass(frozen=True)
class Blob:
    """A blob to send: its digest, size and Content-Type; `attachment` when that type is
    not one a browser may show inline."""

    digest: str
    size: int
    content_type: str
    attachment: bool


@dataclass(frozen=True)
class Refusal:
    """Why a blob is not sent: an HTTP status and a message."""

    status: int
    why: str


def blob(store: Path, digest: str, timeout: float, limit: int = MAX_BLOB) -> Blob | Refusal:
    """The blob with `digest` if a media record names it and it may be sent."""
    if not _DIGEST.fullmatch(digest):
        return Refusal(404, "not a blob digest (64 lowercase hex digits)")
    rows = query(_BLOB_SQL, root=store, params={"digest": digest}, problems=ReadProblems(),
                 timeout=timeout).to_pylist()
    if not rows:
        return Refusal(404, "no media record names this blob")
    # the same bytes may be named by several records: a type that may be shown wins
    row = min(rows, key=lambda r: (r["media_type"] not in SERVED_TYPES, r["size"]))
    if row["size"] > limit:
        return Refusal(413, f"the blob has {row['size']:,} bytes, more than the "
                            f"{limit:,} the dashboard sends")
    shown = row["media_type"] in SERVED_TYPES
    return Blob(digest, row["size"], row["media_type"] if shown else
                "application/octet-stream", not shown)


def open_checked(store: Path, sent: Blob) -> BinaryIO | None:
    """The blob's file opened for reading if it is a regular file, reached through no
    link, of exactly the declared size; None if not (missing, replaced, another size)."""
    try:
        handle = open_blob(store, sent.digest)
    except OSError:
        return None
    if os.fstat(handle.fileno()).st_size != sent.size:
        handle.close()
        return None
    return handle
