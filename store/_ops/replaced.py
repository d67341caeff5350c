"""Parts that a merge replaced: kept readable under their names for a grace period.

A merge renames one part over its inputs' seq ranges into place; the parts it merged are
then *replaced*. tracklake's readers skip them at once (a part whose range lies within
another's, `reader.list_stream`), but a plain engine (DuckDB, Polars, pyarrow, Spark) that
listed the directory before the rename opens them afterwards, by name. So a replaced part
is deleted only once the part that replaced it has been in place for `grace_seconds()`
(TRACKLAKE_PART_GRACE, default 10 minutes): by the stream's next compaction, or, when its
rank has finished, by a compaction started for that moment (`auto.py`). docs/format.md,
"Compacted parts", gives the rule plain engines use to leave replaced parts out.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from tracklake._errors import StoreError
from tracklake._read.reader import Part, StreamFiles

#: The environment variable giving the grace period in seconds.
GRACE_ENV = "TRACKLAKE_PART_GRACE"
#: Longer than any sane query over the files: a plain engine lists, then reads.
DEFAULT_GRACE_SECONDS = 600.0
#: A grace period longer than this is refused: the parts would stay for ever in effect.
MAX_GRACE_SECONDS = 7 * 86400.0


def grace_seconds() -> float:
    """How long a replaced part stays readable: $TRACKLAKE_PART_GRACE (seconds), else 600."""
    given = os.environ.get(GRACE_ENV, "").strip()
    if not given:
        return DEFAULT_GRACE_SECONDS
    try:
        seconds = float(given)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= MAX_GRACE_SECONDS:
        raise StoreError(f"{GRACE_ENV}={given!r} is not a number of seconds from 0 to "
                         f"{MAX_GRACE_SECONDS:.0f}")
    return seconds


@dataclass(frozen=True)
class Replaced:
    """A replaced part, the part whose range holds it, and when it may be deleted (epoch
    seconds: the holder's modification time plus the grace period)."""

    part: Part
    holder: Part
    until: float


def replaced_parts(files: StreamFiles, grace: float) -> list[Replaced]:
    """The stream's replaced parts (`files.merged`), each with its holder and deadline. A
    holder gone since the listing, or unreadable, gives no deadline yet (`until` inf)."""
    out: list[Replaced] = []
    for part in files.merged:
        holder = next((h for h in files.parts
                       if h.first_seq <= part.first_seq and part.last_seq <= h.last_seq), None)
        if holder is None:
            continue  # listed apart from its holder: the next listing pairs them
        try:
            until = holder.path.stat().st_mtime + grace
        except OSError:
            until = float("inf")
        out.append(Replaced(part, holder, until))
    return out
