"""`tracklake pack` and `tracklake unpack`: carry runs across an air gap in one file
(docs/air-gapped.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from tracklake._cli.names import stored_projects, stored_runs
from tracklake._cli.progress import OperationProgress, quiet_option
from tracklake._errors import TracklakeError


def _fail(exc: TracklakeError) -> None:
    click.echo(f"tracklake: error: {exc}", err=True)
    sys.exit(1)


@click.command()
@click.option("--root", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Store to pack from (default: $TRACKLAKE_ROOT, else ./tracklake-store).")
@click.option("--project", callback=stored_projects, help="Pack the runs of this project.")
@click.option("--run", "runs", multiple=True, callback=stored_runs,
              help="Pack this run id (repeatable).")
@click.option("--all", "all_runs", is_flag=True, help="Pack every run of the store.")
@click.option("-o", "--output", required=True,
              type=click.Path(dir_okay=False, path_type=Path),
              help="The pack file to write, in an existing directory (an existing "
                   "regular file is replaced atomically; anything else is refused).")
@click.option("--since", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="An earlier pack: include only what it (and the packs it was made "
                   "--since) did not hold.")
@quiet_option
def pack(root: Path | None, project: str | None, runs: tuple[str, ...], all_runs: bool,
         output: Path, since: Path | None, quiet: bool) -> None:
    """Pack runs (records, attempt files, artifact blobs) into one file."""
    from tracklake._ops.pack.pack import pack as do_pack

    if not (project or runs or all_runs):
        raise click.UsageError("choose runs: --project P, --run ID or --all")
    try:
        with OperationProgress("pack", "runs", quiet=quiet) as progress:
            report = do_pack(root=root, project=project, runs=runs, all_runs=all_runs,
                             output=output, since=since, progress=progress)
    except TracklakeError as exc:
        _fail(exc)
        return
    if not quiet or report.missing_blobs or report.bad_attempts or report.problems.damaged:
        click.echo(str(report), err=True)


@click.command()
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--root", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Store to merge into (default: $TRACKLAKE_ROOT, else ./tracklake-store); "
                   "created if missing.")
@click.option("--max-part-bytes", type=click.IntRange(min=1), default=None,
              help="Refuse a packed part whose records decode to more bytes than this "
                   "(they are held in memory while merged; default 4 GiB).")
@quiet_option
def unpack(path: Path, root: Path | None, max_part_bytes: int | None, quiet: bool) -> None:
    """Verify a pack and merge it into the store; unpacking it again adds nothing."""
    from tracklake._ops.pack.pack import unpack as do_unpack
    from tracklake._ops.pack.parts import MAX_PART_BYTES

    try:
        with OperationProgress("unpack", "entries", quiet=quiet) as progress:
            report = do_unpack(path, root=root,
                               max_part_bytes=max_part_bytes or MAX_PART_BYTES,
                               progress=progress)
    except TracklakeError as exc:
        _fail(exc)
        return
    if not quiet:
        click.echo(str(report), err=True)
