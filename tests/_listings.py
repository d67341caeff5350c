"""Which directories of a store a reader lists: the store-relative paths handed to the
reader's listing functions, recorded while a test runs."""

from __future__ import annotations

from pathlib import Path

import pytest


def record_listings(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A list that fills with every directory (relative to the store) a reader lists."""
    from tracklake._read import listing

    listed: list[str] = []
    for name in ("listdir_at", "subdirs_at"):
        real = getattr(listing, name)

        def watched(base: Path, rel: str, real: object = real) -> list[str]:
            listed.append(rel)
            return real(base, rel)  # type: ignore[operator, no-any-return]
        monkeypatch.setattr(listing, name, watched)
    return listed
