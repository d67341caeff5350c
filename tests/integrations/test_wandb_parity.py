"""Each RL codebase's W&B call sites (`_wandb_callsites`) run twice: against the real
wandb in offline mode, and against `tracklake.wandb` followed by `tracklake export
wandb`. Read back with wandb's own reader, the two W&B runs agree on every logged value
at its x-axis value, the axes, the tables, the histograms' counts and ranges, the config
and the summary values the code set."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import _wandb_runs as wruns
import pytest
from _optional import optional
from _wandb_callsites import CALLSITES

import tracklake
import tracklake.wandb as tlwandb
from tracklake._integrations.wandb.init import SECONDARY_RANK_BASE
from tracklake.exporters import ExportOptions, Selection, export

optional("wandb")

from tracklake.exporters.wandb.destination import WandbDestination  # noqa: E402

HERE = Path(__file__).parent
#: what each call site must have produced, so that agreeing is not agreeing on nothing
NOT_EMPTY = {
    "slime": ["axes", "config", "identity"],
    "transformers_trainer": ["axes", "config", "summary"],
    "nemo_rl": ["histograms", "config"],
    "openrlhf": ["axes", "tables", "config", "identity"],
    "trl_completions": ["axes", "tables"],
    "verl_tracking": ["tables", "config"],
    "edge_cases": ["histograms"],
}


@pytest.fixture(autouse=True)
def quiet_wandb(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_ERROR_REPORTING", "false")
    monkeypatch.setenv("WANDB_X_DISABLE_STATS", "true")


def _real(name: str, tmp_path: Path) -> wruns.WandbView:
    """The call sites against the real wandb, offline, in a fresh interpreter (wandb's
    process-wide setup keeps the first directory it was given)."""
    out = tmp_path / "real"
    out.mkdir()
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(out),
           "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent)])}
    subprocess.run([sys.executable, "-c", f"import wandb, _wandb_callsites as c; "
                    f"c.CALLSITES[{name!r}](wandb)"], env=env, cwd=out, check=True,
                   timeout=300)
    return wruns.read(wruns.offline_files(out / "wandb"))


def _ours(name: str, tmp_path: Path, root: Path, monkeypatch: pytest.MonkeyPatch
          ) -> wruns.WandbView:
    with monkeypatch.context() as m:
        m.setenv("TRACKLAKE_ROOT", str(root))
        CALLSITES[name](tlwandb)
    assert tlwandb.run is None
    out = tmp_path / "exported"
    summary = export(WandbDestination(dir=str(out)), root=root,
                     selection=Selection(all_runs=True))
    assert not summary.failed, summary
    return wruns.read(wruns.offline_files(out / "wandb"))


@pytest.mark.parametrize("name", sorted(CALLSITES))
def test_the_exported_run_agrees_with_what_wandb_itself_recorded(
        name: str, tmp_path: Path, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = _real(name, tmp_path)
    ours = _ours(name, tmp_path, root, monkeypatch)
    assert real.points, "the fixture logged no values"
    for part in NOT_EMPTY[name]:
        assert getattr(real, part), f"{name} should have logged {part}"
    # as sets: W&B keeps a value logged twice at one x value twice (transformers' last
    # train/epoch), the export once; and a step metric W&B inserted into rows that lacked
    # it (step_sync) adds no new value
    assert set(_without_histograms(ours, real)) == set(real.points)
    assert ours.histograms == real.histograms  # counts and range, as W&B binned them
    assert ours.axes == real.axes
    assert ours.tables == real.tables
    assert real.media == ours.media
    assert ours.config == real.config
    assert ours.summary == real.summary
    # the group, job type and notes the code gave (without one, the export's group is the
    # tracklake run id)
    assert {k: ours.identity.get(k) for k in real.identity} == real.identity


def _without_histograms(ours: wruns.WandbView, real: wruns.WandbView
                        ) -> Counter[tuple[str, object, object]]:
    """Our points with each histogram's metrics checked against W&B's histogram (count,
    and its range as W&B's first and last bin edge) and then left out."""
    points = Counter(ours.points)
    for (key, x, count, low, high), n in real.histograms.items():
        for name, value in (("count", count), ("min", low), ("max", high)):
            assert points[(f"{key}/{name}", x, value)] == n, (key, x, name)
        for name in ("count", "min", "max", "mean", "std"):
            for point in [p for p in points if p[0] == f"{key}/{name}" and p[1] == x]:
                del points[point]
    return points


def test_histograms_are_their_count_min_max_mean_and_std(
        tmp_path: Path, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as m:
        m.setenv("TRACKLAKE_ROOT", str(root))
        CALLSITES["nemo_rl"](tlwandb)
    rows = tracklake.query("SELECT step, key, value FROM metrics WHERE key LIKE "
                           "'train/reward_hist/%' ORDER BY step, key", root=root).to_pylist()
    at_1 = {r["key"].rsplit("/", 1)[1]: r["value"] for r in rows if r["step"] == 1}
    assert at_1["count"] == 9 and at_1["min"] == 0 and at_1["max"] == 2
    assert at_1["mean"] == pytest.approx(1.0) and at_1["std"] == pytest.approx(0.6455, 1e-3)


def test_the_processes_of_slimes_shared_mode_are_ranks_of_one_run_that_agree_with_wandb(
        tmp_path: Path, root: Path) -> None:
    """Primary and secondary of one run id: the real wandb (offline, as slime runs it
    offline) makes one run per process; tracklake.wandb (shared mode) one run with the
    primary at rank 0 and the secondary at a rank of its own. Exported rank by rank, each
    agrees with its process's W&B run."""
    base = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent)])}
    real = tmp_path / "real"
    code = "import wandb, _wandb_callsites as c; c.slime_shared(wandb)"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300, cwd=tmp_path, env={
        **base, "WANDB_MODE": "offline", "FIXTURE_WANDB_MODE": "offline",
        "FIXTURE_WANDB_MODULE": "wandb", "WANDB_DIR": str(real / "primary"),
        "FIXTURE_SECONDARY_ENV": json.dumps({"WANDB_DIR": str(real / "secondary")})})
    code = "import tracklake.wandb as w, _wandb_callsites as c; c.slime_shared(w)"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300, cwd=tmp_path, env={
        **base, "TRACKLAKE_ROOT": str(root), "FIXTURE_WANDB_MODULE": "tracklake.wandb"})
    assert len(tracklake.list_runs(root=root)) == 1  # one run id for both processes
    ranks = sorted(r["rank"] for r in tracklake.query(
        "SELECT DISTINCT rank FROM metrics", root=root).to_pylist())
    assert ranks[0] == 0 and len(ranks) == 2 and ranks[1] >= SECONDARY_RANK_BASE
    for rank, process in zip(ranks, ("primary", "secondary"), strict=True):
        want = wruns.read(wruns.offline_files(real / process / "wandb"))
        out = tmp_path / f"exported-{rank}"
        summary = export(WandbDestination(dir=str(out)), root=root,
                         selection=Selection(all_runs=True),
                         options=ExportOptions(ranks=str(rank)))
        assert not summary.failed, summary
        got = wruns.read(wruns.offline_files(out / "wandb"))
        assert want.points and set(got.points) == set(want.points), process
        assert got.axes == want.axes and got.config == want.config, process
