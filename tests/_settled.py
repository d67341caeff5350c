"""Making a store's files look settled to the run catalog (changed long enough ago)."""

from __future__ import annotations

import os
import time
from pathlib import Path


def age(root: Path, seconds: float = 60.0) -> None:
    """Make every file and directory look changed `seconds` ago (before the racy window
    in which the catalog takes nothing)."""
    past = time.time() - seconds
    for dirpath, dirs, names in os.walk(root):
        for name in [*dirs, *names]:
            os.utime(os.path.join(dirpath, name), (past, past))
