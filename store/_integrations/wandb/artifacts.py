"""``wandb.Artifact``, ``log_artifact`` and ``save`` as store artifacts (content-addressed
blobs): an `Artifact`'s files are stored as one directory named after it, which the W&B
exporter sends as one W&B artifact."""

from __future__ import annotations

import contextlib
import glob as _glob
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from tracklake._integrations.wandb.data_types import Table
from tracklake._write.coerce import jsonable
from tracklake._write.run import Run

REFERENCES_FILE = "wandb_references.json"


class Artifact:
    """``wandb.Artifact(name, type, description, metadata, ...)``: files, directories,
    new files and references, stored when logged."""

    def __init__(self, name: str, type: str, description: str | None = None,
                 metadata: dict[str, Any] | None = None, incremental: bool = False,
                 use_as: str | None = None, **options: Any) -> None:
        self.name = name
        self.type = type
        self.description = description
        self.metadata = dict(metadata or {})
        self.incremental = incremental
        self._files: dict[str, Path | bytes] = {}
        self._references: list[dict[str, Any]] = []

    def add_file(self, local_path: str | os.PathLike[str], name: str | None = None,
                 is_tmp: bool | None = False, **options: Any) -> None:
        path = Path(local_path)
        if not path.is_file():
            raise ValueError(f"Artifact {self.name!r}: add_file({str(path)!r}): not a file")
        self._files[name or path.name] = path.read_bytes() if is_tmp else path

    def add_dir(self, local_path: str | os.PathLike[str], name: str | None = None,
                **options: Any) -> None:
        root = Path(local_path)
        if not root.is_dir():
            raise ValueError(f"Artifact {self.name!r}: add_dir({str(root)!r}): not a directory")
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            relative = path.relative_to(root).as_posix()
            self._files[f"{name}/{relative}" if name else relative] = path

    @contextlib.contextmanager
    def new_file(self, name: str, mode: str = "x", encoding: str | None = None
                 ) -> Iterator[IO[Any]]:
        """A file to write; its contents join the artifact when it is closed."""
        with tempfile.TemporaryDirectory(prefix="tracklake-wandb-") as tmp:
            path = Path(tmp) / "file"
            with open(path, mode.replace("x", "w"), encoding=encoding) as f:
                yield f
            self._files[name] = path.read_bytes()

    def add_reference(self, uri: Any, name: str | None = None, **options: Any) -> None:
        """A reference is recorded (its URI), never fetched: nothing here uses the network."""
        self._references.append({"uri": str(uri), "name": name})

    def add(self, obj: Any, name: str) -> None:
        if not isinstance(obj, Table):
            raise TypeError(f"Artifact.add() takes a Table here, not {type(obj).__name__}")
        self._files[f"{name}.table.json"] = json.dumps(
            {"columns": obj.columns, "data": jsonable(obj.data)}).encode()

    def wait(self, timeout: int | None = None) -> Artifact:
        return self

    def save(self, *args: Any, **kwargs: Any) -> None:
        """W&B uploads here; the artifact is stored by `log_artifact`."""

    def store(self, run: Run, *, aliases: Sequence[str] | None, tags: Sequence[str] | None,
              step: int | None) -> None:
        """Store the files as the directory `name`, with the W&B attributes as metadata."""
        metadata = {"wandb_type": self.type, "description": self.description,
                    "aliases": list(aliases or ()), "tags": list(tags or ()),
                    "metadata": jsonable(self.metadata)}
        with tempfile.TemporaryDirectory(prefix="tracklake-wandb-") as tmp:
            staged = Path(tmp) / "artifact"
            staged.mkdir()
            for name, source in self._files.items():
                target = staged / name.lstrip("/")
                target.parent.mkdir(parents=True, exist_ok=True)
                if isinstance(source, bytes):
                    target.write_bytes(source)
                else:
                    _link_or_copy(source, target)
            if self._references or not self._files:
                (staged / REFERENCES_FILE).write_text(json.dumps(self._references))
            run.log_artifact(staged, name=self.name, metadata=metadata, step=step)


def store_path(run: Run, path: str | os.PathLike[str], *, name: str | None,
               type: str | None, aliases: Sequence[str] | None, step: int | None) -> None:
    """``log_artifact(path)``: the file or directory under `name` (default: its name)."""
    run.log_artifact(path, name=name or Path(path).name, step=step,
                     metadata={"wandb_type": type or "unspecified",
                               "aliases": list(aliases or ())})


def matched_files(glob_str: str | os.PathLike[str], base_path: str | os.PathLike[str] | None,
                  use_glob: bool) -> list[tuple[str, Path]]:
    """``save()``'s files: (name relative to `base_path` or the glob's folder, path)."""
    pattern = os.fspath(glob_str)
    paths = [Path(p) for p in (sorted(_glob.glob(pattern, recursive=True)) if use_glob
                               else [pattern])]
    base = Path(base_path) if base_path is not None else Path(os.path.dirname(pattern) or ".")
    out = []
    for path in paths:
        if path.is_file():
            try:
                name = path.resolve().relative_to(base.resolve()).as_posix()
            except ValueError:
                name = path.name
            out.append((name, path))
    return out


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
