"""Progress of long commands: a bar on a terminal, plain lines in logs, nothing with
--quiet; the counts reach the total and follow the operation's real work."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

import tracklake
from tracklake._cli.main import main
from tracklake._cli.progress import OperationProgress
from tracklake._ops.backup import backup
from tracklake._ops.compact import compact
from tracklake._ops.fsck import fsck

ESCAPE = "\x1b["


class Clock:
    """A clock the test moves: lines every few seconds without waiting seconds."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _store(root: Path, runs: int = 3, steps: int = 40) -> Path:
    for n in range(runs):
        with tracklake.init(project="p", run_id=f"run-{n}", root=root,
                            capture_identity=False) as run:
            for step in range(steps):
                run.log({"loss": 1.0 / (step + 1), "reward": float(step)}, step=step)
                if step % 10 == 0:
                    run.log({"note": f"step {step}"}, step=step)
    return root


def _invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def _console(*, terminal: bool) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=terminal, width=120, color_system="standard"
                   if terminal else None), out


# -- the shared display -------------------------------------------------------------------

def test_lines_every_interval_and_at_the_end_when_not_a_terminal() -> None:
    console, out = _console(terminal=False)
    clock = Clock()
    with OperationProgress("compact", "streams", console=console, interval=5.0,
                           clock=clock) as progress:
        for done in range(1, 11):
            clock.now += 2.0  # a stream every 2 s: a line every third stream
            progress(done, 10, f"p/run-{done}")
    lines = out.getvalue().splitlines()
    assert ESCAPE not in out.getvalue()
    assert lines == [
        "tracklake compact: 3/10 streams (30%), 0.5 streams/s, about 14 s left - p/run-3",
        "tracklake compact: 6/10 streams (60%), 0.5 streams/s, about 8 s left - p/run-6",
        "tracklake compact: 9/10 streams (90%), 0.5 streams/s, about 2 s left - p/run-9",
        "tracklake compact: 10/10 streams done in 20.0 s",
    ]


def test_an_unknown_total_gives_counts_and_rate_without_time_left() -> None:
    console, out = _console(terminal=False)
    clock = Clock()
    with OperationProgress("export tensorboard", "records", console=console, interval=1.0,
                           clock=clock) as progress:
        clock.now += 4.0
        progress(50_000, None, "p/run-0 (run 1 of 2)")
    first, last = out.getvalue().splitlines()
    assert first == ("tracklake export tensorboard: 50,000 records, 12,500.0 records/s - "
                     "p/run-0 (run 1 of 2)")
    assert last == "tracklake export tensorboard: 50,000 records done in 4.0 s"


def test_a_terminal_gets_a_bar_that_reaches_the_total() -> None:
    console, out = _console(terminal=True)
    with OperationProgress("fsck", "streams", console=console) as progress:
        for done in range(1, 5):
            progress(done, 4, "p/run-0 0/1/metrics")
    text = out.getvalue()
    assert ESCAPE in text and "━" in text  # drawn with escape codes and bar glyphs
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    final = [line for line in plain.replace("\r", "\n").splitlines() if line.strip()][-1]
    assert "fsck" in final and "4/4" in final and "streams" in final and "100%" in final


def _final_line(text: str) -> str:
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    return [line for line in plain.replace("\r", "\n").splitlines() if line.strip()][-1]


@pytest.mark.parametrize("width", [40, 60, 80, 120])
def test_a_narrow_terminal_cuts_the_bar_and_names_never_the_counts(width: int) -> None:
    """Before: at 80 columns `181818/? records` read `181… r…` over two lines. Now the
    counts, percent and time left are whole; the bar, the note and the description give
    way, in that order."""
    note = "rlhf-math-reasoning/grpo-qwen2.5-7b-lr1e-6-kl0.001-seed42 (run 1 of 4)"
    for total, counts in ((None, "181818/? records"), (363_636, "181818/363636 records")):
        out = io.StringIO()
        console = Console(file=out, force_terminal=True, width=width, color_system=None)
        with OperationProgress("export tensorboard", "records", console=console) as progress:
            progress(181_818, total, note)
        line = _final_line(out.getvalue())
        assert counts in line and len(line) <= width, line
        if total is not None:
            assert " 50% " in line
        if width >= 120:
            assert line.startswith("export tensorboard ━━━━") and "(run 1 of 4)" in line


def test_the_bars_rate_keeps_one_width() -> None:
    from tracklake._cli.progress_bar import rate_text

    rates = [rate_text(v, "records") for v in (0.004, 0.5, 9.99, 974.4, 10_974.4, 999_999,
                                               1.05e6, 3e9)]
    assert [r.split()[0] for r in rates] == ["0.00", "0.50", "9.99", "974", "11.0k", "1000k",
                                             "1.05M", "3.00G"]
    assert len({len(r) for r in rates}) == 1


def test_quiet_draws_nothing_anywhere() -> None:
    for terminal in (True, False):
        console, out = _console(terminal=terminal)
        with OperationProgress("pack", "runs", quiet=True, console=console,
                               interval=0.0) as progress:
            progress(1, 2, "p/run-0")
            progress(2, 2, "p/run-1")
        assert out.getvalue() == ""


def test_an_operation_that_fails_ends_without_a_done_line() -> None:
    console, out = _console(terminal=False)
    with pytest.raises(OSError), OperationProgress("backup", "files", console=console,
                                                   interval=60.0) as progress:
        progress(1, 3, "a")
        raise OSError("disk full")
    assert "done" not in out.getvalue()


# -- the operations report their real work -------------------------------------------------

def test_compact_reports_each_stream_up_to_the_total(root: Path) -> None:
    _store(root)
    calls: list[tuple[int, int | None, str]] = []
    report = compact(root=root, progress=lambda d, t, n: calls.append((d, t, n)))
    assert report.parts_written
    dones = [d for d, _, _ in calls]
    assert dones == list(range(1, len(calls) + 1))  # one call per stream, in order
    assert {t for _, t, _ in calls} == {len(calls)}
    assert len(calls) == 3 * 2  # three runs, metrics and texts streams each
    assert all(n.startswith("p/run-") for _, _, n in calls)


def test_fsck_and_backup_reach_their_totals(root: Path, tmp_path: Path) -> None:
    _store(root, runs=2)
    checked: list[tuple[int, int | None]] = []
    fsck(root, progress=lambda d, t, n: checked.append((d, t)))
    assert checked and checked[-1] == (checked[-1][1], checked[-1][1])
    copied: list[tuple[int, int | None]] = []
    report = backup(root, tmp_path / "backup", progress=lambda d, t, n: copied.append((d, t)))
    total = copied[-1][1]
    assert copied[-1] == (total, total)
    assert total == len(report.copied) + report.unchanged


# -- the command line ---------------------------------------------------------------------

def test_compact_prints_progress_lines_on_stderr_and_the_summary_on_stdout(
        root: Path) -> None:
    _store(root)
    code, out, err = _invoke("compact", "--root", str(root))
    assert code == 0
    assert out.startswith("compacted ")
    assert "tracklake compact: 6/6 streams done in" in err
    assert ESCAPE not in err and ESCAPE not in out


def _commands(root: Path, tmp_path: Path) -> list[list[str]]:
    r = ["--root", str(root)]
    return [
        ["compact", *r],
        ["fsck", *r],
        ["pack", *r, "--all", "-o", str(tmp_path / "runs.tar")],
        ["unpack", str(tmp_path / "runs.tar"), "--root", str(tmp_path / "other")],
        ["backup", str(tmp_path / "backup"), *r],
        ["restore", str(tmp_path / "backup"), "--root", str(tmp_path / "restored")],
        ["retain", *r, "--keep-last", "1", "--apply"],
        ["export", "tensorboard", *r, "--all", "--logdir", str(tmp_path / "tb")],
    ]


def test_quiet_commands_print_nothing(root: Path, tmp_path: Path) -> None:
    """Every long command with --quiet: exit 0, nothing on stdout or stderr; and the work
    was done (the second run of each finds it done)."""
    _store(root)
    for args in _commands(root, tmp_path):
        code, out, err = _invoke(*args, "--quiet")
        assert (code, out, err) == (0, "", ""), args
    assert (tmp_path / "runs.tar").is_file() and (tmp_path / "restored" / "runs").is_dir()
    assert list((tmp_path / "tb").rglob("events.out.tfevents.*"))
    assert len(tracklake.query("SELECT DISTINCT run FROM runs", root=root)) == 1


def test_without_quiet_each_command_ends_with_a_done_line(root: Path, tmp_path: Path) -> None:
    _store(root)
    names = {"compact": "streams", "fsck": "streams", "pack": "runs", "unpack": "entries",
             "backup": "files", "restore": "files", "retain": "actions",
             "export": "records"}
    for args in _commands(root, tmp_path):
        code, _, err = _invoke(*args)
        assert code == 0, (args, err)
        what = args[0] if args[0] != "export" else "export tensorboard"
        done = [line for line in err.splitlines() if line.startswith(f"tracklake {what}: ")]
        assert done and done[-1].endswith(" s") and " done in " in done[-1], (args, err)
        assert f" {names[args[0]]} done in " in done[-1]
        assert ESCAPE not in err


def test_export_counts_every_record_it_delivered(root: Path, tmp_path: Path) -> None:
    _store(root, runs=2, steps=30)
    code, _, err = _invoke("export", "tensorboard", "--root", str(root), "--all",
                           "--logdir", str(tmp_path / "tb"))
    assert code == 0
    metrics = tracklake.query("SELECT count(*) AS n FROM metrics", root=root)
    summary = re.search(r": (\d+) records from 2 runs", err)
    assert summary is not None
    done = re.search(r"tracklake export tensorboard: ([\d,]+) records done", err)
    assert done is not None
    delivered = int(done.group(1).replace(",", ""))
    assert delivered == int(summary.group(1))
    assert delivered >= metrics.column("n")[0].as_py() == 2 * 30 * 2


# -- a followed export shows lag per run ----------------------------------------------------

def test_a_followed_export_shows_per_run_lag_until_the_run_ends(root: Path) -> None:
    """A live run followed into a destination: the lines name the run, the records
    exported and how far behind it is, and the last says it finished with every record."""
    import threading

    from tracklake._cli.export_progress import ExportDisplay
    from tracklake.exporters import Exporter, ExportOptions, MemoryDestination, Selection

    run = tracklake.init(project="p", run_id="live", root=root, capture_identity=False)
    for step in range(50):
        run.log({"loss": float(step)}, step=step)
    run.flush()
    console, out = _console(terminal=False)
    display = ExportDisplay("memory", follow=True, console=console, interval=0.0)
    destination = MemoryDestination()
    exporter = Exporter(destination, root=root, selection=Selection(runs=("live",)),
                        options=ExportOptions(follow=True, poll_interval=0.05),
                        progress=display, log=lambda m: None)
    with display:
        thread = threading.Thread(target=exporter.run)
        thread.start()
        for step in range(50, 100):
            run.log({"loss": float(step)}, step=step)
        run.finish()
        thread.join(timeout=60)
    assert not thread.is_alive()
    lines = out.getvalue().splitlines()
    assert ESCAPE not in out.getvalue()
    pattern = re.compile(r"tracklake export memory --follow: p/live: ([\d,]+) records "
                         r"exported, (?:[\d,]+ behind at the last poll, [\d.]+ s behind, "
                         r"(live|catching up)|(finished), nothing behind)")
    parsed = [pattern.fullmatch(line) for line in lines]
    assert lines and all(parsed), lines
    exported = [int(m.group(1).replace(",", "")) for m in parsed if m]
    assert exported == sorted(exported)  # never goes back
    held = destination.runs["p/live"].table("metrics")
    assert held is not None and held.num_rows == 100
    last = parsed[-1]
    assert last is not None and last.group(3) == "finished"
    assert exported[-1] >= 100


def test_seconds_behind_is_the_age_of_the_newest_record_while_records_arrive() -> None:
    from tracklake._cli.export_progress import ExportDisplay
    from tracklake.exporters import ExportProgress

    console, out = _console(terminal=False)
    display = ExportDisplay("tensorboard", follow=True, console=console, interval=0.0,
                            wall=lambda: 1_000.0)

    def update(sent: int, delivered: bool, newest: float) -> str:
        display(ExportProgress(run="p/r", index=1, runs=1, records=500, sent=sent,
                               delivered=delivered, newest_us=int(newest * 1e6),
                               finished=False, following=True))
        return out.getvalue().splitlines()[-1]

    assert update(200, False, 997.5).endswith("500 records exported, 200 behind at the "
                                              "last poll, 2.5 s behind, catching up")
    assert update(300, True, 999.0).endswith("300 behind at the last poll, 1.0 s behind, "
                                             "live")
    # a poll that found nothing waiting: the destination holds everything there is
    assert update(0, True, 900.0).endswith("0 behind at the last poll, 0.0 s behind, live")


def test_a_followed_export_on_a_terminal_draws_a_lag_table() -> None:
    from tracklake._cli.export_progress import ExportDisplay
    from tracklake.exporters import ExportProgress

    console, out = _console(terminal=True)
    with ExportDisplay("mlflow", follow=True, console=console, wall=lambda: 50.0) as display:
        for run in ("p/a", "p/b"):
            display(ExportProgress(run=run, index=1, runs=2, records=1234, sent=34,
                                   delivered=True, newest_us=48_000_000, finished=False,
                                   following=True))
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    assert "behind (records)" in plain and "behind (s)" in plain
    assert re.search(r"p/a\s*│\s*1,234\s*│\s*34\s*│\s*2\.0\s*│\s*live", plain)
    assert re.search(r"p/b\s*│\s*1,234\s*│\s*34\s*│\s*2\.0\s*│\s*live", plain)


def test_names_with_brackets_are_shown_as_they_are() -> None:
    """A run named like rich markup is printed literally, on a terminal and in a log."""
    for terminal in (True, False):
        console, out = _console(terminal=terminal)
        with OperationProgress("compact", "streams", console=console,
                               interval=0.0) as progress:
            progress(1, 1, "p/[bold]run[/bold]")
        plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
        assert "p/[bold]run[/bold]" in plain


def test_an_empty_store_says_it_did_nothing(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    code, out, err = _invoke("compact", "--root", str(root))
    assert code == 0
    assert out.startswith("compacted 0 segments")
    assert re.fullmatch(r"tracklake compact: 0 streams done in [\d.]+ s\n", err)


def test_export_follow_on_the_command_line_prints_lag_lines_not_a_bar(
        root: Path, tmp_path: Path) -> None:
    _store(root, runs=1, steps=30)
    code, _, err = _invoke("export", "tensorboard", "--root", str(root), "--run", "run-0",
                           "--follow", "--poll-interval", "0.1", "--logdir",
                           str(tmp_path / "tb"))
    assert code == 0, err
    assert ESCAPE not in err
    assert re.search(r"^tracklake export tensorboard --follow: p/run-0: [\d,]+ records "
                     r"exported, finished, nothing behind$", err, re.MULTILINE), err
    assert " done in " not in err  # no bar's end line: following has no total
