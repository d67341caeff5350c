"""Merging a pack into a store: verify it whole, plan every stream, attempt file and
blob against what the store holds (conflicts raise before anything is written), then
write blobs, parts and attempt files in that order."""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import os
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracklake._errors import FormatError, PackConflictError
from tracklake._format import (
    SCHEMAS,
    StreamId,
    attempt_file,
    blob_path,
    fsync_dir,
    stream_dir,
    write_atomic,
)
from tracklake._format.attempt import MAX_ATTEMPT_BYTES, check_attempt, parse_attempt
from tracklake._format.files import (
    create_new,
    no_link_on_the_way,
    read_regular,
    scratch,
    store_dir,
)
from tracklake._format.naming import resolve_root
from tracklake._format.part_bounds import plain
from tracklake._ops.compact import write_part
from tracklake._ops.pack.archive import open_pack, read_member, verify_open
from tracklake._ops.pack.manifest import (
    CHUNK,
    PACKED_SEGMENT,
    AttemptEntry,
    BlobEntry,
    StreamEntry,
    stream_key,
)
from tracklake._ops.pack.parts import MAX_PART_BYTES, load_part
from tracklake._read.location import regular_blob
from tracklake._read.reader import list_stream, read_stream


@dataclass
class UnpackReport:
    """What `unpack()` added to the store; `new` is 0 when it held everything already."""

    parts_written: list[Path] = field(default_factory=list)
    records: int = 0
    streams_skipped: int = 0
    attempts_written: int = 0
    attempts_skipped: int = 0
    blobs_written: int = 0
    blobs_skipped: int = 0

    @property
    def new(self) -> int:
        return len(self.parts_written) + self.attempts_written + self.blobs_written

    def __str__(self) -> str:
        return (f"unpacked {self.records} new records in {len(self.parts_written)} part(s) "
                f"({self.streams_skipped} stream(s) already present), "
                f"{self.attempts_written} attempt file(s) ({self.attempts_skipped} kept), "
                f"{self.blobs_written} blob(s) ({self.blobs_skipped} already present)")


@dataclass
class _StreamPlan:
    entry: StreamEntry
    ranges: list[tuple[int, int]]  # seq ranges of the new records, one part each
    last_segment: int


def _canonical(table: pa.Table) -> pa.Table:
    keys = [(n, "ascending") for n, t in zip(table.column_names, table.schema.types,
                                             strict=True)
            if not pa.types.is_list(t)]
    return table.take(pc.sort_indices(table, sort_keys=keys))


def _same_rows(a: pa.Table, b: pa.Table) -> bool:
    """Equal record sets (row order inside a seq group aside; NaN equals NaN)."""
    if a.num_rows != b.num_rows:
        return False
    a, b = _canonical(a), _canonical(b)
    for name in a.column_names:
        x, y = a.column(name).combine_chunks(), b.column(name).combine_chunks()
        if x.equals(y):
            continue
        if not pa.types.is_floating(x.type):
            return False
        same = pc.fill_null(pc.or_kleene(pc.equal(x, y),
                                          pc.and_kleene(pc.is_nan(x), pc.is_nan(y))), False)
        same = pc.or_(same, pc.and_(pc.is_null(x), pc.is_null(y)))
        if not pc.all(same).as_py():
            return False
    return True


def _existing(root: Path, s: StreamId, first: int, last: int) -> pa.Table:
    """The target's records of stream `s` with seq in first..last."""
    batches = []
    for batch in read_stream(root, s, first - 1):
        if batch.column(0)[0].as_py() > last:
            break
        batches.append(batch.filter(pc.less_equal(batch.column(0), last)))
    return pa.Table.from_batches(batches, schema=SCHEMAS[s.kind])


def _plan_stream(root: Path, path: Path, tar: tarfile.TarFile,
                 entry: StreamEntry, limit: int) -> _StreamPlan:
    s = entry.stream
    have = _existing(root, s, entry.first_seq, entry.last_seq)
    # with nothing to compare the records with, their seqs are all the plan needs
    incoming = load_part(path, tar, entry, limit, seq_only=have.num_rows == 0)
    have_seqs = pc.unique(have.column("seq"))
    common_in = pc.is_in(incoming.column("seq"), value_set=have_seqs)
    common_have = pc.is_in(have.column("seq"), value_set=pc.unique(incoming.column("seq")))
    # records in both are compared (the rows are copied only when there are such)
    if (have.num_rows or pc.any(common_in).as_py()) and not _same_rows(
            plain(incoming.filter(common_in)), have.filter(common_have)):
        raise PackConflictError(
            f"{path}: stream {stream_key(s)} holds records with seq in "
            f"{entry.first_seq}..{entry.last_seq} that differ from those in {root}; "
            "refusing to overwrite them (were the same run id and attempt used on both "
            "machines?)")
    seqs = incoming.column("seq").to_numpy()
    new = np.unique(seqs[~common_in.to_numpy(zero_copy_only=False)])
    del incoming
    files = list_stream(root, s)
    covered_segment = max((p.last_segment for p in files.parts), default=PACKED_SEGMENT)
    if len(new) == 0:
        return _StreamPlan(entry, [], covered_segment)
    if files.segments:
        raise PackConflictError(
            f"{path}: stream {stream_key(s)} is also being written in {root} (it has live "
            "segments); refusing to merge records into a stream another writer owns")
    firsts = np.array([p.first_seq for p in files.parts], dtype=np.int64)
    lasts = np.array([p.last_seq for p in files.parts], dtype=np.int64)
    slot = np.searchsorted(firsts, new, side="right")
    inside = (slot > 0) & (new <= lasts[np.maximum(slot - 1, 0)]) if len(firsts) else \
        np.zeros(len(new), dtype=bool)
    if inside.any():
        raise PackConflictError(
            f"{path}: stream {stream_key(s)} has seq {int(new[inside][0])}, which falls "
            f"inside a part of {root} that does not hold it; refusing to merge")
    ranges = [(int(new[slot == g].min()), int(new[slot == g].max())) for g in np.unique(slot)]
    return _StreamPlan(entry, ranges, covered_segment)


def _plan_attempt(root: Path, path: Path, tar: tarfile.TarFile,
                  entry: AttemptEntry) -> bytes | None:
    """The attempt file's bytes if they should be written, None to keep the target's."""
    where = f"{path}: member {entry.member!r}"
    data = read_member(tar, tar.getmember(entry.member)).read()
    incoming = parse_attempt(data, where)
    if incoming is None:
        raise FormatError(f"{where}: an empty attempt record")
    if (incoming["project"], incoming["run"], incoming["rank"],
            incoming["attempt"]) != (entry.project, entry.run, entry.rank, entry.attempt):
        raise FormatError(f"{where}: its record names another attempt")
    target = attempt_file(root, entry.project, entry.run, entry.rank, entry.attempt)
    try:
        mine = check_attempt(target)
    except FileNotFoundError:
        return data
    except FormatError as exc:
        raise FormatError(f"{exc}; the pack holds this attempt's record too: repair or "
                          "move away the file in the target, then unpack again") from exc
    if mine is None:
        raise PackConflictError(
            f"{path}: run {entry.project}/{entry.run} rank {entry.rank} attempt "
            f"{entry.attempt} was claimed in {root} by a writer that has not written its "
            "record yet (the same run id is in use on both machines?); refusing to take "
            "it over")
    if read_regular(target, MAX_ATTEMPT_BYTES) == data:
        return None
    if mine["started_at"] != incoming["started_at"]:
        raise PackConflictError(
            f"{path}: run {entry.project}/{entry.run} rank {entry.rank} attempt "
            f"{entry.attempt} exists in {root} as a different attempt (started "
            f"{mine['started_at']}, the pack's {incoming['started_at']}); the same "
            "run id was used on both machines")
    return data if _moment(incoming.get("heartbeat_at")) > _moment(mine.get("heartbeat_at")) \
        else None


def _moment(value: str | None) -> _dt.datetime:
    """A validated timestamp, comparable whatever its time zone (None is earliest)."""
    if value is None:
        return _dt.datetime.min.replace(tzinfo=_dt.timezone.utc)
    return _dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


def _inside(root: Path, target: Path) -> Path:
    """`target`, after checking it lies below `root` (names were validated already)."""
    if not target.absolute().is_relative_to(root) or ".." in target.parts:
        raise FormatError(f"refusing to write {target}: outside the store {root}")
    return target


def _no_link_on_the_way(root: Path, pack_path: Path, targets: list[Path]) -> None:
    """FormatError, before anything is written, if a directory the pack would be written
    into is reached through a symbolic link planted in the store: what is written there
    would land outside it, where no reader looks."""
    for target in targets:
        rel = _inside(root, target).relative_to(root).as_posix()
        if not no_link_on_the_way(root, rel):
            raise FormatError(
                f"refusing to unpack {pack_path} into {root}: {target} is reached through a "
                "symbolic link in the store, and tracklake never writes through one; nothing "
                "was written (`tracklake fsck` lists such links)")


def _copy_blob(root: Path, path: Path, tar: tarfile.TarFile, entry: BlobEntry) -> None:
    final = _inside(root, blob_path(root, entry.sha256))
    tmp = scratch(store_dir(root, root / "blobs" / "tmp") / f"unpack-{entry.sha256}")
    h = hashlib.sha256()
    try:
        with read_member(tar, tar.getmember(entry.member)) as src, create_new(tmp) as out:
            while chunk := src.read(CHUNK):
                h.update(chunk)
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        if h.hexdigest() != entry.sha256:
            raise FormatError(f"{path}: blob {entry.sha256} changed while unpacking")
        store_dir(root, final.parent)
        os.replace(tmp, final)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    fsync_dir(final.parent)


def _merge(root: Path, pack_path: Path, tar: tarfile.TarFile, plan: _StreamPlan,
           max_part_bytes: int, written: list[Path]) -> int:
    """Write the new seq ranges of one packed stream as parts; returns the records."""
    table = load_part(pack_path, tar, plan.entry, max_part_bytes)
    seqs = table.column("seq")
    directory = store_dir(root, _inside(root, stream_dir(root, plan.entry.stream)))
    records = 0
    for lo, hi in plan.ranges:
        whole = (lo, hi) == (plan.entry.first_seq, plan.entry.last_seq)
        chunk = table if whole else table.filter(  # the whole part is not copied
            pc.and_(pc.greater_equal(seqs, lo), pc.less_equal(seqs, hi)))
        written.append(write_part(directory, plan.entry.stream, chunk, plan.last_segment))
        records += chunk.num_rows
    return records


def unpack(path: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None,
           max_part_bytes: int = MAX_PART_BYTES,
           progress: Callable[[int, int | None, str], None] | None = None) -> UnpackReport:
    """Verify the pack at `path`, then merge it into the store at `root`;
    `progress(done, total, note)` is called after each blob and stream merged (entries).

    Nothing is written unless the whole pack checks out and merges without conflict:
    records already present (same seqs, same content) are skipped, records that differ
    raise PackConflictError naming the stream. Unpacking the same pack twice adds nothing.
    """
    pack_path = Path(path)
    root_path = resolve_root(root)
    report = UnpackReport()
    with open_pack(pack_path) as tar:
        manifest = verify_open(pack_path, tar)
        plans = [_plan_stream(root_path, pack_path, tar, e, max_part_bytes)
                 for e in manifest.streams]
        attempts = [(e, _plan_attempt(root_path, pack_path, tar, e))
                    for e in manifest.attempts]
        blobs = [e for e in manifest.blobs if regular_blob(root_path, e.sha256) is None]
        _no_link_on_the_way(root_path, pack_path, [
            *(stream_dir(root_path, p.entry.stream) for p in plans if p.ranges),
            *(attempt_file(root_path, a.project, a.run, a.rank, a.attempt)
              for a, data in attempts if data is not None),
            *(blob_path(root_path, b.sha256) for b in blobs)])
        report.blobs_skipped = len(manifest.blobs) - len(blobs)
        # write: blobs first, so no artifact record points at a missing blob; the attempt
        # files last, so a run shows up once its records are in place
        root_path.mkdir(parents=True, exist_ok=True)
        todo, done = len(blobs) + len(plans), 0
        for b in blobs:
            _copy_blob(root_path, pack_path, tar, b)
            report.blobs_written += 1
            done += 1
            if progress is not None:
                progress(done, todo, f"blob {b.sha256[:12]}")
        for plan in plans:
            if plan.ranges:
                report.records += _merge(root_path, pack_path, tar, plan, max_part_bytes,
                                         report.parts_written)
            else:
                report.streams_skipped += 1
            done += 1
            if progress is not None:
                s = plan.entry.stream
                progress(done, todo, f"{s.project}/{s.run} {s.key()}")
        for a, data in attempts:
            if data is None:
                report.attempts_skipped += 1
                continue
            write_atomic(_inside(root_path, attempt_file(root_path, a.project, a.run, a.rank,
                                                         a.attempt)), data, root=root_path)
            report.attempts_written += 1
    return report
