"""Optional dependencies in tests: skipped where an extra is not installed, but a failure
under ``pytest --require-extras`` (what `make test` runs, with every extra installed), so
that a missing extra never silently skips whole files in CI."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

#: set from ``--require-extras`` when pytest starts (conftest.py)
REQUIRED = False


def optional(module: str) -> Any:
    """`module`, imported; the test is skipped without it unless extras are required."""
    if REQUIRED:
        return importlib.import_module(module)
    return pytest.importorskip(module)
