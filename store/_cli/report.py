"""`tracklake report`: one self-contained HTML file, the dashboard's page with the runs'
data embedded (or Markdown with SVG charts), that shows runs offline."""

from __future__ import annotations

from pathlib import Path

import click

from tracklake._cli.names import given_projects
from tracklake._errors import TracklakeError
from tracklake._read.reader import ReadProblems, find_run
from tracklake._report.series import CurveQuery, XAxis


@click.command()
@click.argument("runs", nargs=-1, required=True)
@click.option("--root", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Store directory (default: $TRACKLAKE_ROOT, else ./tracklake-store).")
@click.option("--project", callback=given_projects,
              help="Project of the runs, if an id exists in several.")
@click.option("-o", "--output", required=True, type=click.Path(path_type=Path),
              help="The HTML file to write (with --format md: a folder for report.md and "
                   "its charts).")
@click.option("--format", "fmt", type=click.Choice(["html", "md"]), default="html",
              show_default=True)
@click.option("--key", "keys", multiple=True,
              help="Metric key or glob to chart; repeatable (default: every key).")
@click.option("--ranks", default=None, metavar="all|mean|N",
              help="Each rank its own curve, their mean, or one rank (default: the lowest); "
                   "the HTML page holds this mode only.")
@click.option("--smooth", default=1, show_default=True, type=click.IntRange(1),
              help="Trailing mean over this many steps (md); the HTML page starts its "
                   "smoothing at the moving average of the same span.")
@click.option("--x", "x_axis", type=click.Choice(["step", "time"]), default="step",
              show_default=True, help="The x axis: the step, or the seconds since the run "
                                      "started (the HTML page switches axes too).")
def report(runs: tuple[str, ...], root: Path | None, project: str | None, output: Path,
           fmt: str, keys: tuple[str, ...], ranks: str | None, smooth: int,
           x_axis: XAxis) -> None:
    """Write a report of runs: the dashboard's page with their data in one file that
    opens offline (charts to toggle, smooth, zoom and hover; runs and config diff;
    generations, traces, events, histograms and media), each part with the SQL that read
    it; or, with --format md, Markdown with SVG charts."""
    from tracklake._cli.main import _store, warn_problems
    from tracklake._cli.plot import parse_ranks
    from tracklake._report.content import read_report
    from tracklake._report.markdown import write_markdown
    from tracklake._ui.offline import read_answers, to_page
    from tracklake.files import write_atomic

    store = _store(root)
    if output.resolve().is_relative_to(store.resolve()):
        raise click.UsageError(f"refusing to write {output} inside the store {store}")
    if not output.absolute().parent.is_dir():  # a typo must not make directories anywhere
        raise click.UsageError(f"cannot write {output}: {output.absolute().parent} is not an "
                               "existing directory (create it first)")
    problems = ReadProblems()
    try:
        spec = CurveQuery(keys=keys or ("*",), ranks=parse_ranks(ranks), smooth=smooth,
                          x=x_axis)
        records = [find_run(store, r, project) for r in runs]
        if fmt == "md":
            content = read_report(store, records, spec, problems)
            charts = len(content.charts)
        else:
            data = read_answers(store, records, spec, problems)
            charts = data["report"]["keys"]
    except TracklakeError as exc:
        raise click.ClickException(str(exc)) from exc
    try:
        if fmt == "md":
            written = write_markdown(content, output)
        else:
            write_atomic(output, to_page(data).encode())
            written = output
    except OSError as exc:
        raise click.ClickException(f"cannot write {output}: {exc.strerror or exc}") from exc
    warn_problems(problems)
    click.echo(f"wrote {written}: {len(records)} runs, {charts} charts")
