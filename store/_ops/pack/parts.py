"""A pack's Parquet parts, read within bounds: their metadata checked against the
manifest before any record is decoded, and their decoded size measured batch by batch."""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import IO

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tracklake._errors import FormatError
from tracklake._format import SCHEMAS, check_version
from tracklake._format.page_headers import pages_total
from tracklake._format.part_bounds import declared_bytes, decoded_bytes, plain
from tracklake._format.records import CHECKED_KINDS, invalid_records
from tracklake._ops.pack.archive import read_member
from tracklake._ops.pack.manifest import StreamEntry

#: The most bytes of records one packed part may decode to. Its records are held in
#: memory while they are merged, so this bounds what a pack can make `unpack` allocate
#: (Parquet's dictionary and run-length encodings let a few kilobytes stand for
#: gigabytes). Raise it with ``unpack(max_part_bytes=...)`` / ``--max-part-bytes``.
MAX_PART_BYTES = 4 << 30
_BATCH_ROWS = 4096


def _check_part_shape(where: str, pf: pq.ParquetFile, entry: StreamEntry) -> None:
    """The part's metadata against the manifest, before any record is decoded."""
    meta = {k.decode(): v.decode() for k, v in (pf.schema_arrow.metadata or {}).items()}
    check_version(meta.get("tracklake.format"), where)
    s = entry.stream
    if (meta.get("tracklake.kind"), meta.get("tracklake.project"), meta.get("tracklake.run"),
            meta.get("tracklake.rank"), meta.get("tracklake.attempt")) != (
            s.kind, s.project, s.run, str(s.rank), str(s.attempt)):
        raise FormatError(f"{where}: its metadata names another stream")
    if not pf.schema_arrow.remove_metadata().equals(SCHEMAS[s.kind]):
        raise FormatError(f"{where}: its columns are not those of {s.kind} records")
    if pf.metadata.num_rows != entry.rows:
        raise FormatError(f"{where}: it holds {pf.metadata.num_rows} rows, the manifest "
                          f"says {entry.rows}")


def _string_columns(f: IO[bytes]) -> list[str]:
    return [field.name for field in pq.ParquetFile(f).schema_arrow
            if pa.types.is_string(field.type)]


def _check_decoded_size(where: str, f: IO[bytes], limit: int) -> None:
    """Refuse a part whose records would decode to more than `limit` bytes: what its
    footer says reading decompresses, judged before any page is read, then what they
    decode to, batch by batch with strings kept dictionary-encoded, so that measuring
    holds one small batch at a time whatever the part expands to."""
    strings = _string_columns(f)
    f.seek(0)
    parquet = pq.ParquetFile(f, read_dictionary=strings)
    # what reading decompresses, judged first: as the footer says, and as the pages'
    # own headers say (which pyarrow allocates by)
    total = max(declared_bytes(parquet.metadata), pages_total(f, where))
    if total <= limit:
        total = 0
        for batch in parquet.iter_batches(_BATCH_ROWS):
            total += decoded_bytes(batch)
            if total > limit:
                break
    if total > limit:
        raise FormatError(
            f"{where}: its records decode to more than {limit} bytes (the limit per "
            "part; a crafted or mislabelled pack?). If the pack is trusted and this "
            "much memory is available, unpack it with a larger --max-part-bytes")


def load_part(path: Path, tar: tarfile.TarFile, entry: StreamEntry,
              limit: int = MAX_PART_BYTES, *, seq_only: bool = False) -> pa.Table:
    """The records of a packed part, checked against the manifest, in bounded memory
    (only their seq column with `seq_only`, the whole part checked all the same).

    Their strings stay dictionary-encoded, as Parquet holds them (so a value repeated
    a million times is held once), except in metrics, whose rows are sorted by key when
    written; `plain()` decodes them."""
    where = f"{path}: member {entry.member!r}"
    try:
        with read_member(tar, tar.getmember(entry.member)) as f:
            _check_part_shape(where, pq.ParquetFile(f), entry)
            f.seek(0)
            _check_decoded_size(where, f, limit)
            f.seek(0)
            keep = [] if entry.stream.kind == "metrics" else _string_columns(f)
            f.seek(0)
            # records whose values are checked are read whole all the same
            whole = not seq_only or entry.stream.kind in CHECKED_KINDS
            table = pq.ParquetFile(f, read_dictionary=keep).read(
                columns=None if whole else ["seq"])
    except (pa.ArrowException, OSError) as exc:
        raise FormatError(f"{where} is not a readable Parquet part ({exc})") from exc
    s = entry.stream
    table = table.replace_schema_metadata(None)
    expected = SCHEMAS[s.kind]
    if not whole:
        expected = pa.schema([expected.field("seq")])
    if not plain(table.slice(0, 0)).schema.equals(expected):
        raise FormatError(f"{where}: its columns are not those of {s.kind} records")
    seqs = table.column("seq")
    if (table.num_rows != entry.rows or seqs.null_count
            or (pc.min(seqs).as_py(), pc.max(seqs).as_py()) != (entry.first_seq,
                                                                entry.last_seq)):
        raise FormatError(f"{where}: its rows or seq range differ from the manifest")
    if s.kind in CHECKED_KINDS and (invalid := invalid_records(s.kind, plain(table))):
        raise FormatError(f"{where}: invalid records ({invalid[1]}); a crafted or damaged "
                          "pack: nothing of it was unpacked")
    return table.select(["seq"]) if seq_only else table
