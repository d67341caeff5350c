"""Which records name each blob: the digests of the artifact and media records."""

from __future__ import annotations

from pathlib import Path

from tracklake._format.schema import BLOB_KINDS
from tracklake._read.reader import ReadProblems, list_streams, read_stream


def blob_refs(root: Path, problems: ReadProblems | None = None
              ) -> dict[str, set[tuple[str, str]]]:
    """digest -> the runs (``project/run``) and kinds (artifacts, media) whose records
    name it. Without `problems`, a damaged file raises `FormatError`."""
    refs: dict[str, set[tuple[str, str]]] = {}
    for s in list_streams(root, kinds=BLOB_KINDS):
        for batch in read_stream(root, s, problems=problems):
            for digest in batch.column("digest").to_pylist():
                if digest:
                    refs.setdefault(digest, set()).add((f"{s.project}/{s.run}", s.kind))
    return refs
