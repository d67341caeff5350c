"""Optional dependencies in tests: skipped where an extra is not installed, but a failure
under ``pytest --require-extras`` (what `make test` runs, with every extra installed), so
that a missing extra never silently skips whole files in CI.

On a Python where an extra does not install (torch and verl on all but the default one,
see the Makefile's `test-pythons`), ``--extras-not-required torch,verl`` names the
top-level modules that still skip there; any other missing one fails."""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

import pytest

#: set from ``--require-extras`` when pytest starts (conftest.py)
REQUIRED = False
#: top-level modules that skip even under ``--require-extras`` (``--extras-not-required``)
NOT_REQUIRED: frozenset[str] = frozenset()


def optional(module: str) -> Any:
    """`module`; the test is skipped without it unless extras are required. Where they are
    (CI), it is imported when first used: a test file's skip check alone imports nothing,
    so a worker that runs none of its tests never pays for verl, torch or Lightning (they
    took 15 to 25 s of every worker's collection)."""
    top = module.partition(".")[0]
    if REQUIRED and top not in NOT_REQUIRED:
        if importlib.util.find_spec(top) is None:
            raise ModuleNotFoundError(f"No module named {top!r}", name=top)
        return _Deferred(module)
    return pytest.importorskip(module)


class _Deferred:
    """Module `name`, imported at the first use of one of its attributes."""

    # what pytest asks of every name in a test module (a test? a unittest class?) is
    # answered without the import
    __test__ = False
    __bases__ = None

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_name", name)

    def _module(self) -> Any:
        return importlib.import_module(object.__getattribute__(self, "_name"))

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._module(), attribute)

    def __setattr__(self, attribute: str, value: Any) -> None:  # monkeypatch.setattr
        setattr(self._module(), attribute, value)

    def __delattr__(self, attribute: str) -> None:
        delattr(self._module(), attribute)
