"""TRL's completions files (``output_dir/completions/completions_NNNNN.parquet``, written
by GRPOTrainer with ``log_completions=True``) as generations at their step."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

#: A completions file larger than this is named and left out, never read whole.
MAX_FILE_BYTES = 256 << 20
_NAME = re.compile(r"^completions_(\d+)\.parquet$")
#: Columns that are not a reward: the rest are one column per reward function plus what
#: ``log_extra`` added.
_NOT_REWARDS = frozenset({"step", "prompt", "completion", "advantage", "image"})


def completion_files(output_dir: str | Path, after_step: int) -> list[tuple[int, Path]]:
    """The completions files of steps above `after_step`, by step."""
    directory = Path(output_dir) / "completions"
    found: list[tuple[int, Path]] = []
    try:
        names = [p.name for p in directory.iterdir()]
    except (FileNotFoundError, NotADirectoryError):
        return []
    for name in names:
        match = _NAME.match(name)
        if match and int(match.group(1)) > after_step:
            found.append((int(match.group(1)), directory / name))
    return sorted(found)


def read_completions(path: Path) -> list[dict[str, Any]] | None:
    """One file's rows as generation samples (input, output, score, extra fields), or None
    (said on stderr) for a file that is not a regular file of a sane size."""
    import pyarrow.parquet as pq

    if not path.is_file() or path.is_symlink() or path.stat().st_size > MAX_FILE_BYTES:
        print(f"tracklake: {path} is not a completions file under {MAX_FILE_BYTES >> 20} MiB; "
              "left out", file=sys.stderr, flush=True)
        return None
    table = pq.read_table(path)
    rewards = [c for c in table.column_names if c not in _NOT_REWARDS]
    samples: list[dict[str, Any]] = []
    for row in table.to_pylist():
        sample: dict[str, Any] = {
            "input": _text(row.get("prompt")), "output": _text(row.get("completion")),
            "score": row.get(rewards[0]) if len(rewards) == 1 else None}
        sample.update({c: row[c] for c in rewards})
        if "advantage" in row:
            sample["advantage"] = row["advantage"]
        samples.append(sample)
    return samples


def _text(value: Any) -> str | None:
    """A prompt or completion: text as is, a chat (a list of messages) as JSON."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)
