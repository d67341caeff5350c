"""Settings given in seconds through the environment."""

from __future__ import annotations

import os


def seconds_from_env(name: str, default: float) -> float:
    """The number of seconds (>= 0) the environment variable `name` sets, or `default`
    where it is unset or empty; ValueError naming it if it is not such a number."""
    value = os.environ.get(name, "").strip()
    try:
        seconds = float(value) if value else default
    except ValueError:
        raise ValueError(f"{name}={value!r} is not a number of seconds") from None
    if not 0 <= seconds < 1e9:
        raise ValueError(f"{name}={value!r} is not a number of seconds >= 0")
    return seconds
