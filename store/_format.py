"""On-disk layout and record schemas (specified in docs/format.md)."""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from tracklake._errors import FormatError, NewerFormatError

#: Major.minor of the on-disk format. Readers refuse a newer major version.
FORMAT_VERSION = "1.0"
FORMAT_MAJOR = 1

_TIME = pa.timestamp("us", tz="UTC")

#: One Arrow schema per record kind. Every kind starts with `seq` (the record group
#: number within its stream) and `time`; cursors count `seq`.
SCHEMAS: dict[str, pa.Schema] = {
    "metrics": pa.schema(
        [("seq", pa.int64()), ("time", _TIME), ("step", pa.int64()),
         ("key", pa.string()), ("value", pa.float64())]
    ),
    "texts": pa.schema(
        [("seq", pa.int64()), ("time", _TIME), ("step", pa.int64()),
         ("key", pa.string()), ("text", pa.string())]
    ),
    "configs": pa.schema(
        [("seq", pa.int64()), ("time", _TIME), ("key", pa.string()), ("value", pa.string())]
    ),
    "generations": pa.schema(
        [("seq", pa.int64()), ("time", _TIME), ("step", pa.int64()), ("key", pa.string()),
         ("sample", pa.int32()), ("input", pa.string()), ("output", pa.string()),
         ("score", pa.float64()), ("extra", pa.string())]
    ),
    "traces": pa.schema(
        [("seq", pa.int64()), ("time", _TIME), ("end_time", _TIME), ("step", pa.int64()),
         ("trace_id", pa.string()), ("span_id", pa.string()), ("parent_id", pa.string()),
         ("name", pa.string()), ("status", pa.string()), ("error", pa.string()),
         ("attributes", pa.string()), ("inputs", pa.string()), ("outputs", pa.string()),
         ("token_ids", pa.list_(pa.int64()))]
    ),
    "artifacts": pa.schema(
        [("seq", pa.int64()), ("time", _TIME), ("step", pa.int64()), ("name", pa.string()),
         ("digest", pa.string()), ("size", pa.int64()), ("media_type", pa.string()),
         ("metadata", pa.string())]
    ),
    "events": pa.schema(
        [("seq", pa.int64()), ("time", _TIME), ("step", pa.int64()), ("level", pa.string()),
         ("kind", pa.string()), ("title", pa.string()), ("text", pa.string())]
    ),
}
KINDS: tuple[str, ...] = tuple(SCHEMAS)

#: Columns that the directory layout contributes (Hive partitions), in path order.
PARTITIONS: tuple[str, ...] = ("project", "run", "rank", "attempt")
PARTITION_SCHEMA = pa.schema(
    [("project", pa.string()), ("run", pa.string()), ("rank", pa.int32()),
     ("attempt", pa.int32())]
)

SEGMENT_SUFFIX = ".arrows"
PART_SUFFIX = ".parquet"
_SEGMENT_RE = re.compile(r"^seg-(\d{6})-(\d{12})\.arrows$")
_PART_RE = re.compile(r"^part-(\d{12})-(\d{12})-(\d{6})\.parquet$")


def check_version(version: object, where: object) -> None:
    """Refuse a file written by a newer major format version (or without a version)."""
    if not isinstance(version, str) or not re.fullmatch(r"\d+\.\d+", version):
        raise FormatError(f"{where}: missing or malformed tracklake format version {version!r}")
    major = int(version.split(".")[0])
    if major > FORMAT_MAJOR:
        raise NewerFormatError(
            f"{where}: written in tracklake format {version}, this tracklake reads "
            f"{FORMAT_MAJOR}.x; upgrade tracklake to read it"
        )


@dataclass(frozen=True)
class StreamId:
    """One append-only stream: a record kind of one attempt of one rank of a run."""

    project: str
    run: str
    rank: int
    attempt: int
    kind: str

    def key(self) -> str:
        """Stable text form used in cursors: ``rank/attempt/kind``."""
        return f"{self.rank}/{self.attempt}/{self.kind}"


def stream_dir(root: Path, s: StreamId) -> Path:
    """Directory holding the live segments and compacted parts of one stream."""
    return (root / s.kind / f"project={s.project}" / f"run={s.run}" / f"rank={s.rank}"
            / f"attempt={s.attempt}")


def attempt_file(root: Path, project: str, run: str, rank: int, attempt: int) -> Path:
    """JSON file holding one rank's identity and status for one attempt."""
    return root / "runs" / f"project={project}" / f"run={run}" / f"rank={rank}" / (
        f"attempt={attempt}.json")


def blob_path(root: Path, digest: str) -> Path:
    """Content-addressed location of an artifact's bytes (digest is hex sha256)."""
    return root / "blobs" / "sha256" / digest[:2] / digest


def segment_name(number: int, first_seq: int) -> str:
    return f"seg-{number:06d}-{first_seq:012d}{SEGMENT_SUFFIX}"


def part_name(first_seq: int, last_seq: int, last_segment: int) -> str:
    """A compacted part holding seqs first..last, made of segments numbered <= last_segment."""
    return f"part-{first_seq:012d}-{last_seq:012d}-{last_segment:06d}{PART_SUFFIX}"


def parse_segment_name(name: str) -> tuple[int, int] | None:
    """(segment number, first seq) of a segment file name, or None if it is not one."""
    m = _SEGMENT_RE.match(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def parse_part_name(name: str) -> tuple[int, int, int] | None:
    """(first seq, last seq, last segment number) of a part file name, or None."""
    m = _PART_RE.match(name)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def fsync_dir(path: Path) -> None:
    """Make a rename or file creation in `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that no reader ever sees a partial file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise OSError(exc.errno, f"cannot write {path}: {exc.strerror}", str(path)) from exc
    fsync_dir(path.parent)
