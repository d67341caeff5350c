"""Programs the tests drive (Chromium, tmux): skipped where not installed, but a failure
under ``pytest --require-extras``, where `make test` has installed them."""

from __future__ import annotations

import shutil

import _optional
import pytest


def program(name: str) -> str:
    """The path of the program `name`; the test is skipped without it unless extras are
    required."""
    path = shutil.which(name)
    if path is not None:
        return path
    if _optional.REQUIRED:
        pytest.fail(f"{name} is not installed (`make test` installs it with apt-get)")
    pytest.skip(f"{name} is not installed")
