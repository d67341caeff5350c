"""Where things live in a store: stream directories, attempt files, blobs, file names
(specified in docs/format.md)."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from tracklake._format.schema import PARTITION_SCHEMA, StreamId

SEGMENT_SUFFIX = ".arrows"
PART_SUFFIX = ".parquet"
#: Live segments are named ``_seg-…`` (format 1.1): Hive discovery in pyarrow, Spark and
#: pandas skips names starting with ``_``, so a Parquet dataset over a kind directory
#: never trips on a segment being written. Format 1.0 wrote ``seg-…``; both are read.
SEGMENT_PREFIX = "_seg-"
#: Numbers are zero-padded to a minimum width, and wider when they outgrow it (segment
#: 1,000,000 of a writer that kept failing and starting new segments stays readable).
_SEGMENT_RE = re.compile(r"^_?seg-(\d{6,})-(\d{12,})\.arrows$")
_PART_RE = re.compile(r"^part-(\d{12,})-(\d{12,})-(\d{6,})\.parquet$")


def stream_dir(root: Path, s: StreamId) -> Path:
    """Directory holding the live segments and compacted parts of one stream."""
    return (root / s.kind / f"project={s.project}" / f"run={s.run}" / f"rank={s.rank}"
            / f"attempt={s.attempt}")


def stream_of_file(path: Path, kind: str) -> StreamId | None:
    """The stream a segment or part of `kind` belongs to, from its directories
    (``…/project=P/run=R/rank=N/attempt=N/part-….parquet``); None for a path of another
    shape, or ranks and attempts that are not numbers a writer makes."""
    values = []
    for directory, name in zip(reversed(path.parents[:4]), PARTITION_SCHEMA.names,
                               strict=True):
        prefix = f"{name}="
        if not directory.name.startswith(prefix):
            return None
        values.append(directory.name.removeprefix(prefix))
    try:
        rank, attempt = int(values[2]), int(values[3])
    except ValueError:
        return None
    if not (0 <= rank < 1 << 31 and 0 <= attempt < 1 << 31):
        return None
    return StreamId(values[0], values[1], rank, attempt, kind)


def attempt_file(root: Path, project: str, run: str, rank: int, attempt: int) -> Path:
    """JSON file holding one rank's identity and status for one attempt."""
    return root / "runs" / f"project={project}" / f"run={run}" / f"rank={rank}" / (
        f"attempt={attempt}.json")


def blob_path(root: Path, digest: str) -> Path:
    """Content-addressed location of an artifact's bytes (digest is hex sha256)."""
    return root / "blobs" / "sha256" / digest[:2] / digest


def local_base(local_root: Path, root: Path) -> Path:
    """Where a node's ranks write the segments of the store at `root` in ship mode: a
    folder of `local_root` named by the store's absolute path, so two stores never share
    one (docs/many-nodes.md, "Write locally, ship segments")."""
    digest = hashlib.sha256(os.fsencode(os.path.abspath(root))).hexdigest()[:16]
    return local_root / f"store-{digest}"


def segment_name(number: int, first_seq: int) -> str:
    """The file name of segment `number` of a stream, starting at `first_seq`."""
    return f"{SEGMENT_PREFIX}{number:06d}-{first_seq:012d}{SEGMENT_SUFFIX}"


def part_name(first_seq: int, last_seq: int, last_segment: int) -> str:
    """A compacted part holding seqs first..last, made of segments numbered <= last_segment."""
    return f"part-{first_seq:012d}-{last_seq:012d}-{last_segment:06d}{PART_SUFFIX}"


def parse_segment_name(name: str) -> tuple[int, int] | None:
    """(segment number, first seq) of a segment file name (``_seg-…`` or format 1.0's
    ``seg-…``), or None if it is not one."""
    m = _SEGMENT_RE.match(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def parse_part_name(name: str) -> tuple[int, int, int] | None:
    """(first seq, last seq, last segment number) of a part file name, or None."""
    m = _PART_RE.match(name)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None
