"""`tracklake ship`: move into the store what ranks of this node left in its node-local
folder in ship mode (a writer killed before its records were shipped); a live writer's
streams are left to its own shipper."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from tracklake._cli.lifecycle import _fail, _root_option, _store
from tracklake._errors import TracklakeError


@click.command()
@_root_option
@click.option("--local", "local_root", type=click.Path(file_okay=False, path_type=Path),
              help="The node-local folder of ship mode (default: $TRACKLAKE_LOCAL_ROOT).")
def ship(root: Path | None, local_root: Path | None) -> None:
    """Ship the records that writers of this node left in the node-local folder.

    Exits 1 when a local segment was found damaged (its whole batches before the damage
    are shipped, the file kept as <name>.damaged) or a stream could not be shipped, after
    shipping everything else."""
    from tracklake._format.layout import local_base
    from tracklake._ops.ship import Shipper, ShipReport
    from tracklake._write.shipping import LOCAL_ROOT_ENV

    store = _store(root)
    given = local_root or os.environ.get(LOCAL_ROOT_ENV)
    if not given:
        raise click.UsageError(f"give --local or set {LOCAL_ROOT_ENV}")
    base = local_base(Path(os.path.abspath(given)), store)
    if not base.is_dir():
        click.echo(f"nothing to ship: {base} does not exist")
        return
    report = ShipReport()
    try:
        shipper = Shipper(base, store)
        try:
            report = shipper.ship(leftovers=True)
        finally:
            shipper.close()
    except (TracklakeError, OSError) as exc:
        _fail(click.ClickException(f"shipping from {base}: {exc}"))
    click.echo(f"shipped {report.records} records ({report.batches} batches) into {store}; "
               f"{report.segments_done} local segments done")
    for ident in report.busy:
        click.echo(f"{ident.project}/{ident.run} rank {ident.rank} attempt {ident.attempt} "
                   f"{ident.kind}: a live process ships it (its writer, or another "
                   "`tracklake ship`)")
    for problem in report.problems:
        click.echo(f"warning: {problem}", err=True)
    if report.problems:  # everything else was shipped; a script must still hear of it
        sys.exit(1)
