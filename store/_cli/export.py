"""`tracklake export DEST ...` and `tracklake export status`: one subcommand per installed
destination (entry point group ``tracklake.exporters``), sharing the selection options."""

from __future__ import annotations

import datetime as _dt
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from tracklake._cli.names import stored_projects, stored_runs
from tracklake._errors import TracklakeError


def _common_options() -> list[click.Parameter]:
    return [
        click.Option(["--root"], type=click.Path(file_okay=False),
                     help="Store directory, or a pyarrow file system URL (s3://bucket/store; "
                          "then --state-dir too) (default: $TRACKLAKE_ROOT, else "
                          "./tracklake-store)."),
        click.Option(["--project"], callback=stored_projects,
                     help="Export the runs of this project."),
        click.Option(["--run", "runs"], multiple=True, callback=stored_runs,
                     help="Export this run id (repeatable)."),
        click.Option(["--tag", "tags"], multiple=True, help="Only runs with this tag."),
        click.Option(["--all", "all_runs"], is_flag=True, help="Export every run."),
        click.Option(["--since"], type=click.DateTime(),
                     help="Only runs started at or after this time (UTC)."),
        click.Option(["--follow"], is_flag=True,
                     help="Keep exporting live runs as they grow (file events, with polling "
                          "as the fallback); stops when the --run runs are finished."),
        click.Option(["--ranks"], default="0", show_default=True,
                     help="A rank number, 'all' (keys under rank{r}/), or mean|min|max "
                          "across ranks per step."),
        click.Option(["--poll-interval"], default=2.0, show_default=True,
                     help="Seconds between polls while following."),
        click.Option(["--batch-rows"], default=50_000, show_default=True,
                     help="Records sent and committed at a time."),
        click.Option(["--commit-interval"], type=float, default=None,
                     help="While following, seconds at least between two commits to a live "
                          "run (default: the destination's; 30 for W&B and SwanLab, whose "
                          "every commit is a session directory; 0 for the others)."),
        click.Option(["--give-up-after"], default=600.0, show_default=True,
                     help="Seconds to keep retrying a failing destination (without --follow)."),
        click.Option(["--while-pid"], type=click.IntRange(min=1), default=None,
                     help="With --follow: once process PID (the trainer) has exited, export "
                          "what the store holds and stop, even if the run was never "
                          "finished (a killed trainer). The final summary then goes to "
                          "stdout."),
        click.Option(["--from-start"], is_flag=True,
                     help="Export the selected runs again from their start: forget what "
                          "this exporter delivered of them (after the destination's files "
                          "were deleted, say). A destination may then hold records twice."),
        click.Option(["--state-dir"], type=click.Path(file_okay=False, path_type=Path),
                     help="Where the exporter keeps its cursors "
                          "(default: ROOT/exports/<destination>)."),
        click.Option(["-q", "--quiet"], is_flag=True,
                     help="Print nothing but errors and warnings (no progress, no "
                          "summary)."),
    ]


_COMMON = {p.name for p in _common_options()}


def missing_package(name: str, exc: ImportError) -> str:
    """What to tell a user whose exporter `name` cannot be imported."""
    return (f"the {name} exporter needs a package that is not installed ({exc}); install it "
            f"with: pip install 'tracklake[{name}]'")


def make_destination(cls: Any, options: Mapping[str, Any]) -> Any:
    """A destination from its command-line options."""
    return cls.from_cli(**options)


def _run_export(name: str, params: dict[str, Any]) -> None:
    from tracklake._read.location import existing_root, is_url
    from tracklake.exporters import ExportOptions, Selection, export, load

    cls = load(name)
    dest_kwargs = {k: v for k, v in params.items() if k not in _COMMON}
    destination = make_destination(cls, dest_kwargs)
    since = params["since"]
    selection = Selection(project=params["project"], runs=tuple(params["runs"]),
                          tags=tuple(params["tags"]), all_runs=params["all_runs"],
                          since=since.replace(tzinfo=_dt.timezone.utc) if since else None)
    if selection.is_empty():
        raise click.UsageError("choose runs: --project P, --run ID, --tag T, --since T or --all")
    if params["while_pid"] is not None and not params["follow"]:
        raise click.UsageError("--while-pid PID means: follow while PID lives; add --follow")
    root = existing_root(params["root"])  # an error naming it if there is no store
    if is_url(root) and params["state_dir"] is None:
        raise click.UsageError(f"{root} is read-only: pass --state-dir DIR, a directory "
                               "where the exporter keeps its cursors")
    unmatched = None if params["follow"] else selection.unmatched(root)
    if unmatched is not None:  # while following, the loop waits for runs to appear
        raise click.ClickException(f"{unmatched} in the store at {root}; `tracklake runs "
                                   f"--root {root}` lists its runs")
    options = ExportOptions(ranks=params["ranks"], follow=params["follow"],
                            poll_interval=params["poll_interval"],
                            batch_rows=params["batch_rows"],
                            commit_interval=params["commit_interval"],
                            give_up_after=params["give_up_after"],
                            state_dir=params["state_dir"], while_pid=params["while_pid"],
                            from_start=params["from_start"])
    from tracklake._cli.export_progress import ExportDisplay

    if options.follow:
        _return_freed_memory()
    quiet = params["quiet"]
    try:
        with ExportDisplay(name, follow=options.follow, quiet=quiet) as display:
            summary = export(destination, root=root, selection=selection, options=options,
                             progress=display)
    except KeyboardInterrupt:
        click.echo("interrupted: everything committed so far is kept", err=True)
        sys.exit(130)
    report = str(summary)
    left = list(dict.fromkeys([o.run for o in summary.failed] + summary.abandoned))
    if left:
        report += (f"\nnot yet exported to {name}: {', '.join(left)}; `tracklake export status "
                   f"--root {root}` shows what is left, and `tracklake export {name} "
                   + " ".join(f"--run {r.split('/', 1)[1]}" for r in left)
                   + f" --root {root}` continues")
    if params["while_pid"] is not None:
        report = "tracklake export (sidecar) " + report
    if left or not quiet:
        _final_report(report, to_stdout=params["while_pid"] is not None)
    else:  # damage is still told
        for path, why in summary.problems.damaged:
            click.echo(f"tracklake: warning: {path}: {why}", err=True)
    if summary.failed:
        sys.exit(1)


def _final_report(text: str, *, to_stdout: bool) -> None:
    """The export's summary, on stderr, or on stdout for a sidecar (whose stdout is the
    trainer's console while its stderr is a log file). A console that is gone (the
    trainer's terminal closed with it) does not fail the export that already succeeded."""
    try:
        click.echo(text, err=not to_stdout)
    except OSError:
        if to_stdout:
            click.echo(text, err=True)


def _return_freed_memory() -> None:
    """Make Arrow allocate through the C library's allocator in this process.

    A followed export lives for the whole run and frees what each poll decoded. With
    pyarrow's default allocator (mimalloc) its resident memory crept up for minutes
    (190 to 255 MiB over a 6 M-value run in benchmarks/export.py); with the system
    allocator it stayed at 160-180 MiB, freed memory going back to the OS.
    """
    import pyarrow as pa

    pa.set_memory_pool(pa.system_memory_pool())


class _ExportGroup(click.Group):
    """Subcommands: `status`, and one per installed destination."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        from tracklake.exporters import available

        return ["status", *available()]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name == "status":
            return status
        from tracklake.exporters import load

        try:
            cls = load(cmd_name)
        except LookupError:
            return None
        except (ImportError, TypeError) as exc:
            message = (missing_package(cmd_name, exc) if isinstance(exc, ImportError)
                       else str(exc))

            def unavailable(**_: Any) -> None:
                raise click.ClickException(message)

            return click.Command(cmd_name, callback=unavailable, help=f"(unavailable) {message}",
                                 context_settings={"ignore_unknown_options": True,
                                                   "allow_extra_args": True})
        options: list[click.Parameter] = cls.cli_options()

        def callback(**params: Any) -> None:
            try:
                _run_export(cmd_name, params)
            except TracklakeError as exc:
                click.echo(f"tracklake: error: {exc}", err=True)
                sys.exit(1)

        return click.Command(cmd_name, params=[*_common_options(), *options],
                             callback=callback,
                             help=(cls.__doc__ or f"Export to {cmd_name}.").split("\n")[0])


@click.command()
@click.option("--root", type=click.Path(file_okay=False, path_type=Path), default=None)
def status(root: Path | None) -> None:
    """How far behind each exporter is, per run, with its last error."""
    from rich.table import Table

    from tracklake._cli.console import literal_console
    from tracklake.exporters import export_status

    rows = export_status(root)
    if not rows:
        click.echo("no exporter has run against this store yet")
        return
    table = Table(title="exporters")
    for col in ("destination", "run", "exported", "behind", "seconds behind", "finished",
                "last success", "last error"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(r["destination"], r["run"], str(r.get("exported", "")),
                      str(r.get("behind", "")), str(r.get("seconds_behind", "")),
                      str(r.get("finished", "")), r.get("last_success") or "",
                      r.get("error") or r.get("last_error") or "")
    literal_console().print(table)


export_group = _ExportGroup(
    "export", help="Replay runs into another tool: `tracklake export DEST --help` for a "
    "destination's options; `tracklake export status`.")
