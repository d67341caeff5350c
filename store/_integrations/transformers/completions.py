"""TRL's completions files (``output_dir/completions/completions_NNNNN.parquet``, written
by GRPOTrainer with ``log_completions=True``) as generations at their step.

TRL writes step N's file on the main process right after each ``log()`` at step N has
called the callbacks' ``on_log``: after the training log, again after an evaluation's log
(with the evaluation's samples) and again after the end-of-training summary (the same
samples as before), so a file is read at the next callback event after each ``on_log``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

#: A completions file larger than this is named and left out, never read whole.
MAX_FILE_BYTES = 256 << 20
#: Columns that are not a reward: the rest are one column per reward function plus what
#: ``log_extra`` added.
_NOT_REWARDS = frozenset({"step", "prompt", "completion", "advantage", "image"})


def completion_file(output_dir: str | Path, step: int) -> Path:
    """Where TRL writes the completions of `step` (and rewrites them when it logs again at
    that step)."""
    return Path(output_dir) / "completions" / f"completions_{step:05d}.parquet"


def read_completions(path: Path) -> list[dict[str, Any]] | None:
    """One file's rows as generation samples (input, output, score, extra fields); None
    where there is no file, or (said on stderr) a file that is not a regular file of a sane
    size."""
    import pyarrow.parquet as pq

    if not path.is_symlink() and not path.exists():  # a trainer that writes none (RLOO)
        return None
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
