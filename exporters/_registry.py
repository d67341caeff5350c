"""Destinations by name, from the ``tracklake.exporters`` entry point group."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from tracklake.exporters._protocol import missing_hooks

GROUP = "tracklake.exporters"


def available() -> list[str]:
    """Names of the installed destinations (built-in ones and plugins)."""
    return sorted({ep.name for ep in entry_points(group=GROUP)})


def load(name: str) -> Any:
    """The destination class registered as `name`: LookupError naming what exists, or
    TypeError naming what a plugin's class lacks of the `Destination` contract."""
    found = [ep for ep in entry_points(group=GROUP) if ep.name == name]
    if not found:
        raise LookupError(f"no exporter named {name!r}; installed: {', '.join(available())}")
    cls = found[0].load()
    missing = missing_hooks(cls)
    if missing:
        raise TypeError(
            f"the exporter {name!r} ({found[0].value}) lacks {', '.join(missing)} of the "
            "Destination contract; subclass tracklake.exporters.Destination to inherit the "
            "defaults")
    return cls
