"""Variables that turn a behaviour on or off take 1/0, true/false, yes/no, on/off; any
other value is refused with an error naming the variable, never read as one or the
other (`TRACKLAKE_COMPACT=maybe` silently left runs compacting themselves)."""

from __future__ import annotations

from pathlib import Path

import pytest

import tracklake
from tracklake._ops.bundle import build_bundles


def test_a_wrong_compaction_switch_is_named_before_init_writes_anything(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACKLAKE_COMPACT", "maybe")
    with pytest.raises(ValueError, match="TRACKLAKE_COMPACT='maybe'"):
        tracklake.init(project="p", run_id="r", root=root, capture_identity=False)
    assert not list(root.glob("runs/**/*.json"))  # no attempt claimed, to show crashed
    # the argument wins over the variable, as before
    with tracklake.init(project="p", run_id="r", root=root, capture_identity=False,
                        compact=False) as run:
        run.log({"loss": 1.0}, step=0)
    monkeypatch.setenv("TRACKLAKE_COMPACT", " Off ")
    with tracklake.init(project="p", run_id="s", root=root, capture_identity=False) as run:
        assert run._compactor is None
    assert tracklake.query("SELECT run, status FROM runs ORDER BY run", root=root
                           ).to_pylist() == [{"run": "r", "status": "finished"},
                                             {"run": "s", "status": "finished"}]


def test_a_wrong_bundle_switch_is_named_by_the_builder(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with tracklake.init(project="p", run_id="r", root=root, capture_identity=False) as run:
        run.log({"loss": 1.0}, step=0)
    monkeypatch.setenv("TRACKLAKE_BUNDLES", "nope")
    with pytest.raises(ValueError, match="TRACKLAKE_BUNDLES='nope'"):
        build_bundles(root)
    monkeypatch.setenv("TRACKLAKE_BUNDLES", "no")
    assert build_bundles(root).disabled
