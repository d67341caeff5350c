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
    "axes_live": ["axes", "tables", "histograms", "config"],
}
#: the call sites with keys on axes of their own
WITH_AXES = sorted(name for name, parts in NOT_EMPTY.items() if "axes" in parts)


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


def _ours(name: str, tmp_path: Path, root: Path, monkeypatch: pytest.MonkeyPatch,
          batch_rows: int | None = None) -> wruns.WandbView:
    with monkeypatch.context() as m:
        m.setenv("TRACKLAKE_ROOT", str(root))
        CALLSITES[name](tlwandb)
    assert tlwandb.run is None
    return _export(root, tmp_path / f"exported-{batch_rows}", batch_rows)


def _export(root: Path, out: Path, batch_rows: int | None = None, ranks: str = "0"
            ) -> wruns.WandbView:
    """Export every run of `root` to `out` (again: from where the last export there
    ended), `batch_rows` records a commit, each commit a W&B session."""
    options = ExportOptions(state_dir=out / "state", ranks=ranks,
                            **({} if batch_rows is None else {"batch_rows": batch_rows}))
    summary = export(WandbDestination(dir=str(out)), root=root,
                     selection=Selection(all_runs=True), options=options, log=lambda _: None)
    assert not summary.failed, summary
    return wruns.read(wruns.offline_files(out / "wandb"))


def _agree(ours: wruns.WandbView, real: wruns.WandbView) -> None:
    """What `test_the_exported_run_agrees_with_what_wandb_itself_recorded` compares."""
    assert set(_without_histograms(ours, real)) == set(real.points)
    assert ours.histograms == real.histograms
    assert ours.axes == real.axes
    assert ours.tables == real.tables
    assert ours.config == real.config


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


@pytest.mark.parametrize("name", WITH_AXES)
def test_values_on_several_axes_all_arrive_whatever_the_batch_size(
        name: str, tmp_path: Path, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Exported a few records a commit, each commit a W&B session: the keys of an axis
    that runs behind W&B's step (or ahead of it) arrive in later sessions all the same
    (before: W&B's increasing steps dropped them, counted in tracklake/dropped_steps)."""
    real = _real(name, tmp_path)
    with monkeypatch.context() as m:
        m.setenv("TRACKLAKE_ROOT", str(root))
        CALLSITES[name](tlwandb)
    for batch_rows in (3, 17):
        ours = _export(root, tmp_path / f"exported-{batch_rows}", batch_rows)
        _agree(ours, real)


def test_a_run_exported_while_it_is_written_agrees_with_wandb(
        tmp_path: Path, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An export now and then while the run is live (as ``--follow`` commits), and once
    it has finished: every value arrives at its x value, none twice, and the W&B step of
    W&B's own axis is the step the run logged it at."""
    real = _real("axes_live", tmp_path)
    out = tmp_path / "exported"
    live: list[int] = []

    def between() -> None:
        tlwandb.run.store_run.flush()  # what a follower sees after the writer's flush
        live.append(len(wruns.offline_files(out / "wandb")) if out.exists() else 0)
        _export(root, out, batch_rows=5)

    with monkeypatch.context() as m:
        m.setenv("TRACKLAKE_ROOT", str(root))
        CALLSITES["axes_live"](tlwandb, between)
    ours = _export(root, out, batch_rows=5)
    assert len(live) == 4 and live[-1] > live[0]  # sessions were written while it ran
    _agree(ours, real)
    # nothing twice (a step metric's own value is in every row W&B synced it into)
    assert Counter(p for p in _without_histograms(ours, real).elements() if p[1] != "axis"
                   ) == Counter(p for p in real.points.elements() if p[1] != "axis")
    states = [json.loads(p.read_text()) for p in (out / "state").rglob("*.json")]
    runs = [v for state in states for v in _values(state) if isinstance(v, dict)
            and "dropped_steps" in v]
    assert runs and all(v["dropped_steps"] == 0 and not v.get("waiting") for v in runs)


def _values(node: object) -> list[object]:
    """Every dict within a JSON value (the export state nests each run's)."""
    if isinstance(node, dict):
        return [node, *(v for value in node.values() for v in _values(value))]
    if isinstance(node, list):
        return [v for value in node for v in _values(value)]
    return []


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
    # every rank under its rank{r}/ prefix, a few records a session: each rank's keys on
    # its own prefixed axes, as each process's W&B run has them
    both = _export(root, tmp_path / "exported-all", batch_rows=4, ranks="all")
    for rank, process in zip(ranks, ("primary", "secondary"), strict=True):
        want = wruns.read(wruns.offline_files(real / process / "wandb"))
        prefix = f"rank{rank}/"
        assert {(key[len(prefix):], x, v) for key, x, v in both.points
                if key.startswith(prefix)} == set(want.points), process
        assert {k[len(prefix):]: v[len(prefix):] for k, v in both.axes.items()
                if k.startswith(prefix)} == want.axes, process
