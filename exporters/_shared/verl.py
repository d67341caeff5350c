"""verl's names for what its trainer logs, so that exports land where verl users look.

verl's `ValidationGenerationsLogger` logs validation samples under ``val/generations``:
to W&B one table row per step (``step, input_1, output_1, score_1, input_2, ...``), to
MLflow an artifact ``val_step{step}.json`` (a list of ``{input, output, score}``), to
TensorBoard a markdown text. Generations stored under that key are exported the same way
(docs/verl.md, "verl's names in the exports").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: The generations key of verl's validation samples.
VAL_GENERATIONS = "val/generations"


def wide_columns(samples: int) -> list[str]:
    """verl's W&B column names for `samples` samples per step."""
    return ["step"] + [f"{c}_{i + 1}" for i in range(samples)
                       for c in ("input", "output", "score")]


def wide_row(step: int | None, samples: Sequence[dict[str, Any]]) -> list[Any]:
    """One step's samples (in sample order) as verl's W&B row."""
    row: list[Any] = [step]
    for sample in samples:
        row.extend((sample.get("input"), sample.get("output"), sample.get("score")))
    return row


def markdown(step: int | None, samples: Sequence[dict[str, Any]]) -> str:
    """One step's samples as verl's TensorBoard text (its exact layout)."""
    text = f"**Generation Results - Step {step}**\n\n"
    for i, sample in enumerate(samples):
        text += (f"### Sample {i + 1}\n**Input:** {sample.get('input')}\n\n"
                 f"**Output:** {sample.get('output')}\n\n**Score:** {sample.get('score')}\n\n"
                 "---\n\n")
    return text


def mlflow_file(step: int) -> str:
    """verl's MLflow artifact name of one step's samples."""
    return f"val_step{step}.json"
