"""Environment variables that turn a behaviour on or off."""

from __future__ import annotations

import os


def switched_on(name: str) -> bool:
    """Whether variable `name` leaves its behaviour on (unset, empty, 1, true, yes, on)
    or turns it off (0, false, no, off); ValueError naming it for anything else."""
    value = os.environ.get(name, "").strip().lower()
    if value in ("", "1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name}={value!r}: give 1 or 0")
