"""`tracklake plot` and `watch --plot`: what a person sees in an 80x24 or 200x50 terminal,
compared with golden text for a fixed data set (rich's console recording, and a real
terminal through tmux), ASCII where the terminal cannot show Unicode, and the curves'
numbers (rank mean, smoothing, downsampling, --since, wall time)."""

from __future__ import annotations

import io
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _pictures import write_runs
from _terminal import run_in_terminal
from click.testing import CliRunner
from rich.console import Console
from rich.text import Text

import tracklake
from tracklake._cli.main import main
from tracklake._cli.plot import render
from tracklake._read.query import with_connection
from tracklake._read.reader import ReadProblems, find_run
from tracklake._report.series import CurveQuery, curves
from tracklake._report.terminal import Screen

GOLDEN = Path(__file__).parent / "plot_golden"
#: Set to rewrite the golden files from what is drawn now (then review the diff).
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
TRACKLAKE = str(Path(sys.executable).with_name("tracklake"))


@pytest.fixture
def store(root: Path) -> Path:
    write_runs(root)
    return root


def recorded(root: Path, runs: list[str], spec: CurveQuery, screen: Screen) -> str:
    """The charts as a colour terminal of the screen's size shows them (text only)."""
    console = Console(record=True, width=screen.width, height=screen.height + 1,
                      force_terminal=True, color_system="standard", file=io.StringIO())
    text = render(root, [find_run(root, r) for r in runs], spec, screen, ReadProblems())
    console.print(Text.from_ansi(text))
    return console.export_text(styles=False)


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.write_text(text)
    assert text == path.read_text(), f"differs from {path} (UPDATE_GOLDEN=1 rewrites it)"


TWO_KEYS = CurveQuery(keys=("loss", "reward"))


def test_two_runs_two_keys_in_80x24_match_the_golden_text(store: Path) -> None:
    text = recorded(store, ["base", "tuned"], TWO_KEYS, Screen(80, 23, color=True))
    lines = text.splitlines()
    assert len(lines) <= 23 and max(len(line) for line in lines) <= 80
    assert "⣿⣿ base" in text and "⣿⣿ tuned" in text  # legend
    check_golden("two_runs_80x24.txt", text)


def test_all_ranks_in_200x50_match_the_golden_text(store: Path) -> None:
    spec = CurveQuery(keys=("loss",), ranks="all")
    text = recorded(store, ["base", "tuned"], spec, Screen(200, 49, color=True))
    assert max(len(line) for line in text.splitlines()) <= 200
    assert "base rank 1" in text and "tuned rank 0" in text
    check_golden("all_ranks_200x50.txt", text)


def test_ascii_mode_draws_no_character_outside_ascii(store: Path) -> None:
    spec = CurveQuery(keys=("loss", "reward"), smooth=5)
    text = recorded(store, ["base", "tuned"], spec, Screen(80, 23, unicode=False, log=True))
    assert text.isascii()
    assert "loss (log)" in text and "++ base" in text and "xx tuned" in text
    check_golden("ascii_log_80x24.txt", text)


def test_plot_in_a_real_80x24_terminal_shows_the_golden_text(store: Path) -> None:
    """tmux runs the command in an 80x24 terminal; its screen is the recorded golden."""
    shown = run_in_terminal([TRACKLAKE, "plot", "base", "tuned", "--key", "loss", "--key",
                             "reward", "--root", str(store)], 80, 24)
    golden = (GOLDEN / "two_runs_80x24.txt").read_text().strip("\n")
    assert shown.strip("\n") == golden


def test_plot_command_falls_back_to_ascii_under_lang_c(store: Path) -> None:
    out = subprocess.run([TRACKLAKE, "plot", "base", "--key", "kl", "--root", str(store)],
                         env={**os.environ, "LANG": "C", "LC_ALL": "C"}, capture_output=True,
                         text=True, check=True).stdout
    assert out.isascii() and "+---" in out and "kl" in out


def test_plot_names_a_missing_key_and_suggests_close_ones(store: Path) -> None:
    result = CliRunner().invoke(main, ["plot", "base", "--key", "los", "--root", str(store)])
    assert result.exit_code == 1
    assert "run p/base has no metric key matching 'los'; did you mean loss?" in result.output
    result = CliRunner().invoke(main, ["plot", "nobody", "--key", "loss", "--root", str(store)])
    assert result.exit_code == 1 and "no run 'nobody'" in result.output


def test_plot_refuses_a_bad_rank_mode(store: Path) -> None:
    result = CliRunner().invoke(main, ["plot", "base", "--key", "loss", "--ranks", "some",
                                       "--root", str(store)])
    assert result.exit_code == 2 and "use all, mean or a rank number" in result.output


def _curves(root: Path, run: str, spec: CurveQuery) -> dict[str, list[float]]:
    found = with_connection(root, ReadProblems(), lambda con: curves(
        con, "p", run, list(spec.keys), spec))
    return {f"{c.key} {c.ranks}": c.ys for c in found} | {
        f"{c.key} {c.ranks} x": c.xs for c in found} | {
        f"{c.key} {c.ranks} n": [c.points] for c in found}


def test_mean_of_ranks_smoothing_and_downsampling_compute_the_right_values(
        store: Path) -> None:
    mean = _curves(store, "base", CurveQuery(keys=("loss",), ranks="mean"))
    assert mean["loss mean of 2 ranks"][0] == pytest.approx(2.1)  # (2.0 + 2.2) / 2
    smooth = _curves(store, "base", CurveQuery(keys=("loss",), ranks=0, smooth=3))
    raw = [2 * math.exp(-s / 60) for s in range(3)]
    assert smooth["loss rank 0"][2] == pytest.approx(sum(raw) / 3)
    assert smooth["loss rank 0"][0] == pytest.approx(raw[0])
    few = _curves(store, "base", CurveQuery(keys=("loss",), ranks=0, buckets=10))
    assert few["loss rank 0 n"] == [200]
    assert few["loss rank 0 x"] == [9.5 + 20 * i for i in range(10)]  # mean step of each
    since = _curves(store, "base", CurveQuery(keys=("kl",), ranks=1, since=150))
    assert since["kl rank 1 x"][0] == 150 and len(since["kl rank 1 x"]) == 50
    wall = _curves(store, "base", CurveQuery(keys=("kl",), ranks=0, x="time"))["kl rank 0 x"]
    assert wall[0] >= 0 and wall == sorted(wall)


def test_nan_infinite_huge_and_single_values_are_drawn_or_left_out_not_crashing(
        root: Path) -> None:
    with tracklake.init(project="p", run_id="odd", root=root) as run:
        run.log({"only-nan": math.nan, "one": 3.0}, step=0)
        for step in range(1, 30):
            run.log({"only-nan": math.nan, "huge": (-1) ** step * 1.7e308,
                     "mixed": math.inf if step % 3 == 0 else step,
                     "neg": -float(step)}, step=step)
    spec = CurveQuery(keys=("*",))
    text = recorded(root, ["odd"], spec, Screen(80, 60, color=True))
    for key in ("huge", "mixed", "one", "neg"):
        assert key in text
    assert "only-nan\n  (nothing to draw)" in text  # no finite value: said, not drawn
    assert "huge [values in units of 1e+308; y -1.7…1.7]" in text
    log_text = recorded(root, ["odd"], CurveQuery(keys=("neg", "one")),
                        Screen(80, 24, log=True))
    assert "neg (log) [29 points <= 0 left out of the log scale]\n  (nothing to draw)" in log_text
    assert "one (log)" in log_text


def test_watch_plot_redraws_until_the_run_ends(root: Path) -> None:
    """The watcher starts while the run is being written and stops once it has ended."""
    run = tracklake.init(project="p", run_id="live", root=root)
    for step in range(20):
        run.log({"loss": 1 / (step + 1)}, step=step)
    assert run.flush()
    watcher = subprocess.Popen(
        [TRACKLAKE, "watch", "live", "--plot", "loss", "--interval", "0.2", "--root",
         str(root)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "LANG": "C.UTF-8", "COLUMNS": "80", "LINES": "24"})
    for step in range(20, 300):
        run.log({"loss": 1 / (step + 1)}, step=step)
    run.finish()
    out, err = watcher.communicate(timeout=120)
    assert watcher.returncode == 0, err
    assert out.rstrip().endswith("run live ended")
    assert "loss" in out and " 200" in out  # the last frame has more than the first 20 steps


def test_watch_plot_once_draws_the_chart_and_stops(store: Path) -> None:
    result = CliRunner().invoke(main, ["watch", "base", "--plot", "reward", "--once",
                                       "--ascii", "--root", str(store)])
    assert result.exit_code == 0, result.output
    assert "reward" in result.output and "+---" in result.output
    assert result.output.rstrip().endswith("run base ended")


def test_odd_key_names_are_taken_literally_and_drawn_harmlessly(root: Path) -> None:
    """A key named like a glob is found as written; control characters in a key cannot
    reach the terminal."""
    with tracklake.init(project="p", run_id="odd-names", root=root) as run:
        for step in range(10):
            run.log({"acc[0]": step, "acc0": -step, "\x1b[2Jwipe": step}, step=step)
    text = recorded(root, ["odd-names"], CurveQuery(keys=("acc[0]",)), Screen(80, 12))
    assert "acc[0]" in text and "acc0" not in text
    text = recorded(root, ["odd-names"], CurveQuery(keys=("*wipe",)), Screen(80, 12))
    assert "\x1b" not in text and "?[2Jwipe" in text


def test_plot_command_with_wall_time_all_ranks_and_since(store: Path) -> None:
    result = CliRunner().invoke(main, ["plot", "base", "tuned", "--key", "reward", "--ranks",
                                       "all", "--x", "time", "--since", "100", "--width",
                                       "100", "--height", "20", "--root", str(store)])
    assert result.exit_code == 0, result.output
    out = result.output
    assert all(len(line) <= 100 for line in out.splitlines())
    for label in ("base rank 0", "base rank 1", "tuned rank 0"):
        assert label in out
    assert " s" in out.splitlines()[-2]  # x labels in seconds


def test_the_y_axis_labels_show_the_datas_range_and_a_constant_is_drawn_at_its_value() -> None:
    """Before: data in 0.13-0.88 labelled 1 and 0 in a short chart, and a constant 1e-6
    drawn on the 0 line."""
    from tracklake._report.series import Curve
    from tracklake._report.terminal import CHART_FRAME_LINES, draw_chart

    ys = [0.13 + 0.75 * i / 99 for i in range(100)]
    text = draw_chart("score", [Curve("r", "score", "0", list(range(100)), ys, 100)],
                      Screen(80, 24), CHART_FRAME_LINES + 3)
    labels = [line.rsplit("│", 1)[1].strip() for line in text.splitlines()[2:5]]
    assert "[y 0.13…0.88]" in text.splitlines()[0]
    assert all(0.1 <= float(label) <= 0.9 for label in labels), labels
    text = draw_chart("lr", [Curve("r", "lr", "0", list(range(50)), [1e-6] * 50, 50)],
                      Screen(80, 24), CHART_FRAME_LINES + 3)
    rows = text.splitlines()[2:5]
    drawn = [line for line in rows if "⠤" in line]
    assert len(drawn) == 1 and float(drawn[0].rsplit("│", 1)[1]) == pytest.approx(1e-6)
