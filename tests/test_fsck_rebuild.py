"""fsck --repair rebuilds what can be derived: a part whose footer (statistics, metric
summary) is damaged while every data page verifies is rewritten from its records and
reads exactly as before; a part whose records are lost is reported in records, keys and
steps."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

import tracklake
from tracklake._ops.fsck import fsck

STEPS = 2000


@pytest.fixture
def store(tmp_path: Path) -> Path:
    root = tmp_path / "s"
    with tracklake.init(project="p", run_id="r", root=root, capture_identity=False) as run:
        for step in range(STEPS):  # enough values that the part carries its summary
            run.log({"loss": 1 / (step + 1), "acc": step / STEPS}, step=step)
    tracklake.compact(root=root, run="r")
    return root


def _part(root: Path) -> Path:
    return next((root / "metrics").rglob("*.parquet"))


def _metrics(root: Path) -> list[dict[str, object]]:
    return tracklake.query("SELECT * FROM metrics_all ORDER BY ALL", root=root).to_pylist()


def _summaries(root: Path) -> list[dict[str, object]]:
    return tracklake.query("SELECT * FROM metric_summaries ORDER BY ALL", root=root).to_pylist()


def test_a_part_with_a_damaged_summary_is_rebuilt_from_its_records(store: Path) -> None:
    before, summaries = _metrics(store), _summaries(store)
    part = _part(store)
    data = bytearray(part.read_bytes())
    match = re.search(rb'"count":\s*(\d+)', bytes(data))
    assert match is not None
    data[match.start(1)] = ord("9") if data[match.start(1)] != ord("9") else ord("8")
    part.write_bytes(bytes(data))  # the summary lies now; the footer checksum says so

    report = fsck(store)
    [problem] = report.problems
    assert problem.path == part and "footer checksum" in problem.what
    assert problem.lost.startswith("nothing yet") and "rebuild" in problem.todo

    repaired = fsck(store, repair=True)
    assert repaired.problems[0].repaired is not None
    assert f"rebuilt from its {2 * STEPS} records" in repaired.problems[0].repaired
    assert (store / "quarantine" / part.relative_to(store)).read_bytes() == bytes(data)
    assert fsck(store).clean
    assert _metrics(store) == before and _summaries(store) == summaries
    once = part.read_bytes()
    assert fsck(store, repair=True).clean and part.read_bytes() == once  # idempotent


def test_a_part_whose_records_are_lost_is_reported_in_keys_and_steps(store: Path,
                                                                      tmp_path: Path) -> None:
    part = _part(store)
    data = bytearray(part.read_bytes())
    data[200] ^= 0x10  # inside the first data pages: their checksum fails
    part.write_bytes(bytes(data))
    report = fsck(store)
    [problem] = report.problems
    assert problem.path == part
    last = STEPS - 1
    assert (f"records seq 0..{last}: {2 * STEPS} values of 2 key(s) (acc, loss), "
            f"steps 0..{last}") in problem.lost
    assert "unverified" in problem.lost
    copy = tmp_path / "copy"
    shutil.copytree(store, copy)
    fsck(copy, repair=True)
    assert not list((copy / "metrics").rglob("*.parquet"))  # quarantined, not rebuilt
    assert fsck(copy).clean
