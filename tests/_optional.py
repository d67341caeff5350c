"""Optional dependencies in tests: skipped where an extra is not installed, but a failure
under ``pytest --require-extras`` (what `make test` runs, with every extra installed), so
that a missing extra never silently skips whole files in CI.

On a Python where an extra does not install (torch and verl on all but the default one,
see the Makefile's `test-pythons`), ``--extras-not-required torch,verl`` names the
top-level modules that still skip there; any other missing one fails."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

#: set from ``--require-extras`` when pytest starts (conftest.py)
REQUIRED = False
#: top-level modules that skip even under ``--require-extras`` (``--extras-not-required``)
NOT_REQUIRED: frozenset[str] = frozenset()


def optional(module: str) -> Any:
    """`module`, imported; the test is skipped without it unless extras are required."""
    if REQUIRED and module.partition(".")[0] not in NOT_REQUIRED:
        return importlib.import_module(module)
    return pytest.importorskip(module)
