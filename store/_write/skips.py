"""Skip and count: values an integration takes but the store does not hold, counted per
key and named once on stderr, instead of failing the training loop."""

from __future__ import annotations

import sys


class Skips:
    """Counts of skipped values per key; the first of each key is said on stderr as
    ``{prefix}: {key!r} is a {type}, {reason}, here and at later steps``."""

    def __init__(self, prefix: str, reason: str, summary: str) -> None:
        self.prefix = prefix
        self.reason = reason
        self.title = summary
        self.counts: dict[str, int] = {}

    def add(self, key: str, value: object) -> None:
        count = self.counts.get(key, 0)
        self.counts[key] = count + 1
        if not count:
            print(f"{self.prefix}: {key!r} is a {type(value).__module__}."
                  f"{type(value).__qualname__}, {self.reason}, here and at later steps",
                  file=sys.stderr, flush=True)

    def report(self) -> str | None:
        """The skipped keys and their counts in one line, or None if nothing was skipped."""
        if not self.counts:
            return None
        return f"{self.prefix}: {self.title}: " + ", ".join(
            f"{k} ×{n}" for k, n in sorted(self.counts.items()))
