"""What TensorBoard's own reader sees of an export."""

from __future__ import annotations

from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def scalar_steps(logdir: Path, tag: str = "loss") -> list[int]:
    """The steps of every `tag` scalar in the event files under `logdir`, sorted, one per
    event (a step written twice is there twice)."""
    steps: list[int] = []
    for events in sorted(logdir.rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events.parent), size_guidance={"scalars": 0})
        acc.Reload()
        if tag in acc.Tags()["scalars"]:
            steps += [e.step for e in acc.Scalars(tag)]
    return sorted(steps)
