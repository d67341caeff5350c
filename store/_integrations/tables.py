"""A table of rows (W&B's and accelerate's ``log_table``) as generation samples."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: Column names taken as a sample's input, output and score, first match wins.
INPUT_COLUMNS = ("prompt", "input", "question", "query")
OUTPUT_COLUMNS = ("completion", "output", "response", "answer", "generation")
SCORE_COLUMNS = ("score", "reward")


def generation_samples(columns: Sequence[str], rows: Sequence[Sequence[Any]]
                       ) -> list[dict[str, Any]]:
    """Each row as a sample: the input, output and score columns by name (any case), every
    other column kept under its own name in the sample's extra fields."""
    names = [str(c) for c in columns]
    roles: dict[str, str] = {}
    for role, choices in (("input", INPUT_COLUMNS), ("output", OUTPUT_COLUMNS),
                          ("score", SCORE_COLUMNS)):
        for name in names:
            if name.lower() in choices and name not in roles.values():
                roles[role] = name
                break
    by_name = {name: role for role, name in roles.items()}
    samples = []
    for index, row in enumerate(rows):
        if len(row) != len(names):
            raise ValueError(f"table row {index} has {len(row)} values for {len(names)} "
                             f"columns {names}")
        samples.append({by_name.get(name, name): value
                        for name, value in zip(names, row, strict=True)})
    return samples


def has_generations(columns: Sequence[str]) -> bool:
    """Whether a table's columns name an input and an output (a table of generations)."""
    lowered = {str(c).lower() for c in columns}
    return bool(lowered & set(INPUT_COLUMNS)) and bool(lowered & set(OUTPUT_COLUMNS))
