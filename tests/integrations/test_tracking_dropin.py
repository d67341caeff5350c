"""`tracklake.Tracking`, the drop-in for verl's `Tracking` that needs no verl: every verl call
site works unchanged, and every backend name is either served or refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tracklake


def _rows(root: Path, sql: str) -> list[dict[str, Any]]:
    return tracklake.query(sql, root=root).to_pylist()


def _tracking(root: Path, backends: Any, **kw: Any) -> tracklake.Tracking:
    return tracklake.Tracking("proj", "exp", backends, root=root, capture_identity=False, **kw)


@pytest.mark.parametrize(("exit_code", "status"), [(0, "finished"), (1, "failed"),
                                                    (-9, "failed")])
def test_finish_takes_verls_exit_code(root: Path, exit_code: int, status: str) -> None:
    tracking = _tracking(root, ["tracklake"])
    tracking.log({"loss": 1.0}, step=0)
    report = tracking.finish(exit_code=exit_code)
    assert report is not None and report.status == status
    assert _rows(root, "select status from runs") == [{"status": status}]


def test_finish_positional_exit_code_and_status_still_work(root: Path) -> None:
    tracking = _tracking(root, ["tracklake"])
    tracking.finish(1)  # verl's finish(self, exit_code=0) called positionally
    assert _rows(root, "select status from runs") == [{"status": "failed"}]
    with pytest.raises(ValueError, match="status must be"):
        _tracking(root, ["tracklake"]).finish("done")


def test_non_metric_values_are_skipped_and_counted_once_per_key(
        root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tracking = _tracking(root, ["console", "tracklake"])
    for step in (1, 2, 3):
        tracking.log({"loss": 0.5, "none": None, "seq": [1, 2], "nested": {"ok": 1, "no": ()},
                      "arr": np.arange(3), "note": "text"}, step=step)
    tracking.finish(exit_code=0)
    assert tracking.skipped == {"none": 3, "seq": 3, "nested/no": 3, "arr": 3}
    captured = capsys.readouterr()
    assert captured.out.splitlines()[0] == "step:1 - loss:0.500 - note:text"
    assert captured.err.count("not a metric; skipped") == 4
    assert "skipped values that are not metrics: arr ×3, nested/no ×3, none ×3, seq ×3" in (
        captured.err)
    assert _rows(root, "select step, key from metrics order by step, key") == [
        {"step": s, "key": k} for s in (1, 2, 3) for k in ("loss", "nested/ok")]
    assert len(_rows(root, "select * from texts")) == 3


def test_a_key_that_is_not_a_string_is_still_refused(root: Path) -> None:
    tracking = _tracking(root, ["tracklake"])
    with pytest.raises(TypeError, match="keys must be str"):
        tracking.log({1: None}, step=0)  # type: ignore[dict-item]
    tracking.finish()


def test_file_backend_writes_verls_jsonl_at_verls_path(root: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERL_FILE_LOGGER_ROOT", str(tmp_path / "files"))
    tracking = _tracking(root, ["file"])
    tracking.log({"loss": np.float32(0.5), "n": 3}, step=1)
    tracking.finish(exit_code=0)
    lines = (tmp_path / "files" / "proj" / "exp.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [{"step": 1, "data": {"loss": 0.5, "n": 3}}]
    assert tracking.run is None and not any(p.is_file() for p in root.rglob("*"))
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "one.jsonl"))
    other = _tracking(root, ["file", "tracklake"])
    other.log({"x": 1.0}, step=2)
    other.finish()
    assert json.loads((tmp_path / "one.jsonl").read_text()) == {"step": 2, "data": {"x": 1.0}}
    assert _rows(root, "select key from metrics") == [{"key": "x"}]


def test_rl_insight_is_a_no_op_when_off_and_refused_when_on(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tracking = _tracking(root, ["rl_insight", "tracklake"])
    tracking.log({"x": 1.0}, step=0)
    tracking.finish()
    monkeypatch.setenv("VERL_RL_INSIGHT_ENABLE", "1")
    with pytest.raises(ValueError, match="'rl_insight' with VERL_RL_INSIGHT_ENABLE=1"):
        _tracking(root, ["rl_insight"])


def test_tracking_alias_means_wandb_with_verls_warning(root: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    with pytest.warns(DeprecationWarning, match="`tracking` logger is deprecated"):
        tracking = _tracking(root, ["tracking"], sidecars=False)
    assert tracking.backends == ["wandb"]
    tracking.log({"x": 1.0}, step=0)
    tracking.finish()
    assert "wandb not run in this process" in capsys.readouterr().err
    assert _rows(root, "select key from metrics") == [{"key": "x"}]


@pytest.mark.parametrize("backend", ["clearml", "trackio", "vemlp_wandb"])
def test_backends_without_an_exporter_are_refused_not_ignored(root: Path, backend: str
                                                              ) -> None:
    with pytest.raises(ValueError, match=rf"\['{backend}'\] have no tracklake exporter"):
        _tracking(root, ["console", "tracklake", backend])
    assert not any(p.is_file() for p in root.rglob("*"))
