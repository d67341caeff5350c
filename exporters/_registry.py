"""Destinations by name, from the ``tracklake.exporters`` entry point group."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

GROUP = "tracklake.exporters"


def available() -> list[str]:
    """Names of the installed destinations (built-in ones and plugins)."""
    return sorted({ep.name for ep in entry_points(group=GROUP)})


def load(name: str) -> Any:
    """The destination class registered as `name`; LookupError naming what exists."""
    found = [ep for ep in entry_points(group=GROUP) if ep.name == name]
    if not found:
        raise LookupError(f"no exporter named {name!r}; installed: {', '.join(available())}")
    return found[0].load()
