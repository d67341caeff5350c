"""`make test` installs every extra and runs pytest with --require-extras: a missing extra
fails its tests there instead of skipping them."""

from __future__ import annotations

import _optional
import pytest


def test_a_missing_extra_skips_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_optional, "REQUIRED", False)
    with pytest.raises(pytest.skip.Exception):
        _optional.optional("tracklake_no_such_extra")


def test_a_missing_extra_fails_when_extras_are_required(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_optional, "REQUIRED", True)
    with pytest.raises(ModuleNotFoundError, match="tracklake_no_such_extra"):
        _optional.optional("tracklake_no_such_extra")
    assert _optional.optional("json").dumps([]) == "[]"


def test_an_extra_named_not_required_skips_though_extras_are_required(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """--extras-not-required, for a Python where that extra does not install."""
    monkeypatch.setattr(_optional, "REQUIRED", True)
    monkeypatch.setattr(_optional, "NOT_REQUIRED", frozenset({"tracklake_no_such_extra"}))
    with pytest.raises(pytest.skip.Exception):
        _optional.optional("tracklake_no_such_extra.sub")
    with pytest.raises(ModuleNotFoundError, match="tracklake_no_such_other"):
        _optional.optional("tracklake_no_such_other")
