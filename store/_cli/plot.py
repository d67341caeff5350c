"""`tracklake plot`: line charts of runs' metrics in the terminal, and the chart that
`tracklake watch --plot` redraws."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import click
from rich.console import Console
from rich.live import Live
from rich.text import Text

from tracklake._cli.names import given_projects
from tracklake._errors import TracklakeError
from tracklake._read.query import with_connection
from tracklake._read.reader import ReadProblems, RunRecord, find_run
from tracklake._report.series import CurveQuery, RankMode, XAxis, collect
from tracklake._report.terminal import Screen, draw_charts

#: What the terminal must show for braille charts (points and frame).
_UNICODE_PROBE = "⣿┌─┐│"


def can_draw_unicode(console: Console) -> bool:
    """Whether the terminal shows braille and box characters: its locale says UTF-8 (with
    LANG=C Python writes UTF-8 anyway, but the terminal behind it may not show it) and
    the output's encoding can write them."""
    for name in ("LC_ALL", "LC_CTYPE", "LANG"):
        value = os.environ.get(name)
        if value:
            if "utf-8" not in value.lower().replace("utf8", "utf-8"):
                return False
            break
    try:
        _UNICODE_PROBE.encode(console.encoding or "ascii")
    except (UnicodeEncodeError, LookupError):
        return False
    return True


def parse_ranks(value: str | None) -> RankMode:
    """`all`, `mean`, a rank number, or None (each run's lowest rank)."""
    if value is None or value in ("all", "mean"):
        return value  # type: ignore[return-value]
    try:
        rank = int(value)
    except ValueError:
        raise click.BadParameter(f"{value!r}: use all, mean or a rank number",
                                 param_hint="--ranks") from None
    if rank < 0:
        raise click.BadParameter(f"{value!r}: a rank is 0 or more", param_hint="--ranks")
    return rank


def screen_for(console: Console, width: int | None, height: int | None, ascii_only: bool,
               log: bool, x: XAxis) -> Screen:
    """The chart area: the terminal's size (80x24 when it is unknown) unless given."""
    size = shutil.get_terminal_size((80, 24))
    return Screen(width=width or size.columns, height=height or max(size.lines - 1, 8),
                  unicode=not ascii_only and can_draw_unicode(console),
                  color=console.color_system is not None and not console.no_color,
                  log=log, x_label=x)


def render(root: Path, records: list[RunRecord], spec: CurveQuery, screen: Screen,
           problems: ReadProblems) -> str:
    """The charts of `spec.keys` for the runs, as text for `screen`."""
    charts = with_connection(root, problems, lambda con: collect(con, records, spec))
    return draw_charts(charts, screen)


def _records(root: Path, runs: tuple[str, ...], project: str | None) -> list[RunRecord]:
    return [find_run(root, run, project) for run in runs]


def chart_options(func: click.decorators.FC) -> click.decorators.FC:
    """The options shared by `plot` and `watch --plot`."""
    for option in reversed([
        click.option("--ranks", default=None, metavar="all|mean|N",
                     help="Each rank its own curve (all), their mean per step (mean), or one "
                          "rank (default: each run's lowest rank)."),
        click.option("--smooth", default=1, show_default=True, type=click.IntRange(1),
                     help="Trailing mean over this many steps."),
        click.option("--since", type=int, default=None, help="Only steps from this one on."),
        click.option("--x", "x_axis", type=click.Choice(["step", "time"]), default="step",
                     show_default=True, help="x axis: step, or seconds since the run started."),
        click.option("--log", is_flag=True, help="Log scale on y (values <= 0 left out)."),
        click.option("--ascii", "ascii_only", is_flag=True,
                     help="ASCII only (automatic when the terminal cannot show Unicode)."),
        click.option("--width", type=click.IntRange(20), default=None,
                     help="Columns (default: the terminal's)."),
        click.option("--height", type=click.IntRange(8), default=None,
                     help="Lines for all charts (default: the terminal's)."),
    ]):
        func = option(func)
    return func


@click.command()
@click.argument("runs", nargs=-1, required=True)
@click.option("--root", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Store directory (default: $TRACKLAKE_ROOT, else ./tracklake-store).")
@click.option("--project", callback=given_projects,
              help="Project of the runs, if an id exists in several.")
@click.option("--key", "keys", multiple=True, required=True,
              help="Metric key or glob, one chart each; repeatable.")
@chart_options
def plot(runs: tuple[str, ...], root: Path | None, project: str | None,
         keys: tuple[str, ...], ranks: str | None, smooth: int, since: int | None,
         x_axis: XAxis, log: bool, ascii_only: bool, width: int | None,
         height: int | None) -> None:
    """Line charts of metric keys in the terminal, several runs overlaid."""
    from tracklake._cli.main import _store, warn_problems

    console = Console(soft_wrap=True, highlight=False)
    store = _store(root)
    problems = ReadProblems()
    try:
        spec = CurveQuery(keys=keys, ranks=parse_ranks(ranks), smooth=smooth, since=since,
                          x=x_axis)
        text = render(store, _records(store, runs, project), spec,
                      screen_for(console, width, height, ascii_only, log, x_axis), problems)
    except TracklakeError as exc:
        raise click.ClickException(str(exc)) from exc
    console.print(Text.from_ansi(text))
    warn_problems(problems)


def watch_plot(root: Path, run: str, project: str | None, interval: float, once: bool,
               spec: CurveQuery, screen: Screen, console: Console) -> bool:
    """Redraw the chart of `spec` every `interval` seconds until the run ends (or at once
    with `once`); True if the run has ended."""
    from tracklake.read import TERMINAL_STATUSES, effective_status

    problems = ReadProblems()
    with Live(console=console, auto_refresh=False, transient=False) as live:
        while True:
            record = find_run(root, run, project)
            text = render(root, [record], spec, screen, problems)
            live.update(Text.from_ansi(text), refresh=True)
            latest = max(record.attempt_numbers)
            now = time.time()
            ended = all(effective_status(a, latest, now) in TERMINAL_STATUSES
                        for a in record.attempts if a["attempt"] == latest)
            if ended or once:
                break
            time.sleep(interval)
    if not console.is_terminal:
        console.line()  # a pipe gets the last frame without its line end
    return ended


def watch_command(root: Path, run: str, project: str | None, key: str, rank: int,
                  interval: float, once: bool, ascii_only: bool) -> None:
    """`tracklake watch RUN --plot KEY`: the chart of one rank, redrawn until the run ends."""
    console = Console(soft_wrap=True, highlight=False)
    screen = screen_for(console, None, None, ascii_only, False, "step")
    # one line below the chart says how the watch ended
    screen = Screen(width=screen.width, height=screen.height - 1, unicode=screen.unicode,
                    color=screen.color)
    spec = CurveQuery(keys=(key,), ranks=rank)
    ended = watch_plot(root, run, project, interval, once, spec, screen, console)
    click.echo(f"run {run} ended" if ended else f"run {run} is still running (--once: "
               "stopped here)")
