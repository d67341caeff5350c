"""Tables of rows (W&B's `Table`, accelerate's ``log_table``) as generations: which
columns are a sample's input, output and score."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tracklake._write.coerce import to_float

#: Column names (any case) taken as a sample's input, output and score; the first present.
INPUT_COLUMNS = ("prompt", "prompts", "input", "inputs", "question", "query", "instruction")
OUTPUT_COLUMNS = ("completion", "completions", "response", "responses", "output", "outputs",
                  "generation", "generations", "answer")
SCORE_COLUMNS = ("reward", "rewards", "score", "scores")


def column_roles(columns: Sequence[str]) -> dict[str, str | None]:
    """The input, output and score columns, by name; none unless there are both an input
    and an output column (then the table is not one of generations)."""
    lowered = {c.lower(): c for c in reversed(columns)}  # the first of equal names wins

    def first(names: tuple[str, ...]) -> str | None:
        return next((lowered[n] for n in names if n in lowered), None)

    source, target = first(INPUT_COLUMNS), first(OUTPUT_COLUMNS)
    if source is None or target is None:
        return {"input": None, "output": None, "score": None}
    return {"input": source, "output": target, "score": first(SCORE_COLUMNS)}


def score_of(column: str, value: Any) -> float | None:
    """A score column's value as a number, or None when it is not one (kept as is)."""
    try:
        number = to_float(column, value)
    except TypeError:
        return None
    return number if isinstance(number, float) else None


def generation_samples(columns: Sequence[str], rows: Sequence[Sequence[Any]]
                       ) -> list[dict[str, Any]]:
    """Each row as a sample: its input, output and score columns by `column_roles`, every
    other column (and a score that is not a number) kept under its own name."""
    names = [str(c) for c in columns]
    role_of = {c: role for role, c in column_roles(names).items() if c is not None}
    samples = []
    for index, row in enumerate(rows):
        if len(row) != len(names):
            raise ValueError(f"table row {index} has {len(row)} values for {len(names)} "
                             f"columns {names}")
        sample: dict[str, Any] = {}
        for name, value in zip(names, row, strict=True):
            role = role_of.get(name)
            if role == "score":
                score = score_of(name, value)
                if score is not None:
                    sample["score"] = score
                    continue
                role = None
            sample[role or name] = value
        samples.append(sample)
    return samples
